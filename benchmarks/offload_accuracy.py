"""The predictor's offload terms against published offload runs: every run of benchmarks/published/
that offloads, predicted as `suite-predict published-accuracy` predicts it (analysis/published_runs.py:
its GPU profile's datasheet and host block, conf/hardware: CPU Adam, the host link), with the
published figures beside.

    python -m benchmarks.offload_accuracy

Where a source publishes its optimizer's time apart (`OPTIMIZER_S`: the ZeRO-Offload tutorial's
log), the predicted optimizer step (CPU Adam and the host link) is compared with it too. Prints one
line per run and the median |error| of tokens/s per GPU; writes nothing.
"""

from __future__ import annotations

import statistics

from analysis import published_runs

OPTIMIZER_S = {"deepspeed-zero-offload-v100-gpt2-10b-s1024-g1": (7.6, 8.0)}
"""The optimizer's seconds per iteration the source's log shows apart, low and high (iterations 8-10:
benchmarks/published/deepspeed-zero-offload.yaml, the tutorial's log screenshot)."""


def offload_rows() -> list[published_runs.Row]:
    """The published runs that offload, each with its trial or why it is skipped."""
    offloading = {r["id"] for _, r in published_runs.load() if (r.get("offload") or "none") != "none"}
    return [r for r in published_runs.rows() if r.id in offloading]


def line(rec: dict) -> str:
    """One scored run: published and predicted tokens/s per GPU, the step and its offload parts."""
    if rec.get("skipped"):
        return f"{rec['id']}: skipped ({rec['skipped']})"
    parts = rec["parts"]
    adam, link = parts.get("host_adam_s", 0.0), parts.get("host_transfer_s", 0.0)
    out = (
        f"{rec['id']}: tokens/s/GPU {rec['measured_tps']:,.0f} published, {rec['predicted_tps']:,.0f} predicted "
        f"({rec['tps_err_pct']:+.0f}%); step {rec['step_s']:.2f} s, of which CPU Adam {adam:.2f} s and the host "
        f"link {link:.2f} s; fits {'yes' if rec['fits'] else 'no'}"
    )
    if rec["id"] in OPTIMIZER_S:
        lo, hi = OPTIMIZER_S[rec["id"]]
        err = 100 * ((adam + link) / ((lo + hi) / 2) - 1)
        out += f"; optimizer {adam + link:.2f} s predicted, {lo}-{hi} s published ({err:+.0f}%)"
    return out


def main() -> None:
    recs = published_runs.predict(offload_rows())
    for rec in recs:
        print(line(rec))
    errors = [abs(rec["tps_err_pct"]) for rec in recs if not rec.get("skipped")]
    if errors:
        print(f"median |error| of tokens/s/GPU over {len(errors)} offload runs: {statistics.median(errors):.0f}%")


if __name__ == "__main__":
    main()
