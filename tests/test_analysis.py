"""analysis/: formulas against hand-computed values (the paper's Pythia-1B on 4x A100),
tables from real trial files (tests/fixtures/results, made by suite-bench on CPU), the
exported winner (its DeepSpeed JSON trains a CPU trial), and bad input handled by name."""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from conftest import single_rank_env

from analysis import ReportError, estimates, published
from analysis.export import export_winner, write_export
from analysis.load import load_results, read_results
from analysis.prices import load_prices
from analysis.tables import (
    across_budgets,
    best_per_budget,
    did_not_fit,
    is_naive,
    method_speedups,
    micro_batch_answer,
    micro_batches,
    speedups,
)
from cli import report as cli
from suite import methods, record, store
from suite.config import Trial
from suite.record import Record, add_run

FIXTURES = Path(__file__).parent / "fixtures" / "results"
PAPER_DAYS, PAPER_STEPS = 17.57, 143_000  # Pythia-1B, 4x A100, best configuration (Khandelwal et al. 2024)


@pytest.fixture(scope="module")
def prices():
    return load_prices()


@pytest.fixture(scope="module")
def raw() -> list[dict]:
    """The fixture records as stored, read without analysis/ (the reference for the tables)."""
    return [json.loads(p.read_text()) for p in sorted(FIXTURES.glob("*.json"))]


@pytest.fixture(scope="module")
def df(prices):
    frame, skipped = load_results(FIXTURES)
    assert skipped == []
    return estimates.add_estimates(frame, prices)


def paper_trial() -> Trial:
    p = published.PUBLISHED[0]
    assert (p.model, p.gpu, p.n_gpus, p.days) == ("pythia-1b", "a100-80gb", 4, PAPER_DAYS)
    return published.trial_for(p)


# --- formulas -------------------------------------------------------------------------


def test_paper_step_time_gives_17_57_days_and_its_costs(prices):
    step_time_s = PAPER_DAYS * 86400 / PAPER_STEPS  # 1,518,048 s / 143,000 steps: 10.6157 s
    days = estimates.training_days(step_time_s, PAPER_STEPS)
    assert days == pytest.approx(17.57)
    assert estimates.gpu_hours(days, 4) == pytest.approx(17.57 * 24 * 4)  # 1686.72
    assert estimates.owned_hardware_usd(prices, "a100-80gb", 4) == 7500 + 4 * 19000
    assert estimates.owned_cost_usd(83_500, days, 5) == pytest.approx(83_500 * 17.57 / 1825)  # $803.89
    assert estimates.owned_cost_usd(83_500, days, 5) == pytest.approx(803.8877, abs=1e-4)
    assert estimates.cloud_cost_usd(1686.72, 2.45) == pytest.approx(4132.464)
    assert math.isnan(estimates.owned_hardware_usd(prices, "rtx-4090", 4))  # not priced by the paper
    assert math.isnan(estimates.owned_hardware_usd(prices, "a100-80gb", 3))  # no such node


def paper_record(t: Trial) -> Record:
    """A record of `t` timed at the paper's Pythia-1B step time (a formula check, not a measurement)."""
    tokens_per_step = 1024 * 2048
    step_time_s = PAPER_DAYS * 86400 / PAPER_STEPS
    metrics = {
        "step_time_s": step_time_s,
        "step_time_std_s": 0.0,
        "tokens_per_step": tokens_per_step,
        "tokens_per_s": tokens_per_step / step_time_s,
        "model_flops_per_token": published.flops_per_token("pythia-1b"),
        "peak_mem_gib": 40.0,
        "gas": t.gas,
        "mfu": None,
    }
    return Record.new(t, "test", "ok", "", metrics, 0.0)


def test_add_estimates_on_a_record_at_the_papers_step_time(prices, tmp_path):
    store.save(tmp_path, paper_record(paper_trial()))
    frame, _ = load_results(tmp_path)
    row = estimates.add_estimates(frame, prices, analytic_mfu=0.99).iloc[0]
    assert row["gpu"] == "a100-80gb" and row["n_gpus"] == 4 and row["budget"] == "a100-80gb-x4"
    assert row["days"] == pytest.approx(17.57)
    assert row["gpu_days"] == pytest.approx(17.57 * 4)
    assert row["original_gpu_days"] == 64 * 3
    assert row["gpu_days_vs_original"] == pytest.approx(17.57 * 4 / 192)
    assert row["owned_cost_usd"] == pytest.approx(803.8877, abs=1e-4)
    assert row["cloud_cost_usd"] == pytest.approx(17.57 * 24 * 4 * prices.cloud["a100-80gb"].usd_per_gpu_hour)
    assert row["peak_tflops"] == 312
    # The paper's time is what FLOPs alone predict at 99% of the A100's bf16 peak.
    assert row["analytic_days"] == pytest.approx(17.57, rel=0.002)


def test_two_nodes_count_every_gpu(prices, tmp_path):
    t = dataclasses.replace(paper_trial(), nodes=2)
    store.save(tmp_path, paper_record(t))
    frame, _ = load_results(tmp_path)
    est = estimates.add_estimates(frame, prices)
    row = est.iloc[0]
    assert (row["budget"], row["n_nodes"], row["gpus_per_node"], row["n_gpus"]) == ("a100-80gb-x4 x 2 nodes", 2, 4, 8)
    assert row["gpu_hours"] == pytest.approx(17.57 * 24 * 8)
    assert row["owned_hardware_usd"] == 2 * (7500 + 4 * 19000)
    w = export_winner(est, "pythia-1b", "a100-80gb-x4", nodes=2)
    assert w.launcher[:3] == ["torchrun", "--nnodes=2", "--nproc_per_node=4"]
    assert w.ds_config["train_batch_size"] == 1024 and w.ds_config["gradient_accumulation_steps"] == t.gas


def test_counted_flops_match_6n_plus_attention_by_hand():
    h, layers, inter, vocab, seq = 2048, 16, 8192, 50304, 2048
    n = layers * (4 * h * h + 2 * h * inter) + vocab * h  # weights that multiply: blocks + output head
    by_hand = 6 * n + 12 * layers * seq * h  # 6.2579e9
    assert published.flops_per_token("pythia-1b") == pytest.approx(by_hand, rel=1e-3)


def test_published_pythia_1b_implies_99_percent_of_peak(prices):
    pub = published.published_estimates(prices).set_index("hardware")
    a100 = pub.loc["a100-80gb-x4"]
    tokens = PAPER_STEPS * 1024 * 2048
    by_hand = tokens * published.flops_per_token("pythia-1b") / (PAPER_DAYS * 86400 * 4 * 312e12)
    assert a100["implied_mfu"] == pytest.approx(by_hand)
    assert a100["implied_mfu"] == pytest.approx(0.99, abs=0.005)
    assert a100["verdict"].startswith("implausible")
    assert a100["owned_cost_usd"] == pytest.approx(803.8877, abs=1e-4)
    assert pub.loc["rtx-3090-x2", "implied_mfu"] > 1
    assert pub.loc["rtx-3090-x2", "verdict"].startswith("impossible")
    assert pub.loc["h100-pcie-x4", "owned_hardware_usd"] == 7500 + 4 * 30000


def test_implied_mfu_inverts_the_analytic_estimate():
    days = estimates.analytic_days(1e21, 8, 312e12, 0.42)
    assert estimates.implied_mfu(days, 1e21, 8, 312e12) == pytest.approx(0.42)
    assert estimates.mfu_verdict(0.42) == "plausible"
    assert estimates.mfu_verdict(float("nan")) == "n/a"


# --- prices ---------------------------------------------------------------------------


def test_price_table_problems_are_all_reported(tmp_path):
    shutil.copytree(Path(estimates.__file__).parents[1] / "conf" / "prices", tmp_path, dirs_exist_ok=True)
    cloud = tmp_path / "cloud.yaml"
    text = cloud.read_text().replace('    date: "2026-03-10"\n', "", 1) + "  a100-99gb:\n    usd_per_gpu_hour: -1\n"
    cloud.write_text(text)
    with pytest.raises(ReportError) as e:
        load_prices(tmp_path)
    msg = str(e.value)
    assert "gpus.rtx-3090: needs date" in msg
    assert "'a100-99gb' is not a GPU profile" in msg
    assert "gpus.a100-99gb: needs provider, source, date" in msg


# --- loading and tables from real trial files ------------------------------------------


def test_fixture_set_is_real_and_varied(raw):
    outcomes = {r["outcome"] for r in raw}
    assert {"ok", "oom", "invalid"} <= outcomes
    assert len({r["trial"]["hardware"]["name"] for r in raw}) >= 2
    assert all(r["schema"] == record.SINGLE_RUN_SCHEMA and r["provenance"]["git_revision"] for r in raw)


def test_load_gives_one_checked_row_per_file(df, raw):
    assert len(df) == len(raw)
    assert set(df["trial_id"]) == {r["trial_id"] for r in raw}
    assert df["step_time_s"].dtype == float
    ok = df[df["outcome"] == "ok"]
    assert ok["step_time_s"].notna().all() and df.loc[df["outcome"] != "ok", "step_time_s"].isna().all()
    # CPU budgets have no price and no peak: n/a, never 0.
    for col in ("cloud_cost_usd", "owned_cost_usd", "peak_tflops", "analytic_days", "mfu"):
        assert df[col].isna().all(), col
    assert (ok["days"] == ok["train_steps"] * ok["step_time_s"] / 86400).all()


def test_malformed_and_foreign_files_are_skipped_by_name(tmp_path, raw):
    for p in sorted(FIXTURES.glob("*.json"))[:3]:
        shutil.copy(p, tmp_path / p.name)
    (tmp_path / "broken.json").write_text('{"schema": "suite.trial/1", ')
    (tmp_path / "foreign.json").write_text('{"hello": "world"}')
    no_metrics = next(r for r in raw if r["outcome"] == "ok") | {"trial_id": "x"}
    no_metrics = no_metrics | {"metrics": {k: v for k, v in no_metrics["metrics"].items() if k != "step_time_s"}}
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "no_step.json").write_text(json.dumps(no_metrics))
    bad_trial = raw[0] | {"trial_id": "y", "trial": {"model": {}}}
    (tmp_path / "sub" / "bad_trial.json").write_text(json.dumps(bad_trial))
    (tmp_path / "sub" / "copy.json").write_text(json.dumps(raw[0]))

    frame, skipped = load_results(tmp_path)
    assert len(frame) == 3
    text = "\n".join(skipped)
    assert len(skipped) == 5, text
    assert f"skipped {tmp_path / 'broken.json'}: not readable JSON" in text
    assert f"skipped {tmp_path / 'foreign.json'}: not a trial record of schema suite.trial/2 or suite.trial/1" in text
    assert "no_step.json: an ok record without numeric metrics step_time_s" in text
    assert "bad_trial.json: its trial does not match suite.config.Trial" in text
    assert "the same trial as" in text

    code = cli.main(["tables", str(tmp_path), "--out", str(tmp_path / "out")])
    assert code == 0
    assert (tmp_path / "out" / "best.md").exists()


def test_a_record_the_estimates_cannot_use_is_read_but_left_out_of_the_frame(tmp_path, raw):
    ok = next(r for r in raw if r["outcome"] == "ok")
    (tmp_path / "no_gas.json").write_text(json.dumps(ok | {"metrics": {**ok["metrics"], "gas": None}}))
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "worker.json").write_text("{}")  # the suite's own folders are not results
    results = read_results(tmp_path)
    assert [r.trial_id for r in results.records()] == [ok["trial_id"]] and results.records(("oom",)) == []
    assert results.frame.empty and results.skipped == ()
    assert results.left_out == (f"skipped {tmp_path / 'no_gas.json'}: an ok record without numeric metrics gas",)


@pytest.mark.parametrize("command", ["tables", "figures", "leaderboard", "accuracy"])
def test_each_report_reads_its_folder_once(command, tmp_path, monkeypatch, capsys):
    from analysis import load

    reads, read = [], load._read
    monkeypatch.setattr(load, "_read", lambda f: reads.append(f) or read(f))
    out = {"leaderboard": ["-o", str(tmp_path / "index.html")]}.get(command, ["--out", str(tmp_path)])
    assert cli.main([command, str(FIXTURES), *out]) == 0
    assert sorted(reads) == sorted(FIXTURES.glob("*.json"))


def _by_group(raw: list[dict], keep) -> dict[tuple[str, str], float]:
    """Smallest step time per (model, hardware) among records `keep` accepts, straight from the files."""
    best: dict[tuple[str, str], float] = {}
    for r in raw:
        if r["outcome"] == "ok" and keep(r["trial"]["methods"]):
            key = (r["trial"]["model"]["name"], r["trial"]["hardware"]["name"])
            best[key] = min(best.get(key, math.inf), r["metrics"]["step_time_s"])
    return best


def test_best_per_budget_is_the_fastest_ok_trial(df, raw):
    best = best_per_budget(df)
    expected = _by_group(raw, lambda m: True)
    assert {(m, h): s for m, h, s in zip(best["model"], best["hardware"], best["step_time_s"], strict=True)} == expected
    for r in best.itertuples():
        group = df[(df["model"] == r.model) & (df["hardware"] == r.hardware)]
        assert r.configs_tried == len(group) and r.configs_ok == (group["outcome"] == "ok").sum()


def test_speedup_is_best_over_naive(df, raw):
    sp = speedups(df).set_index(["model", "budget"])
    naive = _by_group(raw, lambda m: m["zero_stage"] == 0 and m["offload"] == "none" and m["recompute"] == "none")
    best = _by_group(raw, lambda m: True)
    for key, best_s in best.items():
        assert sp.loc[key, "best_step_time_s"] == best_s
        if key in naive:
            assert sp.loc[key, "speedup_pct"] == pytest.approx((naive[key] / best_s - 1) * 100)
            assert sp.loc[key, "speedup_pct"] >= 0
        else:
            assert math.isnan(sp.loc[key, "speedup_pct"])
            assert sp.loc[key, "naive_config"].startswith(("none ran ok", "not measured"))
    assert is_naive(df).any()


def test_did_not_fit_lists_every_other_outcome(df, raw):
    rest = did_not_fit(df)
    assert set(rest["trial_id"]) == {r["trial_id"] for r in raw if r["outcome"] != "ok"}
    assert (rest["outcome"] == "oom").any() and (rest["outcome"] == "invalid").any()
    budgets = across_budgets(df)
    assert set(budgets["budget"]) == {r["trial"]["hardware"]["name"] for r in raw}
    assert set(budgets.loc[budgets["configs_ok"] == 0, "fits"].str[:3]) <= {"no "}


def test_tables_cli_writes_markdown_csv_latex(tmp_path, capsys, df):
    assert cli.main(["tables", str(FIXTURES), "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    for title in ("Best configuration per (model, budget)", "Speed-up", "did not fit", "Published estimates"):
        assert title in out
    assert "| pythia-1b | a100-80gb-x4 |" in out and "99.0%" in out
    for name in ("best", "budgets", "speedup", "not_fit", "published", "trials"):
        for suffix in (".md", ".csv", ".tex"):
            assert (tmp_path / f"{name}{suffix}").stat().st_size > 0
    tex = (tmp_path / "best.tex").read_text()
    assert "\\toprule" in tex and "\\bottomrule" in tex and "50\\% MFU" in tex
    best = pd.read_csv(tmp_path / "best.csv")
    assert sorted(best["step_time_s"]) == pytest.approx(sorted(best_per_budget(df)["step_time_s"]))
    assert best["cloud_cost_usd"].isna().all()
    trials = pd.read_csv(tmp_path / "trials.csv")
    assert len(trials) == len(df)


# --- export ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def winner(df):
    return export_winner(df, "pythia-14m", "cpu-x1")


def test_export_uses_the_suites_deepspeed_config_at_full_gas(winner, df):
    t = winner.trial
    assert winner.row["trial_id"] == best_per_budget(df).set_index("hardware").loc["cpu-x1", "trial_id"]
    assert winner.ds_config == methods.deepspeed_config(t, t.gas)
    gas = t.model.recipe.global_batch // (t.hardware.count * t.methods.micro_batch)
    assert winner.ds_config["gradient_accumulation_steps"] == gas
    assert winner.ds_config["train_batch_size"] == t.model.recipe.global_batch


def test_export_training_arguments_and_launch_command_agree(winner, tmp_path):
    from transformers import AutoConfig, HfArgumentParser, TrainingArguments

    args, ds = winner.training_args, winner.ds_config
    assert args["per_device_train_batch_size"] == ds["train_micro_batch_size_per_gpu"]
    assert args["gradient_accumulation_steps"] == ds["gradient_accumulation_steps"]
    assert args["max_grad_norm"] == ds["gradient_clipping"]
    assert args["max_steps"] == winner.trial.model.recipe.train_steps
    assert winner.launcher == ["torchrun", "--standalone", "--nproc_per_node=1", "run_clm.py"]
    flags = [a for pair in winner.flags for a in pair]
    assert flags[:2] == ["--config_name", "model"]
    # The flags parse as TrainingArguments, each to the exported value (an unknown flag would stay in `rest`).
    # Building TrainingArguments itself needs `accelerate`, which the suite does not install.
    parsed, rest = HfArgumentParser(TrainingArguments).parse_known_args(flags[2:])
    assert rest == []
    for k, v in args.items():
        got = getattr(parsed, k)
        assert (json.loads(got) if isinstance(v, dict) else got) == v, k

    files = write_export(winner, tmp_path / "out")
    assert json.loads((tmp_path / "out" / "ds_config.json").read_text()) == ds
    script = (tmp_path / "out" / "launch.sh").read_text()
    assert f"--per_device_train_batch_size {ds['train_micro_batch_size_per_gpu']} \\\n" in script
    assert subprocess.run(["bash", "-n", str(tmp_path / "out" / "launch.sh")]).returncode == 0
    saved = AutoConfig.from_pretrained(tmp_path / "out" / "model")
    assert saved.hidden_size == winner.trial.model.config["hidden_size"]
    assert all(p.exists() for p in files)


TRAIN = """
import json, sys
import deepspeed, torch
from deepspeed.runtime.config import DeepSpeedConfig
from suite.config import Trial
from suite.models.build import batch, build
from suite.ops import preload_built_ops, skip_shm_comm

trial = Trial.from_json(json.load(open(sys.argv[1])))
cfg = json.load(open(sys.argv[2]))
preload_built_ops()  # the ops scripts/setup.sh built, as a worker loads them
skip_shm_comm()
deepspeed.init_distributed(dist_backend="gloo", verbose=False)
DeepSpeedConfig(cfg)  # DeepSpeed's own parser and batch-size checks
model = build(trial.model, trial.methods.attention, trial.methods.recompute)
engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)  # its optimizer
gen = torch.Generator().manual_seed(0)
losses = []
for _ in range(2 * cfg["gradient_accumulation_steps"]):
    loss = engine(**batch(trial.model, cfg["train_micro_batch_size_per_gpu"], gen, "cpu")).loss
    engine.backward(loss)
    engine.step()
    losses.append(loss.item())
print(json.dumps({"global_steps": engine.global_steps, "losses": losses}))
"""


@pytest.mark.slow
def test_exported_deepspeed_json_trains_a_cpu_trial(winner, tmp_path):
    write_export(winner, tmp_path)
    (tmp_path / "trial.json").write_text(json.dumps(winner.row["trial"]))
    env = single_rank_env()
    cmd = [sys.executable, "-c", TRAIN, str(tmp_path / "trial.json"), str(tmp_path / "ds_config.json")]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["global_steps"] == 2  # two optimizer steps at the exported accumulation
    assert all(math.isfinite(x) for x in result["losses"])


# --- errors a user can act on ----------------------------------------------------------


@pytest.mark.parametrize(
    "argv, expected",
    [
        (
            ["export", str(FIXTURES), "model=pythia-1b", "hardware=a6000-x4"],
            "available:\n  model=pythia-14m hardware=cpu-x1",
        ),
        (["export", str(FIXTURES), "model=pythia-14m"], "give model=NAME and hardware=NAME"),
        (["export", str(FIXTURES), "size=big", "hardware=cpu-x1"], "'size=big' is not KEY=VALUE"),
        (["export", str(FIXTURES), "trial=0000"], "no trial 0000 that ran ok"),
        (["tables", "no/such/dir"], "no/such/dir does not exist"),
        (["tables", str(FIXTURES), "--analytic-mfu", "50"], "must be a fraction in (0, 1]"),
    ],
)
def test_bad_arguments_exit_2_with_a_message(argv, expected, capsys, tmp_path):
    assert cli.main(argv + ["--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert expected in err and "Traceback" not in err


def test_an_empty_folder_says_where_results_come_from(tmp_path, capsys):
    assert cli.main(["tables", str(tmp_path), "--out", str(tmp_path / "out")]) == 2
    assert "run suite-bench first" in capsys.readouterr().err


# --- predicted rows (--predict): apart from the measured tables, labelled, with their error ---


def tiny_predict(hardware: str, *extra: str) -> str:
    """A --predict value for conftest's tiny model on `hardware`: MODEL@HARDWARE,overrides."""
    from tests.conftest import TINY

    model = next(o.split("=", 1)[1] for o in TINY if o.startswith("model="))
    return ",".join([f"{model}@{hardware}", *(o for o in TINY if o.startswith("model.")), *extra])


@pytest.fixture
def isolated_predictor(tmp_path_factory, monkeypatch):
    """No calibration; no published accuracy (traces: the session's cache, conftest)."""
    base = tmp_path_factory.getbasetemp()
    monkeypatch.setenv("SUITE_CALIBRATION_DIR", str(base / "no-calibration"))
    monkeypatch.setattr("suite.paths.accuracy_dir", lambda: base / "no-accuracy")
    return monkeypatch


def test_tables_show_predicted_rows_apart_labelled_with_their_error(isolated_predictor, tmp_path, capsys, prices):
    """A GPU budget nobody measured is predicted (datasheet constants, no GPU needed) in a table
    of its own after the measured ones; one too small says it does not fit; each row carries the
    published error; no measured table or file gains a predicted row."""
    from analysis import predicted
    from analysis.prices import gpu_keys
    from suite.config import SearchConfig
    from suite.predict import Predictor

    accuracy = tmp_path / "accuracy"
    accuracy.mkdir()
    stat = {"n": 12, "median": 4.2, "p90": 9.8, "max": 14.0}
    sxm = {"n": 12, "memory_err_pct_by_kind": {"nvidia-smi": stat}, "step_time_err_pct": stat | {"median": 7.5}}
    summary = {"n_records": 12, "by_regime": {"datacenter-sxm|*|*|*|*": sxm}}
    (accuracy / "cuda.json").write_text(json.dumps(summary | {"fit_right_pct": 100.0, "fit_n": 12, "source": "x"}))
    isolated_predictor.setattr("suite.paths.accuracy_dir", lambda: accuracy)
    fits, tight = tiny_predict("a100-80gb-x1"), tiny_predict("a100-80gb-x1", "hardware.mem_gib=0.01")
    out_dir = tmp_path / "out"
    assert cli.main(["tables", str(FIXTURES), "--out", str(out_dir), "--predict", fits, "--predict", tight]) == 0
    out = capsys.readouterr().out
    title = out.index(predicted.PREDICTED_TITLE)
    assert title > out.index("Published estimates")  # after every measured table
    shown = out[title:].split("\n")
    header = next(line for line in shown if line.startswith("| model"))
    numeric = [h.strip() for h in header.split("|")[6:16] if "error" not in h]
    assert numeric and all(h.startswith("predicted") for h in numeric), numeric
    rows = pd.read_csv(out_dir / "predicted.csv")
    assert list(rows["budget"]) == ["a100-80gb-x1", "a100-80gb-x1 capped at 0.01 GiB"]  # a cap is a budget of its own
    assert all(c.startswith("predicted_") for c in rows.columns if rows[c].dtype == float and c != "mem_budget_gib")
    best, none = rows.iloc[0], rows.iloc[1]
    # The fastest configuration predicted to fit, from the same rows suite-predict ranks.
    a = predicted.asked([fits])[0]
    ranked = predicted.rows(predicted.candidates(a.base, SearchConfig(**a.cfg.search)), Predictor(), prices, gpu_keys())
    first = min((r for r in ranked if r["fits"]), key=lambda r: r["step_time_s"])
    assert best["config"] == first["config"] and best["predicted_step_time_s"] == pytest.approx(first["step_time_s"])
    assert best["predicted_days"] == pytest.approx(
        estimates.training_days(first["step_time_s"], a.base.model.recipe.train_steps)
    )
    assert best["predicted_gpu_hours"] == pytest.approx(24 * best["predicted_days"])
    assert best["fits"] == "yes" and best["configs_fit"] == best["configs_valid"] == len(ranked)
    assert best["memory_error"] == "±4% (n=12, nearest)" and best["time_error"] == "±8% (n=12, nearest)"
    assert best["regime"].startswith("datacenter-sxm · ") and best["regime"].endswith(" · 1 GPU · <1B")
    assert none["config"] == "does not fit" and none["fits"].startswith("no: the least any needs is")
    assert none["configs_fit"] == 0 and math.isnan(none["predicted_step_time_s"]) and math.isnan(none["predicted_days"])
    assert "does not fit" in out[title:] and "nearest regime datacenter-sxm: ±8% median, 10% p90, n=12" in out[title:]
    for path in out_dir.iterdir():  # never mixed: no measured table names the predicted budget
        assert path.stem == "predicted" or "a100-80gb-x1" not in path.read_text(), path.name


def test_bad_predict_values_are_all_reported_and_exit_2(isolated_predictor, tmp_path, capsys):
    argv = ["--predict", "pythia-14m", "--predict", "nope@a6000-x4", "--predict", "pythia-14m@a6000-x4,foo.bar=1"]
    argv += ["--predict", "pythia-14m@cpu-x2", "--predict", "pythia-14m@a6000-x4,seq"]
    for command in ("tables", "leaderboard"):
        assert cli.main([command, str(FIXTURES), "--out", str(tmp_path / "out"), *argv]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"suite-report {command}: error: --predict:") and "Traceback" not in err
        for expected in (
            "'pythia-14m' is not MODEL@HARDWARE",
            "no model 'nope' in conf/model/ (one of: ",
            "Could not override 'foo.bar'",
            "'pythia-14m@cpu-x2': ",  # a CPU profile needs this machine's calibration
            "'seq' is not KEY=VALUE",
        ):
            assert expected in err, expected
    assert not (tmp_path / "out").exists()  # refused before anything is written


# --- repeated runs: intervals, ties, the micro-batch question -------------------------------

# Step times of runs of pythia-14m on cpu-x2 by (ZeRO stage, micro-batch); None: out of memory.
# Made from a real record's metrics with only the step times (and accumulation) set, so every
# answer is known:
RUNS = {
    (0, 8): [None],  # the largest that fits is 4
    (0, 4): [2.0, 2.1, 2.05],
    (0, 2): [1.5, 1.6, 1.55],  # significantly faster than 4
    (0, 1): [1.04, 1.1, 1.2],  # faster still; its interval touches the best one's: tied with it
    (1, 4): [2.0, 2.1, 2.05],
    (1, 2): [2.05, 2.2, 2.15],  # overlaps 4: tied
    (2, 4): [3.0],
    (2, 2): [2.9],  # single runs: no interval, cannot tell
    (3, 4): [1.0, 1.05, 1.02],  # the best: median 1.02 in [1.00, 1.05]
    (3, 2): [2.0, 2.1, 2.2],
    (3, 1): [3.0, 3.1, 3.2],  # the largest is significantly faster
}


@pytest.fixture(scope="module")
def repeated(tmp_path_factory, raw, prices):
    d = tmp_path_factory.mktemp("repeated")
    base = next(r for r in raw if r["trial_id"] == "1b006e20d1190827")  # pythia-14m, cpu-x2, ran ok
    t0 = Trial.from_json(base["trial"])
    for (z, mb), times in RUNS.items():
        t = dataclasses.replace(t0, methods=dataclasses.replace(t0.methods, zero_stage=z, micro_batch=mb))
        rec = None
        for x in times:
            if x is None:
                rec = add_run(rec, t, "test", "oom", "rank 0: MemoryError", {}, 5.0)
            else:
                m = dict(base["metrics"], step_time_s=x, gas=t.gas, gas_measured=t.gas_measured)
                rec = add_run(rec, t, "test", "ok", "", m, 10.0)
        store.save(d, rec)
    frame, skipped = load_results(d)
    assert skipped == []
    return d, estimates.add_estimates(frame, prices)


def test_intervals_load_and_carry_through_to_days_and_cost(repeated):
    _, df = repeated
    row = df.set_index(["zero_stage", "micro_batch"]).loc[(3, 4)]
    assert (row["step_time_s"], row["step_time_ci_lo_s"], row["step_time_ci_hi_s"]) == (1.02, 1.0, 1.05)
    assert row["runs"] == 3 and row["step_time_ci_level"] == 0.75
    assert row["days_lo"] == estimates.training_days(1.0, row["train_steps"])
    assert row["days_hi"] == estimates.training_days(1.05, row["train_steps"])
    assert row["gpu_hours_hi"] == estimates.gpu_hours(row["days_hi"], 2)
    single = df.set_index(["zero_stage", "micro_batch"]).loc[(2, 4)]
    assert single["runs"] == 1 and math.isnan(single["step_time_ci_level"]) and single["days_lo"] == single["days"]


def test_best_per_budget_names_the_configurations_tied_with_it(repeated):
    _, df = repeated
    best = best_per_budget(df).iloc[0]
    assert (best["zero_stage"], best["micro_batch"]) == (3, 4)
    assert best["n_tied"] == 1 and best["tied_configs"] == "DDP mb 1x8 sdpa fp32"  # (0, 1): 1.04 <= 1.05


def test_a_significantly_slower_micro_batch_is_not_taken_for_a_faster_one(raw, tmp_path):
    """The largest micro-batch is compared with the fastest smaller one: a smaller one that is
    significantly slower than the largest never counts as significantly faster."""
    base = next(r for r in raw if r["trial_id"] == "1b006e20d1190827")
    t0 = Trial.from_json(base["trial"])
    for mb, times in {1: (3.0, 3.1, 3.2), 2: (2.0, 2.1, 2.3), 4: (2.0, 2.05, 2.2)}.items():
        t = dataclasses.replace(t0, methods=dataclasses.replace(t0.methods, zero_stage=1, micro_batch=mb))
        rec = None
        for x in times:
            m = dict(base["metrics"], step_time_s=x, gas=t.gas, gas_measured=t.gas_measured)
            rec = add_run(rec, t, "test", "ok", "", m, 10.0)
        store.save(tmp_path, rec)
    df, _ = load_results(tmp_path)
    case = micro_batches(df).iloc[0]
    assert (case["largest_micro_batch"], case["smaller_micro_batch"], case["verdict"]) == (4, 2, "tied")


def test_micro_batch_question_from_records(repeated):
    _, df = repeated
    mb = micro_batches(df).set_index("methods")
    assert len(mb) == 4
    a = mb.loc["DDP sdpa fp32"]
    assert (a["largest_micro_batch"], a["largest_bound"], a["smaller_micro_batch"]) == (4, "oom at 8", 1)
    assert a["verdict"] == "smaller significantly faster" and a["confidence"] == 0.5  # 75% + 75% - 1
    assert a["speedup_pct"] == pytest.approx((2.05 / 1.1 - 1) * 100)
    assert mb.loc["ZeRO-1 sdpa fp32", "verdict"] == "tied"
    assert mb.loc["ZeRO-2 sdpa fp32", "verdict"] == "single runs: no interval"
    d = mb.loc["ZeRO-3 sdpa fp32"]
    assert (d["largest_micro_batch"], d["smaller_micro_batch"], d["verdict"]) == (4, 2, "largest significantly faster")
    assert d["largest_bound"] == "no larger one tried"
    assert micro_batch_answer(micro_batches(df)).startswith(
        "A smaller micro-batch is significantly faster than the largest that ran in 1 of 3 cases with intervals "
        "(1 tied, 1 where the largest is significantly faster); 1 of 4 cases have single runs"
    )


def test_each_memory_method_against_the_naive_one_with_its_interval(repeated):
    """ZeRO-1's best (2.05 [2.0, 2.1]) is significantly slower than the naive DDP (1.1 [1.04, 1.2]);
    ZeRO-3's (1.02 [1.0, 1.05]) overlaps it: tied, its speed-up's interval holds 0; ZeRO-2 ran once."""
    _, df = repeated
    m = method_speedups(df).set_index("memory_methods")
    assert list(m.index) == ["ZeRO-3", "ZeRO-1", "ZeRO-2"]  # fastest first; DDP is the naive one itself
    assert set(m["naive_config"]) == {"DDP mb 1x8 sdpa fp32"} and set(m["naive_step_time_s"]) == {1.1}
    z1, z2, z3 = m.loc["ZeRO-1"], m.loc["ZeRO-2"], m.loc["ZeRO-3"]
    assert z1["verdict"] == "significantly slower" and z1["confidence"] == 0.5
    assert z1["speedup_pct"] == estimates.speedup_pct(1.1, 2.05)
    assert (z1["speedup_lo_pct"], z1["speedup_hi_pct"]) == (
        estimates.speedup_pct(1.04, 2.1),
        estimates.speedup_pct(1.2, 2.0),
    )
    assert z3["verdict"] == "tied" and z3["speedup_lo_pct"] < 0 < z3["speedup_hi_pct"]
    assert z2["verdict"] == "single runs: no interval" and z2["config"] == "ZeRO-2 mb 2x4 sdpa fp32"
    # The smaller micro-batch's speed-up carries its interval the same way.
    ddp = micro_batches(df).set_index("methods").loc["DDP sdpa fp32"]
    assert (ddp["speedup_lo_pct"], ddp["speedup_hi_pct"]) == (
        estimates.speedup_pct(2.0, 1.2),
        estimates.speedup_pct(2.1, 1.04),
    )


def test_tables_and_export_show_intervals_runs_and_ties(repeated, tmp_path, capsys):
    d, df = repeated
    assert cli.main(["tables", str(d), "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    best = out.split("### Best configuration")[1].split("###")[0]
    assert "| ZeRO-3 mb 4x2 sdpa fp32 |" in best and "1.020 [1.000, 1.050]" in best and "75.0%" in best
    assert "DDP mb 1x8 sdpa fp32" in best  # tied with it
    assert "Is the largest micro-batch that fits the fastest?" in out and "1 of 3 cases with intervals" in out
    csv = pd.read_csv(tmp_path / "best.csv")
    assert csv.loc[0, "step_time_ci_lo_s"] == 1.0 and csv.loc[0, "days_hi"] == df["days_hi"].min()
    assert (tmp_path / "micro_batch.csv").exists()
    assert cli.main(["export", str(d), "model=pythia-14m", "hardware=cpu-x2", "--out", str(tmp_path / "x")]) == 0
    script = (tmp_path / "x" / "launch.sh").read_text()
    assert "median of 3 runs; 75.0% interval 1.000-1.050 s" in script
    assert "tied with 1 (intervals overlap): DDP mb 1x8 sdpa fp32" in script


def test_a_configuration_that_fits_only_sometimes_is_not_a_fit(repeated, tmp_path):
    d, df = repeated
    t = Trial.from_json(df.iloc[0]["trial"])
    rec = Record.new(t, "test", "ok", "", {"step_time_s": 0.5, "step_time_std_s": 0.0}, 1.0)
    rec = add_run(rec, t, "test", "oom", "rank 1: MemoryError", {}, 1.0)
    store.save(tmp_path, rec)
    frame, _ = load_results(tmp_path)
    assert frame.loc[0, "outcome"] == "oom" and math.isnan(frame.loc[0, "step_time_s"])
    assert frame.loc[0, "message"].startswith("fits only sometimes")


REPEATS = Path(__file__).parent / "fixtures" / "repeats"


def test_real_repeated_records_load_with_their_runs(prices):
    """tests/fixtures/repeats: real trials of 3 runs (tiny-neox), and real trials whose later run failed."""
    raw = {p.stem: json.loads(p.read_text()) for p in sorted(REPEATS.glob("*.json"))}
    df, skipped = load_results(REPEATS)
    assert skipped == [] and len(df) == len(raw)
    for r in df.itertuples():
        runs = raw[r.trial_id]["runs"]
        times = sorted(x["metrics"]["step_time_s"] for x in runs if x["outcome"] == "ok")
        if r.outcome == "ok":
            assert r.runs == len(runs) == 3 and r.step_time_s == times[1]  # the median of 3
            assert (r.step_time_ci_lo_s, r.step_time_ci_hi_s, r.step_time_ci_level) == (times[0], times[2], 0.75)
        else:  # it ran ok before a run failed: listed with what did not fit or run, not as a fit
            assert 0 < len(times) < len(runs) and f"after {len(times)} ok run(s)" in r.message
            assert math.isnan(r.step_time_s)
    assert {"oom", "timeout"} <= set(df["outcome"]) and (df["outcome"] == "ok").sum() == 4
    est = estimates.add_estimates(df, prices)
    for case in micro_batches(est).itertuples():  # the verdict, from the intervals by hand
        a = (case.largest_step_time_ci_lo_s, case.largest_step_time_ci_hi_s)
        b = (case.smaller_step_time_ci_lo_s, case.smaller_step_time_ci_hi_s)
        overlap = a[0] <= b[1] and b[0] <= a[1]
        faster = "smaller" if case.smaller_step_time_s < case.largest_step_time_s else "largest"
        assert case.verdict == ("tied" if overlap else f"{faster} significantly faster")


def test_compare_orders_its_rows_itself():
    """`compare` answers the same whichever row comes first: the faster one is named by its median."""
    from analysis.tables import compare

    def row(median, lo, hi):
        return pd.Series(
            {"step_time_s": median, "step_time_ci_lo_s": lo, "step_time_ci_hi_s": hi}
            | {"step_time_ci_level": 0.75, "runs": 3}
        )

    fast, slow, near = row(1.0, 0.9, 1.1), row(2.0, 1.8, 2.2), row(1.05, 0.95, 1.15)
    assert compare(fast, slow)[0] == compare(slow, fast)[0] == "significantly faster"
    assert compare(fast, slow)[1] == compare(slow, fast)[1] > 0
    assert compare(near, fast)[0] == "tied"
