"""Run a trial, or fetch it from the store: its runs measured in fresh processes, one claim per
run, the record saved after each, fresh runs logged to W&B. The one loop every command uses
(`suite-bench`, `suite-search`, the GPU check, the benchmarks).

`measure.repeats=N` runs the trial N times into one record (suite.record); `measure.repeats=auto`
runs until the interval of the median is narrow enough (suite.stats). Runs already stored count,
so asking for more adds only the missing ones, and each run is claimed on its own: jobs sharing
a store never run more than the most any of them asked for. A run that fails ends the trial's
runs; a `crashed` one is run again next time.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from suite import cluster, launch, nvme, stats, store, tracking
from suite.config.schema import Trial, WandbConfig
from suite.config.validate import nvme_problems, problems, unsupported
from suite.labels import describe
from suite.methods import on_nvme
from suite.record import Record, with_run

RETRIED = ("crashed",)  # most often the environment or a bug since fixed: measured again


@dataclass
class Ran:
    """A trial's record as `run_one` left it, and how many of its runs were measured now."""

    record: Record
    fresh_runs: int = 0
    """Runs measured now."""
    from_store: bool = False
    """Nothing was measured or decided now: the record is the store's."""

    @property
    def source(self) -> str:
        """Where its figures come from: the store, runs measured now, or both."""
        rec, fresh = self.record, self.fresh_runs
        if self.from_store:
            return "from store"
        if 0 < fresh < len(rec.runs):
            now_s = sum(r.wall_s for r in rec.runs[-fresh:])
            return f"{fresh} of {len(rec.runs)} runs measured now, {now_s:.0f} s"
        return f"{rec.wall_s:.0f} s"


def wants_run(rec: Record | None, t: Trial) -> bool:
    """Whether the trial, stored as `rec` (its crashed runs already dropped), needs another run."""
    if rec is None:
        return True
    if not rec.ok:  # a failed run decided it
        return False
    n = rec.n_runs
    if t.measure.repeats != "auto":
        return n < t.measure.repeats
    return n < t.measure.max_repeats and not stats.narrow_enough(rec.step_times(), t.measure.repeat_width)


def stored(t: Trial, store_dir: str, fresh: bool) -> Record | None:
    """The record that stands for this trial so far: none when it is to be measured afresh
    (`measure.rerun`, before this process's first run), and without crashed runs (run again)."""
    if fresh and t.measure.rerun:
        return None
    rec = store.load(store_dir, t.id)
    return rec.without(RETRIED) if rec else None


def node_here(t: Trial, in_sweep: bool) -> launch.Node:
    """This process's node of the trial; a single run that cannot span its nodes exits 2."""
    try:
        return cluster.node_of(t)
    except cluster.ClusterError as e:
        if in_sweep:
            raise
        print(f"Cannot run this trial here: {e}", file=sys.stderr)
        sys.exit(2)


def refuse(found: list[str]) -> None:
    """A single run with problems: list them all and exit 2."""
    print(f"Invalid trial ({len(found)} problem{'s' * (len(found) > 1)}):", file=sys.stderr)
    for p in found:
        print(f"  - {p}", file=sys.stderr)
    sys.exit(2)


def run_one(t: Trial, store_dir: str, sweep: str, in_sweep: bool, wandb: WandbConfig | None = None) -> Ran:
    """Run (or fetch) one trial's runs and return its stored record; log fresh runs to W&B."""
    t = nvme.resolved(t, store_dir)
    node = node_here(t, in_sweep)
    found = problems(t)
    if not found and node.rank == 0:
        found = nvme_problems(t)  # this machine's drive: only for a trial that is otherwise valid
    logs = str(Path(store_dir) / "logs")
    if node.rank > 0:  # a further node of a multi-node trial: node 0 decides and records
        return Ran(follow_runs(t, node, store_dir, sweep, not found, logs))
    if found:
        if not in_sweep:
            refuse(found)
        rec = Record.new(t, sweep, "invalid", "; ".join(found), {}, 0.0)
        store.save(store_dir, rec)
        return Ran(rec)
    fresh = 0
    while True:
        # One run per claim: a job waiting for this trial waits for one run, not all of them,
        # and reads the runs already stored before it decides to measure another.
        with store.claim(store_dir, t.id, t.measure.timeout_s):
            rec = stored(t, store_dir, fresh == 0)
            if not wants_run(rec, t):
                break
            why = unsupported(t)
            if why and not in_sweep and on_nvme(t):
                # A missing library the user installs with one command: refused as bad input is.
                print(f"Cannot run this trial here: {why}", file=sys.stderr)
                sys.exit(2)
            if why:
                rec = Record.new(t, sweep, "unsupported", why, {}, 0.0)
                store.save(store_dir, rec)
                return Ran(rec)
            rec = with_run(rec, t, sweep, launch.run_trial(t, keep_logs=logs, node=node))
            store.save(store_dir, rec)
            fresh += 1
        if not rec.ok:  # a failed run ends the runs (a crashed one is run again next time)
            break
    if fresh and wandb is not None:
        tracking.log_trial(rec, wandb.mode, wandb.project, wandb.dir)
    return Ran(rec, fresh, from_store=fresh == 0)


def follow_runs(t: Trial, node: launch.Node, store_dir: str, sweep: str, valid: bool, logs: str) -> Record:
    """A further node's part: join each run node 0 makes. It decides from the store as node 0
    does, and after each run waits until node 0 has stored it before deciding again."""
    last = None
    rec = stored(t, store_dir, True)
    while valid and unsupported(t) is None and wants_run(rec, t):
        before = store.stamp(store_dir, t.id)
        last = cluster.follow(t, node, sweep, True, logs)
        if not store.wait_for_change(store_dir, t.id, before, store.CLAIM_SLACK_S):
            break  # node 0 did not record the run: it decides, so this node stops
        rec = store.load(store_dir, t.id)  # a failed run ends the runs here as on node 0
    return last or cluster.follow(t, node, sweep, False, logs)


def summary_line(ran: Ran, t: Trial) -> str:
    """One readable line for a trial's record; says whether it came from the store."""
    rec, source = ran.record, ran.source
    head = f"[{rec.outcome:>11}] {describe(t)}"
    if not rec.ok:
        return f"{head} | {rec.message} ({source})"
    mfu = f"{rec.mfu:.1%}" if rec.mfu is not None else "n/a (cpu)"
    unit = {"token": "tok", "image": "img"}[t.unit]
    kernels = f", kernels {rec.figure('kernel_path')}" if rec.figure("kernel_path") else ""
    w = rec.figure("step_time_within_std_s")
    within = f"; ±{100 * w / rec.step_time_s:.1f}% within a run" if w is not None else ""
    nvme = ""
    if rec.figure("nvme_read_bytes_per_step") is not None:
        nvme = (
            f", NVMe {rec.figure('nvme_read_bytes_per_step') / 1e6:,.1f} MB read + "
            f"{rec.figure('nvme_write_bytes_per_step') / 1e6:,.1f} MB written/step "
            f"({rec.figure('nvme_read_gbps'):.2f} + {rec.figure('nvme_write_gbps'):.2f} GB/s)"
        )
    line = (
        f"{head} | step {rec.step_time_s:.3f} s ({rec.measured_phrase()}{within})"
        f"{' NOISY' if rec.figure('noisy') else ''}, {rec.tokens_per_s:,.0f} {unit}/s, MFU {mfu}, "
        f"peak {rec.peak_mem_gib:.2f} GiB{nvme}{kernels} ({source})"
    )
    wrong = rec.figure("profile_mismatch")
    if wrong:
        fits = f"profile {wrong['detected']}" if wrong["detected"] else "no profile in conf/hardware/"
        line += (
            f"\n              WARNING: ran on {wrong['device_name']}, not the {wrong['profile_gpu']} of "
            f"hardware={wrong['profile']} ({fits} fits it): its MFU and memory figures are against the wrong GPU"
        )
    return line
