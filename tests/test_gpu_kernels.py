"""What a GPU run keeps that a CPU trace would not, and how published code builds and steps its
model: dropout's 1-byte mask, fused RMSNorm, torchtitan's selective policy, ZeRO-2's offload
without a device gradient partition, ZeRO-3's step one sub-group at a time, a model built in 16
bits or on the meta device. No GPU needed: the trace runs under fake tensors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import CPU_RUN, TINY, make_trial

from suite import methods
from suite.config import compose
from suite.models.arch import shape
from suite.predict import Predictor, gpu, memory
from suite.predict.trace import traced
from suite.record import Record

ROOT = Path(__file__).resolve().parent.parent
SMALL = ["model.config.num_hidden_layers=2", "model.recipe.seq_len=64", "model.recipe.global_batch=8", *CPU_RUN]
GPT2 = [
    "model=gpt2-124m",
    "model.config.n_layer=2",
    "model.config.n_embd=64",
    "model.config.n_head=4",
    "model.config.vocab_size=1024",
    "model.recipe.seq_len=64",
    "model.recipe.global_batch=8",
    *CPU_RUN,
]
LLAMA = [
    "model=tinyllama-1.1b",
    "model.config.hidden_size=64",
    "model.config.num_attention_heads=4",
    "model.config.num_key_value_heads=4",
    "model.config.intermediate_size=128",
    "model.config.vocab_size=1024",
    *SMALL,
]


def forward_end(tr, b: int) -> float:
    """Bytes the forward leaves for the backward at micro-batch b."""
    a, c = next((a, c) for k, a, c in tr.frontier if k == -2)
    return a + c * b


def test_a_gpus_dropout_keeps_a_one_byte_mask_where_a_cpu_keeps_its_noise():
    t = make_trial(GPT2)
    cpu, cuda = (traced(t.model, "eager", "none", "fp32", device=d) for d in ("cpu", "cuda"))
    s, b = shape(t.model), 4
    seq = t.model.recipe.seq_len
    # GPT-2 drops out its embeddings, and per block the attention probabilities and both residual branches
    dropped = b * (seq * s.hidden * (1 + 2 * s.layers) + s.heads * seq * seq * s.layers)
    assert forward_end(cpu, b) - forward_end(cuda, b) == pytest.approx(3 * dropped, rel=0.01)  # fp32 noise vs bool
    assert cpu.flops(b) == pytest.approx(cuda.flops(b))
    with pytest.raises(ValueError, match="device"):
        traced(t.model, "eager", "none", "fp32", device="tpu")


def test_a_fused_rmsnorm_keeps_its_input_only_and_layernorm_is_already_one_kernel():
    llama = make_trial(LLAMA)
    eager, fused = (traced(llama.model, "sdpa", "none", "bf16", device="cuda", norm=n) for n in ("model", "fused"))
    s, b = shape(llama.model), 4
    norms = (2 * s.layers + 1) * b * llama.model.recipe.seq_len * s.hidden  # elements through RMSNorms
    # transformers' RMSNorm keeps an fp32 copy of its input and the normalized bf16 tensor beside it
    assert forward_end(eager, b) - forward_end(fused, b) >= 4 * norms
    pythia = make_trial(TINY)
    a, c = (traced(pythia.model, "sdpa", "none", "bf16", device="cuda", norm=n) for n in ("model", "fused"))
    assert a.activation_bytes(b) == c.activation_bytes(b)


def test_torchtitans_selective_policy_recomputes_every_second_matmul():
    t = make_trial(LLAMA)
    full, alternate, selective = (
        traced(t.model, "sdpa", r, "bf16") for r in ("full", "selective-alternate", "selective")
    )
    assert full.activation_bytes(4) < alternate.activation_bytes(4) < selective.activation_bytes(4)
    assert selective.flops(4) < alternate.flops(4) < full.flops(4)


def test_zero2_offload_keeps_no_gradient_partition_on_the_gpu_as_measured_on_an_h200():
    path = ROOT / "results/gpu-check/2026-12-04-h200-rerun/records/a0cd7637f62630f3.json"
    rec = Record.from_json(json.loads(path.read_text()))
    t = rec.trial
    assert (t.methods.zero_stage, t.methods.offload) == (2, "optimizer")
    p = Predictor().predict(t)
    names = [x[0] for part in ("steady", "backward", "boundary") for x in p.memory_terms[part]]
    assert not any("gradient partition buffer" in n for n in names)
    assert p.peak_mem_gib == pytest.approx(rec.metrics["peak_mem_gib"], rel=0.01)


def test_zero3s_step_flattens_and_converts_one_sub_group_at_a_time():
    t = compose.trial(
        ["model=pythia-6.9b", "hardware=a100-80gb", "hardware.count=2", "methods.zero_stage=3"]
        + ["methods.micro_batch=1", "model.recipe.global_batch=64"]
    )
    tr = traced(t.model, "sdpa", "none", "bf16")
    groups = methods.sub_groups(t, tr.param_numels)
    assert len(groups) > 1  # 3.4B elements a rank: sub-groups of 1e9
    step = memory.layout(t, tr).optimizer
    assert sum(x.bytes for x in step) == pytest.approx(6 * max(groups))  # bf16 flattened + its fp32 copy
    assert sum(x.bytes for x in step) < 6 * tr.n_params / 2 / 2


def test_a_model_is_built_as_its_code_builds_it():
    offload = compose.trial(
        ["model=pythia-12b", "hardware=v100", "methods.zero_stage=2", "methods.offload=optimizer"]
        + [
            "methods.micro_batch=1",
            "model.recipe.global_batch=8",
            "model.recipe.seq_len=512",
            "model.recipe.precision=fp16",
        ]
    )
    fp32, half = (Predictor().predict(offload, gpu.Implementation(built=b)) for b in ("fp32", "16-bit"))
    params = fp32.n_params / 2**30
    assert fp32.build_peak_mem_gib == pytest.approx(4 * params, rel=0.01)  # > 32 GiB: no V100 builds it so
    assert half.build_peak_mem_gib == pytest.approx(2 * params, rel=0.01) and half.fits and not fp32.fits
    fsdp = compose.trial(
        ["model=pythia-6.9b", "hardware=a100-80gb", "hardware.count=8", "methods.engine=fsdp2", "methods.micro_batch=1"]
    )
    host, meta = (Predictor().predict(fsdp, gpu.Implementation(built=b)) for b in ("fp32", "meta"))
    assert host.host_gib > 25 and meta.host_gib == 0 and meta.build_peak_mem_gib < host.build_peak_mem_gib
    with pytest.raises(ValueError, match="built"):
        memory.layout(fsdp, traced(fsdp.model, "sdpa", "none", "bf16"), built="bf16")


def test_every_published_run_that_ran_is_predicted_to_fit():
    """The published scores (`suite-predict published-accuracy --publish`): no false "does not fit"."""
    s = json.loads((ROOT / "results/accuracy/cuda-published.json").read_text())
    assert s["fit"]["ran"] >= 190 and s["fit"]["false_no_fit"] == 0
