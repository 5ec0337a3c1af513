"""The predictor's offload terms against published offload runs: every run of benchmarks/published/
that offloads, predicted as its implementation ran on its GPU profile's datasheet and host block
(conf/hardware: CPU Adam, host link), with the published figures beside.

    python benchmarks/offload_accuracy.py

`published_accuracy.py` scores the same files for everything else (it leaves ZeRO-3 rows out);
here a ZeRO-3 row is DeepSpeed's ZeRO-3. Where a source publishes its optimizer's time apart (the
ZeRO-Offload tutorial's log), that is compared with the predicted optimizer step (CPU Adam and the
host link) too. Prints one line per run and the median |error| of tokens/s per GPU.
"""

from __future__ import annotations

import math
import statistics
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import published_accuracy as pa  # noqa: E402 - the published runs' loader, beside this file

OPTIMIZER_S = {"deepspeed-zero-offload-v100-gpt2-10b-s1024-g1": (7.6, 8.0)}
"""The optimizer's seconds per iteration the source's log shows apart (range of iterations 8-10)."""


def offload_rows() -> list[pa.Row]:
    """The published runs that offload, ZeRO-3 ones as DeepSpeed's ZeRO-3."""
    out = []
    for src, r in pa.load():
        if (r.get("offload") or "none") == "none":
            continue
        zero3 = r["sharding"] == "zero3"
        shown = {**r, "sharding": "zero2"} if zero3 else r  # why_not and trial_for know ZeRO 0-2 by name
        row = pa.Row(
            id=r["id"], source=src["id"], group=src["group"], gpu=r["gpu"], gpus=r["gpus"], model=r["model"]["name"],
            params=r["model"].get("params_counted") or 0, seq_len=r["seq_len"], quality=r.get("quality", ""),
            measured_tps=r["measured"].get("tokens_per_s_per_gpu"), measured_mfu=r["measured"].get("mfu"),
            measured_mem_gib=r["measured"].get("peak_mem_gib"),
        )  # fmt: skip
        row.skipped = pa.why_not(shown)
        if not row.skipped:
            t = pa.trial_for(src, shown)
            if zero3:
                t = replace(t, methods=replace(t.methods, zero_stage=3))
            row.trial, row.impl = t, pa.implementation(src, r)
        out.append(row)
    return out


def main() -> int:
    recs = pa.predict(offload_rows())
    errors = []
    for rec in recs:
        if rec.get("skipped"):
            print(f"{rec['id']}: skipped ({rec['skipped']})")
            continue
        errors.append(abs(rec["tps_err_pct"]))
        parts = rec["parts"]
        adam, link = parts.get("host_adam_s", 0.0), parts.get("host_transfer_s", 0.0)
        line = (
            f"{rec['id']}: tokens/s/GPU {rec['measured_tps']:,.0f} published, {rec['predicted_tps']:,.0f} predicted "
            f"({rec['tps_err_pct']:+.0f}%); step {rec['step_s']:.2f} s, of which CPU Adam {adam:.2f} s and the host "
            f"link {link:.2f} s; fits {'yes' if rec['fits'] else 'no'}"
        )
        if rec["id"] in OPTIMIZER_S:
            lo, hi = OPTIMIZER_S[rec["id"]]
            opt = parts.get("adam_s", math.nan)
            err = 100 * (opt / ((lo + hi) / 2) - 1)
            line += f"; optimizer {opt:.2f} s predicted, {lo}-{hi} s published ({err:+.0f}%)"
        print(line)
    if errors:
        print(f"median |error| of tokens/s/GPU over {len(errors)} offload runs: {statistics.median(errors):.0f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
