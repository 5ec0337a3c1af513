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
"""

from __future__ import annotations

import pandas as pd

from analysis.estimates import speedup_pct
from analysis.prices import Prices
from analysis.published import SOURCE
from analysis.render import Column, Table

GROUP = ["model", "recipe", "budget"]
NOT_OK_ORDER = ("oom", "timeout", "nan", "crashed", "unsupported", "invalid")


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


def best_per_budget(df: pd.DataFrame) -> pd.DataFrame:
    """The fastest `ok` row per (model, recipe, budget), with how many configurations were tried."""
    best = _fastest(_ok(df)).join(_tried(df), on=GROUP)
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
    model, budget, recipe = Column("model", "model"), Column("budget", "budget"), Column("recipe", "recipe")
    config, outcome = Column("config", "configuration"), Column("outcome", "outcome")
    step, std = Column("step_time_s", "step (s)", "s"), Column("step_time_std_s", "std (s)", "s")
    days, analytic = Column("days", "days", "days"), Column("analytic_days", predicted, "days")
    cloud, owned = Column("cloud_cost_usd", "cloud cost", "usd"), Column("owned_cost_usd", "owned cost", "usd")
    mfu, peak = Column("mfu", "MFU", "frac%"), Column("peak_mem_gib", "peak GiB", "gib")
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
                std,
                days,
                Column("gpu_hours", "GPU-hours", "hours"),
                cloud,
                owned,
                mfu,
                peak,
                analytic,
                Column("configs_ok", "ran ok", "int"),
                Column("configs_tried", "tried", "int"),
                recipe,
            ),
            (
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
                recipe,
            ),
            (
                "Naive: plain data parallel, no offload, no recomputation, its fastest micro-batch measured. "
                "Speed-up = naive step time / best step time - 1.",
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
                owned,
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
                std,
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
            (predicted_note,),
        ),
    ]
