"""`suite-bench`: resolve a trial from Hydra config, validate it, run it, store the result.

    suite-bench model=pythia-160m hardware=a100-80gb-x4 methods.zero_stage=2
    suite-bench -m model=pythia-14m,pythia-31m hardware=cpu-x2 methods.zero_stage=0,1,2,3

A single run with bad values exits 2 listing every problem. In a multirun a bad
combination is recorded as `invalid` and the sweep goes on; a trial already in the store
is served from it unless `measure.rerun=true` (a `crashed` one is always run again).
"""

from __future__ import annotations

import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from suite import launch, store
from suite.config import Trial, problems, register, unsupported

RETRIED = ("crashed",)  # most often the environment or a bug since fixed: measured again
CONF_DIR = str(Path(__file__).resolve().parent.parent / "conf")


def trial_from_cfg(cfg: DictConfig) -> Trial:
    d = OmegaConf.to_container(cfg, resolve=True)
    return Trial.from_dict({k: d[k] for k in ("model", "hardware", "methods", "measure", "debug")})


def describe(t: Trial) -> str:
    me = t.methods
    return (
        f"{t.model.name} {t.hardware.name} zero={me.zero_stage} offload={me.offload} "
        f"recompute={me.recompute} mb={me.micro_batch}x{t.gas} attn={me.attention}"
        f"{' compile' if me.compile else ''} {t.precision}"
    )


def summary_line(rec: dict, t: Trial, source: str) -> str:
    m = rec["metrics"]
    head = f"[{rec['outcome']:>11}] {describe(t)}"
    if rec["outcome"] != "ok":
        return f"{head} | {rec['message']} ({source})"
    mfu = f"{m['mfu']:.1%}" if m.get("mfu") is not None else "n/a (cpu)"
    spread = 100 * m["step_time_std_s"] / m["step_time_s"]
    return (
        f"{head} | step {m['step_time_s']:.3f} s ±{spread:.1f}%{' NOISY' if m['noisy'] else ''}, "
        f"{m['tokens_per_s']:,.0f} tok/s, MFU {mfu}, peak {m['peak_mem_gib']:.2f} GiB ({source})"
    )


def run_one(t: Trial, store_dir: str, sweep: str, in_sweep: bool) -> dict:
    """Run (or fetch) one trial and return its stored record."""
    found = problems(t)
    if found:
        if not in_sweep:
            print(f"Invalid trial ({len(found)} problem{'s' * (len(found) > 1)}):", file=sys.stderr)
            for p in found:
                print(f"  - {p}", file=sys.stderr)
            sys.exit(2)
        rec = store.record(t, sweep, "invalid", "; ".join(found), {}, 0.0)
        store.save(store_dir, rec)
        return rec
    cached = store.load(store_dir, t.id)
    if cached is not None and cached["outcome"] not in RETRIED and not t.measure.rerun:
        cached["_source"] = "from store"
        return cached
    why = unsupported(t)
    if why:
        rec = store.record(t, sweep, "unsupported", why, {}, 0.0)
    else:
        o = launch.run_trial(t, keep_logs=str(Path(store_dir) / "logs"))
        rec = store.record(t, sweep, o.outcome, o.message, o.metrics, o.wall_s)
    store.save(store_dir, rec)
    return rec


@hydra.main(config_path=CONF_DIR, config_name="config", version_base="1.3")
def bench(cfg: DictConfig) -> None:
    t = trial_from_cfg(cfg)
    in_sweep = HydraConfig.get().mode == RunMode.MULTIRUN
    rec = run_one(t, cfg.store.dir, cfg.store.sweep, in_sweep)
    source = rec.pop("_source", f"{rec['wall_s']:.0f} s")
    print(summary_line(rec, t, source), flush=True)
    print(f"              -> {store.path_for(cfg.store.dir, t.id)}", flush=True)


def main() -> None:
    register()
    bench()


if __name__ == "__main__":
    main()
