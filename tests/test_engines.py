"""The engine axis (DeepSpeed or FSDP2): its settings and their problems, stable trial ids, the
worker's step accounting and memory windows, and ZeRO-3 built through transformers for every
model family. Real 2-process FSDP2 trials are in test_trial.py, next to the ZeRO ones they match.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import TINY, TINY_MEMBERS, make_trial, ops_setup_builds, single_rank_env

from suite import metrics, worker
from suite.config import Trial
from suite.config.validate import problems, unsupported
from suite.models.arch import shape as model_shape
from suite.runner import run_one

FIXTURES = Path(__file__).parent / "fixtures" / "results"


@pytest.mark.parametrize(
    "overrides,expected",
    [
        (["methods.engine=fsdp2", "methods.zero_stage=2"], "methods.zero_stage=2 is a DeepSpeed setting"),
        (["methods.engine=fsdp2", "methods.offload=optimizer"], "methods.offload=optimizer is not available"),
        (["methods.reshard_after_forward=false"], "applies to methods.engine=fsdp2 only"),
        (["methods.engine=megatron"], "methods.engine='megatron'"),
    ],
)
def test_settings_of_the_other_engine_are_problems(overrides, expected):
    found = problems(make_trial(TINY + overrides))
    assert any(expected in p for p in found), found


def test_fsdp2_default_is_written_out_once_and_deepspeed_ids_do_not_change():
    plain = make_trial(TINY + ["methods.engine=fsdp2"])
    full = make_trial(TINY + ["methods.engine=fsdp2", "methods.reshard_after_forward=true"])
    assert plain.methods.reshard_after_forward is True and plain.id == full.id
    assert problems(plain) == [] and problems(make_trial(TINY + ["+sharding=fsdp-shard-grad-op"])) == []
    assert plain.id != make_trial(TINY + ["methods.engine=fsdp2", "methods.reshard_after_forward=false"]).id
    assert plain.id != make_trial(TINY).id
    # Records stored before the engine axis existed keep their trial ids.
    for f in sorted(FIXTURES.glob("*.json")):
        rec = json.loads(f.read_text())
        assert Trial.from_json(rec["trial"]).id == rec["trial_id"], f.name


def test_the_sharding_group_sets_each_engine_mode():
    got = {}
    for name in ("ddp", "zero1", "zero2", "zero3", "fsdp-shard-grad-op", "fsdp-full-shard"):
        me = make_trial(TINY + [f"+sharding={name}"]).methods
        got[name] = (me.engine, me.zero_stage, me.reshard_after_forward)
    assert got == {
        "ddp": ("deepspeed", 0, None),
        "zero1": ("deepspeed", 1, None),
        "zero2": ("deepspeed", 2, None),
        "zero3": ("deepspeed", 3, None),
        "fsdp-shard-grad-op": ("fsdp2", 0, False),
        "fsdp-full-shard": ("fsdp2", 0, True),
    }
    # DeepSpeed's modes through the group are the very trials a plain zero_stage names.
    assert make_trial(TINY + ["+sharding=zero2"]).id == make_trial(TINY + ["methods.zero_stage=2"]).id


def test_fsdp2_offload_on_cpu_is_unsupported_without_a_launch(tmp_path):
    t = make_trial(TINY + ["methods.engine=fsdp2", "methods.offload=optimizer+params"])
    assert problems(t) == []
    assert "accelerator" in unsupported(t)
    rec = run_one(t, str(tmp_path), "test", in_sweep=True).record
    assert rec.outcome == "unsupported" and rec.wall_s == 0.0


# --- the worker's step accounting (the loop itself runs in test_trial.py) -------------------------


def test_warm_up_goes_on_until_nothing_compiles_and_stops_at_its_cap():
    w = worker.Window(warmup=2, timed=3)
    assert not w.keep(new_graphs=5, skipped=False) and not w.timing  # below measure.warmup_steps
    assert not w.keep(new_graphs=1, skipped=False) and not w.timing  # still compiling: warm up more
    assert not w.keep(new_graphs=0, skipped=False) and w.timing and w.first_timed
    assert w.keep(new_graphs=2, skipped=False) and w.recompiles == 2  # counted (the flag), kept
    capped = worker.Window(warmup=1, timed=3)
    for _ in range(1 + worker.EXTRA_WARMUP):
        capped.keep(new_graphs=1, skipped=False)
    assert capped.timing and capped.warmup_run == 1 + worker.EXTRA_WARMUP


def test_a_timed_window_that_keeps_skipping_updates_is_nan():
    w = worker.Window(warmup=1, timed=2)
    w.keep(new_graphs=0, skipped=False)
    assert not w.keep(new_graphs=0, skipped=True) and not w.keep(new_graphs=0, skipped=True)
    with pytest.raises(worker.NonFiniteLoss, match="3 steps of the timed window skipped"):
        w.keep(new_graphs=0, skipped=True)


def test_the_timed_windows_peak_excludes_the_build():
    """The worker's memory windows on this kernel: what the build held is not the timed peak."""
    worker.reset_peaks(cuda=False)
    base = worker.host_hwm_gib()  # as the worker takes it: the runtime imported before the build
    build_alloc = bytearray(400 * 2**20)  # the build's transient: 400 MiB touched, then freed
    build_alloc[::4096] = b"x" * len(build_alloc[::4096])
    build = worker.peaks(cuda=False)
    del build_alloc
    worker.reset_peaks(cuda=False)
    timed_alloc = bytearray(40 * 2**20)
    timed_alloc[::4096] = b"y" * len(timed_alloc[::4096])
    timed = worker.peaks(cuda=False)
    rank = {**timed, **{f"build_{k}": v for k, v in build.items()}, "host_base_gib": base}
    m = metrics.memory([rank], cuda=False)
    assert m["build_peak_mem_gib"] > 0.38
    assert 0.03 < m["peak_mem_gib"] < 0.2
    assert m["host_peak_gib"] == timed["host_peak_gib"] and m["peak_reserved_gib"] is None


# --- ZeRO-3 built through transformers, against ZeRO-0, for every model family ------------------

# The CPU-sized member of each task and architecture (conftest.TINY_MEMBERS), on one worker.
# Plus a Llama-style decoder for RoPE and grouped-query attention.
FAMILY_MODELS = {
    name: [o for o in overrides if not o.startswith(("hardware=", "methods.micro_batch="))]
    for name, overrides in {
        **TINY_MEMBERS,
        "llama": ["model=tinyllama-1.1b", *TINY[1:], "model.config.num_key_value_heads=2"],
    }.items()
}

BUILD_BOTH = """
import json, sys
import torch
from suite import engines
from suite.config import Trial
from suite.models.build import batch

out = {}
for name, spec in json.loads(sys.argv[1]).items():
    t = Trial.from_json(spec)
    eng = engines.make(t, torch.device("cpu"), 1)
    eng.build()
    gen = torch.Generator().manual_seed(0)
    # The first loss over 32 samples, as the first warm-up step would take it.
    losses = [eng.micro_step(batch(t.model, 8, gen, "cpu"), True).item() for _ in range(4)]
    buffers = {n: str(b.dtype) for n, b in eng.engine.module.named_buffers()}
    out[name] = {"loss": sum(losses) / len(losses), "buffers": buffers, "stage": t.methods.zero_stage}
print(json.dumps(out))
"""


@pytest.mark.slow
def test_zero3_builds_every_family_as_zero0_does():
    specs = {}
    for model, base in FAMILY_MODELS.items():
        for stage in (0, 3):
            overrides = [*base, f"methods.zero_stage={stage}", "hardware=cpu-x1"]
            t = make_trial(overrides + ["methods.precision=bf16", "methods.micro_batch=8"])
            specs[f"{model}/{stage}"] = t.to_json()
    env = single_rank_env()
    cmd = [sys.executable, "-c", BUILD_BOTH, json.dumps(specs)]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    built = json.loads(out.stdout.strip().splitlines()[-1])
    for model in FAMILY_MODELS:
        zero0, zero3 = built[f"{model}/0"], built[f"{model}/3"]
        t = Trial.from_json(specs[f"{model}/0"])
        shape = model_shape(t.model)
        classes = shape.num_labels if t.model.task == "image-classification" else shape.vocab
        # Each loss is a bf16 value: one step of bf16 near ln(100) is 2^-7 of it (0.8%), so the 1%
        # asked for gets that quantization on top.
        assert zero3["loss"] == pytest.approx(zero0["loss"], rel=0.01 + 2**-7), model
        # Random init: near ln(classes). Mamba's embeddings start wider (initializer_range 0.1, not
        # 0.02), so its logits are not near-uniform: 7.36 against ln(1024) = 6.93 here.
        assert zero3["loss"] == pytest.approx(math.log(classes), rel=0.10), model
        assert zero3["buffers"] == zero0["buffers"], model  # RoPE inv_freq stays fp32 under bf16
        if any("inv_freq" in k for k in zero3["buffers"]):
            assert {v for k, v in zero3["buffers"].items() if "inv_freq" in k} == {"torch.float32"}


# --- metrics: rates at a known peak, an impossible timing, extrapolated accumulation ----------


def test_rates_and_mfu_at_a_known_peak_where_fp32_runs_as_tf32():
    """An A100 (datasheet: 156 dense TF32 TFLOPS, 19.5 FP32) runs fp32 matmuls as tf32 where
    methods.tf32 is on, so its fp32 MFU is against 156, and against 19.5 where it is off (torch's
    default); a V100 has no tf32: 15.7. Rates by hand at 2 s per step."""
    fp32 = ["model=pythia-160m", "hardware=a100-80gb-x8", "methods.precision=fp32"]
    assert metrics.peak_flops(make_trial(fp32)) == 19.5e12
    a100 = make_trial([*fp32, "methods.tf32=true"])
    assert metrics.peak_flops(a100) == 156e12
    v100 = make_trial(["model=pythia-160m", "hardware=v100-x8", "methods.precision=fp32"])
    assert metrics.peak_flops(v100) == 15.7e12
    assert metrics.peak_flops(make_trial(["model=pythia-160m", "hardware=a100-80gb-x8"])) == 312e12  # its recipe's fp16
    assert metrics.peak_flops(make_trial(TINY)) is None  # a CPU has no datasheet peak
    tokens_per_step = 1024 * 2048  # Pythia's recipe: 1024 sequences of 2048 tokens
    r = metrics.rates(a100, 2.0, model_flops_per_token=1e9, hardware_flops_per_token=1.5e9)
    assert r["tokens_per_s"] == tokens_per_step / 2.0 and r["tokens_per_s_per_device"] == tokens_per_step / 16.0
    assert r["samples_per_s"] == 1024 / 2.0
    assert r["mfu"] == pytest.approx(1e9 * tokens_per_step / 2.0 / (8 * 156e12))
    assert r["hfu"] == pytest.approx(1.5 * r["mfu"]) and r["precision"] == "fp32"
    assert metrics.rates(make_trial(TINY), 2.0, 1e9, 1e9)["mfu"] is None


def test_an_mfu_above_100_percent_is_an_error_that_becomes_a_crashed_run():
    t = make_trial(["model=pythia-160m", "hardware=a100-80gb-x8", "methods.precision=fp32"])
    with pytest.raises(metrics.ImplausibleTiming, match=r"implied MFU \d+% exceeds 100% of a100-80gb-x8's peak"):
        metrics.rates(t, 1e-6, model_flops_per_token=1e9, hardware_flops_per_token=1e9)
    # The worker records what it raises by its class: a wrong timing is a crashed run, measured again.
    assert worker.classify(metrics.ImplausibleTiming("implied MFU 400%")) == "crashed"


def test_a_step_of_more_micro_steps_than_measured_is_extrapolated_from_them():
    """gas 4 (8 samples, 2 workers, micro-batch 1), 2 measured (measure.max_micro_steps): each
    step is (4 - 1) x the plain micro-step + the boundary one + the optimizer step."""
    t = make_trial(TINY + ["methods.micro_batch=1", "measure.max_micro_steps=2"])
    assert (t.gas, t.gas_measured) == (4, 2)
    m = metrics.step_metrics(t, [[1.0], [1.2]], [1.5, 1.5], [0.5, 0.5], 64e6, 64e6)
    assert m["extrapolated"] and (m["gas"], m["gas_measured"]) == (4, 2)
    assert m["step_time_min_s"] == 3 * 1.0 + 1.5 + 0.5 and m["step_time_max_s"] == pytest.approx(3 * 1.2 + 1.5 + 0.5)
    assert m["step_time_s"] == pytest.approx((5.0 + 5.6) / 2) and m["micro_time_s"] == pytest.approx(1.1)


def test_ops_without_a_compiler_say_what_to_install_before_any_build(tmp_path, monkeypatch):
    """setup.sh's `python -m suite.ops` on a machine without a C++ compiler: no op is built (an
    empty build folder), and the error names the ops and the package to install."""
    from suite import ops

    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
    with pytest.raises(ops.OpBuildError, match="cpu_adam, fused_adam(, async_io)? need a C.. compiler") as e:
        ops.build(log=lambda *_: None)
    assert "apt-get install g++" in str(e.value) and not list(tmp_path.rglob("*.so"))  # nothing built
    assert ops.main([]) == 1


def test_ops_named_are_the_only_ones_built_and_a_wrong_name_exits_2(tmp_path, monkeypatch, capsys):
    """The demo's setup names fused_adam (`python -m suite.ops fused_adam`): cpu_adam is left for
    later, and said so; a name that is no op exits 2 naming the ops."""
    from suite import ops

    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    asked = []
    monkeypatch.setattr(ops, "build", lambda names: asked.append(names) or {"fused_adam": 1.0})
    assert ops.main(["fused_adam"]) == 0 and asked == [("FusedAdamBuilder",)]
    assert "not built now: cpu_adam" in capsys.readouterr().out
    assert ops.main(["adam"]) == 2 and "no op adam; the ops: cpu_adam, fused_adam" in capsys.readouterr().err
    assert ops.main([]) == 0 and asked[-1] == ops_setup_builds()
