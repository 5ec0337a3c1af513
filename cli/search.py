"""`suite-search`: the fastest configuration of one model on one budget, found with few trials.

    suite-search model=pythia-1b hardware=a6000 hardware.count=4
    suite-search experiment=cpu-search            # a CPU-sized example

How it searches and when it stops: suite/search.py and docs/search.md. It prints the winner with
its median step time, interval, memory and days to train, the configurations statistically tied
with it and what it spent; its log is `store.dir/search-<model>-<hardware>.json`. Bad settings
exit 2, every problem listed; so does a budget of GPUs this machine does not have (suite-predict
answers for those).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf

from analysis.estimates import training_days
from cli import hydra_argv
from suite import paths, store
from suite.config.compose import register, trial_from_cfg
from suite.config.schema import SearchConfig, Trial
from suite.config.validate import absent_devices, problems
from suite.labels import describe, methods_label
from suite.progress import Progress
from suite.record import Record
from suite.runner import Ran, run_one, summary_line
from suite.search import SearchReport, log_of, search, search_problems


def describe_interval(rec: Record) -> str:
    return f"{rec.step_time_s:.3f} s/step ({rec.measured_phrase()})"


def micro_batch_lines(report: SearchReport) -> list[str]:
    """Per combination measured: the largest micro-batch that fits, and whether it is the fastest."""
    lines = []
    for name, mb in report.largest_fit.items():
        fastest = report.fastest_mb[name]
        verdict = "largest is fastest" if fastest == mb else f"micro-batch {fastest} is faster"
        later = next(
            (r for i, r in report.latest.items() if methods_label(report.trials[i]) == name
             and report.trials[i].methods.micro_batch == mb and not r.ok),
            None,
        )  # fmt: skip
        lines.append(
            f"  {name}: largest micro-batch that fits {mb}; {verdict}"
            + (f" (but a later run of it ended {later.outcome}: {later.message})" if later else "")
        )
    return lines


def summary(base: Trial, report: SearchReport) -> str:
    lines = [f"search for {base.model.name} on {base.hardware.name}: {report.stopped}"]
    lines.append(
        f"  spent: {report.launched} runs launched, {len(report.records)} configurations used, "
        f"{report.trial_s:.0f} s of trials (the full grid is {report.grid_size} configurations)"
    )
    lines += micro_batch_lines(report)
    lines += [f"  set aside: {line}" for line in report.set_aside]
    best = report.best
    if best is None:
        lines.append("  no configuration fits this budget")
        return "\n".join(lines)
    t, iv = report.trials[best.trial_id], best.interval
    steps = t.model.recipe.train_steps
    days, lo, hi = (training_days(x, steps) for x in (best.step_time_s, iv.lo, iv.hi))
    mfu = f"{best.mfu:.1%}" if best.mfu is not None else "n/a"
    lines.append(
        f"  best: {methods_label(t)} micro-batch {t.methods.micro_batch} x GAS {t.gas}: {describe_interval(best)}, "
        f"peak {best.peak_mem_gib:.2f} GiB, MFU {mfu}, {days:.1f} days ({lo:.1f}-{hi:.1f}) for {steps:,} steps"
    )
    lines.append(f"  result: {best.trial_id}.json")
    lines.append(f"  confirmation: {report.confirmed}")
    tied = report.tied()
    if tied:
        lines.append("  tied with the best (their intervals overlap: the runs cannot tell them apart):")
    for r in tied:
        rt = report.trials[r.trial_id]
        lines.append(f"    {methods_label(rt)} micro-batch {rt.methods.micro_batch}: {describe_interval(r)}")
    return "\n".join(lines)


def _main(cfg: DictConfig) -> None:
    base = trial_from_cfg(cfg)
    search_cfg = SearchConfig(**OmegaConf.to_container(cfg.search, resolve=True))
    found = [p for p in problems(base) if "micro_batch" not in p] + search_problems(search_cfg)
    if found:
        print("Invalid search base:", *[f"  - {p}" for p in found], sep="\n", file=sys.stderr)
        sys.exit(2)
    absent = absent_devices(base)
    if absent:  # every trial would be set aside for it: said once, before any
        predict = " ".join(["suite-predict", *sys.argv[1:]])
        print(f"suite-search: error: {absent}; a search measures trials here. Predict it: {predict}", file=sys.stderr)
        sys.exit(2)
    progress = Progress()

    def run(t: Trial) -> Ran:
        progress.begin(describe(t))
        ran = run_one(t, cfg.store.dir, cfg.store.sweep, True, cfg.wandb)
        progress.end(ran.record, summary_line(ran, t))
        return ran

    report = search(base, search_cfg, run, stored=lambda t: store.path_for(cfg.store.dir, t.id).exists())
    print(summary(base, report))
    out = Path(cfg.store.dir) / f"search-{base.model.name}-{base.hardware.name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(log_of(base, report, search_cfg), indent=1))
    print(f"  search log: {out}")


def main() -> None:
    register("suite-search", __doc__)
    hydra_argv("suite-search")
    hydra.main(config_path=str(paths.conf_dir()), config_name="config", version_base="1.3")(_main)()


if __name__ == "__main__":
    main()
