"""The report's tables, as frames anyone can reuse (the leaderboard does) and as `report_table.Table`s.

A budget is one hardware profile on one or more nodes; step times are compared only within
one (model, recipe, budget) group, since a different recipe (global batch, sequence) is a
different step.

- `best_per_budget`: the fastest `ok` configuration of each group.
- `across_budgets`: each model on every budget tried, including budgets where nothing fits.
- `speedups`: best configuration against the naive one (plain data parallel, no offload, no
  recomputation; its fastest micro-batch), the paper's "memory-saving methods give up to 71%".
- `method_speedups`: each memory method's fastest configuration against the naive one, with the
  speed-up's interval (`speedup_ends`) and whether it is significant, tied or from single runs.
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
from dataclasses import dataclass

import pandas as pd

from analysis.estimates import speedup_pct
from analysis.prices import Prices
from analysis.published import SOURCE
from analysis.report_table import Column, Table
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


def speedup_ends(base: pd.Series, other: pd.Series) -> tuple[float, float]:
    """The interval of `other`'s speed-up over `base` (two `ok` rows) from the intervals of their
    medians: the same formula (estimates.speedup_pct) at the ends, the least (base's low end over
    other's high end) and the most. It holds 0 exactly when the two intervals overlap (tied); for
    two single runs it is a point."""
    lo, hi = "step_time_ci_lo_s", "step_time_ci_hi_s"
    return speedup_pct(base[lo], other[hi]), speedup_pct(base[hi], other[lo])


def _versus(r: pd.Series, base: pd.Series) -> tuple[str, float]:
    """`compare` of `r` with `base`, saying which way a significant difference goes."""
    verdict, confidence = compare(r, base)
    if verdict == "significantly faster" and r["step_time_s"] > base["step_time_s"]:
        verdict = "significantly slower"
    return verdict, confidence


STEP_KEYS = ("step_time_s", "step_time_ci_lo_s", "step_time_ci_hi_s", "runs", "step_time_ci_level")
METHOD_SPEEDUP_COLUMNS = [
    *GROUP, "memory_methods", "config", *STEP_KEYS, "naive_config", *(f"naive_{k}" for k in STEP_KEYS),
    "speedup_pct", "speedup_lo_pct", "speedup_hi_pct", "verdict", "confidence", "trial_id", "naive_trial_id",
]  # fmt: skip


def method_speedups(df: pd.DataFrame) -> pd.DataFrame:
    """Per (model, recipe, budget) and memory methods (sharding, offload, recomputation, any other
    method): the fastest `ok` configuration with them against the naive one (as in `speedups`),
    speedup_pct = (naive / this - 1) * 100 with its interval [speedup_lo_pct, speedup_hi_pct]
    (`speedup_ends`), and `verdict` ("significantly faster", "significantly slower", "tied" or
    single runs) with its confidence (`compare`). Groups without an ok naive configuration are left
    out (`speedups` says why)."""
    ok = _ok(df)
    naive = _fastest(ok[is_naive(ok)]).set_index(GROUP)
    methods = ok.loc[ok.groupby(GROUP + ["memory_methods"])["step_time_s"].idxmin()] if len(ok) else ok
    rows = []
    for _, r in methods[~is_naive(methods)].iterrows():
        key = tuple(r[GROUP])
        if key not in naive.index:
            continue
        n = naive.loc[key]
        row = {k: r[k] for k in (*GROUP, "memory_methods", "config", *STEP_KEYS, "trial_id")}
        row |= {f"naive_{k}": n[k] for k in ("config", *STEP_KEYS, "trial_id")}
        row["speedup_pct"] = speedup_pct(n["step_time_s"], r["step_time_s"])
        row["speedup_lo_pct"], row["speedup_hi_pct"] = speedup_ends(n, r)
        row["verdict"], row["confidence"] = _versus(r, n)
        rows.append(row)
    out = pd.DataFrame(rows, columns=METHOD_SPEEDUP_COLUMNS)
    return out.sort_values([*GROUP, "step_time_s"]).reset_index(drop=True)


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


def _micro_batch_case(case: list[dict]) -> dict | None:
    """One case's row of `micro_batches` (its rows as dicts: a store of thousands has as many
    cases), or None where fewer than two micro-batches ran `ok`."""
    ok = sorted((r for r in case if r["outcome"] == "ok"), key=lambda r: r["micro_batch"])
    if len(ok) < 2:
        return None
    largest, smaller = ok[-1], ok[:-1]
    larger = sorted((r for r in case if r["micro_batch"] > largest["micro_batch"]), key=lambda r: r["micro_batch"])
    bound = f"{larger[0]['outcome']} at {larger[0]['micro_batch']}" if larger else "no larger one tried"
    better = [  # faster than the largest, and separated from it (compare assumes its first is faster)
        r
        for r in smaller
        if r["step_time_s"] < largest["step_time_s"] and compare(r, largest)[0] == "significantly faster"
    ]
    pick = min(better or smaller, key=lambda r: r["step_time_s"])
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
        for k in STEP_KEYS:
            row[f"{side}_{k}"] = r[k]
    lo, hi = speedup_ends(largest, pick)
    return row | {
        "largest_bound": bound,
        "speedup_pct": speedup_pct(largest["step_time_s"], pick["step_time_s"]),
        "speedup_lo_pct": lo,
        "speedup_hi_pct": hi,
        "verdict": verdict,
        "confidence": confidence,
    }


def micro_batches(df: pd.DataFrame) -> pd.DataFrame:
    """Per (model, recipe, budget, methods but the micro-batch) where 2+ micro-batches ran `ok`: the
    largest that ran against the smaller ones. `smaller_*` is a smaller micro-batch significantly
    faster than the largest if there is one (the fastest of those), else the fastest smaller one;
    `verdict` and `confidence` come from `compare`; `largest_bound` says whether a larger one was
    tried and failed (then the largest is the largest that fits) or none was tried."""
    keys = ["outcome", "micro_batch", "config", *GROUP, *STEP_KEYS]
    cases: dict[tuple, list[dict]] = {}
    for r, methods in zip(df[keys].to_dict("records"), map(_methods_key, df["trial"]), strict=True):
        cases.setdefault((*(r[k] for k in GROUP), methods), []).append(r)
    rows = [_micro_batch_case(cases[k]) for k in sorted(cases)]
    return pd.DataFrame([r for r in rows if r], columns=MICRO_BATCH_COLUMNS)


MICRO_BATCH_COLUMNS = (
    GROUP
    + ["methods", "largest_micro_batch", "largest_bound"]
    + [f"{side}_{k}" for side in ("largest", "smaller") for k in STEP_KEYS]
    + ["smaller_micro_batch", "speedup_pct", "speedup_lo_pct", "speedup_hi_pct", "verdict", "confidence"]
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


# ---- the report's tables: their columns and notes, then one small function per table ------------

MODEL, BUDGET, RECIPE = Column("model", "model"), Column("budget", "budget"), Column("recipe", "recipe")
CONFIG, OUTCOME = Column("config", "configuration"), Column("outcome", "outcome")
STEP = Column("step_time_s", "step (s) [interval]", "s", interval=("step_time_ci_lo_s", "step_time_ci_hi_s"))
RUNS, LEVEL = Column("runs", "runs", "int"), Column("step_time_ci_level", "level", "frac%")
WITHIN = Column("step_time_within_std_s", "within (s)", "s")
DAYS = Column("days", "days", "days", interval=("days_lo", "days_hi"))
CLOUD = Column("cloud_cost_usd", "cloud cost", "usd", interval=("cloud_cost_lo_usd", "cloud_cost_hi_usd"))
OWNED = Column("owned_cost_usd", "owned cost", "usd", interval=("owned_cost_lo_usd", "owned_cost_hi_usd"))
MFU, PEAK = Column("mfu", "MFU", "frac%"), Column("peak_mem_gib", "peak GiB", "gib")

INTERVAL_NOTE = (
    "Step: the median of the trial's runs [its interval]; runs: how many, each in fresh processes; level: "
    "the probability that the interval holds the median (order statistics; below 95% with fewer than 6 runs; "
    "n/a for a single run, which has no interval). Days and costs [at the interval's ends]. Within: the "
    "standard deviation of the timed steps inside a run."
)
TIE_NOTE = (
    "Tied: configurations whose interval overlaps the fastest one's; the runs cannot tell them apart. "
    "A single run has no interval and shows no tie it may have."
)


@dataclass(frozen=True)
class Notes:
    """What several tables say of the FLOPs-only estimate and of costs."""

    analytic: Column
    analytic_note: str
    cost_note: str

    @classmethod
    def of(cls, df: pd.DataFrame, prices: Prices) -> Notes:
        analytic_mfu = df["analytic_mfu"].iloc[0] if len(df) else float("nan")
        return cls(
            Column("analytic_days", f"predicted days (FLOPs at {analytic_mfu:.0%} MFU)", "days"),
            f"Predicted days come from FLOPs alone: total FLOPs / (GPUs x peak x {analytic_mfu:.0%} MFU); "
            "they are an estimate, never a measurement.",
            "Cloud cost = GPU-hours x the price in conf/prices/cloud.yaml; owned cost = purchase price "
            f"(conf/prices/owned.yaml, Khandelwal et al. 2024's) amortized over {prices.amortization_years:g} years. "
            "n/a: no price or no peak (CPU).",
        )


def best_table(df: pd.DataFrame, n: Notes) -> Table:
    columns = (
        MODEL, BUDGET, CONFIG, Column("gas_measured", "GAS timed", "int"), STEP, RUNS, LEVEL, WITHIN, DAYS,
        Column("gpu_hours", "GPU-hours", "hours", interval=("gpu_hours_lo", "gpu_hours_hi")), CLOUD, OWNED, MFU, PEAK,
        n.analytic, Column("n_tied", "tied", "int"), Column("tied_configs", "tied with", width=60),
        Column("configs_ok", "ran ok", "int"), Column("configs_tried", "tried", "int"), RECIPE,
    )  # fmt: skip
    extrapolated = (
        "A step with fewer accumulation steps timed than the recipe's (mb AxGAS) is extrapolated "
        "from its measured micro-step, boundary and optimizer times."
    )
    notes = (INTERVAL_NOTE, TIE_NOTE, extrapolated, n.analytic_note, n.cost_note)
    return Table("best", "Best configuration per (model, budget)", best_per_budget(df), columns, notes)


def budgets_table(df: pd.DataFrame, n: Notes) -> Table:
    columns = (
        MODEL, BUDGET, Column("fits", "fits"), DAYS, Column("gpu_days", "GPU-days", "days"),
        Column("original_gpu_days", "original GPU-days", "days"), Column("gpu_days_vs_original", "vs original", "x"),
        CLOUD, OWNED, RECIPE,
    )  # fmt: skip
    notes = ("Original GPU-days: GPUs x days of the model's original pretraining run (conf/model/).", n.cost_note)
    return Table("budgets", "Each model across budgets", across_budgets(df), columns, notes)


def speedup_table(df: pd.DataFrame) -> Table:
    columns = (
        MODEL, BUDGET, Column("naive_config", "naive configuration"),
        Column("naive_step_time_s", "naive step (s)", "s"), Column("best_config", "best configuration"),
        Column("best_step_time_s", "best step (s)", "s"),
        Column("speedup_pct", "speed-up", "%"), Column("significant", "best significantly faster?"), RECIPE,
    )  # fmt: skip
    note = (
        "Naive: plain data parallel, no offload, no recomputation, its fastest micro-batch measured. "
        "Speed-up = naive median step time / best median step time - 1; significant when their "
        "intervals, each from 2+ runs, do not overlap."
    )
    return Table("speedup", "Speed-up of the best configuration over the naive one", speedups(df), columns, (note,))


def method_speedup_table(df: pd.DataFrame) -> Table:
    columns = (
        MODEL, BUDGET, Column("memory_methods", "methods"), CONFIG, STEP, RUNS,
        Column("naive_config", "naive configuration"),
        Column("naive_step_time_s", "naive step (s)", "s",
               interval=("naive_step_time_ci_lo_s", "naive_step_time_ci_hi_s")),
        Column("naive_runs", "naive runs", "int"),
        Column("speedup_pct", "speed-up [interval]", "%", interval=("speedup_lo_pct", "speedup_hi_pct")),
        Column("verdict", "verdict"), Column("confidence", "confidence", "frac%"), RECIPE,
    )  # fmt: skip
    note = (
        "Each memory method (sharding, offload, recomputation) by the fastest configuration that ran ok with it "
        "(any micro-batch, attention, compile) against the naive one (plain data parallel, no offload, no "
        "recomputation, its fastest micro-batch). Speed-up = naive median / this median - 1, [at the intervals' "
        "ends: the naive low end over this high end, and the other way]; tied when the two intervals overlap "
        "(the speed-up's interval holds 0); significant when they do not, each from 2+ runs; confidence: at "
        "least the sum of the two intervals' levels minus 1."
    )
    title = "Speed-up of each memory method over the naive configuration"
    return Table("method_speedup", title, method_speedups(df), columns, (note,))


def micro_batch_table(df: pd.DataFrame) -> Table:
    mb = micro_batches(df)

    def step(side: str) -> Column:
        lo, hi = f"{side}_step_time_ci_lo_s", f"{side}_step_time_ci_hi_s"
        return Column(f"{side}_step_time_s", f"{side}: step (s)", "s", interval=(lo, hi))

    columns = (
        MODEL, BUDGET, Column("methods", "methods"), Column("largest_micro_batch", "largest mb", "int"),
        Column("largest_bound", "next larger"), step("largest"), Column("largest_runs", "largest: runs", "int"),
        Column("smaller_micro_batch", "smaller mb", "int"), step("smaller"),
        Column("smaller_runs", "smaller: runs", "int"),
        Column("speedup_pct", "smaller's speed-up", "%", interval=("speedup_lo_pct", "speedup_hi_pct")),
        Column("verdict", "verdict"),
        Column("confidence", "confidence", "frac%"), RECIPE,
    )  # fmt: skip
    notes = (
        micro_batch_answer(mb),
        "The seed paper assumed the largest micro-batch that fits is the fastest. Each case holds the "
        "methods fixed; the smaller micro-batch shown is one significantly faster than the largest if "
        "any is, else the fastest smaller one. Significant: the intervals of the two medians, each from "
        "2+ runs, do not overlap; confidence: at least the sum of the two intervals' levels minus 1. "
        "The smaller's speed-up [at the intervals' ends] = largest median / smaller median - 1.",
        "Next larger: the outcome of the next larger micro-batch tried (out of memory: the largest that "
        "fits), or none tried.",
    )
    return Table("micro_batch", "Is the largest micro-batch that fits the fastest?", mb, columns, notes)


def engines_table(df: pd.DataFrame) -> Table:
    sides = [
        col
        for e, name in (("deepspeed", "DeepSpeed"), ("fsdp2", "FSDP2"))
        for col in (
            Column(f"{e}_config", f"{name}: fastest"),
            Column(f"{e}_step_time_s", f"{name} step (s)", "s"),
            Column(f"{e}_peak_mem_gib", f"{name} peak GiB", "gib"),
            Column(f"{e}_max_micro_batch", f"{name} largest mb", "int"),
        )
    ]
    columns = (
        MODEL, BUDGET, Column("sharding", "sharding"), Column("offload", "offload"), *sides,
        Column("fsdp2_speedup_pct", "FSDP2 faster by", "%"), RECIPE,
    )  # fmt: skip
    notes = (
        "Each engine's fastest configuration that ran ok at that sharding (any recomputation, micro-batch, "
        "attention, compile), its peak memory per device in the timed window, and the largest micro-batch "
        "that ran ok under it. FSDP2 faster by = DeepSpeed's step time / FSDP2's - 1 (negative: DeepSpeed "
        "is faster).",
        "ZeRO-2 reduce-scatters gradients at every micro-step; FSDP2 at the boundary only, accumulating "
        "unsharded fp32 gradients before it (suite/engines.py).",
    )
    return Table("engines", "DeepSpeed and FSDP2 at equal sharding", engines(df), columns, notes)


def not_fit_table(df: pd.DataFrame) -> Table:
    columns = (MODEL, BUDGET, CONFIG, OUTCOME, Column("message", "why", width=90), RECIPE)
    return Table("not_fit", "Configurations that did not fit or did not run", did_not_fit(df), columns)


def published_table(published: pd.DataFrame) -> Table:
    columns = (
        MODEL, BUDGET, Column("published_days", "published days", "days"), Column("note", "note"),
        Column("model_flops_per_token", "FLOPs/token", "sci"), Column("peak_tflops", "peak TFLOP/s", "num"),
        Column("implied_mfu", "implied MFU", "frac%"), Column("verdict", "verdict"),
        Column("owned_hardware_usd", "hardware", "usd"), Column("owned_cost_usd", "owned cost", "usd"),
    )  # fmt: skip
    notes = (
        f"Source: {SOURCE}.",
        "Implied MFU = FLOPs of the whole run (counted, fwd + bwd) / (days x GPUs x dense peak).",
    )
    return Table("published", "Published estimates and the MFU they imply", published, columns, notes)


def trials_table(df: pd.DataFrame, n: Notes) -> Table:
    columns = (
        MODEL, BUDGET, CONFIG, OUTCOME, STEP, RUNS, LEVEL, WITHIN,
        Column("step_time_between_std_s", "between (s)", "s"), DAYS, n.analytic,
        Column("tokens_per_s", "tokens/s", "int"), MFU, PEAK, CLOUD, OWNED,
        Column("trial_id", "trial"), RECIPE,
        Column("cloud_price_source", "cloud price source"),
    )  # fmt: skip
    rows = df.sort_values(["model", "recipe", "budget", "outcome", "step_time_s"])
    notes = (INTERVAL_NOTE, "Between: the standard deviation of the runs' step times.", n.analytic_note)
    return Table("trials", "Every trial", rows, columns, notes)


def report(df: pd.DataFrame, published: pd.DataFrame, prices: Prices) -> list[Table]:
    """Every table of `suite-report tables`, from an estimated frame and the published figures."""
    n = Notes.of(df, prices)
    return [
        best_table(df, n),
        budgets_table(df, n),
        speedup_table(df),
        method_speedup_table(df),
        micro_batch_table(df),
        engines_table(df),
        not_fit_table(df),
        published_table(published),
        trials_table(df, n),
    ]
