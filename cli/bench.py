"""`suite-bench`: resolve a trial from Hydra config, validate it, run it, store the result.

    suite-bench model=pythia-14m hardware=cpu                        # one trial on two CPU workers
    suite-bench model=pythia-160m hardware=a100-80gb hardware.count=4 methods.zero_stage=2
    suite-bench model=mamba-2.8b hardware=h100-sxm hardware.count=4
    suite-bench -m model=pythia-14m,pythia-31m hardware=cpu methods.zero_stage=0,1,2,3
    suite-bench model=hf model.hf_config=path/to/config.json model.task=causal-lm hardware=a6000 hardware.count=4
    suite-bench --config-dir my_conf model=my-model hardware=a6000   # my_conf/model/my-model.yaml

A single run with bad values exits 2 listing every problem. In a multirun a bad
combination is recorded as `invalid` and the sweep goes on; a trial already in the store
is served from it unless `measure.rerun=true` (a `crashed` one is always run again).
`measure.repeats=N` runs the trial N times, each in fresh worker processes, into one record.
With `hydra/launcher=slurm` each trial is a Slurm job; `cluster.nodes=N` spreads one trial
over N nodes. docs/configuration.md lists every setting.
"""

from __future__ import annotations

import sys

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from cli import hydra_argv
from suite import paths, store
from suite.config.compose import register, trial_from_cfg
from suite.labels import describe
from suite.progress import Progress
from suite.runner import run_one, summary_line


def sweep_size(cfg_sweeper_params: dict, argv: list[str]) -> int | None:
    """How many jobs Hydra's basic sweeper makes of these overrides (None if unknown)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    args = [a for a in argv if not a.startswith("-")]
    merged = {a.split("=", 1)[0]: a for a in [f"{k}={v}" for k, v in cfg_sweeper_params.items()] + args if "=" in a}
    try:
        parsed = OverridesParser.create().parse_overrides(list(merged.values()))
    except Exception:  # noqa: BLE001 - only a progress figure depends on it
        return None
    n = 1
    for o in parsed:
        if o.is_sweep_override():
            n *= len(list(o.sweep_iterator()))
    return n


_progress: Progress | None = None  # one per process: Hydra runs a multirun's jobs in this process


@hydra.main(config_path=str(paths.conf_dir()), config_name="config", version_base="1.3")
def bench(cfg: DictConfig) -> None:
    global _progress
    t = trial_from_cfg(cfg)
    hc = HydraConfig.get()
    in_sweep = hc.mode == RunMode.MULTIRUN
    if _progress is None:
        total = sweep_size(dict(hc.sweeper.get("params") or {}), sys.argv[1:]) if in_sweep else 1
        _progress = Progress(total)
    _progress.begin(describe(t))
    ran = run_one(t, cfg.store.dir, cfg.store.sweep, in_sweep, cfg.wandb)
    line = f"{summary_line(ran, t)}\n              -> {store.path_for(cfg.store.dir, t.id)}"
    _progress.end(ran.record, line)


def main() -> None:
    register("suite-bench", __doc__)
    hydra_argv("suite-bench")
    bench()


if __name__ == "__main__":
    main()
