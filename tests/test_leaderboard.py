"""The leaderboard page: built from real trial results, checked in a real headless browser.

The results are the real CPU trial files of tests/fixtures/results (made by suite-bench:
runs, out-of-memory and invalid outcomes on cpu-x1, cpu-x2 and cpu-x2-1gb, one run each)
and tests/fixtures/repeats (trials of 3 runs each, and trials whose later run failed). The
GPU-shaped budgets, the hostile model name and the twin of the fastest repeated trial are
copies of those real records with only their identity changed (hardware profile and count,
model name, attention, trial id): their measurements are the CPU ones, which is all the page
needs to be tested. The twin has the fastest trial's very runs, so the two are tied.

The browser is Debian's `chromium` driven by Selenium through `chromium-driver`; without
them the browser tests skip. A screenshot is saved to tests/artifacts/leaderboard.png.
"""

from __future__ import annotations

import copy
import json
import math
import re
import shutil
import tempfile
from pathlib import Path

import pandas as pd
import pytest
from omegaconf import OmegaConf

from analysis.estimates import add_estimates
from analysis.load import load_results, read_results
from analysis.prices import load_prices
from analysis.tables import best_per_budget, tied_with_fastest
from cli.report import main as report_main
from leaderboard.callback import WriteLeaderboard
from leaderboard.page import script_json, write_leaderboard
from suite.config import Trial
from suite.config.compose import gpu_profiles

FIXTURES = Path(__file__).parent / "fixtures" / "results"
REPEATS = Path(__file__).parent / "fixtures" / "repeats"
HOSTILE = '<script>window.__pwned=1;alert(1)</script><img src=x onerror="window.__pwned=2">'
ARTIFACTS = Path(__file__).parent / "artifacts"
CHROMIUM, DRIVER = shutil.which("chromium"), shutil.which("chromedriver")
CHROMIUM_FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--window-size=1366,900", "--hide-scrollbars",
)  # fmt: skip
# GPU-shaped budgets of a "pythia-160m": (GPU profile, count) <- the real records of (model, hardware).
GPU_BUDGETS = {
    ("a6000", 1): ("pythia-31m", "cpu-x2-1gb"),
    ("a6000", 2): ("pythia-14m", "cpu-x2"),
    ("a6000", 4): ("pythia-14m", "cpu-x1"),
    ("rtx-3090", 2): ("pythia-31m", "cpu-x2"),
    ("rtx-3090", 4): ("pythia-14m", "cpu-x2-1gb"),
}


def relabel(rec: dict, model: str, gpu: str, count: int) -> dict:
    """A copy of a real record with only its identity changed: hardware, model name, trial id."""
    rec = copy.deepcopy(rec)
    rec["trial"]["hardware"].update(gpu_profiles()[gpu], name=f"{gpu}-x{count}", count=count)
    rec["trial"]["model"]["name"] = model
    rec["trial_id"] = Trial.from_json(rec["trial"]).id
    return rec


def twin(rec: dict) -> dict:
    """A copy of a real record under another configuration's name (eager attention): tied with it."""
    rec = copy.deepcopy(rec)
    rec["trial"]["methods"]["attention"] = "eager"
    rec["trial_id"] = Trial.from_json(rec["trial"]).id
    return rec


def fastest_repeated() -> dict:
    recs = [json.loads(p.read_text()) for p in sorted(REPEATS.glob("*.json"))]
    ok = [r for r in recs if r["outcome"] == "ok" and r["trial"]["model"]["name"] == "tiny-neox"]
    return min(ok, key=lambda r: r["metrics"]["step_time_s"])


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("results")
    real = [json.loads(p.read_text()) for p in [*sorted(FIXTURES.glob("*.json")), *sorted(REPEATS.glob("*.json"))]]
    for rec in real:
        (d / f"{rec['trial_id']}.json").write_text(json.dumps(rec))
    copies = [
        relabel(rec, "pythia-160m", gpu, n)
        for (gpu, n), source in GPU_BUDGETS.items()
        for rec in real
        if (rec["trial"]["model"]["name"], rec["trial"]["hardware"]["name"]) == source
    ]
    copies.append(relabel(next(r for r in real if r["outcome"] == "ok"), HOSTILE, "a6000", 2))
    copies.append(twin(fastest_repeated()))
    for rec in copies:
        (d / f"{rec['trial_id']}.json").write_text(json.dumps(rec))
    (d / "torn.json").write_text('{"schema": "suite.trial/1", ')
    return d


@pytest.fixture(scope="module")
def frame(results) -> pd.DataFrame:
    """What analysis makes of the results: the page must show the same rows and winners."""
    return add_estimates(load_results(results)[0], load_prices())


@pytest.fixture(scope="module")
def page(results, tmp_path_factory) -> Path:
    read = read_results(results)
    assert len(read.messages) == 1 and "torn.json" in read.messages[0]
    out, _ = write_leaderboard(read, tmp_path_factory.mktemp("page") / "index.html")
    return out


@pytest.fixture(scope="module")
def predicted_page(results, tmp_path_factory) -> Path:
    """The page with two budgets nobody measured predicted (GPU datasheet constants, no GPU
    needed): one that fits, one too small for any configuration; no accuracy published."""
    from tests.test_analysis import tiny_predict

    base, out = tmp_path_factory.getbasetemp(), tmp_path_factory.mktemp("predicted") / "index.html"
    asked = [tiny_predict(PREDICTED_BUDGET), tiny_predict(PREDICTED_BUDGET, "hardware.mem_gib=0.01")]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("suite.paths.accuracy_dir", lambda: base / "no-accuracy")
        assert (
            report_main(["leaderboard", str(results), "-o", str(out), *(a for v in asked for a in ("--predict", v))])
            == 0
        )
    return out


PREDICTED_BUDGET = "a100-80gb-x1"  # measured by no fixture


def page_data(path: Path) -> dict:
    html = path.read_text()
    block = html.split('<script id="leaderboard-data" type="application/json">')[1].split("</script>")[0]
    return json.loads(block)


def test_predicted_rows_travel_apart_from_the_measured_ones(predicted_page, page, frame):
    data, plain = page_data(predicted_page), page_data(page)
    assert plain["predicted"] == [] and len(data["predicted"]) == 2
    assert sorted(r["trial_id"] for r in data["rows"]) == sorted(frame["trial_id"])
    assert PREDICTED_BUDGET not in {r["hardware"] for r in data["rows"]}
    fits, none = data["predicted"]
    assert fits["budget"] == PREDICTED_BUDGET and none["budget"] == f"{PREDICTED_BUDGET} capped at 0.01 GiB"
    assert fits["fits"] == "yes" and fits["predicted_step_time_s"] > 0 and fits["predicted_days"] > 0
    assert none["config"] == "does not fit" and none["predicted_step_time_s"] is None
    assert fits["memory_error"] == "±? (not scored)" and fits["regime"].startswith("datacenter-sxm · ")


# ---- the HTML file itself --------------------------------------------------------------------


def test_page_is_one_self_contained_file_with_escaped_data(page):
    html = page.read_text()
    assert html.count("<script") == 2  # the JSON data block and the page's own script
    assert "<script>window.__pwned" not in html and "<img" not in html
    assert "\\u003cscript\\u003ewindow.__pwned" in html
    head, data = html.split('<script id="leaderboard-data" type="application/json">')
    code = head + data.split("</script>", 1)[1]  # everything but the data
    for external in ("<link", " src=", "href=", "@import", "url(", "fetch(", "XMLHttpRequest", "import("):
        assert external not in code
    assert "script-src 'sha256-" in html and "default-src 'none'" in html


def test_script_json_round_trips_and_cannot_end_its_script_element():
    obj = {"model": "</script><!--", "loss": [1.5, math.nan, math.inf], "&": "\u2028"}
    text = script_json(obj)
    assert not set("<>&\u2028") & set(text)
    assert json.loads(text) == {"model": "</script><!--", "loss": [1.5, None, None], "&": "\u2028"}


def test_cli_writes_the_leaderboard(results, tmp_path, capsys):
    out = tmp_path / "board" / "index.html"
    assert report_main(["leaderboard", str(results), "-o", str(out)]) == 0
    captured = capsys.readouterr()
    assert str(out.resolve()) in captured.out and "torn.json" in captured.err
    assert out.read_text().startswith("<!DOCTYPE html>")
    assert report_main(["leaderboard", str(tmp_path / "missing"), "-o", str(out)]) == 2


def test_sweep_callback_writes_the_leaderboard_next_to_the_results(results, tmp_path, capsys):
    store = tmp_path / "store"
    shutil.copytree(results, store)
    WriteLeaderboard().on_multirun_end(OmegaConf.create({"store": {"dir": str(store)}}))
    assert (store / "leaderboard.html").exists()
    assert f"Leaderboard: {(store / 'leaderboard.html').resolve()}" in capsys.readouterr().out


# ---- in a real browser -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def browser():
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (pip install selenium)")
    if not (CHROMIUM and DRIVER):
        pytest.skip("Debian's chromium and chromium-driver are missing (apt-get install chromium chromium-driver)")
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in CHROMIUM_FLAGS:
        options.add_argument(flag)
    profile = tempfile.mkdtemp(prefix="chromium-profile-")
    options.add_argument(f"--user-data-dir={profile}")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(DRIVER), options=options)
    yield driver
    driver.quit()
    shutil.rmtree(profile, ignore_errors=True)


@pytest.fixture
def board(browser, page):
    browser.get(page.as_uri())
    yield browser
    errors = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    assert errors == [], errors


def column_cell(driver, row, column: str) -> str:
    """The text of one column's cell in a row, the column found by its header's key."""
    index = driver.execute_script(
        "return [...document.querySelectorAll('#head th')].findIndex(th => th.dataset.key === arguments[0]);", column
    )
    assert index >= 0, f"no column {column}"
    return row.find_elements("css selector", "td")[index].text


def cells(driver, column: str, body: str = "#rows-ok") -> list[str]:
    """The text of one column in the visible rows of `body` (#rows-ok: the ones that ran, #table: all)."""
    index = driver.execute_script(
        "return [...document.querySelectorAll('#head th')].findIndex(th => th.dataset.key === arguments[0]);", column
    )
    return driver.execute_script(
        f"return [...document.querySelectorAll('{body} tr.row')].map(tr => tr.children[arguments[0]].textContent);",
        index,
    )


def number(text: str) -> float:
    """The figure a cell shows first (before its interval, runs or flags)."""
    return float(re.match(r"[\d,.$]+", text).group().replace(",", "").replace("$", ""))


def test_page_loads_from_file_with_every_result(board, frame):
    from selenium.webdriver.common.by import By

    assert board.current_url.startswith("file://")
    assert sorted(board.execute_script("return [...document.querySelectorAll('tr.row')].map(tr => tr.dataset.id)")) == (
        sorted(frame["trial_id"])
    )
    n = len(frame)
    assert f"Showing {n} of {n} results" in board.find_element(By.ID, "count").text
    assert "torn.json" in board.find_element(By.ID, "skipped").text
    # Failed configurations are set apart, below the ones that ran; the winners are analysis's.
    assert sorted(cells(board, "outcome", body="#rows-failed")) == sorted(frame.loc[frame.outcome != "ok", "outcome"])
    best = board.execute_script(
        "return [...document.querySelectorAll('#rows-ok tr.row.best')].map(tr => tr.dataset.id)"
    )
    assert sorted(best) == sorted(best_per_budget(frame)["trial_id"])


def test_intervals_runs_and_ties_are_shown(board, frame):
    from selenium.webdriver.common.by import By

    fast = fastest_repeated()
    rows = {tr.get_attribute("data-id"): tr for tr in board.find_elements(By.CSS_SELECTOR, "#rows-ok tr.row")}
    marks = {i: rows[i].find_element(By.CSS_SELECTOR, "td.star") for i in (fast["trial_id"], twin(fast)["trial_id"])}
    assert sorted(m.text for m in marks.values()) == ["\u2605 tied", "\u2606 tied"]  # the fastest says it is tied
    best = next(i for i, m in marks.items() if m.text == "\u2605 tied")
    n = best_per_budget(frame).set_index("trial_id").loc[best, "n_tied"]  # the twin, and any real tie
    assert n >= 1 and set(cells(board, "best")) >= {"\u2605", "\u2605 tied", "\u2606 tied", ""}
    title = marks[best].find_element(By.TAG_NAME, "span").get_attribute("title")
    assert f"tied with {n} other configuration" in title
    m = fast["metrics"]
    step = column_cell(board, rows[fast["trial_id"]], "step_time_s")
    assert step.startswith(f"{m['step_time_s']:.3f}") and "3 runs, 75.0% interval" in step
    assert f"[{m['step_time_ci_lo_s']:.3f}, {m['step_time_ci_hi_s']:.3f}]" in step
    row = frame.set_index("trial_id").loc[fast["trial_id"]]
    days = column_cell(board, rows[fast["trial_id"]], "days")
    assert days.startswith(f"{row['days']:.2f}") and f"[{row['days_lo']:.2f}, {row['days_hi']:.2f}]" in days
    single = frame[(frame.runs == 1) & (frame.outcome == "ok")].iloc[0]
    assert "single run" in rows[single["trial_id"]].text
    # A configuration that fitted on some runs and not on another is listed with those that did not fit.
    flaky = frame[frame.message.str.startswith("fits only sometimes")]
    failed = board.execute_script(
        "return [...document.querySelectorAll('#rows-failed tr.row')].map(tr => tr.dataset.id)"
    )
    assert len(flaky) and set(flaky["trial_id"]) <= set(failed)
    rows[fast["trial_id"]].click()  # its details list every run
    detail = board.find_element(By.CSS_SELECTOR, "tr.detail")
    assert "Runs (3)" in detail.text and len(detail.find_elements(By.CSS_SELECTOR, ".run-table tbody tr")) == 3
    assert "holds the median with 75.0%" in detail.text and "spread between runs" in detail.text


def test_sorting_by_days_orders_the_rows(board):
    from selenium.webdriver.common.by import By

    days = board.find_element(By.CSS_SELECTOR, "th[data-key=days] button")
    days.click()
    ascending = [number(t) for t in cells(board, "days")]
    assert ascending == sorted(ascending) and len(set(ascending)) > 1
    days.click()
    assert [number(t) for t in cells(board, "days")] == sorted(ascending, reverse=True)
    assert board.find_element(By.CSS_SELECTOR, "th[data-key=days]").get_attribute("aria-sort") == "descending"


def test_filters_hide_the_other_rows(board, frame):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    Select(board.find_element(By.ID, "f-hardware")).select_by_value("a6000-x1")
    assert sorted(cells(board, "config", body="#table")) == sorted(frame.loc[frame.hardware == "a6000-x1", "config"])
    Select(board.find_element(By.ID, "f-hardware")).select_by_value("")
    board.find_element(By.ID, "f-search").send_keys("recompute 3090")
    hit = frame[frame.hardware.str.startswith("rtx-3090") & frame.config.str.contains("recompute")]
    assert sorted(cells(board, "config", body="#table")) == sorted(hit["config"]) and len(hit) > 0
    board.find_element(By.ID, "f-search").clear()
    board.find_element(By.ID, "f-best").click()  # the fastest of each budget, and those tied with it
    tied = int(tied_with_fastest(frame).sum())
    assert tied >= 1 and len(cells(board, "model", body="#table")) == len(best_per_budget(frame)) + tied


def test_plots_render(board, frame):
    from selenium.webdriver.common.by import By

    def count(selector: str) -> int:
        return len(board.find_elements(By.CSS_SELECTOR, selector))

    assert count("#plot-days svg") == frame["model"].nunique()  # one recipe per model here
    lines = board.execute_script(
        "return [...document.querySelectorAll('#plot-days .panel')]"
        ".filter(p => p.querySelector('h4').textContent === 'pythia-160m')"
        ".map(p => p.querySelectorAll('polyline').length);"
    )
    assert lines == [2]  # pythia-160m: one line per GPU type (A6000, RTX 3090) across its GPU counts
    assert count("#plot-front svg") == 6 and count("#plot-front circle.point") >= 6
    assert count("#plot-fit svg") == 6 and count("#plot-fit rect") >= 8
    assert "OOM" in board.find_element(By.ID, "plot-fit").text
    box = board.find_element(By.CSS_SELECTOR, "#plot-days svg").rect
    assert box["width"] > 300 and box["height"] > 150


def test_predicted_section_is_apart_marked_and_out_of_the_measured_table(browser, predicted_page, frame):
    from selenium.webdriver.common.by import By

    browser.get(predicted_page.as_uri())
    section = browser.find_element(By.ID, "predicted")
    assert section.is_displayed() and "Predicted (not measured)" in section.text
    rows = section.find_elements(By.CSS_SELECTOR, "#predicted-rows tr")
    assert len(rows) == 2 and all(PREDICTED_BUDGET in r.text for r in rows)
    heads = [th.text for th in section.find_elements(By.CSS_SELECTOR, "#predicted-head th")]
    assert sum(h.startswith("Predicted") for h in heads) >= 8 and "Best configuration (predicted)" in heads
    fits, none = (r.text for r in rows)
    assert (
        "error in its regime: ±? (not scored)" in fits and "does not fit" in none and "no: the least any needs" in none
    )
    assert "fit so far" in fits and "Error of " in section.text and "not scored in datacenter-sxm" in section.text
    # Never in the measured table, its filters, stars or plots.
    measured = browser.execute_script("return [...document.querySelectorAll('#table tr.row')].map(tr => tr.dataset.id)")
    assert sorted(measured) == sorted(frame["trial_id"])
    assert PREDICTED_BUDGET not in browser.find_element(By.ID, "table").text
    assert PREDICTED_BUDGET not in [o.text for o in browser.find_elements(By.CSS_SELECTOR, "#f-hardware option")]
    assert PREDICTED_BUDGET not in browser.find_element(By.ID, "plots").text
    assert [e for e in browser.get_log("browser") if e["level"] == "SEVERE"] == []


def test_without_predictions_the_section_is_hidden(board):
    from selenium.webdriver.common.by import By

    assert not board.find_element(By.ID, "predicted").is_displayed()


def test_a_hostile_model_name_is_text_and_runs_nothing(board):
    from selenium.common.exceptions import NoAlertPresentException
    from selenium.webdriver.common.by import By

    with pytest.raises(NoAlertPresentException):
        board.switch_to.alert.text  # noqa: B018 - reading it is what raises
    assert board.execute_script("return window.__pwned") is None
    assert board.execute_script("return document.scripts.length") == 2
    assert board.find_elements(By.TAG_NAME, "img") == []
    assert HOSTILE in cells(board, "model")
    assert HOSTILE in [o.text for o in board.find_elements(By.CSS_SELECTOR, "#f-model option")]
    assert HOSTILE in board.find_element(By.ID, "plot-days").text


def test_a_row_opens_to_its_provenance_and_export_and_a_screenshot_is_saved(board):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    Select(board.find_element(By.ID, "f-model")).select_by_value("pythia-160m")
    board.find_element(By.CSS_SELECTOR, "#rows-ok tr.row.best").click()
    detail = board.find_element(By.CSS_SELECTOR, "tr.detail")
    text = detail.text
    for heading in ("Trial", "Measurement", "Time to train and cost", "Provenance", "git revision", "versions"):
        assert heading in text
    summaries = [s.text for s in detail.find_elements(By.TAG_NAME, "summary")]
    assert "Export: DeepSpeed config (ds_config.json)" in summaries
    exported = detail.find_elements(By.TAG_NAME, "details")[1]
    exported.find_element(By.TAG_NAME, "summary").click()
    assert '"zero_optimization"' in exported.find_element(By.TAG_NAME, "pre").text
    Select(board.find_element(By.ID, "f-model")).select_by_value("")  # the whole board, that row still open
    assert len(board.find_elements(By.CSS_SELECTOR, "tr.detail")) == 1
    ARTIFACTS.mkdir(exist_ok=True)
    height = board.execute_script("return document.documentElement.scrollHeight")
    board.set_window_size(1366, min(height + 40, 8000))
    board.save_screenshot(str(ARTIFACTS / "leaderboard.png"))
    assert (ARTIFACTS / "leaderboard.png").stat().st_size > 10_000
