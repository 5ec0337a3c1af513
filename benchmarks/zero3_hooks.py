"""ZeRO-3's host cost per collective on a GPU (`suite.predict.gpu.ZERO3_HOOK_S`), measured: the GPU
check's Pythia-160M on one GPU under DeepSpeed ZeRO-0 and ZeRO-3, at micro-batches 1, 4 and 16, in
`--rounds` turns (the order of the trials rotates, so a drift of the machine spreads over all).

Each ZeRO-3 micro-step against ZeRO-0's at the same micro-batch, over the collectives the predictor
counts, gives the cost per collective; how it moves with the micro-batch (the compute) says whether
the host's time adds to the kernels' (the same at every micro-batch) or overlaps them (smaller where
there is more compute). Run where the GPU check runs (its environment: scripts/gpu-check.sh sets it):

    PYTHONPATH=$PWD:/tmp/gpu-check-site DS_ACCELERATOR=cuda python -m benchmarks.zero3_hooks OUT_DIR
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
from pathlib import Path

from benchmarks.output import write_result
from suite import detect
from suite.gpu_check import plan
from suite.gpu_check.plan import Check
from suite.predict import machine, timing
from suite.predict.trace import traced
from suite.runner import run_one

MICRO_BATCHES = (1, 4, 16)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out")
    p.add_argument("--rounds", type=int, default=2)
    args = p.parse_args()
    out = Path(args.out)
    base = plan.base_trial(detect.profile_of(*detect.local_gpus()[0]))
    base = dataclasses.replace(base, measure=dataclasses.replace(base.measure, param_stats=False))
    rows = []
    for r in range(args.rounds):
        for k, mb in enumerate(MICRO_BATCHES[r % 3 :] + MICRO_BATCHES[: r % 3]):
            for stage in (3, 0) if (r + k) % 2 else (0, 3):
                c = Check(f"zero{stage} mb{mb}", {"zero_stage": stage, "micro_batch": mb, "precision": "bf16"}, (), 60)
                t = plan.trial_of(base, c)
                # Another round of the same trial is a new run, not the stored one.
                t = dataclasses.replace(t, measure=dataclasses.replace(t.measure, seed=base.measure.seed + r))
                rec = run_one(t, str(out / "records"), "zero3-hooks", in_sweep=True).record
                m = rec.metrics or {}
                rows.append(
                    {
                        "round": r,
                        "zero_stage": stage,
                        "micro_batch": mb,
                        "outcome": rec.outcome,
                        "micro_time_s": m.get("micro_time_s"),
                        "trial_id": rec.trial_id,
                    }
                )
                print(json.dumps(rows[-1]), flush=True)
    summary = summarize(rows, base)
    write_result(out / "zero3_hooks.json", "zero3_hooks", {"rows": rows, "summary": summary}, device="cuda")
    print(json.dumps(summary, indent=1))


def summarize(rows: list[dict], base) -> dict:
    """Per micro-batch: the median micro-steps of each stage, and ZeRO-3's excess per collective."""

    out = {}
    for mb in MICRO_BATCHES:
        med = {}
        for stage in (0, 3):
            xs = [
                x["micro_time_s"]
                for x in rows
                if x["micro_batch"] == mb and x["zero_stage"] == stage and x["micro_time_s"]
            ]
            med[stage] = statistics.median(xs) if xs else None
        t = plan.trial_of(base, Check("z3", {"zero_stage": 3, "micro_batch": mb, "precision": "bf16"}, (), 60))
        n = timing.step_parts(t, traced(t.model, "sdpa", "none", "bf16"), machine.datasheet(t)).detail[
            "collectives_micro"
        ]
        per = (med[3] - med[0]) / n if med[0] and med[3] else None
        out[f"mb{mb}"] = {
            "zero0_micro_s": med[0],
            "zero3_micro_s": med[3],
            "collectives": n,
            "excess_per_collective_s": per,
        }
    return out


if __name__ == "__main__":
    sys.exit(main())
