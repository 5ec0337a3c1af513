"""The GPU check without a GPU: it exits 3 saying so, its trials are valid, and its verdicts judge
records as they should. The records below are made up to exercise each verdict; none ran on a GPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from suite import gpu_check
from suite.config.validate import problems, unsupported
from suite.record import Record


def test_without_a_gpu_the_check_exits_3_and_says_so(tmp_path):
    script = Path(__file__).resolve().parent.parent / "scripts" / "gpu-check.sh"
    env = dict(os.environ, PYTHON=sys.executable)
    out = subprocess.run(["bash", script, str(tmp_path / "out")], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 3, out.stdout + out.stderr
    assert "no CUDA GPU" in out.stderr and "nothing to check" in out.stderr
    assert not (tmp_path / "out").exists()  # nothing run, nothing written


def test_every_planned_trial_is_valid_on_an_h200_and_the_first_ones_matter_most():
    base = gpu_check.base_trial("h200")
    checks = gpu_check.plan()
    names = [c.name for c in checks]
    assert len(names) == len(set(names)) == 20  # 16 of the grid, oom, offload, flash, compile
    assert names[:4] == [
        "bf16 zero=0 recompute=none",
        "bf16 zero=3 recompute=none",
        "fp16 zero=0 recompute=none",
        "fp16 zero=3 recompute=none",
    ]
    grid = [c for c in checks if "recompute" in c.methods]
    assert len({(c.methods["precision"], c.methods["zero_stage"], c.methods["recompute"]) for c in grid}) == 16
    for c in grid:  # each ZeRO-3 trial's first loss has its ZeRO-0 trial to compare with, run before it
        if c.methods["zero_stage"] == 3:
            assert names.index(c.name.replace("zero=3", "zero=0")) < names.index(c.name)
    for c in checks:
        t = gpu_check.trial_of(base, c)
        assert problems(t) == [], c.name
        assert t.model.name == "pythia-160m" and t.hardware.name == "h200-x1" and t.measure.rerun
    oom = gpu_check.trial_of(base, next(c for c in checks if c.name == "forced oom"))
    assert oom.methods.micro_batch == gpu_check.OOM_MICRO_BATCH and oom.gas >= 1
    flash = gpu_check.trial_of(base, next(c for c in checks if c.name == "flash_attention_2"))
    why = unsupported(flash, capability=(9, 0))
    assert why is None or "flash-attn" in why


def test_the_predictor_answers_through_its_interface():
    t = gpu_check.base_trial("h200")  # the check's own trial, predicted from the H200's datasheet
    gib = gpu_check.predicted_gib(t)
    assert gib is not None and 0 < gib < t.hardware.mem_gib


def record(outcome="ok", message="", **metrics):
    base = {"mfu": 0.41, "hfu": 0.41, "peak_mem_gib": 20.0, "skipped_steps_discarded": 0, "first_loss": 10.9}
    return Record("t", "gpu-check", outcome, message, {}, {**base, **metrics}, 14.0, None)


def test_verdicts_pass_plausible_figures_and_name_what_fails():
    checks = {c.name: c for c in gpu_check.plan()}
    z0, z3 = checks["bf16 zero=0 recompute=none"], checks["bf16 zero=3 recompute=none"]
    records = {z0.name: record(first_loss=10.90), z3.name: record(first_loss=10.95)}
    assert gpu_check.judge(z3, records[z3.name], records, 21.0).passed
    bad = record(mfu=1.4e-3, skipped_steps_discarded=2, first_loss=40.8, profile_mismatch=None)
    row = gpu_check.judge(z3, bad, {**records, z3.name: bad}, 40.0)
    assert row.verdicts["mfu"] == "FAIL: mfu 0.0014 outside 20%-75%"
    assert row.verdicts["skipped"] == "FAIL: 2 skipped in the timed window"
    assert row.verdicts["first_loss"] == "FAIL: 40.8000 against ZeRO-0's 10.9000"
    assert row.verdicts["memory"] == "FAIL: predicted/measured 2.00"
    unknown = record()
    del unknown.metrics["skipped_steps_discarded"]
    assert gpu_check.judge(z0, unknown, records, 20.0).verdicts["skipped"].startswith("FAIL: no count")
    rc = checks["bf16 zero=0 recompute=full"]
    assert gpu_check.judge(rc, record(mfu=0.15, hfu=0.21), records, 20.0).verdicts == {
        "hfu": "pass",  # recomputation: the hardware's utilization is the plausible one
        "skipped": "pass",
        "memory": "pass",
        "profile": "pass",
    }
    wrong = record(profile_mismatch={"device_name": "NVIDIA H100 NVL", "detected": "h100-nvl"})
    assert gpu_check.judge(z0, wrong, records, 20.0).verdicts["profile"].startswith("FAIL: ran on NVIDIA H100 NVL")


def test_the_forced_oom_flash_and_left_out_checks():
    checks = {c.name: c for c in gpu_check.plan()}
    oom = checks["forced oom"]
    assert gpu_check.judge(oom, record("oom", "rank 0: OutOfMemoryError: CUDA out of memory."), {}, None).passed
    assert not gpu_check.judge(oom, record("crashed", "rank 0: RuntimeError: boom"), {}, None).passed
    flash = checks["flash_attention_2"]
    assert gpu_check.judge(flash, record("unsupported", "flash-attn is not installed (...)"), {}, None).passed
    assert not gpu_check.judge(flash, record("crashed", "rank 0: ImportError"), {}, None).passed
    left = gpu_check.judge(checks["fp16 zero=2 recompute=full"], None, {}, None)
    assert left.outcome == "not run" and not left.passed


def test_the_table_has_a_line_per_check_and_says_what_failed():
    checks = gpu_check.plan()
    rows = [gpu_check.judge(checks[0], record(), {}, 20.0), gpu_check.judge(checks[1], None, {}, None)]
    text = gpu_check.table(rows)
    lines = text.splitlines()
    assert lines[0].startswith("check") and "verdict" in lines[0]
    assert lines[2].startswith("bf16 zero=0 recompute=none") and lines[2].endswith("PASS")
    assert "41.0%" in lines[2] and "20.00" in lines[2]
    assert lines[3].startswith("bf16 zero=3 recompute=none") and "not run" in lines[3]
    assert "FAIL run: left out by the time budget" in lines[3]
    assert lines[-1] == "1 of 2 checks passed"


@pytest.mark.parametrize("second,code", [("pass", 0), ("not run", 4), ("fail", 1)])
def test_the_exit_code_says_whether_all_passed_a_verdict_failed_or_the_budget_left_checks_out(tmp_path, second, code):
    checks = gpu_check.plan()
    other = {"pass": record(), "not run": None, "fail": record(mfu=0.9)}[second]
    rows = [gpu_check.judge(checks[0], record(), {}, 20.0), gpu_check.judge(checks[2], other, {}, 20.0)]
    with pytest.raises(SystemExit) as done:
        gpu_check.finish(tmp_path, rows)
    assert done.value.code == code
    assert (tmp_path / "table.txt").read_text().splitlines()[2].startswith("bf16 zero=0 recompute=none")
    assert len(json.loads((tmp_path / "verdicts.json").read_text())) == 2
