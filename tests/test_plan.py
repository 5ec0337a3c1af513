"""suite-plan (analysis/plan.py, cli/plan.py): every GPU type and count, bought or rented, measured
where the store holds a trial and predicted elsewhere, the answer, the front and every exit path.

Pythia-14M's recipe as the fixtures measured it (batch 16 x 128 tokens, fp32) on two GPU types keeps
each plan to seconds; a fixture record relabelled to 2x RTX 3090 (tests/test_leaderboard.py's
`relabel`) is the measured option beside the predicted ones.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import matplotlib
import pandas as pd
import pytest

import analysis.plan
from analysis import plotting
from analysis.estimates import co2e_kg, energy_kwh, error_band, training_days
from analysis.load import read_results
from analysis.plan import Plan, _answered, cell, figure_data, lines, make_plan, plan_table
from analysis.prices import load_prices
from cli.plan import main
from suite.config.compose import gpu_profiles
from suite.config.schema import PREDICTION_ONLY, Trial
from suite.labels import config_label
from tests.test_figures import points_outside
from tests.test_leaderboard import browser, relabel  # noqa: F401 - browser: the fixture

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests/fixtures/results"
RECIPE = ["model=pythia-14m", "model.recipe.seq_len=128", "model.recipe.global_batch=16", "model.recipe.precision=fp32"]
GPUS = "plan.gpus=[rtx-3090,h100-sxm]"


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    """A store with one GPU record of the recipe: the fastest 2-worker fixture, on 2 RTX 3090s."""
    d = tmp_path_factory.mktemp("store")
    real = [json.loads(p.read_text()) for p in sorted(FIXTURES.glob("*.json"))]
    ok = [r for r in real if r["outcome"] == "ok" and r["trial"]["hardware"]["name"] == "cpu-x2"]
    ok = [r for r in ok if r["trial"]["model"]["name"] == "pythia-14m"]
    rec = relabel(min(ok, key=lambda r: r["metrics"]["step_time_s"]), "pythia-14m", "rtx-3090", 2)
    (d / f"{rec['trial_id']}.json").write_text(json.dumps(rec))
    return d


@pytest.fixture(scope="module")
def plan(store, tmp_path_factory) -> Plan:
    out = tmp_path_factory.mktemp("plan")
    return make_plan([*RECIPE, GPUS, f"store.dir={store}", f"plan.out={out}"], load_prices())


def test_measured_where_the_store_holds_a_trial_predicted_elsewhere_each_in_its_own_columns(plan, store):
    o = plan.options
    measured = o[o["source"] == "measured"]
    assert set(measured["budget"]) == {"rtx-3090-x2"} and set(measured["acquisition"]) == {"buy", "rent"}
    assert set(o["gpu"]) == {"rtx-3090", "h100-sxm"} and len(o) == 2 * 2 * 4  # each bought or rented, 4 counts
    for source, other in (("measured", "predicted"), ("predicted", "measured")):
        rows = o[o["source"] == source]
        assert rows[[c for c in o if c.startswith(f"{source}_")]].notna().all().all(), source
        assert rows[[c for c in o if c.startswith(f"{other}_")]].isna().all().all(), source
    rec = json.loads(next(store.glob("*.json")).read_text())
    m = measured.iloc[0]
    assert m["trial_id"] == rec["trial_id"]
    steps = plan.steps
    assert m["measured_days"] == pytest.approx(training_days(rec["metrics"]["step_time_s"], steps))
    loaded = read_results(store).frame.iloc[0]  # the record as the reports read it: its median's interval
    assert m["measured_days_lo"] == pytest.approx(training_days(loaded["step_time_ci_lo_s"], steps))
    assert m["measured_days_hi"] == pytest.approx(training_days(loaded["step_time_ci_hi_s"], steps))
    p = o[o["source"] == "predicted"].iloc[0]
    lo, hi = error_band(p["predicted_days"], p["error_p90_pct"])
    assert (p["predicted_days_lo"], p["predicted_days_hi"]) == pytest.approx((lo, hi))
    assert p["predicted_days_lo"] < p["predicted_days"] < p["predicted_days_hi"]


def test_dollars_energy_and_co2e_follow_the_days(plan):
    s, prices = plan.settings, load_prices()
    for _, r in plan.options.iterrows():
        src, n = r["source"], r["n_gpus"]
        days = r[f"{src}_days"]
        kwh = energy_kwh(gpu_profiles()[r["gpu"]]["power_w"], n, days, s.pue)
        assert r[f"{src}_kwh"] == pytest.approx(kwh) and r[f"{src}_co2e_kg"] == pytest.approx(co2e_kg(kwh, 480))
        if r["acquisition"] == "rent":
            bill = days * 24 * n * prices.cloud[r["gpu"]].usd_per_gpu_hour
            assert r[f"{src}_usd"] == pytest.approx(bill) == r[f"{src}_run_usd"]
        else:  # the purchase up front; the run's cost amortized over 5 years, with the electricity either way
            power = kwh * s.usd_per_kwh
            assert r[f"{src}_usd"] == pytest.approx(r["hardware_usd"] + power)
            assert r[f"{src}_run_usd"] == pytest.approx(r["hardware_usd"] * days / (5 * 365) + power)


def test_the_answer_first_then_the_front_every_figure_labelled(plan):
    text = lines(plan)
    at = next(i for i, line in enumerate(text) if line.startswith("ANSWER"))
    assert text[at + 1].lstrip().startswith("cheapest (no deadline given): ")
    assert text[at + 2].lstrip().startswith("fastest (no budget given): ")
    assert all(("MEASURED" in line) != ("PREDICTED" in line) for line in text[at + 1 : at + 3])
    front = plan.options[plan.options["on_front"]]
    usd = front["measured_usd"].fillna(front["predicted_usd"])
    days = front["measured_days"].fillna(front["predicted_days"])
    assert (days.sort_values().index == usd.sort_values(ascending=False).index).all()  # faster costs more
    body = "\n".join(text)
    assert ("  MEASURED" in body) == (front["source"] == "measured").any() and "  PREDICTED, not measured" in body
    heads = [line for line in text if "option" in line and "days" in line]
    assert heads and all(("measured days" in h) != ("predicted days" in h) for h in heads)
    table = plan_table([plan])
    for c in table.columns:  # a figure's header says whose it is; a price is neither
        if c.fmt in ("days", "hours") or c.key.endswith("usd") and c.key != "hardware_usd":
            assert c.header.split()[0] in ("measured", "predicted"), c.header


def test_each_gpu_type_bought_and_rented_its_cheapest_within_the_limits_else_the_nearest(plan):
    o, days, usd = plan.options, plan.value("days"), plan.value("usd")
    fastest_of_each = days.groupby([o["acquisition"], o["gpu"]]).min()
    deadline = (fastest_of_each.min() + fastest_of_each.max()) / 2  # some types make it, some do not
    p = _answered(replace(plan, settings=replace(plan.settings, max_days=deadline)))
    kinds = [(o.loc[i, "acquisition"], o.loc[i, "gpu"]) for _, i in p.by_type]
    assert sorted(kinds) == sorted(fastest_of_each.index)
    for within, i in p.by_type:
        same = o[(o["acquisition"] == o.loc[i, "acquisition"]) & (o["gpu"] == o.loc[i, "gpu"])].index
        inside = [j for j in same if days[j] <= deadline]
        if inside:
            assert within == "yes" and usd[i] == min(usd[j] for j in inside)
        else:
            assert days[i] == days[same].min() and within == f"no: {days[i] / deadline:.2f}x"
    assert {w == "yes" for w, _ in p.by_type} == {True, False}
    section = "\n".join(lines(p)).split("Each GPU type")[1].split("\n\n")[0]
    assert "within limits  option" in section and all(o.loc[i, "option"] in section for _, i in p.by_type)
    assert "rtx-3090" in section and "h100-sxm" in section
    shown = plan_table([p]).frame
    assert all(o.loc[i, "option"] in set(shown["option"]) for _, i in p.by_type)


def test_the_figure_draws_every_point_of_its_csv(plan):
    data = figure_data(plan)
    with matplotlib.rc_context(plotting.STYLE):
        fig = plotting.plan_front(data)
    drawn = sum(len(line.get_xdata()) for ax in fig.axes for line in ax.get_lines() if line.get_marker() != "None")
    assert len(data) == len(plan.options) and drawn >= len(data)
    assert points_outside(fig) == []


def test_a_predicted_band_is_the_error_of_its_best_configurations_regime(monkeypatch):
    """The error a predicted row carries is asked of the configuration it shows (its engine, GPU
    count, ...: its regime), not of the budget's base trial."""
    asked = []

    def error_of(trial, n_params):
        asked.append(trial)
        return 10.0, 20.0

    monkeypatch.setattr(analysis.plan, "predicted_error_pct", error_of)
    few = ["search.engines=[deepspeed]", "search.recomputes=[none]", "plan.gpus=[h100-sxm]", "plan.buy=false"]
    p = make_plan([*RECIPE, *few, "store.dir=/nonexistent"], load_prices())
    assert [config_label(t, t.gas) for t in asked] == list(p.options.sort_values("n_gpus")["config"])
    assert (p.options["error_p90_pct"] == 20.0).all()
    o = p.options
    bands = [end for days in o["predicted_days"] for end in error_band(days, 20.0)]
    assert [end for pair in zip(o["predicted_days_lo"], o["predicted_days_hi"], strict=True) for end in pair] == (
        pytest.approx(bands)
    )


def test_a_band_without_an_upper_end_says_unbounded():
    """A p90 error of 100% or more bounds the measurement from below only: the text says so."""
    lo, hi = error_band(10.0, 150.0)
    row = pd.Series({"source": "predicted", "predicted_days": 10.0, "predicted_days_lo": lo, "predicted_days_hi": hi})
    assert math.isnan(hi) and cell(row, "days", "{:g}".format) == "10 [4, unbounded]"
    bounded = row.copy()
    bounded["predicted_days_hi"] = error_band(10.0, 20.0)[1]
    assert cell(bounded, "days", "{:g}".format) == "10 [4, 12.5]"


def test_tokens_recipe_chinchilla_or_a_number(plan):
    assert plan.tokens == 16 * 128 * 143_000 and plan.steps == 143_000
    few = make_plan([*RECIPE, "plan.gpus=[h100-sxm]", "plan.tokens=1e7", "store.dir=/nonexistent"], load_prices())
    assert few.steps == math.ceil(1e7 / (16 * 128)) and few.store.endswith("(absent)")
    chin = make_plan([*RECIPE, "plan.gpus=[h100-sxm]", "plan.tokens=chinchilla"], load_prices())
    assert chin.tokens == 20 * int(chin.tokens_why.split("x ")[1].split()[0].replace(",", "")) > 0


def test_limits_nothing_meets_exit_2_naming_the_nearest(store, tmp_path, capsys):
    args = [*RECIPE, GPUS, f"store.dir={store}", f"plan.out={tmp_path}", "plan.max_days=1e-6", "plan.max_usd=1e-3"]
    assert main(args, workers=1) == 2
    out, err = capsys.readouterr()
    assert "ANSWER: nothing meets 1e-06 days and $0" in out and (tmp_path / "pythia-14m" / "front.png").exists()
    assert err.startswith("suite-plan: error: nothing meets") and "the nearest: " in err and err.count("\n") == 1
    assert main([*RECIPE, GPUS, f"store.dir={store}", f"plan.out={tmp_path}", "plan.max_days=1e6"], workers=1) == 0
    assert "cheapest within 1e+06 days: " in capsys.readouterr().out


@pytest.mark.parametrize(
    "args, says",
    [
        (["model=pythia-1b", "plan.max_days=-3"], "plan.max_days=-3 must be > 0"),
        (["model=pythia-1b", "plan.max_usd=0", "plan.pue=0.5"], "plan.max_usd=0 must be > 0 (or null: no limit); "),
        (["model=pythia-1b", "plan.gpus=[tpu]"], "plan.gpus: tpu not a GPU type of conf/hardware/"),
        (["model=nope"], "model=nope: no conf/model/nope.yaml"),
        (["plan.max_days=3"], "give model=NAME"),
        (["model=pythia-1b", "hardware=a6000"], "choose the types with plan.gpus="),
        (["model=pythia-1b", "plan.tokens=many"], "plan.tokens=many must be recipe, chinchilla or a number"),
        (["model=pythia-1b", "plan.max_days=soon"], "could not be converted to Float"),
        (["model=pythia-1b", "plan.deadline=3"], "plan.deadline=3: no such setting"),
        (["model=pythia-1b", "--fast"], "--fast: not an option of suite-plan"),
    ],
)
def test_bad_input_exits_2_with_one_line(args, says, capsys):
    assert main(args, workers=1) == 2
    out, err = capsys.readouterr()
    assert says in err and err.count("\n") == 1 and "Traceback" not in err and out == ""


def test_the_command_from_any_directory_exits_2_without_a_traceback(tmp_path):
    """The exit codes of the installed command's process: bad input is 2, one line, from any folder."""
    for args in (["model=nope"], ["model=pythia-1b", "plan.max_nodes=0"]):
        r = subprocess.run([sys.executable, "-m", "cli.plan", *args], cwd=tmp_path, capture_output=True, text=True,
                           env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}, timeout=120)  # fmt: skip
        assert r.returncode == 2 and r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, r.stderr
    assert "plan.max_nodes=0 must be >= 1" in r.stderr


def test_the_command_predicts_in_forked_workers_as_one_process_does(plan, store, tmp_path):
    """The command in a process of its own, from another folder, its budgets predicted by 2 forked
    workers: every option as the plan made in one process has it (one GPU type's, to be quick)."""
    code = "import sys; from cli.plan import main; sys.exit(main(sys.argv[1:], workers=2))"
    args = [*RECIPE, "plan.gpus=[h100-sxm]", f"store.dir={store}", f"plan.out={tmp_path / 'out'}"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, "-c", code, *args], cwd=tmp_path, capture_output=True, text=True, env=env,
                       timeout=300)  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    forked = pd.read_csv(tmp_path / "out" / "pythia-14m" / "options.csv")
    one = plan.options[plan.options["gpu"] == "h100-sxm"]
    assert list(forked["option"]) == list(one["option"]) and list(forked["config"]) == list(one["config"])
    for c in ("measured_days", "predicted_days", "predicted_days_hi", "measured_usd", "predicted_usd"):
        assert forked[c].to_numpy() == pytest.approx(one[c].to_numpy(), nan_ok=True), c


def test_board_power_is_on_every_gpu_and_out_of_the_trial_id():
    assert {"power_w", "power_source"} <= set(PREDICTION_ONLY)
    for gpu, d in gpu_profiles().items():
        assert d["power_w"] > 0 and d["power_source"], gpu
    for path in sorted(FIXTURES.glob("*.json")):  # records made before the field keep their ids
        rec = json.loads(path.read_text())
        rec["trial"]["hardware"]["power_w"] = 123.0
        assert Trial.from_json(rec["trial"]).id == rec["trial_id"]


def test_the_reports_show_the_plan_apart(store, tmp_path, capsys):
    from cli.report import main as report_main
    from tests.test_leaderboard import page_data

    spec = ",".join([RECIPE[0].split("=")[1], *RECIPE[1:], GPUS, "plan.max_days=1e6"])
    assert report_main(["tables", str(store), "--out", str(tmp_path), "--plan", spec]) == 0
    table = pd.read_csv(tmp_path / "plan.csv")
    assert {"measured_days", "predicted_days"} <= set(table.columns) and (table["answer"].fillna("") != "").any()
    assert "### The plan" in capsys.readouterr().out and (tmp_path / "plan.tex").exists()
    page = tmp_path / "board.html"
    assert report_main(["leaderboard", str(store), "-o", str(page), "--no-figures", "--plan", spec]) == 0
    data = page_data(page)
    (p,) = data["plan"]
    assert p["model"] == "pythia-14m" and p["answer"][0].startswith("cheapest within 1e+06 days")
    assert all(r["source"] in ("measured", "predicted") for r in p["rows"])
    other = {"measured": "predicted", "predicted": "measured"}
    assert all(r[f"{other[r['source']]}_days"] is None and r[f"{r['source']}_days"] for r in p["rows"])
    assert {r["trial_id"] for r in data["rows"]} == {f.stem for f in store.glob("*.json")}  # no plan row in it
    assert report_main(["tables", str(store), "--plan", "pythia-1b,plan.max_days=-1"]) == 2


def test_the_leaderboards_plan_section_in_a_browser(store, tmp_path, browser):  # noqa: F811 - the fixture
    """The Plan section drawn by page.js: shown, the answer first, each row's figures in its source's
    columns only, no error in the console."""
    from selenium.webdriver.common.by import By

    from cli.report import main as report_main

    spec = ",".join([RECIPE[0].split("=")[1], *RECIPE[1:], GPUS, "plan.max_days=1e6"])
    page = tmp_path / "board.html"
    assert report_main(["leaderboard", str(store), "-o", str(page), "--no-figures", "--plan", spec]) == 0
    browser.get(page.as_uri())
    section = browser.find_element(By.ID, "plan")
    assert section.is_displayed() and "cheapest within 1e+06 days: " in section.text
    heads = [th.get_attribute("data-key") for th in section.find_elements(By.CSS_SELECTOR, ".plan-table th")]
    rows = section.find_elements(By.CSS_SELECTOR, ".plan-table tbody tr")
    assert rows and "rtx-3090" in section.text and "h100-sxm" in section.text  # each GPU type's pick
    for tr in rows:
        source = "measured" if "measured" in tr.get_attribute("class").split() else "predicted"
        other = {"measured": "predicted", "predicted": "measured"}[source]
        texts = dict(zip(heads, (td.text for td in tr.find_elements(By.CSS_SELECTOR, "td")), strict=True))
        assert texts[f"{source}_days"] and texts[f"{source}_usd"], texts
        assert not any(texts[k] for k in heads if k.startswith(f"{other}_")), texts
    assert [e for e in browser.get_log("browser") if e["level"] == "SEVERE"] == []
