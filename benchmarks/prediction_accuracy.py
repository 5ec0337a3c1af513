"""Prediction accuracy on CPU: calibrate this machine, measure the cpu-grid space (or reuse what
the store has), and score the predictor against every trial; plus a plausibility check of the
GPU profiles against published well-tuned runs.

    python -m benchmarks.prediction_accuracy                      # calibrate, 8 models x 48 trials, score
    python -m benchmarks.prediction_accuracy --publish            # also results/accuracy/cpu.json, for suite-predict
    python -m benchmarks.prediction_accuracy --repeats 2          # each trial run twice, scored on the median
    python -m benchmarks.prediction_accuracy --tiny               # the same end to end on a tiny setting (minutes)
    python -m benchmarks.prediction_accuracy --models qwen2-tied-384,gpt2-256   # some models only
    python -m benchmarks.prediction_accuracy --plausibility       # GPU predictions against MPT-1B and TinyLlama only
    python -m benchmarks.prediction_accuracy --memory-only        # one timed step per trial: memory and fit/oom only
    python -m benchmarks.prediction_accuracy --rescore RESULT.json ... CAL.json ... --out X.json
                                     # results' step times predicted again from each calibration
    python -m benchmarks.prediction_accuracy --rescore RESULT.json ... CAL.json ... --memory-only --out X.json
                                     # results' peak memory and fit/oom predicted again (no timing)

Models: pythia-14m, pythia-31m, a Llama-shaped model that is not in conf/ (hidden 384, 6
layers, 6 heads, 2 key/value heads, vocabulary 32000, intermediate 1024), a Qwen2 of the same
shape with tied input and output embeddings, a GPT-2 (hidden 256, 6 layers, 4 heads,
tied embeddings, learned positions), and Gemma-shaped ones (hidden 256, 2 layers, 4 heads of
128, one key/value head, vocabulary 65536: Gemma tied and untied, Gemma-2 tied), each over the
cpu-grid space and FSDP2 beside it (ZeRO 0-3 and FSDP2's two modes x 2 recomputation x
micro-batches 1, 2, 4, 8: 48 trials per model) on two CPU workers
with the recipe shrunk as experiment=cpu-search shrinks it (sequence 128, global batch 16) and
a 0.8 GiB budget per worker, so that the larger configurations run out of memory. The
calibration is microbenchmarks only (suite.calibrate); nothing is fitted to the trials.
Targets: peak memory median |error| <= 5%, max <= 15%; fit/oom right >= 95%; step time median
|error| <= 10%; rank correlation >= 0.9 within each model. Timings are only meaningful on a
quiet machine; memory and fit/oom are meaningful under any load.

The plausibility check predicts tokens/s per GPU and MFU of the best configuration of a
Pythia-1B-class model on 8x A100-80GB and of TinyLlama-1.1B on 1x A100-40GB, next to what
well-tuned runs publish (llm-foundry's MPT-1B: 20,513 tokens/s per A100-80GB at 59.9% MFU;
TinyLlama: 24k tokens/s per A100-40GB, 56% MFU). It checks the GPU profiles for plausibility,
not the predictor's accuracy: those runs use other code (fused kernels, FlashAttention-2).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

from analysis.accuracy import _err, _rank_corr, _stats, as_text, method_label, score, summary
from analysis.predicted import composed, predict_budget
from analysis.prices import gpu_keys, load_prices
from benchmarks.output import RESULTS, ROOT, write_result
from suite.calibrate import calibrate
from suite.config.compose import trial
from suite.config.schema import SearchConfig
from suite.files import write_json
from suite.predict import Predictor
from suite.predict.machine import Machine, calibration_key, load_calibration, save_calibration
from suite.predict.regimes import fit_counts
from suite.record import Record
from suite.runner import run_one, summary_line
from suite.space import shardings, with_methods

# The Llama-shaped decoder not in conf/ (and a Qwen2 of the same shape), in transformers' field names.
SHAPE_384 = [
    "model.config.hidden_size=384",
    "model.config.num_hidden_layers=6",
    "model.config.num_attention_heads=6",
    "model.config.num_key_value_heads=2",
    "model.config.intermediate_size=1024",
    "model.config.vocab_size=32000",
    "model.recipe.precision=fp32",
]
# The models, as overrides of experiment=cpu-search (the only place to edit if the schema changes).
MODELS = {
    "pythia-14m": ["model=pythia-14m"],
    "pythia-31m": ["model=pythia-31m"],
    "llama-384": ["model=tinyllama-1.1b", "model.name=llama-384", *SHAPE_384],
    # Input and output embeddings tied (one weight, one gradient, one optimizer state), GQA.
    "qwen2-tied-384": [
        "model=tinyllama-1.1b",
        "model.name=qwen2-tied-384",
        "model.model_type=qwen2",
        *SHAPE_384,
        "+model.config.tie_word_embeddings=true",
    ],
    # Another family: GPT-2 (learned positions, LayerNorm with biases, GELU, tied embeddings).
    "gpt2-256": [
        "model=gpt2-124m",
        "model.name=gpt2-256",
        "model.config.n_embd=256",
        "model.config.n_layer=6",
        "model.config.n_head=4",
        "model.config.n_inner=1024",
        "model.recipe.precision=fp32",
    ],
}
# Gemma-shaped (one key/value head, head_dim 128 wider than hidden/heads, GeGLU, a 64k vocabulary
# whose tied embedding is most of the model), its untied twin, and a Gemma-2 (eager attention).
GEMMA_256 = [
    "model=tinyllama-1.1b",
    "model.config.hidden_size=256",
    "model.config.num_hidden_layers=2",
    "model.config.num_attention_heads=4",
    "model.config.num_key_value_heads=1",
    "+model.config.head_dim=128",
    "model.config.intermediate_size=768",
    "model.config.vocab_size=65536",
    "model.recipe.precision=fp32",
]
GEMMA = ["model.model_type=gemma", "+model.config.hidden_act=gelu_pytorch_tanh", *GEMMA_256]
MODELS |= {
    "gemma-256": [*GEMMA, "model.name=gemma-256", "+model.config.tie_word_embeddings=true"],
    "gemma-256-untied": [*GEMMA, "model.name=gemma-256-untied", "+model.config.tie_word_embeddings=false"],
    "gemma2-256": [
        "model.model_type=gemma2",
        "+model.config.hidden_activation=gelu_pytorch_tanh",
        *GEMMA_256,
        "model.name=gemma2-256",
        "+model.config.tie_word_embeddings=true",
        "methods.attention=eager",  # transformers' Gemma-2 runs no sdpa
    ],
}
TINY_GPT2 = ["model.config.n_embd=64", "model.config.n_layer=2", "model.config.n_head=4", "model.config.n_inner=128"]
"""The tiny setting of the GPT-2 shape, in GPT-2's field names."""
TINY = [
    "model.config.hidden_size=64",
    "model.config.num_hidden_layers=2",
    "model.config.num_attention_heads=4",
    "model.config.intermediate_size=128",
    "model.config.vocab_size=1024",
]
# Sharding: DeepSpeed's ZeRO 0-3 and FSDP2's two modes, the search's default space.
SHARDINGS = shardings(SearchConfig())
GRID = {"sharding": SHARDINGS, "recompute": ("none", "full"), "micro_batch": (1, 2, 4, 8)}
PUBLISHED = {
    "MPT-1B, llm-foundry, 8x A100-80GB": ("pythia-1b", "a100-80gb-x8", 20513, 0.599),
    "TinyLlama-1.1B, 1x A100-40GB": ("tinyllama-1.1b", "a100-40gb-x1", 24000, 0.56),
}


def trials(tiny: bool, budget_gib: float, memory_only: bool = False, repeats: int = 1, only: tuple[str, ...] = ()):
    """Every configuration of the grid for every model, each measured `repeats` times in fresh
    workers (one timed step when only memory counts: the peak is reached in the second step,
    once the optimizer's states exist)."""
    import itertools

    out = []
    for name, overrides in MODELS.items():
        if only and name not in only:
            continue
        small = (TINY_GPT2 if name.startswith("gpt2") else TINY) if tiny else []
        base = trial(["experiment=cpu-search", f"hardware.mem_gib={budget_gib}", *overrides, *small])
        base = replace(base, measure=replace(base.measure, repeats=repeats))
        if memory_only:
            base = replace(base, measure=replace(base.measure, timed_steps=1, timeout_s=900))
        tiny_grid = {
            "sharding": [SHARDINGS[0], SHARDINGS[3], SHARDINGS[5]],
            "recompute": ("none",),
            "micro_batch": (1, 8),
        }
        for sh, r, mb in itertools.product(*(tiny_grid if tiny else GRID).values()):
            out.append((name, with_methods(base, **sh, recompute=r, micro_batch=mb)))
    return out


def calibrated(t, recalibrate: bool, quick: bool) -> str:

    key = calibration_key(t.hardware)
    existing = load_calibration(key)
    if existing is not None and not recalibrate:
        return f"reused {existing.source}"
    m = calibrate(replace(t, nodes=1), quick=quick)
    return f"{m.source} -> {save_calibration(m, key)}"


def measure(ts, store_dir: Path) -> list[Record]:

    recs = []
    for i, (_, t) in enumerate(ts, 1):
        ran = run_one(t, str(store_dir), "prediction-accuracy", True)
        print(f"[{i}/{len(ts)}] {summary_line(ran, t)}", flush=True)
        recs.append(ran.record)
    return recs


def plausibility() -> list[dict]:
    """The best configuration `suite-predict` names for each model and budget of PUBLISHED, with its
    tokens/s per GPU and MFU beside the published ones."""

    rows = []
    prices, keys = load_prices(), gpu_keys()
    for label, (model, hardware, tokens, mfu) in PUBLISHED.items():
        best = predict_budget(composed([f"model={model}", f"hardware={hardware}"]), prices, keys).best
        t, per_gpu = best["trial"], best["tokens_per_s"] / best["trial"].devices
        rows.append(
            {
                "published": label,
                "published_tokens_per_s_per_gpu": tokens,
                "published_mfu": mfu,
                "model": model,
                "hardware": hardware,
                "best_configuration": {
                    k: getattr(t.methods, k)
                    for k in ("engine", "zero_stage", "reshard_after_forward", "offload", "recompute", "micro_batch")
                },
                "predicted_tokens_per_s_per_gpu": per_gpu,
                "predicted_mfu": best["mfu"],
            }
        )
        print(
            f"{label}: published {tokens:,} tok/s/GPU at {mfu:.1%} MFU; predicted for {model} on {hardware}: "
            f"{per_gpu:,.0f} tok/s/GPU at {best['mfu']:.1%} MFU (plausibility, not accuracy)"
        )
    return rows


def rescore(result: Path, calibrations: list[Path]) -> list[dict]:
    """The step times a run of this benchmark measured (its JSON), predicted again from other
    calibrations of the same machine, each with its loop scales per engine (the engine's
    optimizer scale and cost per collective) and with ZeRO-0's alone (its compute and optimizer
    scales for every engine, no collective's cost): how much of the step-time error is the
    calibration's, not the trials'. Each row also gives the lowest rank correlation of a model."""
    import statistics

    import pandas as pd

    measured = json.loads(result.read_text())
    budget = measured["records"][0]["mem_budget_gib"]
    by_key = {(n, method_label(t), t.methods.recompute, t.methods.micro_batch): t for n, t in trials(False, budget)}
    ok = [r for r in measured["records"] if r["outcome"] == "ok" and r.get("step_time_s")]
    rows = []
    for path in calibrations:
        cal = Machine.from_json(json.loads(path.read_text()))
        z0 = cal.step_scale.get("zero0", {})
        for scales, ms in (
            ("per engine", cal),
            ("ZeRO-0 only", replace(cal, step_scale={"zero0": z0})),
        ):
            pred = Predictor(machine=ms)
            errs, predicted = [], []
            for r in ok:
                t = by_key[(r["model"], r["method"], r["recompute"], r["micro_batch"])]
                predicted.append(pred.predict(t).step_time_s)
                errs.append(100 * (predicted[-1] / r["step_time_s"] - 1))
            st = _stats(pd.Series(errs))
            df = pd.DataFrame({"model": [r["model"] for r in ok], "p": predicted, "m": [r["step_time_s"] for r in ok]})
            df["err"] = errs
            rank = {model: _rank_corr(g.p, g.m) for model, g in df.groupby("model") if len(g) >= 3}
            per_model = {model: _stats(g["err"]) for model, g in df.groupby("model")}
            row = {
                "trials": result.name,
                "measured": measured["provenance"]["date"],
                "calibration": cal.source,
                "scales": scales,
                "n": st["n"],
                "median_abs_err_pct": st["median"],
                "p90_abs_err_pct": st["p90"],
                "max_abs_err_pct": st["max"],
                "median_signed_err_pct": statistics.median(errs),
                "spearman": rank,
                "spearman_min": min(rank.values(), default=None),
                "per_model_step_err_pct": per_model,
            }
            rows.append(row)
            print(
                f"{result.name} ({row['measured'][:16]}) with {cal.source[:44]}, scales {scales}: step time "
                f"{row['median_abs_err_pct']:.1f} / {row['p90_abs_err_pct']:.1f} / {row['max_abs_err_pct']:.1f} % "
                f"(median signed {row['median_signed_err_pct']:+.1f}%); rank correlation, lowest model: "
                + ("n/a" if row["spearman_min"] is None else f"{row['spearman_min']:.2f}"),
                flush=True,
            )
            for model, f in per_model.items():
                print(f"  {model}: step time {f['median']:.1f} / {f['p90']:.1f} / {f['max']:.1f} %", flush=True)
    return rows


def rescore_memory(result: Path, calibrations: list[Path]) -> list[dict]:
    """The peak memory and fit/oom of a run of this benchmark (its JSON), predicted again by this
    predictor from each calibration (its runtime bytes and budget margin are the only constants
    memory reads): a change of the memory model scored on the trials as measured, none run again.
    Each row: the figures overall, per model and per method, and every record as predicted."""
    import pandas as pd

    measured = json.loads(result.read_text())
    budget = measured["records"][0]["mem_budget_gib"]
    models = tuple({r["model"] for r in measured["records"]})
    by_id = {t.id: t for memory_only in (False, True) for _, t in trials(False, budget, memory_only, only=models)}
    rows = []
    for path in calibrations:
        cal = Machine.from_json(json.loads(path.read_text()))
        pred = Predictor(machine=cal)
        recs = []
        for r in measured["records"]:
            p = pred.predict(by_id[r["trial_id"]])
            # as analysis.accuracy scores it: the timed peak where the build was measured apart
            timed_only = r.get("build_peak_mem_gib") is not None
            peak = p.peak_mem_gib if timed_only else max(p.peak_mem_gib, p.build_peak_mem_gib)
            recs.append(
                {
                    **{k: r[k] for k in ("trial_id", "model", "method", "recompute", "micro_batch", "outcome")},
                    "pred_peak_mem_gib": peak,
                    "pred_device_gib": p.device_gib,
                    "pred_fits": p.fits,
                    "peak_mem_gib": r.get("peak_mem_gib"),
                    "peak_mem_err_pct": _err(peak, r.get("peak_mem_gib")) if r["outcome"] == "ok" else None,
                    "recorded_pred_peak_mem_gib": r.get("pred_peak_mem_gib"),
                    "fit_right": p.fits == (r["outcome"] == "ok"),
                }
            )
        df = pd.DataFrame(recs)
        df["err"] = pd.to_numeric(df["peak_mem_err_pct"])

        def figures(g: pd.DataFrame) -> dict:
            ran = [o == "ok" for o in g["outcome"]]
            return {
                "peak_mem_err_pct": _stats(g["err"]),
                "fit_right": int(g["fit_right"].sum()),
                "fit_n": len(g),
                "fit": fit_counts([bool(f) for f in g["pred_fits"]], ran),
            }

        row = {
            "trials": result.name,
            "measured": measured["provenance"]["date"],
            "calibration": cal.source,
            **figures(df),
            "median_signed_err_pct": float(df["err"].median()),
            "per_model": {m: figures(g) for m, g in df.groupby("model")},
            "per_method": {m: figures(g) for m, g in df.groupby("method")},
            "records": recs,
        }
        rows.append(row)
        st = row["peak_mem_err_pct"]
        print(
            f"{result.name} with {cal.source[:60]}: peak memory {st['median']:.1f} / {st['p90']:.1f} / "
            f"{st['max']:.1f} % (median, p90, max |error|), {fit_text(row['fit'])}",
            flush=True,
        )
        for label, per in (("model", row["per_model"]), ("method", row["per_method"])):
            for name, f in per.items():
                print(
                    f"  {label} {name}: memory median {f['peak_mem_err_pct'].get('median', float('nan')):.1f}%, "
                    f"max {f['peak_mem_err_pct'].get('max', float('nan')):.1f}%, {fit_text(f['fit'])}"
                )
    return rows


def fit_text(f: dict[str, int]) -> str:
    """Fit called wrong each way apart (`suite.predict.regimes.fit_counts`)."""
    fits, no_fit = f"{f['false_fit']}/{f['oom']} OOMs", f"{f['false_no_fit']}/{f['ran']} that ran"
    return f'false "fits" {fits}, false "does not fit" {no_fit}'


def chosen(ap: argparse.ArgumentParser, models: str) -> tuple[str, ...]:
    """The --models asked for (empty: all); an unknown one is an error naming the choices."""
    only = tuple(m for m in models.split(",") if m)
    unknown = [m for m in only if m not in MODELS]
    if unknown:
        ap.error(f"--models: unknown {', '.join(unknown)}; choose from {', '.join(MODELS)}")
    return only


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--tiny", action="store_true", help="a tiny setting end to end: 6 trials per model, quick calibration"
    )
    ap.add_argument("--budget-gib", type=float, default=0.8)
    ap.add_argument("--models", default="", help=f"comma-separated subset of {', '.join(MODELS)} (default: all)")
    ap.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="runs of each trial, each in fresh workers; scored on their median (runs already in --store count)",
    )
    ap.add_argument("--store", default=str(ROOT / "results/tmp/prediction_accuracy"))
    ap.add_argument("--out", help="default: results/benchmarks/prediction_accuracy.json (--rescore: -rescored.json)")
    ap.add_argument("--recalibrate", action="store_true", help="calibrate even if this machine has a calibration")
    ap.add_argument("--publish", action="store_true", help="write the summary to results/accuracy/cpu.json")
    ap.add_argument("--plausibility", action="store_true", help="only the GPU plausibility check")
    ap.add_argument("--memory-only", action="store_true", help="one timed step per trial; score memory and fit/oom")
    ap.add_argument("--note", default="", help="the machine and its load, recorded with the figures")
    ap.add_argument(
        "--rescore",
        nargs="+",
        metavar="JSON",
        help="results of this benchmark and calibration files (told apart by content): predict each "
        "result's step times (with --memory-only: peak memory and fit/oom) again from each calibration",
    )
    args = ap.parse_args()
    if args.repeats < 1:
        ap.error(f"--repeats {args.repeats}: give a number of runs >= 1")
    args.out = args.out or str(RESULTS / f"prediction_accuracy{'-rescored' if args.rescore else ''}.json")
    if args.rescore:
        paths = [Path(p) for p in args.rescore]
        results = [p for p in paths if "records" in json.loads(p.read_text())]
        calibrations = [p for p in paths if p not in results]
        if not results or not calibrations:
            ap.error("--rescore takes one or more results of this benchmark and one or more calibration files")
        again = rescore_memory if args.memory_only else rescore
        rows = [row for r in results for row in again(r, calibrations)]
        what = "memory rescored" if args.memory_only else "rescored"
        print(f"wrote {write_result(args.out, f'prediction_accuracy {what}', {'note': args.note, 'rows': rows})}")
        return

    out: dict = {"note": args.note}
    if not args.plausibility:
        ts = trials(args.tiny, args.budget_gib, args.memory_only, args.repeats, chosen(ap, args.models))
        out["calibration"] = calibrated(ts[0][1], args.recalibrate, quick=args.tiny)
        print(f"calibration: {out['calibration']}", flush=True)
        recs = measure(ts, Path(args.store))
        scored = [(r, r.trial_id) for r in recs if r.outcome in ("ok", "oom")]
        df = score(scored)
        s = summary(df)
        s["source"] = f"benchmarks/prediction_accuracy.py ({args.note or 'no note'})"
        if args.memory_only:  # one timed step: its times are not figures
            for q in ("step_time_err_pct", "micro_err_pct", "boundary_err_pct", "optimizer_err_pct"):
                s.pop(q, None)
                for per in s["per_method"].values():
                    per.pop(q, None)
            s["spearman"], s["spearman_min"] = [], None
        print(as_text(s, "cpu"))
        out["summary"] = s
        out["records"] = df.drop(columns=["file"]).to_dict("records")
        out["outcomes"] = {o: sum(r.outcome == o for r in recs) for o in sorted({r.outcome for r in recs})}
        if args.publish:
            write_json(paths.publish_dir() / "cpu.json", s, indent=1)
    if not args.tiny:
        out["plausibility"] = plausibility()
    print(f"wrote {write_result(args.out, 'prediction_accuracy', out)}")


if __name__ == "__main__":
    main()
