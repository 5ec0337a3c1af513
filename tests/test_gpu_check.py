"""The GPU check without a GPU: its plan and time budget, its environment check and fallbacks, its
verdicts, table and exit code, on mocks (a fake clock, a fake NVML, a fake nvidia-smi, fake op
builds) and CPU runs. Records below are made up unless a test runs trials; none ran on a GPU. The
tests marked `gpu` run the check's GPU-only parts where there is one."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import pytest
from conftest import TINY, make_trial, measured_all, single_rank_env

from suite import store, worker
from suite.config.validate import problems
from suite.gpu_check import check, environment, plan, verdicts
from suite.gpu_check.plan import REFERENCE, Budget
from suite.gpu_check.verdicts import Context, Expect, Row
from suite.record import Record
from suite.runner import Ran

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "gpu-check.sh"
# Parameter statistics [elements, mean, std] as transformers initializes Pythia-160M (normal(0, 0.02)
# weights, zero biases, unit layer norms), and as a build that skipped that init leaves them: torch's
# own defaults (embedding N(0, 1); Linear weight and bias uniform(+-1/sqrt(768)), std 1/sqrt(3 * 768)).
STATS = {
    "gpt_neox.embed_in.weight": [38633472, 1e-6, 0.02],
    "gpt_neox.layers.0.attention.query_key_value.weight": [1769472, -2e-6, 0.02],
    "gpt_neox.layers.0.attention.query_key_value.bias": [2304, 0.0, 0.0],
    "gpt_neox.layers.0.input_layernorm.weight": [768, 1.0, 0.0],
    "embed_out.weight": [38633472, 0.0, 0.02],
}
UNINITIALIZED = {
    "gpt_neox.embed_in.weight": [38633472, 1e-4, 1.0],
    "gpt_neox.layers.0.attention.query_key_value.weight": [1769472, 1e-5, 0.0208],
    "gpt_neox.layers.0.attention.query_key_value.bias": [2304, 3e-4, 0.0208],
    "gpt_neox.layers.0.input_layernorm.weight": [768, 1.0, 0.0],
    "embed_out.weight": [38633472, 0.0, 0.0208],
}
PREDICTED = Expect(peak_gib=31.0, step_s=5.4, micro_s=0.084, boundary_s=0.086)


@pytest.fixture(scope="module")
def base():
    return plan.base_trial("h200")


@pytest.fixture(scope="module")
def checks():
    return {c.name: c for c in plan.plan()}


def metrics(**over):
    """What a worker records for one of the check's trials on an H200, as figures go."""
    m = {
        "step_time_s": 5.4,
        "step_time_std_s": 0.01,
        "step_time_min_s": 5.39,
        "step_time_max_s": 5.41,
        "timed_steps": 3,
        "noisy": False,
        "gas": 64,
        "gas_measured": 2,
        "micro_time_s": 0.084,
        "boundary_time_s": 0.086,
        "optimizer_time_s": 0.002,
        "tokens_per_s": 388_000.0,
        "mfu": 0.38,
        "hfu": 0.38,
        "peak_mem_gib": 31.0,
        "build_peak_mem_gib": 2.0,
        "optimizer": "deepspeed FusedAdam",
        "warmup_steps_run": 2,
        "skipped_steps_warmup": 0,
        "skipped_steps_discarded": 0,
        "recompiles_timed": 0,
        "first_loss": 10.95,
        "loss_per_step": [10.70, 10.61, 10.52],
        "profile_mismatch": None,
        "param_stats": STATS,
    }
    return {**m, **over}


def record(t, outcome="ok", message="", wall_s=18.0, **over):
    return Record.new(t, "gpu-check", outcome, message, metrics(**over) if outcome == "ok" else {}, wall_s)


def judged(c, base, rec, ref=None, expects=None):
    ref = ref if ref is not None else record(plan.trial_of(base, plan.plan()[0]))
    ctx = Context({REFERENCE: ref, c.name: rec}, expects or {REFERENCE: PREDICTED, c.name: PREDICTED})
    return verdicts.judge(c, rec, ctx)


# --- 1. a trial cut by the check's own budget is not run, never failed -----------------------------


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


class FakeBuild:
    """environment.OpBuild's interface: building `ops` (builder: name; default the check's) for
    `build_s` of the fake clock, then `why` (the GPU grid's tests use it too)."""

    def __init__(self, clock, build_s, why=None, ops=None):
        self.clock, self.end, self.why, self.wall_s = clock, clock() + build_s, why or {}, build_s
        self.logs, self.no_deepspeed = {op: Path(f"ops-{n}.log") for op, n in (ops or plan.OPS).items()}, None

    def running(self):
        return self.clock() < self.end

    def wait(self):
        self.clock.now = max(self.clock.now, self.end)
        return self.why


def session(tmp_path, monkeypatch, base, total_s, hang=(), why=None, build_s=75.0):
    """A check on fake time: each trial takes its estimate (those named in `hang` never end), the ops
    build for `build_s`. Returns the session and the trials it was handed, in order."""
    clock = Clock()
    monkeypatch.setattr(environment, "OpBuild", lambda *a, **k: FakeBuild(clock, build_s, why))
    monkeypatch.setattr(check, "expect", lambda t: PREDICTED)
    by_id = {}
    for c in plan.plan():
        by_id[plan.trial_of(base, c).id] = by_id[plan.trial_of(base, c, frozenset(plan.OPS)).id] = c
    ran = []

    def run_one(t, store_dir, sweep, in_sweep):
        c = by_id[t.id]
        ran.append((c.name, t))
        if c.name in hang:
            clock.now += t.measure.timeout_s
            rec = Record.new(t, sweep, "timeout", f"no result within measure.timeout_s={t.measure.timeout_s:g}", {}, 0)
        else:
            clock.now += c.est_s
            outcome = "oom" if c.methods.get("micro_batch") == plan.OOM_MICRO_BATCH else "ok"
            rec = record(t, outcome, "rank 0: OutOfMemoryError: CUDA out of memory" * (outcome == "oom"), c.est_s)
        store.save(store_dir, rec)
        return Ran(rec, 1)

    budget = Budget(total_s, clock() - plan.STARTUP_S, clock)
    predict = lambda trials: lambda: dict.fromkeys(trials, PREDICTED)  # noqa: E731 - no predictor run
    s = check.Session(tmp_path, base, budget, environment.Environment([]), run_one, predict)
    return s, ran


def test_a_trial_cut_by_the_budget_reads_not_run_and_the_exit_code_says_so(tmp_path, monkeypatch, base):
    s, ran = session(tmp_path, monkeypatch, base, total_s=250, hang=("ZeRO-2 offload bf16",))
    rows = {r.name: r for r in s.run()}
    cut = rows["ZeRO-2 offload bf16"]
    assert cut.status == "NOT RUN" and "cut by the budget after 65 s" in cut.verdicts["budget"]
    offload = next(t for name, t in ran if name == "ZeRO-2 offload bf16")
    assert not store.path_for(s.store, offload.id).exists()  # a cut trial is no record of the trial
    oom = rows["forced OOM"]
    assert oom.status == "NOT RUN" and "needs ~15 s; 0 s are left" in oom.verdicts["budget"]
    assert rows["ZeRO-3 bf16"].status == "PASS" and rows["flash_attention_2"].status == "SKIPPED"
    assert verdicts.exit_code(list(rows.values())) == 4
    assert [name for name, _ in ran][:4] == ["FSDP2 full_shard bf16", "FSDP2 offload bf16", "compile", REFERENCE]


def test_a_trial_that_times_out_within_its_own_timeout_fails(tmp_path, monkeypatch, base):
    s, _ = session(tmp_path, monkeypatch, base, total_s=300, hang=("ZeRO-2 offload bf16",))
    rows = {r.name: r for r in s.run()}
    hung = rows["ZeRO-2 offload bf16"]
    assert hung.status == "FAIL"
    assert hung.verdicts["run"].startswith("FAIL: timeout: no result within measure.timeout_s=90")
    assert verdicts.exit_code(list(rows.values())) == 1


def test_a_check_costs_its_own_estimate_and_leaves_the_ones_ranked_above_it_their_time(checks):
    clock = Clock()
    budget = Budget(300, clock(), clock)
    budget.ran(checks["forced OOM"], wall_s=3.0)  # a fast trial does not make the next look cheap
    assert budget.cost(checks["compile"]) == checks["compile"].est_s
    budget.ran(checks[REFERENCE], wall_s=2 * checks[REFERENCE].est_s + 12)  # slower than estimated: scaled up
    assert budget.cost(checks["compile"]) > checks["compile"].est_s
    above = [checks[REFERENCE], checks["ZeRO-3 bf16"]]
    assert budget.room(checks["compile"], above) == 300 - sum(budget.cost(c) for c in above)
    assert budget.room(checks[REFERENCE], [checks["compile"]]) == 300  # what ranks below it reserves nothing


# --- 2. ZeRO-3's build: each parameter against ZeRO-0's, and the loss after updates ----------------


def test_a_zero3_build_that_skipped_init_fails_the_weight_check(base, checks):
    z3 = checks["ZeRO-3 bf16"]
    t = plan.trial_of(base, z3)
    assert judged(z3, base, record(t)).verdicts["weights"] == "pass"
    # Another draw of the same init: within a few % and the sampling error of each tensor.
    drawn = {k: [n, mean + 0.5 * std / math.sqrt(n), std * 1.01] for k, (n, mean, std) in STATS.items()}
    assert judged(z3, base, record(t, param_stats=drawn)).verdicts["weights"] == "pass"
    # Its first loss is ln(50304) like any init near std 0.02: only the weights tell the builds apart.
    bad = judged(z3, base, record(t, param_stats=UNINITIALIZED, first_loss=10.97))
    assert bad.status == "FAIL" and bad.verdicts["weights"].startswith("FAIL: 4 of 5 parameters built otherwise")
    assert "gpt_neox.embed_in.weight: std 1 mean 0.0001, against 0.02" in bad.verdicts["weights"]
    missing = judged(z3, base, record(t, param_stats={**STATS, "extra.weight": [1, 0, 0]}))
    assert missing.verdicts["weights"].startswith("FAIL: 1 parameters not in both builds")


def test_the_loss_after_the_warmups_updates_is_within_half_of_what_the_references_moved(base, checks):
    z3 = checks["ZeRO-3 bf16"]
    t = plan.trial_of(base, z3)
    # The reference (metrics()): 10.95 first, 10.70 after the warm-up's 2 updates: it moved 0.25.
    assert judged(z3, base, record(t, loss_per_step=[10.8, 10.6, 10.55])).verdicts["loss"] == "pass"
    stuck = judged(z3, base, record(t, loss_per_step=[10.95, 10.95, 10.95]))  # no update took
    assert stuck.verdicts["loss"] == (
        "FAIL: loss 10.9500 after 2 updates against ZeRO-0 bf16's 10.7000: 0.250 apart, more than 0.5 of the "
        "0.250 ZeRO-0 bf16's moved from its first loss 10.9500"
    )
    double = judged(z3, base, record(t, loss_per_step=[10.45, 10.3, 10.2]))  # twice the step
    assert double.verdicts["loss"].startswith("FAIL: loss 10.4500 after 2 updates")
    later = judged(z3, base, record(t, warmup_steps_run=5))
    assert later.verdicts["loss"] == "skipped: the first timed losses come after 5 and 2 updates"
    flat = record(plan.trial_of(base, plan.plan()[0]), loss_per_step=[10.95, 10.9, 10.8])
    assert judged(z3, base, record(t), ref=flat).verdicts["loss"].startswith("skipped: ZeRO-0 bf16's loss did not move")


H200 = Path(__file__).parents[1] / "results" / "gpu-check" / "2026-12-04-h200" / "records"


def test_the_first_gpu_runs_sound_builds_pass_the_loss_verdict_that_their_last_losses_failed():
    """The H200 run's records: after 4 updates at the recipe's peak learning rate each draw of the
    init took its own path (the old verdict's 3 FAILs); after the warm-up's 2 they agree."""
    recs = [Record.from_json(json.loads(p.read_text())) for p in sorted(H200.glob("*.json"))]
    ok = [r for r in recs if r.ok and r.trial.precision == "bf16"]
    ref = next(r for r in ok if r.trial.methods.engine == "deepspeed" and r.trial.methods.zero_stage == 0)
    others = [r for r in ok if r is not ref]
    assert len(others) == 4  # ZeRO-3, FSDP2, FSDP2 offload, ZeRO-2 offload
    for r in others:
        assert verdicts.loss_verdict(r.metrics, ref.metrics) == "pass", r.trial.methods
    last = {abs(r.metrics["loss_per_step"][-1] / ref.metrics["loss_per_step"][-1] - 1) for r in others}
    assert sum(x > 0.02 for x in last) == 3  # what the last-loss comparison within 2% called FAIL


BUILDS = """
import json, sys
import torch
import transformers.integrations.deepspeed as hf_deepspeed
from suite import engines
from suite.config import Trial

out = {}
for name, spec in json.loads(sys.argv[1]).items():  # FSDP2 first: it opens the process group
    if name == "zero3 without init":
        hf_deepspeed.initialize_weights_zero3 = lambda model: None  # what a wrong build would do
    eng = engines.make(Trial.from_json(spec), torch.device("cpu"), 1)
    eng.build()
    out[name] = eng.param_stats()
print(json.dumps(out))
"""


@pytest.mark.slow
def test_zero3_and_fsdp2_build_zero0s_weights_and_a_build_without_init_does_not():
    cpu = [*TINY, "hardware=cpu-x1", "methods.precision=bf16", "methods.micro_batch=8"]
    specs = {
        "fsdp2": make_trial([*cpu, "methods.engine=fsdp2"]),
        "zero0": make_trial([*cpu, "methods.zero_stage=0"]),
        "zero3": make_trial([*cpu, "methods.zero_stage=3"]),
        "zero3 without init": make_trial([*cpu, "methods.zero_stage=3"]),
    }
    cmd = [sys.executable, "-c", BUILDS, json.dumps({k: t.to_json() for k, t in specs.items()})]
    out = subprocess.run(cmd, env=single_rank_env(), capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    built = json.loads(out.stdout.strip().splitlines()[-1])
    assert len(built["zero0"]) > 10 and built["zero0"]["gpt_neox.embed_in.weight"][2] == pytest.approx(0.02, rel=0.05)
    assert verdicts.weights_verdict(built["zero3"], built["zero0"]) == "pass"
    assert verdicts.weights_verdict(built["fsdp2"], built["zero0"]) == "pass"
    assert verdicts.weights_verdict(built["zero3 without init"], built["zero0"]).startswith("FAIL: ")


# --- 3. MFU floors per method, each saying where it comes from ---------------------------------------


def test_mfu_floors_come_from_zero0_and_the_predictor_and_say_so(base, checks):
    off = checks["ZeRO-2 offload bf16"]
    t = plan.trial_of(base, off)
    host = Expect(peak_gib=29.4, micro_s=0.092, boundary_s=0.094)  # no host CPU Adam calibrated here
    # Offload on one GPU, host copies each step: 15% is what it costs, not a fault (a flat 20% floor failed it).
    slow = record(t, mfu=0.15, step_time_s=13.7, optimizer_time_s=7.8)
    row = judged(off, base, slow, expects={REFERENCE: PREDICTED, off.name: host})
    assert row.verdicts["mfu"] == "pass" and row.figures["floor"] == pytest.approx(0.5 * 0.15 * 13.7 / 13.69, rel=1e-3)
    z0 = checks[REFERENCE]
    broken = judged(z0, base, record(plan.trial_of(base, z0), mfu=0.05, step_time_s=41.0))
    said = "FAIL: mfu 5.0% below its floor 19.0% (0.5 of the lower of: 38.0%, the predictor's)"
    assert broken.verdicts["mfu"] == said
    z3 = checks["ZeRO-3 bf16"]
    meh = judged(z3, base, record(plan.trial_of(base, z3), mfu=0.12, step_time_s=17.1), ref=record(t, mfu=0.3))
    assert "ZeRO-0 bf16's measured x the predicted ratio 1.00" in meh.verdicts["mfu"] and meh.status == "FAIL"
    over = judged(z0, base, record(plan.trial_of(base, z0), mfu=0.8))
    assert over.verdicts["mfu"].startswith("FAIL: mfu 80.0% above 75%")
    none = judged(z3, base, record(plan.trial_of(base, z3)), expects={z3.name: Expect(why="the predictor failed")})
    assert none.verdicts["mfu"].startswith("skipped: no floor (the predictor failed)")


# --- 4. passes that test nothing: flash-attn not installed, the launcher's memory ------------------


def test_flash_attention_without_flash_attn_is_skipped_not_passed(tmp_path, monkeypatch, base, checks):
    monkeypatch.setattr("suite.gpu_check.check.flash_attn_problem", lambda: "flash-attn is not installed (...)")
    s, ran = session(tmp_path, monkeypatch, base, total_s=300)
    rows = {r.name: r for r in s.run()}
    assert rows["flash_attention_2"].status == "SKIPPED" and "flash_attention_2" not in [n for n, _ in ran]
    assert verdicts.why(rows["flash_attention_2"]) == "run: flash-attn is not installed (...)"
    flash = checks["flash_attention_2"]
    t = plan.trial_of(base, flash)
    unsupported = Record.new(t, "gpu-check", "unsupported", "flash-attn is not installed", {}, 0)
    assert judged(flash, base, unsupported).status == "SKIPPED"


@contextmanager
def probe(pid=4242):
    yield pid


def test_the_launcher_is_asked_of_its_own_process_not_of_nvidia_smi(tmp_path, monkeypatch):
    smi = tmp_path / "nvidia-smi"  # lists another container's process: the old check's false FAIL
    smi.write_text("#!/bin/sh\necho '777, 1024 MiB'\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    me = os.getpid()
    assert verdicts.launcher_verdict(False, lambda: 1 / 0, probe)[0] == "pass"  # no CUDA here: nothing asked
    assert verdicts.launcher_verdict(True, lambda: [(777, 2**30), (4242, 2**29)], probe)[0] == "pass"
    assert verdicts.launcher_verdict(True, lambda: [(me, 500 * 2**20), (4242, 1)], probe)[0] == (
        "FAIL: the launcher holds 500 MiB of GPU memory"
    )
    # A container's NVML lists nothing of ours (the old check's vacuous pass): it cannot tell.
    assert verdicts.launcher_verdict(True, lambda: [], probe)[0].startswith("skipped: NVML does not list our")
    unknown = verdicts.launcher_verdict(True, lambda: [(me, None)], probe)[0]
    assert unknown.startswith("skipped: NVML lists the launcher")
    monkeypatch.setattr("torch.cuda.is_initialized", lambda: True)
    monkeypatch.setattr(verdicts, "nvml_processes", lambda: [(777, 2**30), (4242, 2**29)])
    monkeypatch.setattr(verdicts, "probe_process", probe)
    assert check.launcher_row().status == "PASS"


# --- 5. FSDP2 on the GPU --------------------------------------------------------------------------


def test_fsdp2_full_shard_and_cpu_offload_are_checked_and_run_beside_the_op_build(base, checks):
    full, offload = checks["FSDP2 full_shard bf16"], checks["FSDP2 offload bf16"]
    for c in (full, offload):
        t = plan.trial_of(base, c)
        assert problems(t) == [] and t.methods.engine == "fsdp2" and t.methods.reshard_after_forward is True
        assert plan.op_needed(t) is None and {"weights", "loss", "mfu", "memory"} <= set(c.verdicts)
    assert plan.trial_of(base, offload).methods.offload == "optimizer+params"  # CPUOffloadPolicy
    pending = [(c, plan.trial_of(base, c)) for c in plan.plan()]
    assert plan.next_check(pending, building=True)[0] == full
    assert plan.next_check(pending, building=False)[0].name == REFERENCE


# --- 6. the environment, the op build and its fallback --------------------------------------------


def test_a_missing_nvcc_says_so_and_fused_adams_trials_fall_back(monkeypatch, base, checks):
    monkeypatch.setattr("torch.utils.cpp_extension.CUDA_HOME", None)
    f = environment.nvcc_finding()
    assert f.verdict.startswith("FAIL: nvcc not found (PATH, CUDA_HOME or /usr/local/cuda): DeepSpeed's FusedAdam")
    env = environment.check({"PATH": os.environ["PATH"]})
    assert set(env.unbuildable) == {"FusedAdamBuilder"} and not env.fatal
    t = plan.trial_of(base, checks["ZeRO-3 bf16"], frozenset(env.unbuildable))
    assert t.methods.optimizer == "torch_fused" and problems(t) == [] and plan.op_needed(t) is None
    offload = plan.trial_of(base, checks["ZeRO-2 offload bf16"], frozenset(env.unbuildable))
    assert offload.methods.optimizer == "engine"  # CPU Adam needs no nvcc


def test_an_nvcc_of_another_cuda_major_than_torchs_is_named(tmp_path, monkeypatch):
    nvcc = tmp_path / "bin" / "nvcc"
    nvcc.parent.mkdir()
    nvcc.write_text("")
    monkeypatch.setattr("torch.utils.cpp_extension.CUDA_HOME", str(tmp_path))
    monkeypatch.setattr("torch.version.cuda", "13.0")
    said = "Cuda compilation tools, release 12.4, V12.4.131"
    f = environment.nvcc_finding(run=lambda cmd: said)
    assert f.verdict.startswith(f"FAIL: {nvcc} is CUDA 12.4 but torch") and "built for CUDA 13.0" in f.verdict
    ok = environment.nvcc_finding(run=lambda cmd: said.replace("12.4", "13.0"))
    assert ok.verdict == "pass" and ok.message == f"{nvcc}: CUDA 13.0, torch's 13.0"


def test_ninja_beside_the_python_but_off_path_is_put_on_path(tmp_path, monkeypatch):
    venv_bin = tmp_path / "venv" / "bin"
    venv_bin.mkdir(parents=True)
    (venv_bin / "ninja").write_text("#!/bin/sh\n")
    (venv_bin / "ninja").chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(venv_bin / "python"))
    monkeypatch.setitem(sys.modules, "ninja", None)  # the ninja package's own binary: not here either
    env = {"PATH": str(tmp_path / "empty")}
    f = environment.ninja_finding(env)
    assert f.verdict == "pass" and "not on PATH" in f.message and env["PATH"].startswith(f"{venv_bin}{os.pathsep}")
    env = {"PATH": str(tmp_path / "empty")}
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    assert environment.ninja_finding(env).verdict.startswith("FAIL: ninja is not on PATH nor beside this Python")


def test_a_missing_or_old_package_is_named_and_ends_the_check(monkeypatch):
    real = environment.importlib.metadata.version
    fake = {"deepspeed": None, "transformers": "4.40.0"}

    def version(name):
        if name not in fake:
            return real(name)
        if fake[name] is None:
            raise environment.importlib.metadata.PackageNotFoundError(name)
        return fake[name]

    monkeypatch.setattr(environment.importlib.metadata, "version", version)
    found = {f.what: f for f in environment.package_findings()}
    deepspeed = found["deepspeed"]
    assert deepspeed.fatal and "deepspeed is not installed (the suite needs deepspeed>=0.15)" in deepspeed.verdict
    assert found["transformers"].verdict == "FAIL: transformers 4.40.0 is installed; the suite needs transformers>=4.46"
    assert found["torch"].verdict == "pass"


class AfterFailure:
    """A clock past every deadline from the moment the failing stand-in build has ended, however
    slowly a loaded machine started it: its failure is read as a failure, and the hanging build
    is killed at the deadline at once, not after real seconds."""

    def __init__(self):
        self.build = None

    def late(self) -> bool:
        fused = self.build.procs.get("FusedAdamBuilder") if self.build else None
        return fused is not None and fused.poll() is not None

    def __call__(self) -> float:
        return time.monotonic() + (1000.0 if self.late() else 0.0)


def test_op_builds_that_fail_hang_or_find_no_deepspeed_say_so(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "ext"))
    from torch.utils.cpp_extension import _get_build_directory

    lock = Path(_get_build_directory("cpu_adam", verbose=False)) / "lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    old = Path(_get_build_directory("fused_adam", verbose=False)) / "lock"
    old.parent.mkdir(parents=True, exist_ok=True)
    old.write_text("")
    os.utime(old, (0, 0))  # another process's, from before this build: not ours to remove
    real = environment.BUILD
    script = "import sys, time\nif sys.argv[1] == 'FusedAdamBuilder':\n"
    script += "    sys.exit(print('nvcc fatal: no sm_90') or 1)\ntime.sleep(60)\n"
    monkeypatch.setattr(environment, "BUILD", script)
    clock = AfterFailure()
    start = time.monotonic()
    build = clock.build = environment.OpBuild(list(plan.OPS), {}, tmp_path, timeout_s=120.0, clock=clock)
    lock.write_text("")  # what the build killed while holding it leaves
    assert build.running() or clock.late()
    why = build.wait()
    assert why["FusedAdamBuilder"] == "did not build: nvcc fatal: no sm_90 (see ops-fused_adam.log)"
    assert why["CPUAdamBuilder"] == "not built within 120 s (see ops-cpu_adam.log)" and not lock.exists()
    assert old.exists()
    assert time.monotonic() - start < 60 and not build.running()
    monkeypatch.setattr(environment, "BUILD", real.replace("deepspeed.accelerator", "deepspeed_nowhere"))
    gone = environment.OpBuild(["FusedAdamBuilder"], {}, tmp_path, timeout_s=60.0)
    gone.wait()
    assert gone.no_deepspeed.startswith("DeepSpeed does not import: ModuleNotFoundError")


def test_a_session_whose_fused_adam_did_not_build_runs_deepspeed_with_torchs_adamw(tmp_path, monkeypatch, base):
    why = {"FusedAdamBuilder": "did not build: nvcc fatal (see ops-fused_adam.log)"}
    s, ran = session(tmp_path, monkeypatch, base, total_s=300, why=why)
    rows = s.run()
    assert rows[0].name == "DeepSpeed ops fused_adam+cpu_adam" and rows[0].status == "FAIL"
    got = dict(ran)
    assert got[REFERENCE].methods.optimizer == "torch_fused" and got["ZeRO-3 bf16"].methods.optimizer == "torch_fused"
    assert got["ZeRO-2 offload bf16"].methods.optimizer == "engine" and got["compile"].methods.engine == "fsdp2"
    z3 = next(r for r in rows if r.name == "ZeRO-3 bf16")
    assert z3.status == "PASS"
    assert "ran with torch's fused AdamW (methods.optimizer=torch_fused): fused_adam" in z3.notes[0]


def test_the_worker_names_an_oom_where_torch_has_no_OutOfMemoryError(monkeypatch):
    import torch

    oom = torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB.")
    monkeypatch.delattr(torch, "OutOfMemoryError")
    assert worker.classify(oom) == "oom"


@pytest.mark.slow
def test_deepspeed_trains_with_torchs_fused_adamw_where_its_ops_are_not_built(trial_store):
    stages = (["methods.zero_stage=0"], ["methods.zero_stage=3"], ["methods.zero_stage=2", "methods.offload=optimizer"])
    for rec in measured_all(trial_store, [[*TINY, *extra, "methods.optimizer=torch_fused"] for extra in stages]):
        assert rec.ok, rec.message
        assert rec.metrics["optimizer"] == "torch fused AdamW" and rec.metrics["loss_per_step"][-1] < 7.0


@pytest.mark.slow
def test_the_checks_run_on_real_cpu_trials_judges_their_weights_and_losses(tmp_path, monkeypatch):
    """The check's own run (ops, budget, store, predictions, verdicts) on two CPU workers, with the
    checks a CPU can train: the weights and losses of real ZeRO-3, FSDP2 and offload runs against
    ZeRO-0's, from their records (MFU and memory have no peak or calibration on a CPU)."""
    names = (REFERENCE, "ZeRO-3 bf16", "FSDP2 full_shard bf16", "ZeRO-2 offload bf16")
    monkeypatch.setattr(check, "plan", lambda: [c for c in plan.plan() if c.name in names])
    monkeypatch.setattr(plan, "MICRO_BATCH", 2)
    monkeypatch.setenv("SUITE_CALIBRATION_DIR", str(tmp_path / "none"))  # not the session's: no CPU calibration
    base = make_trial([*TINY, *(f"measure.{k}={v}" for k, v in plan.MEASURE.items()), "measure.rerun=true"])
    s = check.Session(tmp_path, base, Budget(1800, time.time()), environment.Environment([]))
    rows = {r.name: r for r in s.run()}
    # Built at setup (scripts/test.sh runs it): loaded from the shared cache, whichever clone built it.
    ops = rows["DeepSpeed ops fused_adam+cpu_adam"]
    assert ops.status == "PASS", ops.verdicts
    for name in names[1:]:
        assert s.records[name].ok, s.records[name].message
        assert rows[name].verdicts["loss"] == "pass", (name, s.records[name].metrics["loss_per_step"])
    for name in names[1:3]:
        assert rows[name].verdicts["weights"] == "pass", name
    assert rows["ZeRO-3 bf16"].verdicts["memory"].startswith("skipped: no predicted peak (the predictor failed")
    assert {r.trial.hardware.count for r in s.records.values()} == {2}  # sharded over two ranks


def test_ids_stay_as_they_were_with_parameter_statistics_and_the_engines_optimizer():
    plain = make_trial(TINY)
    assert make_trial([*TINY, "measure.param_stats=true"]).id == plain.id
    assert make_trial([*TINY, "methods.optimizer=engine"]).id == plain.id
    assert make_trial([*TINY, "methods.optimizer=torch_fused"]).id != plain.id
    fsdp = make_trial([*TINY, "methods.engine=fsdp2", "methods.optimizer=torch_fused"])
    assert any("methods.optimizer=torch_fused applies to methods.engine=deepspeed only" in p for p in problems(fsdp))


def test_the_wheel_list_holds_what_the_check_imports_that_the_gpu_machine_lacks():
    """Every distribution the check's trials import, with what each requires in turn (as installed
    here), is on the H200 machine's image or among the wheels, at a version the requirements allow."""
    from importlib import metadata

    from packaging.requirements import Requirement

    def norm(name):
        return name.lower().replace("_", "-")

    # The image's packages the check stands on (its package list, 2026-11).
    machine = {"torch", "transformers", "numpy", "psutil", "ninja", "py-cpuinfo", "msgpack", "einops", "tqdm"}
    machine |= {"packaging", "pyyaml", "cloudpickle", "typing-extensions", "nvidia-ml-py", "filelock", "jinja2"}
    wheels = {}
    for line in (ROOT / "scripts" / "gpu-wheels.txt").read_text().splitlines():
        if line.split("#")[0].strip():
            name, version = line.split("==")
            wheels[norm(name)] = version.strip()
    seen, todo = set(), [n for n in environment.NEEDED if n not in machine]
    while todo:
        name = todo.pop()
        if name in seen or name in machine:
            continue
        seen.add(name)
        assert name in wheels, f"{name} is needed and neither on the machine nor in scripts/gpu-wheels.txt"
        assert metadata.version(name) == wheels[name], f"the tests run {name} {metadata.version(name)}"
        for r in map(Requirement, metadata.requires(name) or []):
            if r.marker is None or r.marker.evaluate({"extra": ""}):
                if norm(r.name) in wheels:
                    assert r.specifier.contains(wheels[norm(r.name)]), f"{name} needs {r}"
                todo.append(norm(r.name))
    assert seen == set(wheels) - {"typing-extensions"}  # no wheel beyond the need


def test_the_checks_records_are_scored_by_accuracy_for_cuda(tmp_path, monkeypatch, base, checks):
    from analysis import accuracy
    from suite import paths
    from suite.predict import published_error

    records = tmp_path / "records"
    for name in (REFERENCE, "forced OOM"):
        t = plan.trial_of(base, checks[name])
        oom = name == "forced OOM"
        rec = record(t, "oom" if oom else "ok", "rank 0: OutOfMemoryError: CUDA out of memory" * oom)
        store.save(records, rec)
    monkeypatch.setattr(paths, "publish_dir", lambda: tmp_path / "published")
    monkeypatch.setattr(paths, "accuracy_dir", lambda: tmp_path / "published")
    result = accuracy.run(records, tmp_path / "report", publish=True)["cuda"]
    assert result["step_time_err_pct"]["n"] == 1 and result["peak_mem_err_pct"]["n"] == 1
    assert result["fit_right_pct"] == 100.0 and result["fit_n"] == 2  # the forced OOM: predicted not to fit
    assert result["fit"] == {"ran": 1, "false_no_fit": 0, "oom": 1, "false_fit": 0}  # each way apart
    h200 = result["by_regime"]["datacenter-sxm|*|*|*|*"]  # what an H200 prediction's error label reads
    assert h200["n"] == 2 and h200["fit"] == result["fit"]
    assert published_error("cuda")["step_time_err_pct"] == result["step_time_err_pct"]


# --- 7. the plan and its time ---------------------------------------------------------------------


def test_the_dry_run_plan_fits_300_s_with_room_for_the_op_build(base):
    checks = [(c, plan.trial_of(base, c)) for c in plan.plan() if c.name != "flash_attention_2"]
    for build_s in (plan.OPS_BUILD_S, plan.OPS_TIMEOUT_S):  # even a build that reaches its timeout
        slots, end = plan.timeline(checks, build_s)
        assert end <= plan.BUDGET_S, build_s
        beside = [s.check.name for s in slots if s.beside_build]
        assert beside == ["FSDP2 full_shard bf16", "FSDP2 offload bf16", "compile"]
    after = [s.check.name for s in slots if not s.beside_build]
    small = f"ZeRO-3 bf16 micro-batch {plan.SMALL_MICRO_BATCH}"
    assert after == [REFERENCE, "ZeRO-3 bf16", "ZeRO-2 offload bf16", "forced OOM", small, "ZeRO-0 fp16"]
    assert [c.name for c in plan.plan()][:3] == [REFERENCE, "ZeRO-3 bf16", "FSDP2 full_shard bf16"]
    for c in plan.plan():
        assert problems(plan.trial_of(base, c)) == [], c.name


def test_the_dry_run_prints_the_plan_with_its_seconds_and_exits_0():
    out = subprocess.run(
        ["bash", SCRIPT, "--dry-run"], env=dict(os.environ, PYTHON=sys.executable), capture_output=True, text=True
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "ZeRO-0 bf16" in out.stdout and out.stdout.count("fits") == 2 and "DOES NOT FIT" not in out.stdout


def test_without_a_gpu_the_check_exits_3_and_says_so(tmp_path):
    env = dict(os.environ, PYTHON=sys.executable, CUDA_VISIBLE_DEVICES="")  # no GPU seen, on any machine
    out = subprocess.run(["bash", SCRIPT, str(tmp_path / "out")], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 3, out.stdout + out.stderr
    assert "no CUDA GPU" in out.stderr and "nothing to check" in out.stderr
    assert not (tmp_path / "out").exists()  # nothing run, nothing written


def test_the_predictor_gives_the_check_its_figures_from_a_process_of_its_own(base, checks, tmp_path, monkeypatch):
    # A host with no calibration: offload's CPU Adam runs at the profile's cited host rate (hardware.host).
    monkeypatch.setenv("SUITE_CALIBRATION_DIR", str(tmp_path / "none"))
    names = (REFERENCE, "ZeRO-2 offload bf16")
    got = verdicts.predictions({n: plan.trial_of(base, checks[n]) for n in names})()
    e, off = got[REFERENCE], got["ZeRO-2 offload bf16"]
    assert 0 < e.peak_gib < 140 and e.step_s > 0 and e.micro_s > 0
    assert off.step_s > e.step_s and off.micro_s > 0 and not off.why  # the host's Adam and the link added


# --- the table and the exit code ------------------------------------------------------------------


def test_the_table_tells_pass_fail_skipped_and_not_run_apart_and_the_exit_code_follows(tmp_path, base, checks):
    z0 = checks[REFERENCE]
    rows = [
        judged(z0, base, record(plan.trial_of(base, z0))),
        Row("flash_attention_2", "skipped", verdicts={"run": "skipped: flash-attn is not installed"}),
        Row("ZeRO-0 fp16", "not run", verdicts={"budget": "not run: needs ~20 s; 5 s are left"}),
    ]
    text = verdicts.write(tmp_path, rows, {"budget_s": 300})
    lines = text.splitlines()
    assert lines[0].startswith("check") and lines[0].endswith("why")
    assert lines[2].split()[:4] == ["ZeRO-0", "bf16", "PASS", "ok"] and "38.0%" in lines[2] and "19.0%" in lines[2]
    assert "SKIPPED" in lines[3] and lines[3].endswith("run: flash-attn is not installed")
    assert "NOT RUN" in lines[4] and lines[4].endswith("budget: needs ~20 s; 5 s are left")
    assert lines[-1] == "1 PASS, 0 FAIL, 1 SKIPPED, 1 NOT RUN of 3 checks"
    assert verdicts.exit_code(rows) == 4 and verdicts.exit_code(rows[:2]) == 0
    failed = judged(z0, base, record(plan.trial_of(base, z0), skipped_steps_discarded=2))
    assert verdicts.exit_code([*rows, failed]) == 1 and verdicts.why(failed) == "skipped: 2 skipped in the timed window"
    saved = json.loads((tmp_path / "verdicts.json").read_text())
    assert [r["status"] for r in saved["rows"]] == ["PASS", "SKIPPED", "NOT RUN"] and saved["budget_s"] == 300


# --- on a GPU -------------------------------------------------------------------------------------


@pytest.mark.gpu
def test_on_this_gpu_nvml_sees_our_probe_and_not_the_launcher():
    import torch

    from suite import detect

    detect.local_gpus()  # what the check's launcher does to the CUDA runtime before its verdict
    initialized = torch.cuda.is_initialized()
    verdict, seen = verdicts.launcher_verdict(initialized, verdicts.nvml_processes, verdicts.probe_process)
    assert verdict == "pass", seen


@pytest.mark.gpu
def test_on_this_gpu_the_environment_can_build_deepspeeds_ops():
    env = environment.check(dict(os.environ))
    assert env.unbuildable == {} and not env.fatal, [f.verdict for f in env.findings if f.verdict != "pass"]


def test_a_cuda_images_arch_list_with_an_arch_specific_entry_still_builds_deepspeeds_ops(monkeypatch):
    """The first run on an H200 (2026-12-04): the image sets TORCH_CUDA_ARCH_LIST with "9.0a",
    DeepSpeed 0.19's builder read int("0a") and FusedAdam never built. The build and every rank
    now hand DeepSpeed the list as it reads it; +PTX and the other entries kept."""
    from deepspeed.ops.op_builder.fused_adam import FusedAdamBuilder

    from suite.ops import deepspeed_arch_list, readable_arch_list

    assert deepspeed_arch_list("8.0 8.6 9.0a 10.0+PTX") == "8.0;8.6;9.0;10.0+PTX"
    assert deepspeed_arch_list("9.0a;9.0;9.0a+PTX") == "9.0;9.0+PTX"
    builder = FusedAdamBuilder()
    builder.jit_mode = True
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "8.0 9.0a 10.0+PTX")
    with pytest.raises(ValueError, match="0a"):
        builder.compute_capability_args()  # as DeepSpeed reads the image's list
    readable_arch_list()
    builder.compute_capability_args()  # DeepSpeed writes back the list it builds for
    assert os.environ["TORCH_CUDA_ARCH_LIST"] == "8.0;9.0;10.0+PTX"
    assert "readable_arch_list()" in environment.BUILD  # the check's own build reads it so too
