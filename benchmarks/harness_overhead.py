"""Harness overhead: the suite's measured step time against a bare PyTorch loop.

Same model, micro-batch, precision (fp32) and optimizer (AdamW, clip 1.0), one process.
The suite runs its real trial (a fresh worker under a DeepSpeed ZeRO-0 engine, timers with
device syncs); the bare loop is plain PyTorch in a fresh process. Ratio = suite / bare.

    python -m benchmarks.harness_overhead [--pairs 3] [--out results/benchmarks/harness_overhead.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

from benchmarks.output import RESULTS, ROOT, write_result
from suite import launch
from suite.config import Trial
from suite.config.compose import trial

OVERRIDES = [
    "model=pythia-14m",
    "model.recipe.seq_len=128",
    "model.recipe.global_batch=4",
    "model.recipe.precision=fp32",
    "hardware=cpu-x1",
    "methods.micro_batch=4",
    "measure.warmup_steps=3",
    "measure.timed_steps=20",
    "measure.rerun=true",
]


def bare(spec: str) -> None:
    """The comparison loop, run in its own process: nothing but PyTorch."""
    import torch

    from suite.models.build import batch, build  # deferred with torch: only the bare process loads it

    t = Trial.from_json(json.loads(spec))
    torch.manual_seed(t.measure.seed)
    model = build(t.model, t.methods.attention, t.methods.recompute)
    r = t.model.recipe
    opt = torch.optim.AdamW(
        model.parameters(), lr=r.lr, betas=tuple(r.betas), weight_decay=r.weight_decay, foreach=True
    )
    gen = torch.Generator().manual_seed(t.measure.seed)
    pool = [batch(t.model, t.methods.micro_batch, gen, "cpu") for _ in range(2)]
    times = []
    for step in range(t.measure.warmup_steps + t.measure.timed_steps):
        t0 = time.perf_counter()
        loss = model(**pool[step % 2]).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), r.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if step >= t.measure.warmup_steps:
            times.append(time.perf_counter() - t0)
    print(json.dumps({"step_time_s": statistics.fmean(times), "std_s": statistics.stdev(times)}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=3, help="bare/suite pairs, interleaved")
    ap.add_argument("--out", default=str(RESULTS / "harness_overhead.json"))
    args = ap.parse_args()

    t = trial(OVERRIDES)
    env = dict(os.environ, OMP_NUM_THREADS=str(os.cpu_count()))  # what the suite gives its one worker
    pairs = []
    for i in range(args.pairs):
        out = subprocess.run(
            [sys.executable, "-m", "benchmarks.harness_overhead", "--bare", json.dumps(t.to_json())],
            cwd=ROOT,
            capture_output=True,
            text=True,
            env=env,
            check=True,
        )
        b = json.loads(out.stdout.strip().splitlines()[-1])
        o = launch.run_trial(t)
        assert o.outcome == "ok", o.message
        s = o.metrics
        ratio = s["step_time_s"] / b["step_time_s"]
        pairs.append({"bare_step_time_s": b["step_time_s"], "suite_step_time_s": s["step_time_s"], "ratio": ratio})
        print(f"pair {i + 1}: bare {b['step_time_s']:.4f} s, suite {s['step_time_s']:.4f} s, ratio {ratio:.3f}")
    result = {
        "overrides": OVERRIDES,
        "trial": t.to_json(),
        "pairs": pairs,
        "ratio_first": pairs[0]["ratio"],
        "ratio_median": statistics.median(p["ratio"] for p in pairs),
        "target": 1.03,
    }
    write_result(args.out, "harness_overhead", result)
    print(
        f"ratio (first pair) {result['ratio_first']:.3f}, median of {len(pairs)} {result['ratio_median']:.3f} "
        f"(target <= 1.03) -> {args.out}"
    )


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--bare":
        bare(sys.argv[2])
    else:
        main()
