"""Multi-node trials: this process's place in a trial that spans several nodes.

A trial with `cluster.nodes=N` runs in one Slurm job of N nodes with one task per node:
`hydra/launcher=slurm` asks for that, and so does `srun --nodes=N --ntasks-per-node=1` in
an allocation. Each task is the launcher of its node's ranks (`suite.launch`), with the
same worker code as a one-node trial; the ranks meet through torch.distributed's env://
rendezvous at the job's first node. Node 0 decides, measures and records; the other nodes
run their ranks, and their ranks' failure reports reach node 0 through the shared store
(`suite.launch`), so node 0 records the root cause wherever it happened.
"""

from __future__ import annotations

import os
import random

from suite import launch
from suite.config import Trial
from suite.record import Record


class ClusterError(RuntimeError):
    """A multi-node trial outside a Slurm job of its shape, or a failure on a further node."""


def master_port(job_id: str) -> int:
    """The rendezvous port every node derives alike: $MASTER_PORT, else one seeded by the
    job id (the rule of submitit's TorchDistributedEnvironment, which needs a submitit job)."""
    if "MASTER_PORT" in os.environ:
        return int(os.environ["MASTER_PORT"])
    return random.Random(job_id).randint(20000, 60000)


def node_of(t: Trial) -> launch.Node:
    """Where this process runs the trial: node 0 on localhost for one node, else from Slurm."""
    if t.nodes <= 1:  # below 1 is invalid, and reported as such
        return launch.Node()
    hint = (
        f"run it as a Slurm job of {t.nodes} nodes with one task each: `suite-bench -m hydra/launcher=slurm ... "
        f"cluster.nodes={t.nodes}`, or `srun --nodes={t.nodes} --ntasks-per-node=1 suite-bench ...` in an allocation"
    )
    if "SLURM_JOB_ID" not in os.environ:
        raise ClusterError(f"cluster.nodes={t.nodes} but this is not a Slurm job; {hint}")
    from submitit.slurm.slurm import SlurmJobEnvironment  # reads the SLURM_* variables and node list

    env = SlurmJobEnvironment()
    if env.num_nodes != t.nodes or env.num_tasks != t.nodes:
        raise ClusterError(
            f"cluster.nodes={t.nodes} but this Slurm job step has {env.num_nodes} node(s) and "
            f"{env.num_tasks} task(s); {hint}"
        )
    return launch.Node(rank=env.node, master_addr=env.hostnames[0], port=master_port(env.job_id))


def follow(t: Trial, node: launch.Node, sweep: str, run: bool, keep_logs: str) -> Record:
    """A further node's part: run its ranks when node 0 runs the trial (`run`), never store.

    Returns a record for the job's log (outcome `follower`), also when the trial failed and
    node 0 recorded why; raises ClusterError when its ranks failed and node 0 gave no account
    of the trial (it is gone), so the job, and with it the sweep, reports the failure.
    """
    if not run:
        return Record.new(t, sweep, "follower", f"node {node.rank}: node 0 does not run this trial", {}, 0.0)
    try:
        run = launch.run_trial(t, keep_logs=keep_logs, node=node)
    except launch.NoAccount as e:
        raise ClusterError(f"node {node.rank} of trial {t.id}: {e}") from e
    return Record.new(t, sweep, "follower", f"node {node.rank}: {run.message}", {}, run.wall_s)
