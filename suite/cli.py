"""`suite-bench`: resolve a trial from Hydra config, validate it, run it, store the result.

    suite-bench model=pythia-14m hardware=cpu-x2                    # one trial on two CPU workers
    suite-bench model=pythia-160m hardware=a100-80gb-x4 methods.zero_stage=2
    suite-bench model=mamba-2.8b hardware=h100-sxm-x4
    suite-bench -m model=pythia-14m,pythia-31m hardware=cpu-x2 methods.zero_stage=0,1,2,3
    suite-bench model=hf model.hf_config=path/to/config.json model.task=causal-lm hardware=a6000-x4
    suite-bench --config-dir my_conf model=my-model hardware=a6000-x4  # my_conf/model/my-model.yaml

A single run with bad values exits 2 listing every problem. In a multirun a bad
combination is recorded as `invalid` and the sweep goes on; a trial already in the store
is served from it unless `measure.rerun=true` (a `crashed` one is always run again).

`measure.repeats=N` runs the trial N times, each in fresh worker processes, into one
record (suite/store.py); `measure.repeats=auto` runs until the interval of the median is
narrow enough (suite/stats.py). Runs already stored count, so asking for more adds only the
missing ones, and each run is claimed on its own: jobs sharing a store never run more than
the most any of them asked for. A run that fails ends the trial's runs.

With `hydra/launcher=slurm` each trial is a Slurm job (suite/slurm.py); `cluster.nodes=N`
spreads one trial over N nodes (suite/cluster.py).
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from suite import cluster, launch, stats, store, tracking
from suite.config import Trial, problems, register, unsupported
from suite.progress import Progress

RETRIED = ("crashed",)  # most often the environment or a bug since fixed: measured again
CONF_DIR = str(Path(__file__).resolve().parent.parent / "conf")


def trial_from_cfg(cfg: DictConfig) -> Trial:
    """The trial of a composed config; a local config.json's fields are copied into the
    trial (`suite.models.inline`), so its record stands alone."""
    from suite import models

    d = OmegaConf.to_container(cfg, resolve=True)
    spec = {k: d[k] for k in ("model", "hardware", "methods", "measure", "debug")}
    t = Trial.from_dict({**spec, "nodes": d["cluster"]["nodes"]})
    return replace(t, model=models.inline(t.model))


def describe(t: Trial) -> str:
    """The trial in one line, with the attention and precision that run (see `Trial`)."""
    me, r = t.methods, t.model.recipe
    precision = t.precision
    if me.precision == "recipe" and precision != r.precision:
        precision += f" (recipe {r.precision}; {t.hardware.device.upper()} trains {precision})"
    sharding = f"zero={me.zero_stage}"
    if me.engine == "fsdp2":
        sharding = f"fsdp2 {'full_shard' if me.reshard_after_forward else 'shard_grad_op'}"
    return (
        f"{t.model.name} {t.hardware.name} {sharding} offload={me.offload} "
        f"recompute={me.recompute} mb={me.micro_batch}x{t.gas} attn={t.attention}"
        f"{' compile' if me.compile else ''} {precision}"
    )


def summary_line(rec: dict, t: Trial) -> str:
    """One readable line for a trial's record; says whether it came from the store."""
    source = rec.get("_source") or f"{rec['wall_s']:.0f} s"
    m = rec["metrics"]
    head = f"[{rec['outcome']:>11}] {describe(t)}"
    if rec["outcome"] != "ok":
        return f"{head} | {rec['message']} ({source})"
    mfu = f"{m['mfu']:.1%}" if m.get("mfu") is not None else "n/a (cpu)"
    unit = {"token": "tok", "image": "img"}[t.unit]
    kernels = f", kernels {m['kernel_path']}" if m.get("kernel_path") else ""
    w = m["step_time_within_std_s"]
    within = f", ±{100 * w / m['step_time_s']:.1f}% within a run" if w is not None else ""
    if m["runs"] == 1:
        step = f"step {m['step_time_s']:.3f} s (single run{within})"
    else:
        step = (
            f"step {m['step_time_s']:.3f} s (median of {m['runs']} runs, {m['step_time_ci_level']:.1%} interval "
            f"{m['step_time_ci_lo_s']:.3f}-{m['step_time_ci_hi_s']:.3f} s{within})"
        )
    line = (
        f"{head} | {step}{' NOISY' if m['noisy'] else ''}, "
        f"{m['tokens_per_s']:,.0f} {unit}/s, MFU {mfu}, peak {m['peak_mem_gib']:.2f} GiB{kernels} ({source})"
    )
    wrong = m.get("profile_mismatch")
    if wrong:
        fits = f"profile {wrong['detected']}" if wrong["detected"] else "no profile in conf/gpu/"
        line += (
            f"\n              WARNING: ran on {wrong['device_name']}, not the {wrong['profile_gpu']} of "
            f"hardware={wrong['profile']} ({fits} fits it): its MFU and memory figures are against the wrong GPU"
        )
    return line


def wants_run(rec: dict | None, t: Trial) -> bool:
    """Whether the trial, stored as `rec` (its crashed runs already dropped), needs another run."""
    if rec is None:
        return True
    if rec["outcome"] != "ok":  # a failed run decided it
        return False
    n = rec["metrics"]["runs"]
    if t.measure.repeats != "auto":
        return n < t.measure.repeats
    times = [r["metrics"]["step_time_s"] for r in store.ok_runs(rec)]
    return n < t.measure.max_repeats and not stats.narrow_enough(times, t.measure.repeat_width)


def stored(t: Trial, store_dir: str, fresh: bool) -> dict | None:
    """The record that stands for this trial so far: none when it is to be measured afresh
    (`measure.rerun`, before this process's first run), and without crashed runs (run again)."""
    if fresh and t.measure.rerun:
        return None
    return store.without(store.load(store_dir, t.id), RETRIED)


def node_here(t: Trial, in_sweep: bool) -> launch.Node:
    """This process's node of the trial; a single run that cannot span its nodes exits 2."""
    try:
        return cluster.node_of(t)
    except cluster.ClusterError as e:
        if in_sweep:
            raise
        print(f"Cannot run this trial here: {e}", file=sys.stderr)
        sys.exit(2)


def run_one(t: Trial, store_dir: str, sweep: str, in_sweep: bool, wandb_cfg=None) -> dict:
    """Run (or fetch) one trial's runs and return its stored record; log fresh runs to W&B.

    The record says how it came: `_source` is "from store" when no run was measured now, and
    `_fresh_runs` counts the runs measured now.
    """
    node = node_here(t, in_sweep)
    found = problems(t)
    logs = str(Path(store_dir) / "logs")
    if node.rank > 0:  # a further node of a multi-node trial: node 0 decides and records
        return follow_runs(t, node, store_dir, sweep, not found, logs)
    if found:
        if not in_sweep:
            print(f"Invalid trial ({len(found)} problem{'s' * (len(found) > 1)}):", file=sys.stderr)
            for p in found:
                print(f"  - {p}", file=sys.stderr)
            sys.exit(2)
        rec = store.record(t, sweep, "invalid", "; ".join(found), {}, 0.0)
        store.save(store_dir, rec)
        return rec
    fresh = 0
    while True:
        # One run per claim: a job waiting for this trial waits for one run, not all of them,
        # and reads the runs already stored before it decides to measure another.
        with store.claim(store_dir, t.id, t.measure.timeout_s):
            rec = stored(t, store_dir, fresh == 0)
            if not wants_run(rec, t):
                break
            why = unsupported(t)
            if why:
                rec = store.record(t, sweep, "unsupported", why, {}, 0.0)
                store.save(store_dir, rec)
                break
            o = launch.run_trial(t, keep_logs=logs, node=node)
            rec = store.with_run(rec, t, sweep, o.outcome, o.message, o.metrics, o.wall_s)
            store.save(store_dir, rec)
            fresh += 1
        if rec["outcome"] != "ok":  # a failed run ends the runs (a crashed one is run again next time)
            break
    rec["_fresh_runs"] = fresh
    if fresh == 0:
        rec["_source"] = "from store"
    elif fresh < len(rec["runs"]):
        now_s = sum(r["wall_s"] for r in rec["runs"][-fresh:])
        rec["_source"] = f"{fresh} of {len(rec['runs'])} runs measured now, {now_s:.0f} s"
    if fresh and wandb_cfg is not None:
        tracking.log_trial(rec, wandb_cfg.mode, wandb_cfg.project, wandb_cfg.dir)
    return rec


def follow_runs(t: Trial, node: launch.Node, store_dir: str, sweep: str, valid: bool, logs: str) -> dict:
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


def sweep_size(cfg_sweeper_params: dict, argv: list[str]) -> int | None:
    """How many jobs Hydra's basic sweeper makes of these overrides (None if unknown)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    args = [a for a in argv if not a.startswith("-")]
    merged = {a.split("=", 1)[0]: a for a in [f"{k}={v}" for k, v in cfg_sweeper_params.items()] + args if "=" in a}
    try:
        overrides = OverridesParser.create().parse_overrides(list(merged.values()))
    except Exception:  # noqa: BLE001 - only a progress figure depends on it
        return None
    n = 1
    for o in overrides:
        if o.is_sweep_override():
            n *= len(list(o.sweep_iterator()))
    return n


_progress: Progress | None = None  # one per process: Hydra runs a multirun's jobs in this process


@hydra.main(config_path=CONF_DIR, config_name="config", version_base="1.3")
def bench(cfg: DictConfig) -> None:
    global _progress
    t = trial_from_cfg(cfg)
    hc = HydraConfig.get()
    in_sweep = hc.mode == RunMode.MULTIRUN
    if _progress is None:
        total = sweep_size(dict(hc.sweeper.get("params") or {}), sys.argv[1:]) if in_sweep else 1
        _progress = Progress(total)
    _progress.begin(describe(t))
    rec = run_one(t, cfg.store.dir, cfg.store.sweep, in_sweep, cfg.wandb)
    line = f"{summary_line(rec, t)}\n              -> {store.path_for(cfg.store.dir, t.id)}"
    _progress.end(rec, line)


def main() -> None:
    register()
    bench()


if __name__ == "__main__":
    main()
