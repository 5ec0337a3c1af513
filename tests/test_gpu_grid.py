"""The GPU grid without a GPU: its plan and budget (the dry run's total within 480 s, its order of
priorities), the doubling to the out-of-memory boundary, a budget cut that reads NOT RUN, and the
script's exit without a GPU. The forecasts are a stand-in memory model (no tracing); the trials are
made up; none ran on a GPU."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_gpu_check import Clock, FakeBuild, metrics

from suite import store
from suite.gpu_check import environment, verdicts
from suite.gpu_check.plan import Budget
from suite.gpu_grid import grid, plan
from suite.gpu_grid.plan import Forecast, Item, Plan
from suite.record import Record
from suite.runner import Ran

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "gpu-grid.sh"
PARAMS = {"pythia-160m": 0.16e9, "pythia-410m": 0.41e9, "pythia-1b": 1.0e9}
SAMPLE_GIB = {"pythia-160m": 1.8, "pythia-410m": 2.9, "pythia-1b": 3.4}  # activations per sample, no recomputation


def device_gib(t, truth: float = 1.0) -> float:
    """A stand-in for the predictor: 16 bytes of model state per parameter (less the optimizer's 12
    under offload) and activations per sample, a quarter of them under full recomputation."""
    n = PARAMS[t.model.name]
    states = (4 if t.methods.offload != "none" else 16) * n / 2**30
    sample = SAMPLE_GIB[t.model.name] * (0.25 if t.methods.recompute == "full" else 1.0)
    return truth * (states + t.methods.micro_batch * sample)


def fake_forecasts(trials):
    out = {}
    for key, t in trials.items():
        gib, cap = device_gib(t), t.hardware.mem_gib
        micro = 0.0065 * t.methods.micro_batch * PARAMS[t.model.name] / 0.16e9  # 0.052 s: 160M at mb 8
        step = None if t.methods.offload != "none" else t.gas * micro
        out[key] = Forecast(gib <= cap, gib, gib - 0.3, step, micro, micro, int(PARAMS[t.model.name]))
    return out


@pytest.fixture(scope="module")
def grid_plan():
    return Plan.make("h200", 1, predict=fake_forecasts)


def test_the_dry_runs_plan_fits_480_s_and_keeps_the_order_of_priorities(grid_plan, capsys):
    admitted, left, slots, end = grid_plan.planned(plan.BUDGET_S)
    assert end <= plan.BUDGET_S and len(slots) >= 15 and left
    order = {item: k for k, item in enumerate(grid_plan.items)}
    assert [order[i] for i in admitted] == sorted(order[i] for i in admitted)  # admitted in priority order
    # The first round's core: each model under each memory once, their DDP boundary first.
    first = grid_plan.items[: 3 * len(plan.CORE)]
    assert {(i.model, i.cap_gib) for i in first} == set(plan.ROUNDS[0])
    assert first[0] == Item("pythia-1b", 24.0, True, (("zero_stage", 0),))
    assert set(first) <= set(admitted)  # the budget holds the first round's core
    # FSDP2's trials need no DeepSpeed op: they run while the ops build.
    beside = [s.check.name for s in slots if s.beside_build]
    assert beside and all("FSDP2" in name for name in beside)
    # Every planned boundary is expected to run its predicted largest fit, then that doubled (predicted OOM).
    b = next(i for i in admitted if i.boundary and i.model == "pythia-1b" and i.cap_gib == 24.0)
    mb = grid_plan.start(b)
    assert grid_plan.expected(b) == [mb, 2 * mb]
    f = [grid_plan.forecast[grid_plan.trial(b, m).id] for m in (mb, 2 * mb)]
    assert f[0].fits and not f[1].fits and f[0].device_gib <= 24 < f[1].device_gib
    assert grid.dry_run("h200", 1, plan.BUDGET_S, grid_plan) == 0
    out = capsys.readouterr().out
    assert "pythia-1b@24GiB DDP mb 2" in out and "beside the op build" in out and "fits" in out
    assert f"ends at {end:.0f} s of a 480 s budget: fits" in out and "left out of the plan" in out
    assert grid.dry_run("h200", 1, 200.0, grid_plan) == 0  # a shorter budget plans fewer, still within it


def test_a_plans_trials_are_valid_capped_and_estimated_from_the_predictor(grid_plan):
    item = Item("pythia-410m", 48.0, False, tuple(sorted(plan.FSDP2.items())))
    c, t = grid_plan.probe(item, 8)
    assert c.name == "pythia-410m@48GiB FSDP2 full_shard mb 8" and t.hardware.mem_gib == 48
    assert t.precision == "bf16" and t.model.recipe.seq_len == 2048 and t.gas == 128 and t.gas_measured == 2
    f = grid_plan.forecast[t.id]
    steps = (plan.MEASURE["warmup_steps"] + plan.MEASURE["timed_steps"]) * (f.micro_s + f.boundary_s)
    assert c.est_s == pytest.approx(15.0 + 6.0 * 0.41 + steps) and c.timeout_s == 60.0
    own = grid_plan.bases[("pythia-160m", None)]
    assert own.hardware.mem_gib == 140 and grid_plan.memory(None) == "140GiB"
    from suite.config.validate import problems

    assert problems(t) == [] and problems(own) == []


def search(start: int, boundary: bool = True) -> grid.Search:
    return grid.Search(Item("pythia-1b", 24.0, boundary, ()), 0, start, [1, 2, 4, 8, 16, 32])


def test_a_boundary_doubles_from_the_predicted_fit_until_out_of_memory_or_halves_until_one_fits():
    up = search(4)
    for mb, outcome in ((4, "ok"), (8, "ok"), (16, "oom")):
        assert up.next_mb() == mb
        up.results[mb] = outcome
    assert up.next_mb() is None and up.boundary()["largest_ok_mb"] == 8 and up.boundary()["smallest_oom_mb"] == 16
    down = search(4)
    for mb, outcome in ((4, "oom"), (2, "oom"), (1, "ok")):
        assert down.next_mb() == mb
        down.results[mb] = outcome
    assert down.next_mb() is None
    nothing = search(1)
    nothing.results[1] = "oom"
    assert nothing.next_mb() is None and nothing.boundary() == {
        "largest_ok_mb": None,
        "smallest_oom_mb": 1,
        "tried": {1: "oom"},
    }
    top = search(32)
    top.results[32] = "ok"
    assert top.next_mb() is None  # fits at the ladder's top: no boundary within the recipe
    crashed = search(4)
    crashed.results[4] = "crashed"
    assert crashed.next_mb() is None
    point = search(2, boundary=False)
    point.results[2] = "oom"
    assert point.next_mb() is None


FUSED_ADAM = {"FusedAdamBuilder": "fused_adam"}  # the one op the grid's fake machine builds


def run_grid(tmp_path, grid_plan, total_s, truth=1.0, slower=1.0):
    """The planned grid on fake time: each trial takes its estimate (times `slower`); a trial is out of
    memory where the stand-in's memory times `truth` passes its cap."""
    clock = Clock()
    start = clock() - plan.STARTUP_S - plan.PLAN_S
    admitted, _, _, _ = grid_plan.planned(plan.BUDGET_S)
    ran = []

    def run_one(t, store_dir, sweep, in_sweep):
        ran.append(t)
        est = next(c.est_s for c, u in grid_plan._probes.values() if u.id == t.id)
        clock.now += est * slower
        outcome = "ok" if device_gib(t, truth) <= t.hardware.mem_gib else "oom"
        m = metrics(peak_mem_gib=device_gib(t, truth))
        rec = Record.new(t, sweep, outcome, "rank 0: CUDA out of memory" * (outcome == "oom"), m, est * slower)
        store.save(store_dir, rec)
        return Ran(rec, 1)

    budget = Budget(total_s, start, clock, rank={})
    g = grid.Grid(tmp_path, grid_plan, admitted, budget, FakeBuild(clock, 45.0, ops=FUSED_ADAM), run_one)
    return g, g.run(), ran


def test_the_grid_runs_its_plan_fsdp2_beside_the_build_and_finds_each_boundary(tmp_path, grid_plan):
    g, rows, ran = run_grid(tmp_path, grid_plan, plan.BUDGET_S)
    assert rows[0].name == "DeepSpeed ops fused_adam" and rows[0].status == "PASS"
    assert ran[0].methods.engine == "fsdp2"  # beside the op build
    assert all(r.status == "PASS" for r in rows) and verdicts.exit_code(rows) == 0
    found = g.boundaries()
    assert found and all(b["right"] for b in found)  # the stand-in is its own truth
    first = found[0]
    assert first["item"] == "pythia-1b@24GiB DDP boundary from mb 2"
    assert first["largest_ok_mb"] == 2 and first["smallest_oom_mb"] == 4
    ooms = [r for r in rows if r.outcome == "oom"]
    assert ooms and all(r.verdicts["run"] == "pass" for r in ooms)  # out of memory is a measurement
    text = verdicts.table(rows, grid.COLUMNS)
    assert "pythia-1b@24GiB DDP mb 4" in text and "OOM" in text


def test_a_wrong_prediction_moves_the_search_and_a_budget_cut_reads_not_run(tmp_path, grid_plan):
    # Memory 30% above the stand-in's: the predicted fits run out of memory, each search halves, and the
    # trials it did not expect push the last planned ones past the budget.
    g, rows, _ = run_grid(tmp_path, grid_plan, plan.BUDGET_S, truth=1.3, slower=1.2)
    first = g.boundaries()[0]
    assert first["largest_ok_mb"] == 1 and first["smallest_oom_mb"] == 2 and first["right"] is False
    assert any(r.notes == ["predicted to fit"] for r in rows)
    cut = [r for r in rows if r.status == "NOT RUN"]
    assert cut and all("left once the trials ranked above it have theirs" in r.verdicts["budget"] for r in cut)
    assert verdicts.exit_code(rows) == 4
    assert {r.status for r in rows} <= {"PASS", "NOT RUN"}


def test_without_a_gpu_the_grid_exits_3_and_writes_nothing(tmp_path):
    env = dict(os.environ, PYTHON=sys.executable, CUDA_VISIBLE_DEVICES="")  # no GPU seen, on any machine
    out = subprocess.run(["bash", SCRIPT, str(tmp_path / "out")], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 3, out.stdout + out.stderr
    assert "gpu-grid: no CUDA GPU" in out.stderr and "nothing to run" in out.stderr
    assert not (tmp_path / "out").exists() and not (tmp_path / "out.tar.gz").exists()
    direct = subprocess.run(
        [sys.executable, "-m", "suite.gpu_grid", str(tmp_path / "out")], env=env, capture_output=True, text=True
    )
    assert direct.returncode == 3 and "nothing to run" in direct.stderr and not (tmp_path / "out").exists()


@pytest.mark.slow
def test_the_scripts_dry_run_plans_within_480_s_with_the_predictor():
    out = subprocess.run(
        ["bash", SCRIPT, "--dry-run"], env=dict(os.environ, PYTHON=sys.executable), capture_output=True, text=True
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "pythia-1b@24GiB DDP" in out.stdout and "480 s budget: fits" in out.stdout


def test_the_environment_finding_rows_are_the_checks(tmp_path):
    rows = grid.environment_rows(environment.Environment([environment.Finding("ninja", "pass", "/usr/bin/ninja")]))
    assert rows[0].name == "env: ninja" and rows[0].status == "PASS"


def test_a_run_writes_its_rows_boundaries_plan_and_readme_and_exits_by_its_rows(tmp_path, monkeypatch, grid_plan):
    import json

    from suite import detect
    from suite.gpu_check import check

    clock = Clock()
    monkeypatch.setattr(detect, "diagnose", lambda: (0, "h200-x1"))
    monkeypatch.setattr(environment, "check", lambda: environment.Environment([]))
    monkeypatch.setattr(environment, "OpBuild", lambda *a, **k: FakeBuild(clock, 45.0, ops=FUSED_ADAM))
    monkeypatch.setattr(Plan, "make", classmethod(lambda cls, gpu, count: grid_plan))
    monkeypatch.setenv("GPU_GRID_BUDGET_S", "150")  # a short budget: a few trials, then NOT RUN
    monkeypatch.setenv("GPU_GRID_START", str(time.time() - plan.STARTUP_S - plan.PLAN_S))

    def run_one(t, store_dir, sweep, in_sweep):
        outcome = "ok" if device_gib(t) <= t.hardware.mem_gib else "oom"
        rec = Record.new(t, sweep, outcome, "", metrics(peak_mem_gib=device_gib(t)) if outcome == "ok" else {}, 20.0)
        store.save(store_dir, rec)
        return Ran(rec, 1)

    monkeypatch.setattr(check, "run_one", run_one)  # what run_within runs where the grid gives none
    out = tmp_path / "2026-12-05-h200"
    with pytest.raises(SystemExit) as exit_:
        grid.main([str(out)])
    doc = json.loads((out / "grid.json").read_text())
    assert exit_.value.code == verdicts.exit_code(
        [verdicts.Row(r["name"], r["outcome"], verdicts=r["verdicts"]) for r in doc["rows"]]
    )
    assert doc["planned"] and doc["left_out"] and doc["budget_s"] == 150 and doc["gpu"] == "h200"
    assert doc["planned"][0] == "pythia-1b@24GiB DDP boundary from mb 2"
    records = list((out / "records").glob("*.json"))
    assert records and len(records) == sum(
        r["status"] == "PASS" for r in doc["rows"] if r["name"] != "DeepSpeed ops fused_adam"
    )
    readme = (out / "README.md").read_text()
    assert readme.startswith("# The GPU grid on 1 x h200") and "## Out-of-memory boundaries" in readme
    assert "suite-report accuracy results/gpu-grid/2026-12-05-h200/records --publish" in readme


class StandIn:
    """A predictor for scoring the fixture grid: `device_gib`'s memory (its peak 0.3 GiB less), and a
    step of 6.656 s (0.0065 s per sample) times a factor per engine and 1.3 under recomputation."""

    ENGINE = {"DDP": 1.0, "ZeRO-2": 1.02, "FSDP2 full_shard": 1.05, "ZeRO-3": 1.5}

    def predict(self, t):
        from types import SimpleNamespace

        from suite.labels import sharding_label

        gib = device_gib(t)
        step = 0.0065 * 1024 * self.ENGINE[sharding_label(t)] * (1.3 if t.methods.recompute == "full" else 1.0)
        return SimpleNamespace(
            peak_mem_gib=gib - 0.3, build_peak_mem_gib=1.4, device_gib=gib, fits=gib <= t.hardware.mem_gib,
            step_time_s=step, t_micro_s=step / t.gas, t_boundary_s=step / t.gas, t_optimizer_s=0.02,
            n_params=int(PARAMS[t.model.name]),
        )  # fmt: skip

    def machine(self, t):
        from types import SimpleNamespace

        return SimpleNamespace(probe_flops=0.0)


def test_a_fixture_grid_is_scored_per_cap_per_engine_and_per_budget_with_each_trials_regime():
    from analysis import accuracy
    from analysis.load import read_results

    results = read_results(ROOT / "tests" / "fixtures" / "gpu-grid")
    recs = accuracy.scorable(results)
    assert len(recs) == 11 and not results.skipped
    s = accuracy.summary(accuracy.score(recs, predictor_for=lambda host: StandIn()))
    # Fit or out-of-memory, per memory: under the 24 GiB cap ZeRO-3 with recomputation at mb 32 was
    # predicted to fit (16.8 GiB) and ran out of memory; every other call was right.
    assert s["per_memory"]["24 GiB capped"]["fit_right_pct"] == pytest.approx(100 * 6 / 7)
    assert s["per_memory"]["140 GiB"]["fit_n"] == 4 and s["per_memory"]["140 GiB"]["fit_right_pct"] == 100.0
    assert s["fit_n"] == 11 and s["fit_right_pct"] == pytest.approx(100 * 10 / 11)
    assert s["fit"] == {"ran": 7, "false_no_fit": 0, "oom": 4, "false_fit": 1}  # each way apart
    # Memory: |predicted - measured| / measured of the 7 that ran, e.g. DDP mb 8: 16.5 against 16.9 GiB.
    mem = s["per_memory"]["24 GiB capped"]["peak_mem_err_pct"]
    assert mem["n"] == 4 and mem["max"] == pytest.approx(100 * (10.6 - (2.384 + 7.2 - 0.3)) / 10.6, abs=0.1)
    assert s["peak_mem_err_pct"]["n"] == 7 and s["peak_mem_err_pct"]["median"] == pytest.approx(2.4, abs=0.1)
    # Step time per engine: DDP 6.656 s against 7.10 and 6.30 (6.3% and 5.7%).
    ddp = s["per_engine"]["DDP"]["step_time_err_pct"]
    assert ddp["n"] == 2 and ddp["median"] == pytest.approx((100 * 0.444 / 7.1 + 100 * 0.356 / 6.3) / 2, abs=0.05)
    assert set(s["per_engine"]) == {"DDP", "ZeRO-2", "ZeRO-3", "FSDP2 full_shard"}
    assert s["per_engine"]["ZeRO-3"]["step_time_err_pct"]["p90"] > 20  # 12.98 s against 9.80 at the H200's own
    # Rank correlation per budget: the cap is a budget of its own; FSDP2 and ZeRO-2 swapped under it.
    rho = {sp["budget"]: sp["spearman"] for sp in s["spearman"]}
    assert rho == {"h200-x1 capped at 24 GiB": pytest.approx(0.8), "h200-x1": pytest.approx(1.0)}
    # Each trial's regime, which per-regime labels group by.
    t = next(t for t in s["trials"] if t["outcome"] == "oom" and t["sharding"] == "ZeRO-3")
    assert t["gpu"] == "NVIDIA H200" and t["gpus"] == 1 and t["engine"] == "deepspeed" and t["zero_stage"] == 3
    assert t["offload"] == "none" and t["model_params"] == 160_000_000 and t["memory_gib"] == 24 and t["capped"]
    assert t["pred_fits"] and t["fit_right"] is False and t["step_time_err_pct"] is None
    fsdp = next(t for t in s["trials"] if t["engine"] == "fsdp2" and not t["capped"])
    assert fsdp["zero_stage"] is None and fsdp["model_params"] == 162322944 and fsdp["memory_gib"] == 140
    import json

    json.dumps(s, allow_nan=False)  # what --publish writes: plain JSON


def test_the_fixture_grids_accuracy_is_published_as_cuda_json(tmp_path, monkeypatch, capsys):
    """What `suite-report accuracy RECORDS --publish` does after a grid, on the made-up grid: the
    summary per device kind, written to results/accuracy/cuda.json (here a folder of the test's)."""
    import json

    from analysis import accuracy
    from suite import paths

    monkeypatch.setattr(paths, "publish_dir", lambda: tmp_path / "published")
    fixture = ROOT / "tests" / "fixtures" / "gpu-grid"
    result = accuracy.run(fixture, tmp_path / "out", publish=True, predictor_for=lambda host: StandIn())
    published = json.loads((tmp_path / "published" / "cuda.json").read_text())
    assert set(result) == {"cuda"} and published == json.loads(json.dumps(result["cuda"]))
    assert published["n_records"] == 11 and published["source"] == f"suite-report accuracy {fixture}"
    assert published["fit_right_pct"] == pytest.approx(100 * 10 / 11)
    assert published["per_memory"]["24 GiB capped"]["fit_n"] == 7
    assert {"median", "p90"} <= set(published["per_engine"]["FSDP2 full_shard"]["step_time_err_pct"])
    assert len(published["spearman"]) == 2 and len(published["trials"]) == 11
    out = capsys.readouterr().out
    assert 'within 24 GiB capped: false "fits" 1 of 3 OOMs, false "does not fit" 0 of 4 that ran' in out
    assert "published " in out
    # What an H200 prediction's error label reads: the regimes of the 11, each relaxed level too.
    assert published["by_regime"]["datacenter-sxm|*|*|*|*"]["n"] == 11
    assert published["by_regime"]["datacenter-sxm|*|*|*|*"]["fit"] == published["fit"]
