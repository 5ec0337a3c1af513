"""The report's tables, as frames anyone can reuse (the leaderboard does) and as `render.Table`s.

A budget is one hardware profile on one or more nodes; step times are compared only within
one (model, recipe, budget) group, since a different recipe (global batch, sequence) is a
different step.

- `best_per_budget`: the fastest `ok` configuration of each group.
- `across_budgets`: each model on every budget tried, including budgets where nothing fits.
- `speedups`: best configuration against the naive one (plain data parallel, no offload, no
  recomputation; its fastest micro-batch), the paper's "memory-saving methods give up to 71%".
- `did_not_fit`: every configuration that did not run `ok` (out of memory first), with why.
- `engines`: DeepSpeed against FSDP2 at equal sharding (ZeRO-2 and shard_grad_op, ZeRO-3 and
  full_shard), per group and offload: each engine's fastest configuration, its peak memory,
  and the largest micro-batch that ran.
- `micro_batches`: the seed paper assumed the largest micro-batch that fits is fastest; per
  (model, budget, methods) case, the largest that ran against the fastest smaller one.

Step times are medians of a trial's runs with an interval of the median (suite/stats.py).
The fastest of a group is the smallest median; a configuration is tied with it when their
intervals overlap (`tied_with_fastest`). `compare` says whether one configuration is
significantly faster than another: their intervals do not overlap, and each comes from more
than one run (a single run has no interval, so it cannot show a difference).
"""

from __future__ import annotations

import json
import re

import pandas as pd

from analysis.estimates import speedup_pct
from analysis.prices import Prices
from analysis.published import SOURCE
from analysis.render import Column, Table
from suite import stats

GROUP = ["model", "recipe", "budget"]
NOT_OK_ORDER = ("oom", "timeout", "nan", "crashed", "unsupported", "invalid")
SINGLE = "single runs: no interval"


def _ok(df: pd.DataFrame) -> pd.DataFrame:
    return df[df["outcome"] == "ok"]


def _fastest(df: pd.DataFrame) -> pd.DataFrame:
    """The row with the smallest step time of each group (groups without a row are absent)."""
    if df.empty:
        return df
    return df.loc[df.groupby(GROUP)["step_time_s"].idxmin()]


def _tried(df: pd.DataFrame) -> pd.DataFrame:
    return df.groupby(GROUP).agg(
        configs_tried=("outcome", "size"),
        configs_ok=("outcome", lambda s: int((s == "ok").sum())),
        outcomes=("outcome", lambda s: ", ".join(f"{n} {o}" for o, n in s.value_counts().items())),
    )


def interval(row: pd.Series) -> stats.Interval:
    """The interval of the median step time of an `ok` row."""
    level = row["step_time_ci_level"]
    return stats.Interval(
        row["step_time_ci_lo_s"], row["step_time_ci_hi_s"], 0.0 if pd.isna(level) else level, row["runs"]
    )


def tied_with_fastest(df: pd.DataFrame) -> pd.Series:
    """Per row: an `ok` configuration, not the fastest of its group, whose interval overlaps the fastest one's."""
    fastest = {tuple(r[GROUP]): r for _, r in _fastest(_ok(df)).iterrows()}
    return pd.Series(
        [
            r["outcome"] == "ok"
            and r["trial_id"] != fastest[key]["trial_id"]
            and interval(r).overlaps(interval(fastest[key]))
            for key, (_, r) in zip(map(tuple, df[GROUP].values), df.iterrows(), strict=True)
        ],
        index=df.index,
        dtype=bool,
    )


def compare(faster: pd.Series, slower: pd.Series) -> tuple[str, float]:
    """Whether the one of the two with the smaller median is significantly faster than the other,
    and with what confidence (stats.separation): significant when their intervals, each from 2+
    runs, do not overlap. The arguments may come in either order."""
    if faster["step_time_s"] > slower["step_time_s"]:
        faster, slower = slower, faster
    if faster["runs"] < 2 or slower["runs"] < 2:
        return SINGLE, float("nan")
    a, b = interval(faster), interval(slower)
    if a.overlaps(b):
        return "tied", float("nan")
    return "significantly faster", stats.separation(a, b)


def best_per_budget(df: pd.DataFrame) -> pd.DataFrame:
    """The fastest `ok` row per (model, recipe, budget), with how many configurations were tried
    and the ones tied with it (`n_tied`, `tied_configs`: their configurations, fastest first)."""
    best = _fastest(_ok(df)).join(_tried(df), on=GROUP)
    tied = df[tied_with_fastest(df)].sort_values("step_time_s")
    names = tied.groupby(GROUP)["config"].agg(list)
    best["tied_configs"] = ["; ".join(names.get(tuple(k), [])) for k in best[GROUP].values]
    best["n_tied"] = [len(names.get(tuple(k), [])) for k in best[GROUP].values]
    return best.sort_values(["model", "recipe", "days", "budget"]).reset_index(drop=True)


def across_budgets(df: pd.DataFrame) -> pd.DataFrame:
    """Every (model, recipe, budget) tried: its best row, or NaN figures where nothing ran `ok`."""
    out = _tried(df).reset_index().merge(_fastest(_ok(df)), on=GROUP, how="left")
    out["fits"] = [
        "yes" if n else f"no ({outcomes})" for n, outcomes in zip(out["configs_ok"], out["outcomes"], strict=True)
    ]
    return out.sort_values(["model", "recipe", "days", "budget"], na_position="last").reset_index(drop=True)


def is_naive(df: pd.DataFrame) -> pd.Series:
    """No memory-saving method: plain data parallel, nothing offloaded, nothing recomputed."""
    return (df["sharding"] == "DDP") & (df["offload"] == "none") & (df["recompute"] == "none")


def speedups(df: pd.DataFrame) -> pd.DataFrame:
    """Per group with an `ok` row: best against naive step time; speedup_pct = (naive / best - 1) * 100."""
    best = _fastest(_ok(df)).set_index(GROUP)
    naive = _fastest(_ok(df[is_naive(df)])).set_index(GROUP)
    naive_tried = df[is_naive(df)].groupby(GROUP)["outcome"].agg(lambda s: ", ".join(sorted(set(s))))
    out = pd.DataFrame(
        {
            "best_config": best["config"],
            "best_step_time_s": best["step_time_s"],
            "best_days": best["days"],
            "naive_config": naive["config"].reindex(best.index),
            "naive_step_time_s": naive["step_time_s"].reindex(best.index),
            "naive_days": naive["days"].reindex(best.index),
        }
    )
    missing = out["naive_config"].isna()
    why = naive_tried.reindex(out.index[missing])
    out.loc[missing, "naive_config"] = ["not measured" if pd.isna(w) else f"none ran ok ({w})" for w in why]
    out["speedup_pct"] = speedup_pct(out["naive_step_time_s"], out["best_step_time_s"])
    out["significant"] = [compare(best.loc[k], naive.loc[k])[0] if k in naive.index else "n/a" for k in out.index]
    return out.reset_index().sort_values(["model", "recipe", "budget"]).reset_index(drop=True)


# Equal sharding under the two engines: gradients and optimizer state sharded, parameters whole
# between forward and backward; and everything sharded (load.SHARDINGS names them).
ENGINE_PAIRS = (("ZeRO-2", "FSDP2 shard_grad_op"), ("ZeRO-3", "FSDP2 full_shard"))


def _engine_side(rows: pd.DataFrame, prefix: str) -> dict:
    ok = _ok(rows)
    if ok.empty:
        return {f"{prefix}_config": f"none ran ok ({', '.join(sorted(set(rows['outcome'])))})"}
    best = ok.loc[ok["step_time_s"].idxmin()]
    return {
        f"{prefix}_config": best["config"],
        f"{prefix}_step_time_s": best["step_time_s"],
        f"{prefix}_peak_mem_gib": best["peak_mem_gib"],
        f"{prefix}_max_micro_batch": ok["micro_batch"].max(),
    }


def engines(df: pd.DataFrame) -> pd.DataFrame:
    """DeepSpeed against FSDP2 at equal sharding, per (model, recipe, budget) and offload, for each
    pair of ENGINE_PAIRS tried under both engines. fsdp2_speedup_pct = (DeepSpeed's best step time
    / FSDP2's - 1) * 100: positive where FSDP2 is faster."""
    out = []
    for (model, recipe, budget, offload), g in df.groupby(GROUP + ["offload"]):
        for ds, fsdp in ENGINE_PAIRS:
            a, b = g[g["sharding"] == ds], g[g["sharding"] == fsdp]
            if a.empty or b.empty:
                continue
            row = {"model": model, "recipe": recipe, "budget": budget, "offload": offload, "sharding": f"{ds} / {fsdp}"}
            out.append(row | _engine_side(a, "deepspeed") | _engine_side(b, "fsdp2"))
    figures = [f"{e}_{k}" for e in ("deepspeed", "fsdp2") for k in ("step_time_s", "peak_mem_gib", "max_micro_batch")]
    frame = pd.DataFrame(out).reindex(
        columns=[*GROUP, "offload", "sharding", "deepspeed_config", "fsdp2_config", *figures]
    )
    frame["fsdp2_speedup_pct"] = speedup_pct(frame["deepspeed_step_time_s"], frame["fsdp2_step_time_s"])
    return frame.sort_values([*GROUP, "offload", "sharding"]).reset_index(drop=True)


def _methods_key(trial: dict) -> str:
    """The methods of a trial but its micro-batch: what one micro-batch case holds fixed."""
    return json.dumps({k: v for k, v in trial["methods"].items() if k != "micro_batch"}, sort_keys=True)


def micro_batches(df: pd.DataFrame) -> pd.DataFrame:
    """Per (model, recipe, budget, methods but the micro-batch) where 2+ micro-batches ran `ok`: the
    largest that ran against the smaller ones. `smaller_*` is a smaller micro-batch significantly
    faster than the largest if there is one (the fastest of those), else the fastest smaller one;
    `verdict` and `confidence` come from `compare`; `largest_bound` says whether a larger one was
    tried and failed (then the largest is the largest that fits) or none was tried."""
    cases = df.assign(_methods=[_methods_key(t) for t in df["trial"]])
    rows = []
    for _, case in cases.groupby(GROUP + ["_methods"]):
        ok = _ok(case).sort_values("micro_batch")
        if len(ok) < 2:
            continue
        largest = ok.iloc[-1]
        larger = case[case["micro_batch"] > largest["micro_batch"]].sort_values("micro_batch")
        bound = (
            f"{larger.iloc[0]['outcome']} at {larger.iloc[0]['micro_batch']}" if len(larger) else "no larger one tried"
        )
        smaller = ok.iloc[:-1]
        better = [  # faster than the largest, and separated from it (compare assumes its first is faster)
            r
            for _, r in smaller.iterrows()
            if r["step_time_s"] < largest["step_time_s"] and compare(r, largest)[0] == "significantly faster"
        ]
        pick = min(better, key=lambda r: r["step_time_s"]) if better else smaller.loc[smaller["step_time_s"].idxmin()]
        if pick["step_time_s"] <= largest["step_time_s"]:
            verdict, confidence = compare(pick, largest)
            verdict = {"significantly faster": "smaller significantly faster"}.get(verdict, verdict)
        else:
            verdict, confidence = compare(largest, pick)
            verdict = {"significantly faster": "largest significantly faster"}.get(verdict, verdict)
        row = {k: largest[k] for k in GROUP}
        row["methods"] = re.sub(r"\bmb \d+(x\d+)? ?", "", largest["config"]).strip()
        for side, r in (("largest", largest), ("smaller", pick)):
            row[f"{side}_micro_batch"] = r["micro_batch"]
            for k in ("step_time_s", "step_time_ci_lo_s", "step_time_ci_hi_s", "runs"):
                row[f"{side}_{k}"] = r[k]
        row.update(
            largest_bound=bound,
            speedup_pct=speedup_pct(largest["step_time_s"], pick["step_time_s"]),
            verdict=verdict,
            confidence=confidence,
        )
        rows.append(row)
    return pd.DataFrame(rows, columns=MICRO_BATCH_COLUMNS)


MICRO_BATCH_COLUMNS = (
    GROUP
    + ["methods", "largest_micro_batch", "largest_bound"]
    + [
        f"{side}_{k}"
        for side in ("largest", "smaller")
        for k in ("step_time_s", "step_time_ci_lo_s", "step_time_ci_hi_s", "runs")
    ]
    + ["smaller_micro_batch", "speedup_pct", "verdict", "confidence"]
)


def micro_batch_answer(mb: pd.DataFrame) -> str:
    """The seed paper's question answered in one sentence from the `micro_batches` frame."""
    n = len(mb)
    counts = mb["verdict"].value_counts()
    tested = n - counts.get(SINGLE, 0)
    return (
        f"A smaller micro-batch is significantly faster than the largest that ran in "
        f"{counts.get('smaller significantly faster', 0)} of {tested} cases with intervals "
        f"({counts.get('tied', 0)} tied, {counts.get('largest significantly faster', 0)} where the largest "
        f"is significantly faster); {counts.get(SINGLE, 0)} of {n} cases have single runs and cannot tell."
    )


def did_not_fit(df: pd.DataFrame) -> pd.DataFrame:
    rest = df[df["outcome"] != "ok"].copy()
    rest["_order"] = rest["outcome"].map({o: i for i, o in enumerate(NOT_OK_ORDER)})
    return rest.sort_values(["model", "recipe", "budget", "_order", "config"]).drop(columns="_order")


def report(df: pd.DataFrame, published: pd.DataFrame, prices: Prices) -> list[Table]:
    """Every table of `suite-report tables`, from an estimated frame and the published figures."""
    analytic_mfu = df["analytic_mfu"].iloc[0] if len(df) else float("nan")
    predicted = f"predicted days (FLOPs at {analytic_mfu:.0%} MFU)"
    predicted_note = (
        f"Predicted days come from FLOPs alone: total FLOPs / (GPUs x peak x {analytic_mfu:.0%} MFU); "
        "they are an estimate, never a measurement."
    )
    cost_note = (
        "Cloud cost = GPU-hours x the price in conf/prices/cloud.yaml; owned cost = purchase price "
        f"(conf/prices/owned.yaml, Khandelwal et al. 2024's) amortized over {prices.amortization_years:g} years. "
        "n/a: no price or no peak (CPU)."
    )
    interval_note = (
        "Step: the median of the trial's runs [its interval]; runs: how many, each in fresh processes; level: "
        "the probability that the interval holds the median (order statistics; below 95% with fewer than 6 runs; "
        "n/a for a single run, which has no interval). Days and costs [at the interval's ends]. Within: the "
        "standard deviation of the timed steps inside a run."
    )
    tie_note = (
        "Tied: configurations whose interval overlaps the fastest one's; the runs cannot tell them apart. "
        "A single run has no interval and shows no tie it may have."
    )
    model, budget, recipe = Column("model", "model"), Column("budget", "budget"), Column("recipe", "recipe")
    config, outcome = Column("config", "configuration"), Column("outcome", "outcome")
    step = Column("step_time_s", "step (s) [interval]", "s", interval=("step_time_ci_lo_s", "step_time_ci_hi_s"))
    runs, level = Column("runs", "runs", "int"), Column("step_time_ci_level", "level", "frac%")
    within = Column("step_time_within_std_s", "within (s)", "s")
    days = Column("days", "days", "days", interval=("days_lo", "days_hi"))
    analytic = Column("analytic_days", predicted, "days")
    cloud = Column("cloud_cost_usd", "cloud cost", "usd", interval=("cloud_cost_lo_usd", "cloud_cost_hi_usd"))
    owned = Column("owned_cost_usd", "owned cost", "usd", interval=("owned_cost_lo_usd", "owned_cost_hi_usd"))
    mfu, peak = Column("mfu", "MFU", "frac%"), Column("peak_mem_gib", "peak GiB", "gib")
    mb = micro_batches(df)
    return [
        Table(
            "best",
            "Best configuration per (model, budget)",
            best_per_budget(df),
            (
                model,
                budget,
                config,
                Column("gas_measured", "GAS timed", "int"),
                step,
                runs,
                level,
                within,
                days,
                Column("gpu_hours", "GPU-hours", "hours", interval=("gpu_hours_lo", "gpu_hours_hi")),
                cloud,
                owned,
                mfu,
                peak,
                analytic,
                Column("n_tied", "tied", "int"),
                Column("tied_configs", "tied with", width=60),
                Column("configs_ok", "ran ok", "int"),
                Column("configs_tried", "tried", "int"),
                recipe,
            ),
            (
                interval_note,
                tie_note,
                "A step with fewer accumulation steps timed than the recipe's (mb AxGAS) is extrapolated "
                "from its measured micro-step, boundary and optimizer times.",
                predicted_note,
                cost_note,
            ),
        ),
        Table(
            "budgets",
            "Each model across budgets",
            across_budgets(df),
            (
                model,
                budget,
                Column("fits", "fits"),
                days,
                Column("gpu_days", "GPU-days", "days"),
                Column("original_gpu_days", "original GPU-days", "days"),
                Column("gpu_days_vs_original", "vs original", "x"),
                cloud,
                owned,
                recipe,
            ),
            ("Original GPU-days: GPUs x days of the model's original pretraining run (conf/model/).", cost_note),
        ),
        Table(
            "speedup",
            "Speed-up of the best configuration over the naive one",
            speedups(df),
            (
                model,
                budget,
                Column("naive_config", "naive configuration"),
                Column("naive_step_time_s", "naive step (s)", "s"),
                Column("best_config", "best configuration"),
                Column("best_step_time_s", "best step (s)", "s"),
                Column("speedup_pct", "speed-up", "%"),
                Column("significant", "best significantly faster?"),
                recipe,
            ),
            (
                "Naive: plain data parallel, no offload, no recomputation, its fastest micro-batch measured. "
                "Speed-up = naive median step time / best median step time - 1; significant when their "
                "intervals, each from 2+ runs, do not overlap.",
            ),
        ),
        Table(
            "micro_batch",
            "Is the largest micro-batch that fits the fastest?",
            mb,
            (
                model,
                budget,
                Column("methods", "methods"),
                Column("largest_micro_batch", "largest mb", "int"),
                Column("largest_bound", "next larger"),
                Column(
                    "largest_step_time_s",
                    "largest: step (s)",
                    "s",
                    interval=("largest_step_time_ci_lo_s", "largest_step_time_ci_hi_s"),
                ),
                Column("largest_runs", "largest: runs", "int"),
                Column("smaller_micro_batch", "smaller mb", "int"),
                Column(
                    "smaller_step_time_s",
                    "smaller: step (s)",
                    "s",
                    interval=("smaller_step_time_ci_lo_s", "smaller_step_time_ci_hi_s"),
                ),
                Column("smaller_runs", "smaller: runs", "int"),
                Column("speedup_pct", "smaller's speed-up", "%"),
                Column("verdict", "verdict"),
                Column("confidence", "confidence", "frac%"),
                recipe,
            ),
            (
                micro_batch_answer(mb),
                "The seed paper assumed the largest micro-batch that fits is the fastest. Each case holds the "
                "methods fixed; the smaller micro-batch shown is one significantly faster than the largest if "
                "any is, else the fastest smaller one. Significant: the intervals of the two medians, each from "
                "2+ runs, do not overlap; confidence: at least the sum of the two intervals' levels minus 1.",
                "Next larger: the outcome of the next larger micro-batch tried (out of memory: the largest that "
                "fits), or none tried.",
            ),
        ),
        Table(
            "engines",
            "DeepSpeed and FSDP2 at equal sharding",
            engines(df),
            (
                model,
                budget,
                Column("sharding", "sharding"),
                Column("offload", "offload"),
                *(
                    col
                    for e, name in (("deepspeed", "DeepSpeed"), ("fsdp2", "FSDP2"))
                    for col in (
                        Column(f"{e}_config", f"{name}: fastest"),
                        Column(f"{e}_step_time_s", f"{name} step (s)", "s"),
                        Column(f"{e}_peak_mem_gib", f"{name} peak GiB", "gib"),
                        Column(f"{e}_max_micro_batch", f"{name} largest mb", "int"),
                    )
                ),
                Column("fsdp2_speedup_pct", "FSDP2 faster by", "%"),
                recipe,
            ),
            (
                "Each engine's fastest configuration that ran ok at that sharding (any recomputation, micro-batch, "
                "attention, compile), its peak memory per device in the timed window, and the largest micro-batch "
                "that ran ok under it. FSDP2 faster by = DeepSpeed's step time / FSDP2's - 1 (negative: DeepSpeed "
                "is faster).",
                "ZeRO-2 reduce-scatters gradients at every micro-step; FSDP2 at the boundary only, accumulating "
                "unsharded fp32 gradients before it (suite/engines.py).",
            ),
        ),
        Table(
            "not_fit",
            "Configurations that did not fit or did not run",
            did_not_fit(df),
            (model, budget, config, outcome, Column("message", "why", width=90), recipe),
        ),
        Table(
            "published",
            "Published estimates and the MFU they imply",
            published,
            (
                model,
                budget,
                Column("published_days", "published days", "days"),
                Column("note", "note"),
                Column("model_flops_per_token", "FLOPs/token", "sci"),
                Column("peak_tflops", "peak TFLOP/s", "num"),
                Column("implied_mfu", "implied MFU", "frac%"),
                Column("verdict", "verdict"),
                Column("owned_hardware_usd", "hardware", "usd"),
                Column("owned_cost_usd", "owned cost", "usd"),
            ),
            (
                f"Source: {SOURCE}.",
                "Implied MFU = FLOPs of the whole run (counted, fwd + bwd) / (days x GPUs x dense peak).",
            ),
        ),
        Table(
            "trials",
            "Every trial",
            df.sort_values(["model", "recipe", "budget", "outcome", "step_time_s"]),
            (
                model,
                budget,
                config,
                outcome,
                step,
                runs,
                level,
                within,
                Column("step_time_between_std_s", "between (s)", "s"),
                days,
                analytic,
                mfu,
                peak,
                cloud,
                owned,
                Column("trial_id", "trial"),
                recipe,
                Column("cloud_price_source", "cloud price source"),
            ),
            (interval_note, "Between: the standard deviation of the runs' step times.", predicted_note),
        ),
    ]
