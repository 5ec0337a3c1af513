"""DeepSpeed against FSDP2 at equal sharding on CPU: each engine at its largest micro-batch that
fits a memory budget, with its step time and peak memory, side by side.

Two CPU workers, each with a `--mem-gib` budget (RLIMIT_DATA, so out-of-memory is real). For each
model and each pair of equal sharding (ZeRO-2 and FSDP2 shard_grad_op; ZeRO-3 and FSDP2
full_shard), the micro-batch is doubled from 1 until a trial does not run `ok` or the per-device
batch is reached; the largest that ran is reported. Models: Pythia-31M and TinyLlama-1.1B's
shape shrunk to CPU size (SHRUNK), both on the recipe shrunk to `--seq-len` x `--global-batch`.
Every trial's record stays in `--work` (`suite-report tables` on it shows the engines table).

    python -m benchmarks.engines [--models pythia-31m,tinyllama-1.1b] [--mem-gib 1.5] [--out FILE]
    python -m benchmarks.engines --tiny       # a check that it runs (seconds per trial), not a measurement
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

from benchmarks.output import RESULTS, ROOT, write_result
from suite.config.compose import trial
from suite.runner import run_one

# conf/sharding/ names: DeepSpeed's, then FSDP2's mode of equal sharding.
PAIRS = (("zero2", "fsdp-shard-grad-op"), ("zero3", "fsdp-full-shard"))
# TinyLlama-1.1B's architecture (grouped-query attention, SwiGLU, 32k vocabulary) at CPU size.
SHRUNK = {
    "tinyllama-1.1b": [
        "model.config.hidden_size=256",
        "model.config.num_hidden_layers=4",
        "model.config.num_attention_heads=8",
        "model.config.num_key_value_heads=2",
        "model.config.intermediate_size=704",
    ]
}
TINY = [
    "model.config.hidden_size=64",
    "model.config.num_hidden_layers=2",
    "model.config.num_attention_heads=4",
    "model.config.intermediate_size=256",
]


def largest_fit(base: list[str], sharding: str, per_device: int, store_dir: Path) -> dict:
    """Double the micro-batch from 1 while trials run ok; the record of the largest that did."""

    best, tried, mb = None, [], 1
    while mb <= per_device:
        t = trial([*base, f"+sharding={sharding}", f"methods.micro_batch={mb}"])
        rec = run_one(t, str(store_dir), "engines", in_sweep=True).record
        tried.append({"micro_batch": mb, "outcome": rec.outcome, "trial_id": rec.trial_id})
        print(f"  {sharding} mb {mb}: {rec.outcome} {rec.message[:120]}", flush=True)
        if not rec.ok:
            break
        best, mb = rec, mb * 2
    side = {"sharding": sharding, "tried": tried, "largest_micro_batch": None}
    if best is not None:
        m = best.metrics
        side.update(
            largest_micro_batch=best.trial.methods.micro_batch,
            trial_id=best.trial_id,
            step_time_s=m["step_time_s"],
            step_time_within_std_s=m["step_time_within_std_s"],
            peak_mem_gib=m["peak_mem_gib"],
            build_peak_mem_gib=m["build_peak_mem_gib"],
            optimizer=m["optimizer"],
        )
    return side


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="pythia-31m,tinyllama-1.1b")
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--global-batch", type=int, default=32)
    ap.add_argument("--mem-gib", type=float, default=1.5, help="memory budget per CPU worker")
    ap.add_argument("--tiny", action="store_true", help="tiny shapes and batch: checks that it runs")
    ap.add_argument("--work", default=str(ROOT / "results/tmp/engines"))
    ap.add_argument("--out", help="default: results/benchmarks/engines.json (with --tiny: WORK/engines.json)")
    args = ap.parse_args()
    work = Path(args.work)
    shutil.rmtree(work, ignore_errors=True)
    out_path = Path(args.out or (work / "engines.json" if args.tiny else RESULTS / "engines.json"))
    seq, gb = (32, 4) if args.tiny else (args.seq_len, args.global_batch)
    rows = []
    for model in args.models.split(","):
        base = [
            f"model={model}",
            *(TINY if args.tiny else SHRUNK.get(model, [])),
            f"model.recipe.seq_len={seq}",
            f"model.recipe.global_batch={gb}",
            "model.recipe.precision=fp32",
            "hardware=cpu-x2",
            f"hardware.mem_gib={args.mem_gib}",
            "measure.warmup_steps=1",
            "measure.timed_steps=3",
            "measure.max_micro_steps=2",
            "measure.timeout_s=600",
            "wandb.mode=disabled",
        ]
        for ds, fsdp in PAIRS:
            print(f"{model}: {ds} against {fsdp}", flush=True)
            sides = [largest_fit(base, s, gb // 2, work) for s in (ds, fsdp)]
            rows.append({"model": model, "overrides": base, "deepspeed": sides[0], "fsdp2": sides[1]})
    write_result(out_path, "engines", {"tiny": args.tiny, "mem_gib_per_worker": args.mem_gib, "rows": rows})

    def cell(s: dict) -> str:
        if s["largest_micro_batch"] is None:
            return f"{s['sharding']}: nothing fits"
        return (
            f"{s['sharding']}: mb {s['largest_micro_batch']}, step {s['step_time_s']:.3f} s, "
            f"peak {s['peak_mem_gib']:.2f} GiB"
        )

    for r in rows:
        print(f"{r['model']:>16} | {cell(r['deepspeed'])} | {cell(r['fsdp2'])}")
    print(f"-> {out_path}")


if __name__ == "__main__":
    main()
