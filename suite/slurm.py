"""Sweeps as Slurm jobs through hydra-submitit-launcher, each job sized by its own trial.

`hydra/launcher=slurm` (conf/hydra/launcher/slurm.yaml) selects the suite's Slurm
launcher, and `hydra/launcher=local` its local one (submitit's local executor: the same
jobs as local processes). Hydra takes launchers only from the `hydra_plugins` package, so
they are declared in hydra_plugins/suite_launcher/; what they do is here (`SizedLaunch`).
Both are the plugin's launchers with two changes:

- each job asks for what its trial needs (`resources`: nodes, GPUs, CPUs, memory, time
  limit) on the partition, account and QOS of conf/cluster/ (`site`); jobs that ask alike
  share one job array, so one sweep may mix hardware and node counts;
- every job is awaited, and one that ended without a result (Slurm's time limit,
  `scancel`, a node failure) or that failed on any of its nodes becomes a failed job with
  a clear message; Hydra raises the first of them once all jobs are done.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Sequence
from typing import Any

from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, JobStatus, filter_overrides
from hydra_plugins.hydra_submitit_launcher.config import BaseQueueConf
from omegaconf import OmegaConf, open_dict

from suite import store
from suite.config import ClusterConfig, Trial
from suite.config.compose import trial_from_cfg

log = logging.getLogger(__name__)

RANK_HOST_GIB = 4.0  # host memory of one rank's runtime: torch, DeepSpeed, a CUDA context, pinned buffers
JOB_START_S = 300.0  # a job's own time around its trial: start-up, imports, composing the config
STATE_POLL_S = 20.0  # how often job states are asked for while waiting (submitit alone: every 10 min)


class JobEnded(RuntimeError):
    """A job that ended without a result, or failed on one of its nodes."""


def resources(t: Trial, c: ClusterConfig) -> dict[str, Any]:
    """What one trial's job asks per node, in hydra-submitit-launcher's terms."""
    cuda = t.hardware.device == "cuda"
    n = t.hardware.count
    # CPU ranks hold the model in host memory (hardware.mem_gib each when set); offload
    # moves up to a GPU's worth of state per rank to the host.
    held = t.hardware.mem_gib if not cuda or t.methods.offload != "none" else 0.0
    # Each of its runs (measure.repeats) may first wait out another job's run of the same trial.
    time_s = t.max_runs * (2 * t.measure.timeout_s + store.CLAIM_SLACK_S) + JOB_START_S
    return {
        "nodes": t.nodes,
        "tasks_per_node": 1,  # one launcher per node, which starts the node's ranks
        "gpus_per_node": n if cuda else None,
        "cpus_per_task": c.cpus_per_node or n * (c.cpus_per_gpu if cuda else 1),
        "mem_gb": c.mem_gb or math.ceil(n * (RANK_HOST_GIB + held)),
        "timeout_min": c.time_min or math.ceil(time_s / 60),
    }


def site(c: ClusterConfig) -> dict[str, Any]:
    """Partition, account, QOS, extra sbatch options and setup lines, where conf/cluster/ sets them."""
    given = {
        "partition": c.partition,
        "account": c.account,
        "qos": c.qos,
        "additional_parameters": dict(c.sbatch),
        "setup": list(c.setup),
    }
    return {k: v for k, v in given.items() if v}


class SizedLaunch:
    """The launch step for the plugin's launchers: one job array per request, every job awaited."""

    _EXECUTOR: str

    def _request(self, overrides: Sequence[str]) -> dict[str, Any]:
        cfg = self.hydra_context.config_loader.load_sweep_config(self.config, list(overrides))
        with open_dict(cfg):
            del cfg["hydra"]
        t = trial_from_cfg(cfg)
        c = ClusterConfig(**OmegaConf.to_container(cfg.cluster, resolve=True))
        return {**resources(t, c), **(site(c) if self._EXECUTOR == "slurm" else {})}

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        import submitit

        params = dict(self.params)
        folder = params.pop("submitit_folder")
        init = {f"{self._EXECUTOR}_{k}": params.pop(k) for k in ("max_num_timeout",) if k in params}
        base = set(OmegaConf.structured(BaseQueueConf).keys())
        groups: dict[str, list[int]] = {}
        requests: dict[str, dict[str, Any]] = {}
        for i, overrides in enumerate(job_overrides):
            request = {**params, **self._request(overrides)}
            key = json.dumps(request, sort_keys=True)
            requests[key] = request
            groups.setdefault(key, []).append(i)

        jobs = []
        for key, members in groups.items():
            executor = submitit.AutoExecutor(cluster=self._EXECUTOR, folder=folder, **init)
            executor.update_parameters(
                **{k if k in base else f"{self._EXECUTOR}_{k}": v for k, v in requests[key].items()}
            )
            shown = {k: requests[key][k] for k in ("nodes", "gpus_per_node", "cpus_per_task", "mem_gb", "timeout_min")}
            log.info(f"{len(members)} {self._EXECUTOR} job(s), each asking {shown}")
            idx = [initial_job_idx + i for i in members]
            for i, n in zip(members, idx, strict=True):
                log.info(f"\t#{n} : {' '.join(filter_overrides(job_overrides[i]))}")
            # The plugin's job arguments: overrides, sweep-dir key, job number, job id, Hydra state.
            submitted = executor.map_array(
                self,
                [list(job_overrides[i]) for i in members],
                ["hydra.sweep.dir"] * len(members),
                idx,
                [f"job_id_for_{n}" for n in idx],
                [Singleton.get_state()] * len(members),
            )
            jobs += zip(members, submitted, strict=True)
        self._await([job for _, job in jobs])
        returns = [self._collect(job, job_overrides[i]) for i, job in sorted(jobs, key=lambda x: x[0])]
        for r in returns:
            if r.status == JobStatus.FAILED:
                log.error(f"failed: {r._return_value}")
        return returns

    def _await(self, jobs: list[Any]) -> None:
        """Until every job is done. submitit asks Slurm for job states at 2, 4, 8, ... s and
        then every 10 minutes; asking every STATE_POLL_S notices a killed job sooner."""
        next_poll = time.monotonic() + STATE_POLL_S
        while not all(job.done() for job in jobs):
            if self._EXECUTOR == "slurm" and time.monotonic() > next_poll:
                jobs[0].watcher.update()  # one sacct call for all of them
                next_poll = time.monotonic() + STATE_POLL_S
            time.sleep(1)

    def _collect(self, job: Any, overrides: Sequence[str]) -> JobReturn:
        from submitit.core.utils import FailedJobError, UncompletedJobError

        try:
            returns = job.results()  # one per task, so per node: node 0 first
        except (UncompletedJobError, FailedJobError) as e:
            why = JobEnded(
                f"{self._EXECUTOR} job {job.job_id} ({' '.join(filter_overrides(overrides))}) ended "
                f"{job.state} before its result came back: {str(e).strip().splitlines()[0]}; "
                f"its log: {job.paths.stdout}"
            )
            return JobReturn(overrides=list(overrides), status=JobStatus.FAILED, _return_value=why)
        failed = [r for r in returns if r.status != JobStatus.COMPLETED]
        return failed[0] if failed else returns[0]
