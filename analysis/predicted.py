"""Predicted rows: the predictor's figures for a (model, budget), with days and cost, every figure
labelled predicted and shown with the error measured so far in its regime. `suite-predict` (cli/predict.py)
prints them; `suite-report tables` and `leaderboard` take `--predict MODEL@HARDWARE[,KEY=VALUE...]`.

- `predict_budget`: the one policy both commands answer with: the precision a GPU runs the recipe
  in (`runs_in`: fp16 where it has no bf16), the candidates (`candidates`: the valid configurations
  of `suite.space`, eager, or the one `search.fixed=true` names), each predicted with days and cost
  (`rows`), ranked so that the first that fits is the best (`Budget.best`). `predict_all` does it for
  every budget of `suite-predict`'s overrides (hardware=all: every GPU profile at every count);
  `composed` composes them, Hydra run once per model and overrides.
- `asked` checks every --predict value at once; `best_row` is the best row of one budget asked
  for; `predicted_frame` and `predicted_table` give the rows and their report table. Every figure's
  column is `predicted_*`; they never join a measured frame.
- `labels`: each row's error labels (`suite.predict.regimes`): step time, memory (GiB/GPU, the
  nvidia-smi kind) and fit, from scored runs of the row's own regime or the nearest one, named;
  `best_row` carries the best row's, and its step-time error as numbers (the band a figure draws).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import pandas as pd

from analysis import ReportError
from analysis.estimates import cloud_cost_usd, gpu_hours, owned_cost_usd, owned_hardware_usd, training_days
from analysis.prices import gpu_keys
from analysis.report_table import Column, Table
from suite.config import compose
from suite.config.schema import GPU_COUNTS, SearchConfig, Trial
from suite.config.validate import problems
from suite.labels import budget_label, config_label, recipe_label
from suite.predict import Predictor
from suite.predict.comm import Network
from suite.predict.machine import NotCalibrated, machine_for
from suite.predict.regimes import ErrorLabel, FitLabel, error_label, fit_label, n_params_of
from suite.space import configurations

PUBLISHED_CAVEAT = (
    "published runs use their own (often fused) code, so an HF-eager trial of the suite should be expected "
    "at or below them"
)


@dataclass(frozen=True)
class Labels:
    """The error labels of one predicted row (`suite.predict.regimes`): its step time's, its memory
    figure's (the nvidia-smi kind: GiB/GPU is `device_gib`, what must fit) and its fit's."""

    step: ErrorLabel
    memory: ErrorLabel
    fit: FitLabel

    @property
    def regime(self) -> str:
        return self.step.regime.text

    @property
    def detail(self) -> str:
        """Every label in full, with the published runs' caveat where a figure comes from them."""
        text = f"{self.step.long}; {self.memory.long}; fit: {self.fit.text}"
        published = "published runs" in (self.step.origin, self.memory.origin)
        return f"{text}; {PUBLISHED_CAVEAT}" if published else text


def labels(t: Trial, n_params: int) -> Labels:
    """The labels of trial `t`'s prediction, for a model of `n_params` parameters."""
    return Labels(
        error_label(t, "step", n_params), error_label(t, "memory", n_params, "nvidia-smi"), fit_label(t, n_params)
    )


def rows(trials: list[Trial], predictor, prices, keys: dict[str, str]) -> list[dict]:
    """Each trial predicted, with days and cost; `keys` maps datasheet GPU names to price keys."""
    out = []
    for t in trials:
        p = predictor.predict(t)
        n_params = n_params_of(t)
        days = training_days(p.step_time_s, t.model.recipe.train_steps) if not math.isnan(p.step_time_s) else math.nan
        gpu = keys.get(t.hardware.gpu, "")
        cloud = prices.cloud.get(gpu)
        hours = gpu_hours(days, t.devices)
        out.append(
            {
                "trial": t,
                "config": config_label(t, t.gas),
                "fits": p.fits,
                "device_gib": p.device_gib,
                "peak_mem_gib": p.peak_mem_gib,
                "step_time_s": p.step_time_s,
                "tokens_per_s": p.tokens_per_s,
                "mfu": p.mfu,
                "days": days,
                "gpu_hours": hours,
                "cloud_usd": cloud_cost_usd(hours, cloud.usd_per_gpu_hour) if cloud else math.nan,
                "owned_usd": owned_cost_usd(
                    owned_hardware_usd(prices, gpu, t.hardware.count, t.nodes), days, prices.amortization_years
                )
                if gpu
                else math.nan,
                "host_gib": p.host_gib,
                "nvme_gib": p.nvme_gib,
                "short_of": p.short_of,
                "labels": labels(t, n_params),
            }
        )
    out.sort(key=lambda r: (not r["fits"], math.isnan(r["step_time_s"]), r["step_time_s"]))
    return out


def runs_in(base: Trial) -> tuple[Trial, str]:
    """`base` at the precision its GPU trains the recipe in, and a label where that is not the
    recipe's: a GPU without bf16 (a V100) runs a bf16 recipe at fp16. A precision set with
    `methods.precision` is kept as given (and `problems` names it if the GPU cannot run it)."""
    hw = base.hardware
    if base.methods.precision == "recipe" and base.precision == "bf16" and hw.device == "cuda" and not hw.bf16:
        return replace(base, methods=replace(base.methods, precision="fp16")), "fp16 (bf16 unsupported)"
    return base, ""


def candidates(base: Trial, search: SearchConfig) -> list[Trial]:
    """The configurations predicted for `base`: with `search.fixed` the one `methods.*` names, else
    every valid one of the search space (`suite.space.configurations`) at every micro-batch, eager
    (`torch.compile` is not modelled)."""
    return [base] if search.fixed else configurations(base, replace(search, compiles=[False]))


@dataclass(frozen=True)
class Budget:
    """One budget predicted (`predict_budget`): its base trial at the precision it runs, every
    candidate's row ranked (None where it cannot run at all, `why` says why), the predictor."""

    base: Trial
    rows: list[dict] | None
    predictor: object
    label: str = ""
    """Where the budget is not predicted as asked: "fp16 (bf16 unsupported)"."""
    why: str = ""

    @property
    def best(self) -> dict | None:
        """The fastest configuration predicted to fit, or None."""
        return next((r for r in self.rows or () if r["fits"]), None)


def predict_budget(cfg, prices, keys: dict[str, str]) -> Budget:
    """The one answer of `suite-predict` and `--predict` for a composed config: its precision
    (`runs_in`), its candidates (`candidates`), each predicted and ranked (`rows`). A base that is
    invalid at that precision, or a CPU budget without this machine's constants, raises
    ReportError."""

    base, label = runs_in(compose.trial_from_cfg(cfg))
    search = SearchConfig(**cfg.search)
    found = [p for p in problems(base) if search.fixed or "micro_batch" not in p]
    if found:
        raise ReportError("invalid base: " + "; ".join(found))
    predictor = _predictor(cfg)
    try:
        return Budget(base, rows(candidates(base, search), predictor, prices, keys), predictor, label)
    except NotCalibrated as e:
        raise ReportError(str(e)) from None


def _predictor(cfg):

    return Predictor(network=Network(cfg.cluster.network_gbps, cfg.cluster.network))


HARDWARE_KEYS = ("hardware", "hardware.count")


def composed(overrides: list[str]):
    """`compose.config(overrides)`, with Hydra run once per set of the other overrides: where the
    hardware is one GPU profile and a count that no other override (or experiment) touches, that
    profile is swapped into the config the others compose (`compose.with_hardware`), milliseconds
    instead of a sixth of a second (`hardware=all` is 19 profiles x 4 counts)."""
    given = compose.overrides(overrides)
    hardware = {k: v for k, _, v in (o.partition("=") for o in given) if k in HARDWARE_KEYS}
    rest = [o for o in given if o.partition("=")[0] not in HARDWARE_KEYS]
    own = any(o.split("=", 1)[0].lstrip("+~").startswith(("hardware", "experiment")) for o in rest)
    gpu, count = hardware.get("hardware", ""), hardware.get("hardware.count", "")
    if own or gpu not in compose.gpu_profiles() or not count.isdigit():
        return compose.config(given)
    return compose.with_hardware(compose.config(rest), gpu, int(count), in_place=True)  # config: a copy of its own


def budgets(overrides: list[str]) -> list[list[str]]:
    """The overrides of each budget `suite-predict` answers for: the ones given, or with
    hardware=all each GPU profile at every count of one node in their place."""
    if "hardware=all" not in overrides:
        return [overrides]
    rest = [o for o in overrides if o != "hardware=all"]
    return [[*rest, f"hardware={gpu}", f"hardware.count={n}"] for gpu in compose.gpu_profiles() for n in GPU_COUNTS]


def predict_all(overrides: list[str], prices, keys: dict[str, str]) -> list[Budget]:
    """`predict_budget` of every budget of `suite-predict`'s overrides (`budgets`). Under
    hardware=all a profile that cannot run the model is a Budget saying why, never the end."""
    every = "hardware=all" in overrides
    out = []
    for one in budgets(overrides):
        cfg = composed(one)
        try:
            out.append(predict_budget(cfg, prices, keys))
        except ReportError as e:
            if not every:
                raise
            base, label = runs_in(compose.trial_from_cfg(cfg))
            out.append(Budget(base, None, _predictor(cfg), label, str(e)))
    return out


# ---- predicted rows of `suite-report tables` and the leaderboard: asked for with --predict ----

PREDICT_HELP = (
    "MODEL@HARDWARE[,KEY=VALUE...]: predict the best configuration of a model of conf/model on a profile of "
    "conf/hardware (e.g. pythia-1b@a6000-x4), with any Hydra overrides after it (pythia-1b@a100-80gb-x8,"
    "cluster.nodes=4); repeatable. Shown apart from the measured results, labelled predicted"
)


@dataclass(frozen=True)
class Asked:
    """One (model, budget) asked for with --predict: its composed config and base trial."""

    spec: str
    cfg: object
    base: Trial


def _parts(spec: str) -> list[str]:
    """`spec` split at its commas outside brackets: a list value (`search.engines=[fsdp2,deepspeed]`)
    stays one override."""
    parts, depth, start = [], 0, 0
    for i, c in enumerate(spec):
        depth += (c in "[{") - (c in "]}")
        if c == "," and depth == 0:
            parts.append(spec[start:i])
            start = i + 1
    return [p.strip() for p in [*parts, spec[start:]]]


def _overrides(spec: str) -> tuple[list[str], list[str]]:
    """The Hydra overrides of MODEL@HARDWARE[,KEY=VALUE...], and what is wrong with it."""
    head, *extra = _parts(spec)
    model, sep, hardware = head.partition("@")
    wrong = []
    if not sep or not model or not hardware or "=" in head:
        wrong.append(f"{spec!r} is not MODEL@HARDWARE[,KEY=VALUE...], e.g. pythia-1b@a6000-x4")
        return [], wrong
    for group, name in (("model", model), ("hardware", hardware)):
        names = compose.options(group)
        if not compose.known(group, name):
            form = " (a GPU type, -x<N> for N of them)" if group == "hardware" else ""
            wrong.append(f"{spec!r}: no {group} {name!r} in conf/{group}/{form} (one of: {', '.join(names)})")
    wrong += [f"{spec!r}: {e!r} is not KEY=VALUE" for e in extra if "=" not in e or e.startswith("=")]
    return [f"model={model}", f"hardware={hardware}", *extra], wrong


def asked(specs: list[str]) -> list[Asked]:
    """Each --predict value composed and checked, before anything is predicted; every problem
    of every value is raised at once (ReportError)."""
    if not specs:
        return []
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    out, wrong = [], []
    for spec in specs:
        overrides, bad = _overrides(spec)
        if bad:
            wrong += bad
            continue
        try:
            cfg = composed(overrides)
            base, _ = runs_in(compose.trial_from_cfg(cfg))
        except (HydraException, OmegaConfBaseException, ValueError, TypeError) as e:
            cause = f" ({str(e.__cause__).splitlines()[0]})" if e.__cause__ and str(e.__cause__) else ""
            wrong.append(f"{spec!r}: {str(e).splitlines()[0]}{cause}")
            continue
        found = [f"{spec!r}: {p}" for p in problems(base) if "micro_batch" not in p]
        try:
            machine_for(base)
        except NotCalibrated as e:
            found.append(f"{spec!r}: {e}")
        wrong += found
        if not found:
            out.append(Asked(spec, cfg, base))
    if wrong:
        raise ReportError("--predict: " + "; ".join(wrong))
    return out


def best_row(a: Asked, prices, keys: dict[str, str]) -> dict:
    """The fastest configuration predicted to fit a budget asked for (`predict_budget`), or that
    none does; every figure predicted, with the error measured so far for its kind of device."""
    budget = predict_budget(a.cfg, prices, keys)
    base, rs, best = budget.base, budget.rows, budget.best
    err: Labels = best["labels"] if best else labels(base, n_params_of(base))
    n_fit = sum(r["fits"] for r in rs)
    if best:
        fits = "yes"
    elif rs:
        least = min(rs, key=lambda r: r["device_gib"])
        fits = f"no: the least any needs is {least['device_gib']:.2f} GiB ({least['config']})"
    else:
        fits = "no valid configuration"
    step = err.step
    row = {
        "model": base.model.name,
        "budget": budget_label(base),
        "recipe": recipe_label(base),
        "device": base.hardware.device,
        "gpu_name": base.hardware.gpu,
        "n_gpus": base.devices,
        "mem_budget_gib": base.hardware.mem_gib,
        "unit": base.unit,
        "config": best["config"] if best else "does not fit",
        "fits": fits,
        "configs_fit": n_fit,
        "configs_valid": len(rs),
        "precision": budget.label or base.precision,
        "constants": budget.predictor.machine(base).source,
        "regime": err.regime,
        "memory_error": err.memory.short,
        "time_error": step.short,
        "fit_error": err.fit.text,
        "time_error_label": step.long,
        "error_detail": err.detail,
        # the band a figure draws around this row's predicted days (NaN where nothing is scored)
        "step_time_error_median_pct": step.median_pct if step.scored else math.nan,
        "step_time_error_p90_pct": step.p90_pct if step.scored else math.nan,
        "original_gpus": base.model.recipe.original_gpus,
        "original_days": base.model.recipe.original_days,
    }
    figures = ("device_gib", "step_time_s", "tokens_per_s", "mfu", "days", "gpu_hours", "cloud_usd", "owned_usd")
    for k in figures:
        value = best[k] if best else None
        row[PREDICTED_KEYS[k]] = math.nan if value is None else value
    return row


# Every predicted figure's column is named predicted_*: in a CSV, too, it cannot pass for a measurement.
PREDICTED_KEYS = {
    "device_gib": "predicted_device_gib",
    "step_time_s": "predicted_step_time_s",
    "tokens_per_s": "predicted_tokens_per_s",
    "mfu": "predicted_mfu",
    "days": "predicted_days",
    "gpu_hours": "predicted_gpu_hours",
    "cloud_usd": "predicted_cloud_cost_usd",
    "owned_usd": "predicted_owned_cost_usd",
}
PREDICTED_TITLE = "PREDICTED, not measured: the best configuration per (model, budget) asked for"


def predicted_frame(chosen: list[Asked], prices) -> pd.DataFrame:
    """One row per (model, budget) asked for (`best_row`), in the order asked."""
    keys = gpu_keys()
    return pd.DataFrame([best_row(a, prices, keys) for a in chosen])


def predicted_table(frame: pd.DataFrame) -> Table:
    """The predicted rows as a report table of their own, every figure's header saying predicted."""
    errors = [
        f"Error of {m} on {b} ({r}): {e}."
        for m, b, r, e in zip(frame["model"], frame["budget"], frame["regime"], frame["error_detail"], strict=True)
    ]
    constants = {f"Constants of {b}: {c}." for b, c in zip(frame["budget"], frame["constants"], strict=True)}
    return Table(
        "predicted",
        PREDICTED_TITLE,
        frame,
        (
            Column("model", "model"),
            Column("budget", "budget"),
            Column("config", "predicted best configuration"),
            Column("fits", "fits (predicted)", width=70),
            Column("mem_budget_gib", "GiB per device", "gib"),
            Column("predicted_device_gib", "predicted GiB/GPU", "gib"),
            Column("memory_error", "memory error in its regime"),
            Column("predicted_step_time_s", "predicted step (s)", "s"),
            Column("time_error", "step-time error in its regime"),
            Column("predicted_tokens_per_s", "predicted tokens/s", "int"),
            Column("predicted_mfu", "predicted MFU", "frac%"),
            Column("predicted_days", "predicted days", "days"),
            Column("predicted_gpu_hours", "predicted GPU-hours", "hours"),
            Column("predicted_cloud_cost_usd", "predicted cloud cost", "usd"),
            Column("predicted_owned_cost_usd", "predicted owned cost", "usd"),
            Column("regime", "error regime"),
            Column("fit_error", "fit called wrong so far"),
            Column("configs_fit", "configs predicted to fit", "int"),
            Column("configs_valid", "configs predicted", "int"),
            Column("recipe", "recipe"),
            Column("precision", "predicted at"),
        ),
        (
            "Predicted by suite.predict (suite-predict) for the configurations of the search space "
            "(ZeRO stage, offload, recomputation, attention, every micro-batch), never measured; kept out of "
            "every measured table and winner above. The fastest predicted to fit is shown, or 'does not fit'.",
            "Error in its regime: median |predicted - measured| / measured, with its n, over the scored runs of "
            "the configuration's regime (GPU class, engine, offload, GPU count, size band; docs/predictor.md); "
            "'nearest' where that regime has too few and the nearest scored one is shown, named below. Days, "
            "GPU-hours and costs follow from the predicted step time (same formulas as the measured ones) and "
            "carry its error.",
            *errors,
            *sorted(constants),
        ),
    )
