"""The plan: the seed paper's own question, "$100K or 100 days", answered for any model.

    plan = make_plan(["model=pythia-1b", "plan.max_days=30"], prices)   # every option weighed
    lines(plan)                 # what suite-plan prints: the answer first, then the Pareto front
    plan_table([plan])          # the answer and the front as a report table (suite-report tables --plan)

An option is a GPU type of conf/hardware/ with a price, a count per node (1, 2, 4, 8) and a number of
nodes (1 to `plan.max_nodes`), bought (conf/prices/owned.yaml) or rented (conf/prices/cloud.yaml).
Its step time is measured where the store holds an `ok` trial of the model's recipe on that budget
(the fastest; `analysis.load`), else predicted (`analysis.predicted.predict_budget`, the one policy
of suite-predict); a GPU type without a price is named, not weighed, and a budget that cannot train
the model says why. Days, dollars, energy and CO2e follow from the step time (`analysis.estimates`)
at the tokens asked for, with its interval: a measured trial's interval of the median, a
prediction's band at the p90 of the |error| scored in its regime (`predicted_error_pct`).

Dollars are what an option costs up front: renting, the bill (GPU-hours x price per GPU-hour);
buying, the hardware's purchase price and the run's electricity. The deadline and the budget weigh
those, and so does the Pareto front; the run's share of owned hardware amortized over its life
(Khandelwal et al. 2024's cost) and its electricity are shown beside them as the cost of the run.

Every figure is measured or predicted, and sits in a column named so (`measured_days`,
`predicted_days`, ...): a row fills one of the two; a price is neither.
"""

from __future__ import annotations

import dataclasses
import math
import multiprocessing
from dataclasses import dataclass, field, replace
from pathlib import Path

import pandas as pd
from omegaconf import OmegaConf

from analysis import ReportError, report_table
from analysis import estimates as est
from analysis.figures import pareto
from analysis.load import Results, read_results
from analysis.predicted import _parts, composed, predict_budget, runs_in
from analysis.prices import Prices, gpu_keys
from analysis.report_table import Column, Table
from suite.config import compose
from suite.config.schema import GPU_COUNTS, PlanConfig, Trial
from suite.labels import budget_label
from suite.predict import Predictor
from suite.predict.regimes import error_label
from suite.predict.trace import traced

CHINCHILLA_TOKENS_PER_PARAM = 20
"""Hoffmann et al. 2022, "Training Compute-Optimal Large Language Models": about 20 tokens per parameter."""
QUANTITIES = ("days", "usd", "run_usd", "kwh", "co2e_kg")
"""What each option's step time becomes, each measured or predicted: days to train, dollars up front,
dollars of the run, energy and emissions."""
SOURCES = ("measured", "predicted")
PLAN_KEYS = tuple(f.name for f in dataclasses.fields(PlanConfig))


class Unmet(ReportError):
    """No option meets the deadline and budget asked for; the message names the nearest."""


@dataclass(frozen=True)
class Plan:
    """Every option weighed for one model, and what the answer needs to say of them."""

    model: str
    settings: PlanConfig
    recipe: str
    """The recipe the step times are of (its batch, sequence and precision)."""
    tokens: float
    tokens_why: str
    steps: int
    """Optimizer steps that train on `tokens` at the recipe's batch."""
    options: pd.DataFrame
    """One row per (budget, bought or rented), `measured_*` or `predicted_*` figures (QUANTITIES)."""
    cannot: tuple[str, ...] = ()
    """Budgets that cannot train the model, each with why."""
    unpriced: tuple[str, ...] = ()
    """GPU types weighed by nobody: no price for what is asked (buying, renting)."""
    store: str = ""
    error: str = ""
    """The error the predicted figures carry, in words."""
    answer: tuple[tuple[str, int], ...] = field(default=())
    """(what it answers, its row in `options`), in the order printed."""
    by_type: tuple[tuple[str, int], ...] = field(default=())
    """Each GPU type, bought and rented: (whether it meets the limits, its row in `options`), its
    cheapest option within them, else the nearest to them."""
    unmet: str = ""
    """Why nothing meets the deadline and budget, naming the nearest option; empty when something does."""

    def value(self, q: str) -> pd.Series:
        """A quantity of every option, measured or predicted (for choosing; never for showing)."""
        return either(self.options, q)


def either(frame: pd.DataFrame, q: str, end: str = "") -> pd.Series:
    """`measured_{q}{end}` where measured, else `predicted_{q}{end}`."""
    return frame[f"measured_{q}{end}"].fillna(frame[f"predicted_{q}{end}"])


# ---- the settings ---------------------------------------------------------------------------------


def settings_of(cfg) -> PlanConfig:
    return PlanConfig(**OmegaConf.to_container(cfg.plan, resolve=True))


def tokens_asked(spec: str) -> float | None:
    """`plan.tokens` as a number of tokens, None for recipe or chinchilla; ValueError if it is none of these."""
    if spec in ("recipe", "chinchilla"):
        return None
    n = float(spec)
    if not math.isfinite(n) or n <= 0:
        raise ValueError(spec)
    return n


def problems(s: PlanConfig, gpus: list[str]) -> list[str]:
    """Every problem of the plan's settings at once, each naming the value and what is allowed."""
    out = []
    try:
        tokens_asked(str(s.tokens))
    except ValueError:
        out.append(f"plan.tokens={s.tokens} must be recipe, chinchilla or a number of tokens > 0 (3e11)")
    for key in ("max_days", "max_usd"):
        v = getattr(s, key)
        if v is not None and not v > 0:
            out.append(f"plan.{key}={v:g} must be > 0 (or null: no limit)")
    if s.max_nodes < 1:
        out.append(f"plan.max_nodes={s.max_nodes} must be >= 1")
    for key, least in (("usd_per_kwh", 0), ("grid_g_per_kwh", 0)):
        if getattr(s, key) < least:
            out.append(f"plan.{key}={getattr(s, key):g} must be >= {least}")
    if s.pue < 1:
        out.append(f"plan.pue={s.pue:g} must be >= 1 (the facility's power over its IT's)")
    unknown = [g for g in s.gpus if g not in gpus]
    if unknown:
        out.append(f"plan.gpus: {', '.join(unknown)} not a GPU type of conf/hardware/ (one of: {', '.join(gpus)})")
    return out


def _checked(overrides: list[str]):
    """The composed config of `overrides` (every problem of them raised at once) and its settings."""
    model = next((o.split("=", 1)[1] for o in overrides if o.startswith("model=")), "")
    wrong = []
    if not model:
        wrong.append(f"give model=NAME (one of: {', '.join(compose.options('model'))})")
    elif not compose.known("model", model):
        wrong.append(f"model={model}: no conf/model/{model}.yaml (one of: {', '.join(compose.options('model'))})")
    hardware = [o for o in overrides if o.split("=", 1)[0].lstrip("+~").startswith("hardware")]
    if hardware:
        wrong.append(
            f"{' '.join(hardware)}: suite-plan weighs every GPU type and count; "
            "choose the types with plan.gpus=[a6000,h100-sxm]"
        )
    bad_keys = [o for o in overrides if o.startswith("plan.") and o.split("=", 1)[0][5:] not in PLAN_KEYS]
    wrong += [f"{o}: no such setting (plan.{', plan.'.join(PLAN_KEYS)})" for o in bad_keys]
    if wrong:
        raise ReportError("; ".join(wrong))
    cfg = composed(overrides)
    s = settings_of(cfg)
    found = problems(s, list(compose.gpu_profiles()))
    if found:
        raise ReportError("; ".join(found))
    return cfg, s


# ---- the options ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Timed:
    """A budget's step time: the fastest `ok` trial of the store, or the best predicted configuration
    (`best`: its trial, whose regime its error is scored in; `base`: the budget's)."""

    base: Trial
    source: str
    config: str
    step_s: float
    lo_s: float
    hi_s: float
    trial_id: str = ""
    error_pct: tuple[float, float] = (math.nan, math.nan)
    best: Trial | None = None


def measured_best(frame: pd.DataFrame, base: Trial) -> pd.Series | None:
    """The fastest `ok` trial of `base`'s model, recipe (batch, sequence, precision) and budget in a
    results frame (`analysis.load`), or None."""
    if frame is None or frame.empty:
        return None
    same = frame[
        (frame["outcome"] == "ok")
        & (frame["model"] == base.model.name)
        & (frame["budget"] == budget_label(base))
        & (frame["global_batch"] == base.model.recipe.global_batch)
        & (frame["tokens_per_sample"] == base.tokens_per_sample)
        & (frame["precision"] == base.precision)
        & frame["step_time_s"].notna()
    ]
    return None if same.empty else same.loc[same["step_time_s"].idxmin()]


def predicted_error_pct(trial: Trial, n_params: int) -> tuple[float, float]:
    """(median, p90) of the |error| % scored for a predicted step time of `trial`'s regime
    (`suite.predict.regimes.error_label`: GPU class, engine, GPU count, size band; the nearest
    regime scored where its own has too few runs, as the label says); NaN where nothing is scored."""
    label = error_label(trial, "step", n_params)
    nan = float("nan")
    return (
        (label.median_pct, label.p90_pct if label.p90_pct is not None else label.median_pct)
        if label.scored
        else (nan, nan)
    )


def _n_params(base: Trial) -> int:
    """The model's parameters (tied ones once), from the predictor's cached trace."""
    return traced(Predictor.model_as_run(base), base.methods.attention, "none", base.precision).n_params


def _timed(cfg, frame, prices, keys) -> Timed | str:
    """The step time of one budget, measured or predicted, or why it cannot train the model."""
    base, _ = runs_in(compose.trial_from_cfg(cfg))
    m = measured_best(frame, base)
    if m is not None:
        lo, hi = m["step_time_ci_lo_s"], m["step_time_ci_hi_s"]
        return Timed(base, "measured", m["config"], float(m["step_time_s"]), float(lo), float(hi), m["trial_id"])
    try:
        b = predict_budget(cfg, prices, keys)
    except ReportError as e:
        return str(e)
    best = b.best
    if best is None:
        if not b.rows:
            return "no valid configuration"
        least = min(b.rows, key=lambda r: r["device_gib"])
        return (
            f"predicted not to fit: the least any configuration needs is {least['device_gib']:.1f} GiB per GPU "
            f"({least['config']}), of {b.base.hardware.mem_gib:g}"
        )
    if math.isnan(best["step_time_s"]):
        return f"no step time predicted for its best fit ({best['config']})"
    return Timed(b.base, "predicted", best["config"], best["step_time_s"], math.nan, math.nan, best=best["trial"])


_JOB: tuple = ()
"""What `_each_timed`'s forked workers read: inherited from the parent, never pickled."""


def _timed_at(i: int) -> Timed | str:
    cfgs, frame, prices, keys = _JOB
    return _timed(cfgs[i], frame, prices, keys)


def _each_timed(cfgs: list, frame, prices: Prices, keys, workers: int) -> list[Timed | str]:
    """`_timed` of each budget's config, in order; in `workers` forked processes where more than one
    is asked for (each budget's predictions are its own; a fork shares what the parent loaded, so
    nothing is imported again). Only for a process that has run no torch operation (a fork of one
    that has may hang in the child's first parallel region): suite-plan's own, one per CPU."""
    global _JOB
    if workers <= 1 or len(cfgs) < 2:
        return [_timed(c, frame, prices, keys) for c in cfgs]
    _JOB = (cfgs, frame, prices, keys)
    try:
        with multiprocessing.get_context("fork").Pool(min(workers, len(cfgs))) as pool:
            return pool.map(_timed_at, range(len(cfgs)), chunksize=1)
    finally:
        _JOB = ()


def _figures(t: Timed, steps: int, s: PlanConfig, prices: Prices, gpu: str, buy: bool) -> dict[str, float]:
    """The QUANTITIES of one option at its step time and both ends of its interval (`_lo`, `_hi`)."""
    hw = t.base.hardware
    n = t.base.devices
    purchase = est.owned_hardware_usd(prices, gpu, hw.count, t.base.nodes) if buy else math.nan
    rate = math.nan if buy else prices.cloud[gpu].usd_per_gpu_hour
    out = {}
    for end, step in (("", t.step_s), ("_lo", t.lo_s), ("_hi", t.hi_s)):
        days = est.training_days(step, steps)
        kwh = est.energy_kwh(hw.power_w, n, days, s.pue) if hw.power_w else math.nan
        if buy:
            power = est.electricity_usd(kwh, s.usd_per_kwh)
            usd = purchase + power
            run = est.owned_cost_usd(purchase, days, prices.amortization_years) + power
        else:
            usd = run = est.cloud_cost_usd(est.gpu_hours(days, n), rate)
        values = {"days": days, "usd": usd, "run_usd": run, "kwh": kwh, "co2e_kg": est.co2e_kg(kwh, s.grid_g_per_kwh)}
        out |= {f"{q}{end}": v for q, v in values.items()}
    return out


def _row(t: Timed, steps: int, s: PlanConfig, prices: Prices, gpu: str, buy: bool) -> dict:
    """One option: who it is, its source, and each figure in the column of its source."""
    b = t.base
    nodes = f" ({b.nodes} nodes x {b.hardware.count})" if b.nodes > 1 else ""
    price = (
        prices.owned_source
        if buy
        else f"{prices.cloud[gpu].provider}, {prices.cloud[gpu].source} ({prices.cloud[gpu].date})"
    )
    row = {
        "model": b.model.name,
        "option": f"{'buy' if buy else 'rent'} {b.devices}x {gpu}{nodes}",
        "acquisition": "buy" if buy else "rent",
        "gpu": gpu,
        "gpu_name": b.hardware.gpu,
        "gpus_per_node": b.hardware.count,
        "nodes": b.nodes,
        "n_gpus": b.devices,
        "budget": budget_label(b),
        "source": t.source,
        "config": t.config,
        "trial_id": t.trial_id,
        "hardware_usd": est.owned_hardware_usd(prices, gpu, b.hardware.count, b.nodes) if buy else math.nan,
        "usd_per_gpu_hour": math.nan if buy else prices.cloud[gpu].usd_per_gpu_hour,
        "price_source": price,
        "power_w": b.hardware.power_w or math.nan,
        "error_median_pct": t.error_pct[0],
        "error_p90_pct": t.error_pct[1],
    }
    figures = _figures(t, steps, s, prices, gpu, buy)
    for source in SOURCES:
        for k, v in figures.items():
            row[f"{source}_{k}"] = v if source == t.source else math.nan
    return row


def _tokens(s: PlanConfig, base: Trial, n_params) -> tuple[float, str]:
    r, per_step = base.model.recipe, base.model.recipe.global_batch * base.tokens_per_sample
    unit = "tokens" if base.unit == "token" else "images"
    asked = tokens_asked(str(s.tokens))
    if asked is not None:
        return asked, f"{unit} (plan.tokens)"
    if s.tokens == "chinchilla":
        if base.unit != "token":
            raise ReportError(f"plan.tokens=chinchilla: {base.model.name} trains on images; give a number or recipe")
        n = n_params()
        return CHINCHILLA_TOKENS_PER_PARAM * n, f"tokens (Chinchilla's 20 per parameter x {n:,} parameters)"
    return per_step * r.train_steps, f"{unit} (the recipe's: {r.train_steps:,} steps)"


def make_plan(overrides: list[str], prices: Prices, results: Results | None = None, workers: int = 1) -> Plan:
    """Every option for the model of `overrides` (Hydra's, `plan.*` among them; no hardware), each
    with its best configuration measured in `results` (default: read from `store.dir`, where it
    exists) or predicted, the budgets predicted in `workers` processes; the answer and whether
    anything meets the limits. ReportError for bad settings, every problem at once."""
    cfg, s = _checked(overrides)
    if results is None and Path(cfg.store.dir).exists():
        results = read_results(cfg.store.dir)
    frame = results.frame if results is not None else None
    keys = gpu_keys()
    weighed, unpriced = [], []
    for gpu in s.gpus or list(compose.gpu_profiles()):
        ways = [buy for buy in (True, False) if s.buy in (None, buy)]
        ways = [buy for buy in ways if (gpu in prices.gpu_price_usd if buy else gpu in prices.cloud)]
        (weighed if ways else unpriced).append((gpu, ways))
    rest = [o for o in overrides if not o.startswith("cluster.nodes=")]
    budgets = [
        (gpu, ways, composed([*rest, f"hardware={gpu}", f"hardware.count={count}", f"cluster.nodes={nodes}"]))
        for gpu, ways in weighed
        for nodes in range(1, s.max_nodes + 1)
        for count in GPU_COUNTS
    ]
    each = _each_timed([cfg for _, _, cfg in budgets], frame, prices, keys, workers)
    timed, cannot = [], []
    for (gpu, ways, one), t in zip(budgets, each, strict=True):
        if isinstance(t, str):
            cannot.append(f"{budget_label(compose.trial_from_cfg(one))}: {t}")
        else:
            timed.append((t, gpu, ways))
    first = (weighed or unpriced)[0][0]
    base, _ = runs_in(compose.trial_from_cfg(composed([*rest, f"hardware={first}", "hardware.count=1"])))
    n_params_cache: dict[str, int] = {}

    def n_params() -> int:
        if "n" not in n_params_cache:
            n_params_cache["n"] = _n_params(base)
        return n_params_cache["n"]

    tokens, why = _tokens(s, base, n_params)
    steps = math.ceil(tokens / (base.model.recipe.global_batch * base.tokens_per_sample))
    rows = []
    for t, gpu, ways in timed:
        if t.source == "predicted":
            err = predicted_error_pct(t.best, n_params())
            lo, hi = est.error_band(t.step_s, err[1])
            t = replace(t, lo_s=lo, hi_s=hi, error_pct=err)
        rows += [_row(t, steps, s, prices, gpu, buy) for buy in ways]
    options = _ranked(pd.DataFrame(rows))
    r = base.model.recipe
    sample = f"{r.seq_len} tokens" if base.unit == "token" else f"images of {r.image_size}x{r.image_size}"
    plan = Plan(
        model=base.model.name,
        settings=s,
        recipe=f"batch {r.global_batch} x {sample}, {base.precision}",
        tokens=tokens,
        tokens_why=why,
        steps=steps,
        options=options,
        cannot=tuple(cannot),
        unpriced=tuple(g for g, _ in unpriced),
        store=str(results.path) if results is not None else f"{cfg.store.dir} (absent)",
        error="each predicted row's own regime (GPU class, engine, GPU count, size band; suite.predict.regimes)",
    )
    return _answered(plan)


def _ranked(options: pd.DataFrame) -> pd.DataFrame:
    """The options by dollars up front, with the Pareto front of days against them marked."""
    if options.empty:
        return options.assign(on_front=pd.Series(dtype=bool), on_front_of_kind=pd.Series(dtype=bool))
    days, usd = either(options, "days"), either(options, "usd")
    options = options.assign(on_front=pareto(days, usd), on_front_of_kind=False)
    for _, g in options.groupby("acquisition"):
        options.loc[g.index, "on_front_of_kind"] = pareto(days[g.index], usd[g.index])
    order = sorted(options.index, key=lambda i: (usd[i], days[i]))
    return options.loc[order].reset_index(drop=True)


def _over(plan: Plan) -> pd.Series:
    """How far each option is over the limits: the larger of days / deadline and dollars / budget
    (0 where no limit is given); at most 1 is within them."""
    s, days, usd = plan.settings, plan.value("days"), plan.value("usd")
    ratios = [days / s.max_days if s.max_days is not None else days * 0]
    ratios.append(usd / s.max_usd if s.max_usd is not None else usd * 0)
    return pd.concat(ratios, axis=1).max(axis=1)


def _by_type(plan: Plan, over: pd.Series) -> tuple[tuple[str, int], ...]:
    """Each GPU type's option, bought and rented apart: its cheapest within the limits, else the
    nearest to them (the least over), with "yes" or how far over, in the order of days."""
    days, usd, picks = plan.value("days"), plan.value("usd"), []
    for _, g in plan.options.groupby(["acquisition", "gpu"], sort=False):
        inside = [i for i in g.index if over[i] <= 1]
        if inside:
            picks.append(("yes", min(inside, key=lambda i: (usd[i], days[i]))))
        else:
            i = min(g.index, key=lambda i: (over[i], usd[i]))
            picks.append((f"no: {over[i]:.2f}x", i))
    return tuple(sorted(picks, key=lambda p: (plan.options.loc[p[1], "acquisition"], days[p[1]])))


def limits(s: PlanConfig) -> str:
    both = [
        f"{s.max_days:g} days" if s.max_days is not None else "",
        f"${s.max_usd:,.0f}" if s.max_usd is not None else "",
    ]
    return " and ".join(x for x in both if x)


def _answered(plan: Plan) -> Plan:
    """`plan` with its answer: the cheapest option within the deadline (and budget), the fastest
    within the budget (and deadline); or, where nothing meets them, the nearest option."""
    s, o = plan.settings, plan.options
    if o.empty:
        return replace(
            plan, unmet=f"no option can train {plan.model}" + (": " + "; ".join(plan.cannot[:3]) if plan.cannot else "")
        )
    days, usd = plan.value("days"), plan.value("usd")
    over = _over(plan)
    plan = replace(plan, by_type=_by_type(plan, over))
    ok = over <= 1
    if not ok.any():
        i = int(over.idxmin())
        return replace(
            plan, unmet=f"nothing meets {limits(s)}; the nearest: {describe(plan, i)} ({over[i]:.2f}x the limit)"
        )
    inside = o[ok].index
    cheapest = min(inside, key=lambda i: (usd[i], days[i]))
    fastest = min(inside, key=lambda i: (days[i], usd[i]))
    deadline = f"within {s.max_days:g} days" if s.max_days is not None else "(no deadline given)"
    budget = f"within ${s.max_usd:,.0f}" if s.max_usd is not None else "(no budget given)"
    if s.max_days is not None and s.max_usd is not None:
        deadline = budget = f"within {limits(s)}"
    return replace(plan, answer=((f"cheapest {deadline}", cheapest), (f"fastest {budget}", fastest)))


# ---- what is shown --------------------------------------------------------------------------------


def _usd(x: float) -> str:
    return "n/a" if x is None or math.isnan(x) else f"${x:,.0f}"


def _days(x: float) -> str:
    return "n/a" if x is None or math.isnan(x) else f"{x:,.1f}" if x < 100 else f"{x:,.0f}"


def _with(fmt, x: float, lo: float, hi: float) -> str:
    """`x` and its interval; "unbounded" where only its low end is known (a p90 error of 100% or
    more puts no upper bound on the measurement: `estimates.error_band`)."""
    if math.isnan(lo) or lo == hi:
        return fmt(x)
    return f"{fmt(x)} [{fmt(lo)}, {'unbounded' if math.isnan(hi) else fmt(hi)}]"


def cell(row: pd.Series, q: str, fmt) -> str:
    """A figure of one option with its interval, from the column of its source."""
    p = f"{row['source']}_{q}"
    return _with(fmt, row[p], row[f"{p}_lo"], row[f"{p}_hi"])


def describe(plan: Plan, i: int) -> str:
    """One option in a line: what it is, every figure labelled with its source."""
    r = plan.options.loc[i]
    kwh = (
        "n/a"
        if math.isnan(r[f"{r['source']}_kwh"])
        else f"{r[f'{r.source}_kwh']:,.0f} kWh, {r[f'{r.source}_co2e_kg']:,.0f} kg CO2e"
    )
    return (
        f"{r['option']}, {r['source'].upper()}: {cell(r, 'days', _days)} days, {cell(r, 'usd', _usd)} up front "
        f"({cell(r, 'run_usd', _usd)} the run's cost), {kwh}; {r['config']}"
    )


FRONT_HEAD = ("option", "configuration", "days", "$ up front", "$ of the run", "kWh", "kg CO2e")


def _table(rows: pd.DataFrame, source: str, within: dict[int, str] | None = None) -> list[str]:
    """`rows` of one source as a text table, each figure's header naming the source; `within`: a
    first column, whether each row meets the limits."""
    head = [f"{source} {h}" if h not in ("option", "configuration") else h for h in FRONT_HEAD]
    head = ["within limits", *head] if within is not None else head
    body = [
        [
            *([within[i]] if within is not None else []),
            r["option"],
            r["config"] + (f" (trial {r['trial_id']})" if r["trial_id"] else ""),
            cell(r, "days", _days),
            cell(r, "usd", _usd),
            _usd(r[f"{source}_run_usd"]),
            "n/a" if math.isnan(r[f"{source}_kwh"]) else f"{r[f'{source}_kwh']:,.0f}",
            "n/a" if math.isnan(r[f"{source}_co2e_kg"]) else f"{r[f'{source}_co2e_kg']:,.0f}",
        ]
        for i, r in rows.iterrows()
    ]
    widths = [max(len(x) for x in col) for col in zip(head, *body, strict=True)]
    texts = 3 if within is not None else 2  # left-aligned: the words; right-aligned: the figures

    def line(cells: list[str]) -> str:
        return "  ".join(
            c.ljust(w) if k < texts else c.rjust(w) for k, (c, w) in enumerate(zip(cells, widths, strict=True))
        )

    return [line(head), "-" * len(line(head)), *(line(b) for b in body)]


def lines(plan: Plan) -> list[str]:
    """What suite-plan prints: the question, the answer, the front (measured and predicted apart),
    what cannot train the model and what has no price, how each figure is made."""
    s, o = plan.settings, plan.options
    ways = {None: "bought or rented", True: "bought", False: "rented"}[s.buy]
    nodes = "1 node" if s.max_nodes == 1 else f"1-{s.max_nodes} nodes"
    n_measured = int((o["source"] == "measured").sum()) if len(o) else 0
    out = [
        f"suite-plan: {plan.model} on {plan.tokens:,.0f} {plan.tokens_why}: {plan.steps:,} steps of {plan.recipe}",
        f"  weighed: {len(o)} options ({len({*o['gpu']}) if len(o) else 0} GPU types x 1, 2, 4, 8 GPUs on {nodes}, "
        f"{ways})" + (f"; limits: {limits(s)}" if limits(s) else "; no deadline or budget given"),
        f"  store {plan.store}: {n_measured} options measured, the rest predicted",
        "",
    ]
    if plan.unmet:
        out.append(f"ANSWER: {plan.unmet}")
    else:
        out += ["ANSWER"] + [f"  {what}: {describe(plan, i)}" for what, i in plan.answer]
    front = o[o["on_front"]] if len(o) else o
    out += ["", f"Pareto front ({len(front)} of {len(o)} options): no other option both faster and cheaper up front"]
    for source in SOURCES:
        rows = front[front["source"] == source]
        if len(rows):
            out += ["  MEASURED" if source == "measured" else "  PREDICTED, not measured"]
            out += ["    " + x for x in _table(rows, source)]
    within = dict((i, w) for w, i in plan.by_type)
    picked = o.loc[[i for _, i in plan.by_type]]
    out += ["", f"Each GPU type, {ways}: its cheapest option within the limits, else the nearest to them"]
    for source in SOURCES:
        rows = picked[picked["source"] == source]
        if len(rows):
            out += ["  MEASURED" if source == "measured" else "  PREDICTED, not measured"]
            out += ["    " + x for x in _table(rows, source, within)]
    out += [""]
    if plan.cannot:
        out.append(f"Cannot train {plan.model} ({len(plan.cannot)}): " + "; ".join(plan.cannot))
    if plan.unpriced:
        out.append(f"Not weighed, no price in conf/prices/ to have them {ways}: {', '.join(plan.unpriced)}")
    out += notes(plan)
    return out


def notes(plan: Plan) -> list[str]:
    s = plan.settings
    return [
        "Measured: the fastest ok trial of the store for that budget and recipe, its interval the median's. "
        f"Predicted: suite.predict's best configuration, its interval where the measurement would lie at the p90 "
        f"of the |error| scored for it: {plan.error}; where a regime has too few scored runs, the nearest one's; "
        "at 100% or more the band has no upper end (unbounded; blank in the tables).",
        f"Up front: renting, GPU-hours x the price per GPU-hour (conf/prices/cloud.yaml, dated); buying, the purchase "
        f"price (conf/prices/owned.yaml, Khandelwal et al. 2024) and the run's electricity at ${s.usd_per_kwh:g}/kWh. "
        "The run's cost: the hardware amortized over its life, as the paper does, and the electricity.",
        f"Energy: the GPUs' board power at its datasheet maximum (conf/hardware/) x hours x PUE {s.pue:g} (the host "
        f"is not counted); CO2e at {s.grid_g_per_kwh:g} g/kWh (plan.grid_g_per_kwh).",
    ]


# ---- the report table and the figure ---------------------------------------------------------------

TABLE_TITLE = (
    "The plan: the cheapest and fastest options within the limits, and the Pareto front of days against dollars"
)


def _shown(plan: Plan) -> pd.DataFrame:
    """The answer's options, then the rest of the front, then each GPU type's (`Plan.by_type`), each
    with what it answers."""
    o = plan.options.copy()
    answers: dict[int, list[str]] = {}
    for what, i in plan.answer:
        answers.setdefault(i, []).append(what)
    for within, i in plan.by_type:
        over = within.removeprefix("no: ")
        what = "cheapest within the limits" if within == "yes" else f"nearest to the limits ({over} them)"
        answers.setdefault(i, []).append(f"its GPU type's {what}")
    for i in o.index[o["on_front"]]:
        answers.setdefault(i, []).append("on the front")
    o["answer"] = [", ".join(answers.get(i, [])) for i in o.index]
    o["limits"] = limits(plan.settings) or "none"
    o["tokens"] = plan.tokens
    answered = {i for _, i in plan.answer}
    rank = pd.Series([0 if i in answered else 1 if o.loc[i, "on_front"] else 2 for i in o.index], index=o.index)
    keep = o["answer"] != ""
    return o[keep].loc[rank[keep].sort_values(kind="stable").index]


def plan_table(plans: list[Plan]) -> Table:
    """The answer and the Pareto front of each plan as one report table: `plan`.md/.csv/.tex."""
    frame = pd.concat([_shown(p) for p in plans], ignore_index=True) if plans else pd.DataFrame()
    cols = [
        Column("model", "model"),
        Column("answer", "answer"),
        Column("option", "option"),
        Column("source", "source"),
        Column("config", "configuration"),
    ]
    headers = {"days": ("days", "days"), "usd": ("$ up front", "usd"), "run_usd": ("$ of the run", "usd"),
               "kwh": ("kWh", "hours"), "co2e_kg": ("kg CO2e", "hours")}  # fmt: skip
    for q, (name, fmt) in headers.items():
        for source in SOURCES:
            key = f"{source}_{q}"
            cols.append(Column(key, f"{source} {name}", fmt, interval=(f"{key}_lo", f"{key}_hi")))
    cols += [
        Column("hardware_usd", "purchase price", "usd"),
        Column("usd_per_gpu_hour", "$ per GPU-hour", "sci"),
        Column("limits", "limits"),
        Column("trial_id", "measured trial"),
        Column("price_source", "price source"),
    ]
    notes_ = []
    for p in plans:
        notes_ += [f"{p.model}: {p.tokens:,.0f} {p.tokens_why}, {p.steps:,} steps of {p.recipe}."]
        if p.unmet:
            notes_.append(f"{p.model}: {p.unmet}.")
        if p.cannot:
            notes_.append(f"{p.model} cannot train on: " + "; ".join(p.cannot) + ".")
        if p.unpriced:
            notes_.append(f"Not weighed for {p.model} (no price in conf/prices/): {', '.join(p.unpriced)}.")
    if plans:
        notes_ += notes(plans[0])
    return Table("plan", TABLE_TITLE, frame, tuple(cols), tuple(notes_))


FIGURE_COLUMNS = (
    "model", "tokens", "unit", "option", "acquisition", "gpu", "gpu_name", "n_gpus", "source", "config", "on_front",
    "on_front_of_kind",
    *(f"{s}_{q}{end}" for q in ("days", "usd") for s in SOURCES for end in ("", "_lo", "_hi")),
    "max_days", "max_usd", "trial_id",
)  # fmt: skip


def figure_data(plan: Plan) -> pd.DataFrame:
    """What the plan's figure draws, every row of it: each option weighed, its days and dollars up
    front (measured or predicted, with their intervals), whether it is on the front, the limits."""
    s = plan.settings
    unit = plan.tokens_why.split(" ")[0]
    o = plan.options.assign(tokens=plan.tokens, unit=unit, max_days=s.max_days, max_usd=s.max_usd)
    return o[list(FIGURE_COLUMNS)].astype({"max_days": float, "max_usd": float})


def caption(plan: Plan) -> str:
    o = plan.options
    n_measured = int((o["source"] == "measured").sum())
    return (
        f"The plan for {plan.model}: dollars up front against days to train on {plan.tokens:,.0f} {plan.tokens_why}, "
        f"each of the {len(o)} options weighed ({n_measured} measured, filled; the rest predicted, hollow): rented "
        "above, bought below, a colour and marker per GPU type, bars at the ends of each interval (measured: the "
        "median's; predicted: where the measurement would lie at the p90 of the |error| scored in its regime), each "
        "labelled with its GPU count where it is on its panel's front (dashed: renting only, buying only); ringed: "
        "on the front of both, the options no other beats on days and dollars together. Dotted and dash-dotted "
        "lines: the deadline and the budget, where given. " + " ".join(notes(plan)[1:]) + "\n"
    )


def write_plan(plan: Plan, out: Path) -> list[Path]:
    """The plan's table (plan.md, .csv, .tex), every option (options.csv) and its figure (front.pdf,
    .png, .csv: the data drawn, .txt: the caption) in out/<model>/."""
    from analysis import plotting  # matplotlib, imported only to draw

    d = Path(out) / plan.model
    paths = report_table.write([plan_table([plan])], d)
    plan.options.to_csv(d / "options.csv", index=False)
    paths.append(d / "options.csv")
    if len(plan.options):
        stem = d / "front"
        data = figure_data(plan)
        paths += plotting.drawn(plotting.plan_front, data, stem)
        data.to_csv(stem.with_suffix(".csv"), index=False)
        stem.with_suffix(".txt").write_text(caption(plan), encoding="utf-8")
        paths += [stem.with_suffix(".csv"), stem.with_suffix(".txt")]
    return paths


# ---- asked for by the reports: --plan MODEL[,KEY=VALUE...] --------------------------------------------

PLAN_HELP = (
    "MODEL[,KEY=VALUE...]: the plan of suite-plan for a model of conf/model (e.g. pythia-1b,plan.max_days=30), "
    "its measured options read from the results given; repeatable. The table plan.md/.csv/.tex (tables), a "
    "section of its own (leaderboard)"
)


def asked(specs: list[str]) -> list[list[str]]:
    """The overrides of each --plan value, each checked before anything is read or predicted (every
    problem of every value raised at once, ReportError)."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    out, wrong = [], []
    for spec in specs:
        model, *extra = _parts(spec)
        overrides = [f"model={model}", *extra]
        bad = [f"{e!r} is not KEY=VALUE" for e in extra if "=" not in e or e.startswith("=")]
        try:
            if not bad:
                _checked(overrides)
        except (ReportError, HydraException, OmegaConfBaseException, compose.OverrideError) as e:
            cause = f" ({str(e.__cause__).splitlines()[0]})" if e.__cause__ and str(e.__cause__) else ""
            bad.append(str(e).splitlines()[0] + cause)
        wrong += [f"{spec!r}: {b}" for b in bad]
        out.append(overrides)
    if wrong:
        raise ReportError("--plan: " + "; ".join(wrong))
    return out


def payload(plan: Plan) -> dict:
    """What the leaderboard shows of a plan (page.js, a section of its own): the question, the
    answer, the answer's and the front's options with each figure in the column of its source."""
    shown = _shown(plan)
    figures = [f"{src}_{q}{end}" for q in QUANTITIES for src in SOURCES for end in ("", "_lo", "_hi")]
    keys = ["option", "answer", "source", "config", "trial_id", "on_front", "hardware_usd", *figures]

    def plain(v):
        if isinstance(v, float) and math.isnan(v):
            return None
        return v.item() if hasattr(v, "item") else v

    return {
        "model": plan.model,
        "question": lines(plan)[0].removeprefix("suite-plan: "),
        "answer": [f"{what}: {describe(plan, i)}" for what, i in plan.answer] or [f"Nothing: {plan.unmet}"],
        "rows": [{k: plain(r[k]) for k in keys} for _, r in shown.iterrows()],
        "n_options": len(plan.options),
        "notes": [
            *([f"Cannot train {plan.model}: " + "; ".join(plan.cannot)] if plan.cannot else []),
            *([f"Not weighed, no price in conf/prices/: {', '.join(plan.unpriced)}"] if plan.unpriced else []),
            *notes(plan),
        ],
    }
