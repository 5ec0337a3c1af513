"""The GPU predictor's model (suite.predict.gpu), the methods published runs use (selective
recomputation, FSDP2's reduce-scatter at every micro-step, tied embeddings), `suite-predict`'s
fixed configuration and hardware=all, and the scoring against published runs
(analysis/published_runs.py)."""

from __future__ import annotations

import math
import re
from dataclasses import replace
from functools import cache
from pathlib import Path

import pytest
from conftest import FSDP2, TINY, make_trial, measured_all

from suite.config import compose
from suite.config.validate import problems
from suite.models.arch import attentions, shape
from suite.predict import Predictor, gpu
from suite.predict.comm import Network
from suite.predict.trace import traced

ROOT = Path(__file__).resolve().parent.parent
TEXT_LAYERS = ("num_hidden_layers", "n_layer")


def _at(t, seq: int):
    """`t` at sequence `seq` with two blocks (the bound holds per block; two keep it fast)."""
    cfg = dict(t.model.config)
    for k in TEXT_LAYERS:
        if k in cfg:
            cfg[k] = 2
    for k in ("max_position_embeddings", "n_positions"):
        if k in cfg:
            cfg[k] = seq + 2
    model = replace(t.model, config=cfg, recipe=replace(t.model.recipe, seq_len=seq, global_batch=8))
    return replace(t, model=model, methods=replace(t.methods, micro_batch=1))


@cache
def _hardware(name: str):
    """Profile `name` at 8 devices: one composed config with each profile swapped in
    (`compose.with_hardware`, what Hydra composes; tests/test_config.py), not 19 Hydra runs."""
    cfg = compose.with_hardware(compose.config(["model=pythia-14m"]), name, 8)
    return compose.trial_from_cfg(cfg).hardware


def _attends(t) -> bool:
    return t.unit == "token" and bool(attentions(t.model))


SHIPPED = [m for m in compose.options("model") if m not in ("hf", "mamba-2.8b")]
"""Every shipped model but `hf` (a user's own) and mamba-2.8b, for which mamba-cpu (the same
architecture and code) stands in: without mamba_ssm, its selective scan is traced token by token,
minutes per trace on 2 cores."""


@pytest.mark.parametrize("model", [pytest.param(m, marks=pytest.mark.slow) if m == "mamba-cpu" else m for m in SHIPPED])
def test_predicted_mfu_never_exceeds_one_on_any_gpu_at_any_sequence(model):
    """MFU counts causal attention's FLOPs as its time does (half), so no model on no GPU
    profile at sequences 512 to 32768 is predicted above its GEMM's best fraction of the peak:
    Pythia-1B at four sequences, the others at both ends (a trace is seconds a sequence).
    (mamba-cpu's trace takes 20 s: the full tier's.)"""
    base = compose.trial([f"model={model}", "hardware=h100-sxm", "hardware.count=8"])
    ends = (512, 2048, 8192, 32768) if model == "pythia-1b" else (512, 32768)
    seqs = ends if _attends(base) else (None,)
    for seq in seqs:
        t = _at(base, seq) if seq else replace(base, methods=replace(base.methods, micro_batch=1))
        for name in compose.gpu_profiles():
            hw = _hardware(name)
            one = replace(t, hardware=hw, methods=replace(t.methods, precision="fp16" if not hw.bf16 else "recipe"))
            p = Predictor().predict(one)
            assert p.mfu is not None and 0 < p.mfu < 1.0, (model, seq, name, p.mfu)
            assert p.mfu <= gpu.gemm_best(hw.gpu)[0] + 1e-9, (model, seq, name, p.mfu)


def test_gemm_and_attention_rates_come_from_their_tables():
    assert gpu.arch("NVIDIA H100 80GB HBM3") == "hopper" and gpu.arch("NVIDIA A100-SXM4-80GB") == "ampere"
    assert gpu.gemm_best("NVIDIA A100-SXM4-80GB")[0] == pytest.approx(271.2 / 312, abs=1e-3)
    # FlashAttention-2, causal, head dim 128, 4096 tokens on H100: 294 TFLOP/s of 989.
    assert gpu.attention_fraction("flash2", "NVIDIA H100 80GB HBM3", 4096, 128, True) == pytest.approx(294 / 989)
    # Between measured lengths the rate is interpolated; beyond them clamped.
    mid = gpu.attention_fraction("flash2", "NVIDIA A100-SXM4-80GB", 3000, 64, False)
    assert 162 / 312 < mid < 171 / 312
    assert gpu.attention_fraction("flash2", "NVIDIA A100-SXM4-80GB", 65536, 64, True) == pytest.approx(171 / 312)


def test_a_small_model_is_held_back_by_kernel_launches_and_dispatch():
    """Pythia-14M on an H100 reaches a small fraction of the peak: fixed GEMM time, launch gaps
    and the host's dispatch of every eager operator dominate; compiled it gets faster."""
    t = compose.trial(["model=pythia-14m", "hardware=h100-sxm", "hardware.count=1", "methods.micro_batch=8"])
    eager = Predictor().predict(t)
    compiled = Predictor().predict(replace(t, methods=replace(t.methods, compile=True)))
    assert eager.mfu < 0.2 and compiled.step_time_s < eager.step_time_s


def test_a_fused_implementation_is_faster_than_the_suites_eager_trial():
    t = compose.trial(["model=pythia-1b", "hardware=a100-80gb", "hardware.count=8", "methods.micro_batch=4"])
    fused = gpu.Implementation("fused", frozenset({"attention", "norm", "activation", "loss"}))
    assert Predictor().predict(t, fused).step_time_s < Predictor().predict(t).step_time_s


def test_a_multi_node_prediction_moves_with_the_network():
    t = compose.trial(
        ["model=pythia-1b", "hardware=a100-80gb", "hardware.count=8", "cluster.nodes=4", "methods.engine=fsdp2"]
        + ["methods.micro_batch=8"]
    )
    slow = Predictor(network=Network(100.0, "100 Gb/s")).predict(t)
    fast = Predictor(network=Network(3200.0, "3200 Gb/s")).predict(t)
    assert slow.step_time_s > 1.1 * fast.step_time_s


def test_selective_recomputation_keeps_the_matmuls_and_recomputes_the_rest():
    t = make_trial(TINY)
    none, sel, full = (traced(t.model, "sdpa", r, "fp32") for r in ("none", "selective", "full"))
    assert full.activation_bytes(8) < sel.activation_bytes(8) < none.activation_bytes(8)
    # Nothing with FLOPs is recomputed: the matmuls' outputs are saved.
    assert sel.flops(8) == pytest.approx(none.flops(8)) and full.flops(8) > none.flops(8)
    backward_ops = lambda tr: sum(g.count for g in tr.groups if g.phase == "backward")  # noqa: E731
    assert backward_ops(sel) > backward_ops(none)  # the cheap operators run again


def test_a_fused_loss_keeps_no_fp32_copy_of_the_logits():
    """A published run whose loss is a fused cross-entropy kernel (flash-attn's) is predicted
    without transformers' fp32 log-probabilities and their fp32 gradient: at a large vocabulary
    and micro-batch, where the loss's backward is the peak, two fp32 copies of the logits less;
    an implementation that does not fuse its loss is predicted exactly as the suite's trial."""
    t = compose.trial(
        ["model=pythia-14m", "hardware=a100-80gb", "model.recipe.seq_len=512", "model.recipe.global_batch=64"]
        + ["methods.micro_batch=16"]
    )
    logits = 16 * 512 * shape(t.model).vocab
    unfused = gpu.Implementation(name="unfused loss", fused=frozenset({"attention", "norm"}))
    fused = gpu.Implementation(name="fused loss", fused=frozenset({"attention", "norm", "loss"}))
    suite, same, less = (Predictor().predict(t, impl) for impl in (gpu.SUITE, unfused, fused))
    assert same.peak_mem_gib == suite.peak_mem_gib and same.device_gib == suite.device_gib
    saved_bytes = (suite.peak_mem_gib - less.peak_mem_gib) * 2**30
    assert saved_bytes == pytest.approx(2 * 4 * logits, rel=0.01)
    with pytest.raises(ValueError, match="causal-lm"):
        traced(replace(t.model, task="masked-lm"), "sdpa", "none", "bf16", loss="fused")


def test_reduce_every_micro_step_is_fsdp2_only_and_keeps_no_unsharded_gradients():
    bad = make_trial(TINY + ["methods.reduce_every_micro_step=true"])
    assert any("reduce_every_micro_step" in p for p in problems(bad))
    t = compose.trial(
        ["model=pythia-1b", "hardware=a100-80gb", "hardware.count=8", "methods.engine=fsdp2", "methods.micro_batch=4"]
    )
    every = replace(t, methods=replace(t.methods, reduce_every_micro_step=True))
    assert t.gas > 1 and not problems(every)
    boundary_only, each = Predictor().predict(t), Predictor().predict(every)
    # 4P bytes of fp32 gradients (3.8 GiB) less one unit's being reduced (the root: 0.8 GiB)
    assert each.device_gib < boundary_only.device_gib - 2.5
    assert each.t_micro_s >= boundary_only.t_micro_s
    assert every.id != t.id and make_trial(TINY).id == make_trial(TINY + ["methods.reduce_every_micro_step=false"]).id


def test_fsdp2s_fp32_model_built_on_the_host_is_not_gpu_memory():
    t = compose.trial(
        ["model=pythia-6.9b", "hardware=a100-80gb", "hardware.count=8", "methods.engine=fsdp2", "methods.micro_batch=1"]
    )
    p = Predictor().predict(t)
    assert p.build_peak_mem_gib < 10 and p.host_gib > 25


def test_tied_embeddings_are_one_weight():
    tie = ["model.model_type=qwen2", "+model.config.tie_word_embeddings=true"]
    untie = ["model.model_type=qwen2", "+model.config.tie_word_embeddings=false"]
    base = ["model=tinyllama-1.1b", "hardware=a100-80gb", "model.recipe.seq_len=128", "model.recipe.global_batch=16"]
    a, b = (compose.trial(base + x + ["methods.micro_batch=4"]) for x in (tie, untie))
    ta, tb = traced(a.model, "sdpa", "none", "bf16"), traced(b.model, "sdpa", "none", "bf16")
    assert tb.n_params - ta.n_params == 32000 * 2048
    pa, pb = Predictor().predict(a), Predictor().predict(b)
    assert pa.device_gib < pb.device_gib and pa.t_optimizer_s < pb.t_optimizer_s


def test_suite_predict_fixed_configuration_is_one_row(capsys):
    from cli.predict import main

    args = ["model=pythia-160m", "hardware=a100-80gb", "hardware.count=8", "search.fixed=true"]
    assert main(args + ["methods.engine=fsdp2", "methods.recompute=selective", "methods.micro_batch=4"]) == 0
    out = capsys.readouterr().out
    assert "1 valid configurations" in out and "FSDP2 full_shard recompute selective mb 4x" in out
    assert "error labels by regime" in out and "datacenter-sxm · FSDP · no offload · 2-8 GPUs · <1B" in out
    assert re.search(r"step time.* n=\d+ published runs|step time: not scored in datacenter-sxm", out)
    assert main(args + ["methods.micro_batch=3"]) == 2  # a micro-batch that does not divide is named


def _two_blocks(model: str) -> list[str]:
    """Overrides that cut `model` to two blocks (or one per ConvNeXt stage) where it has more."""
    cfg = compose.trial([f"model={model}"]).model.config
    cut = [f"model.config.{k}=2" for k in TEXT_LAYERS if cfg.get(k, 0) > 2]
    if "depths" in cfg and sum(cfg["depths"]) > len(cfg["depths"]):
        cut.append(f"model.config.depths=[{','.join('1' * len(cfg['depths']))}]")
    return cut


@pytest.mark.parametrize("model", [m if m == "pythia-1b" else pytest.param(m, marks=pytest.mark.slow) for m in SHIPPED])
def test_hardware_all_answers_for_every_shipped_model_as_report_predict_does(model, capsys, monkeypatch):
    """Every GPU profile gets a row: V100s, which have no bf16, at fp16, labelled so. And one policy
    (`analysis.predicted.predict_budget`): `suite-report tables --predict` names the same best
    configuration, with the same figures and label, as `suite-predict hardware=all` printed, on
    every GPU profile (each at one of the four counts, the counts in turn). The README's own,
    pythia-1b, at full size (the quick tier's); the others with two blocks, their architecture
    and recipe otherwise as shipped (a full-size trace is seconds a model; what is tested is the
    rows of every profile, and each block is traced alike); the search space narrowed."""
    from analysis import predicted
    from analysis.prices import load_prices
    from cli import predict

    printed = []
    monkeypatch.setattr(predict, "predict_all", lambda *a: printed.extend(predicted.predict_all(*a)) or printed)
    extra = ["search.engines=[fsdp2]", "search.offloads=[none]", "search.recomputes=[none]"]
    extra += [] if model == "pythia-1b" else _two_blocks(model)
    assert predict.main([f"model={model}", "hardware=all", *extra]) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.split() and line.split()[0].endswith(("-x1", "-x8"))]
    assert len(rows) == 2 * len(compose.gpu_profiles())
    if compose.trial([f"model={model}"]).model.recipe.precision == "bf16":
        assert "fp16 (bf16 unsupported)" in out

    every = {b.base.hardware.name: b for b in printed}
    budgets = [f"{gpu}-x{(1, 2, 4, 8)[i % 4]}" for i, gpu in enumerate(compose.gpu_profiles())]
    asked = predicted.asked([",".join([f"{model}@{b}", *extra]) for b in budgets])  # --predict MODEL@GPU-xN,...
    report = predicted.predicted_frame(asked, load_prices())
    for budget, row in zip(budgets, report.to_dict("records"), strict=True):
        answer, best = every[budget], every[budget].best
        assert row["budget"] == budget and row["precision"] == (answer.label or answer.base.precision), budget
        assert row["config"] == (best["config"] if best else "does not fit"), budget
        line = next(r for r in out.splitlines() if r.startswith(budget + " "))
        assert row["config"] in line, (budget, line)
        for k, column in predicted.PREDICTED_KEYS.items():
            assert row[column] == pytest.approx(best[k] if best else math.nan, nan_ok=True), (budget, k)


def test_published_runs_are_scored_on_a_few_rows():
    from analysis import published_runs as pa

    rows = pa.rows()
    assert len(rows) >= 100 and any(r.skipped for r in rows)
    recs = pa.predict([r for r in rows if r.id.startswith("flash-attn-training")][:2])
    s = pa.score(recs)
    assert s["overall"]["n"] == 2 and s["overall"]["tokens_per_s_per_gpu_err_pct"]["n"] == 2
    assert s["overall"]["fit"]["ran"] == 2 and all(r["regime"]["gpu_class"] for r in recs)
    assert all(0 < r["predicted_mfu"] < 1 for r in recs)
    assert "fuses" in recs[0]["implementation"]


@pytest.mark.slow
def test_selective_recomputation_and_reduce_every_micro_step_train_for_real(trial_store):
    """Real 2-process CPU trials: selective recomputation under DeepSpeed and FSDP2, and FSDP2
    reducing at every micro-step, which trains as the boundary-only reduction does (the same
    mean of the same gradients). FSDP2's boundary-only trial is conftest's FACTS one: measured
    once per session, two trials side by side."""
    cases = {
        "zero2 selective": ["methods.zero_stage=2", "methods.recompute=selective"],
        "fsdp2 boundary": ["methods.engine=fsdp2", *FSDP2["full_shard"]],
        "fsdp2 every": ["methods.engine=fsdp2", "methods.micro_batch=2", "methods.reduce_every_micro_step=true"],
        "fsdp2 every selective": [
            "methods.engine=fsdp2",
            "methods.micro_batch=2",
            "methods.reduce_every_micro_step=true",
            "methods.recompute=selective",
        ],
    }
    recs = dict(zip(cases, measured_all(trial_store, [TINY + v for v in cases.values()]), strict=True))
    for k, rec in recs.items():
        assert rec.outcome == "ok", (k, rec.message)
    m = {k: rec.metrics for k, rec in recs.items()}
    assert m["fsdp2 every"]["gas"] == 2
    assert m["fsdp2 every"]["loss_per_step"] == pytest.approx(m["fsdp2 boundary"]["loss_per_step"], rel=1e-4)
    assert m["fsdp2 every selective"]["loss_per_step"] == pytest.approx(m["fsdp2 every"]["loss_per_step"], rel=1e-4)
    # Selective recomputation recomputes no matmul: hardware FLOPs are the model's.
    sel = m["zero2 selective"]
    assert sel["hardware_flops_per_token"] == pytest.approx(sel["model_flops_per_token"], rel=0.01)


def test_the_demos_predicted_rows_carry_their_regimes_error_and_a_plausible_mfu():
    """Pythia-1B on 2x RTX 3090, 4x A6000 and 8x A100 (scripts/demo.sh): each row says its error
    in its regime with its n (against published runs), and no predicted MFU is above the best MFU
    published for an Ampere GPU (these three are Ampere; the published runs are A100s)."""
    import json

    from analysis.predicted import asked, best_row
    from analysis.prices import gpu_keys, load_prices

    published = json.loads((ROOT / "results" / "accuracy" / "cuda-published.json").read_text())
    best_ampere = max(v for k, v in published["best_published_mfu_by_gpu"].items() if k.startswith("a100"))
    prices, keys = load_prices(), gpu_keys()
    for a in asked(["pythia-1b@rtx-3090-x2", "pythia-1b@a6000-x4", "pythia-1b@a100-80gb-x8"]):
        row = best_row(a, prices, keys)
        assert row["fits"] == "yes" and 0 < row["predicted_mfu"] <= best_ampere, row
        assert row["regime"] in row["time_error_label"], row["time_error_label"]
        if "by_regime" in published:  # as `suite-predict published-accuracy --publish` writes it now
            assert row["time_error"].startswith("±") and "(n=" in row["time_error"], row["time_error"]
            assert "published runs" in row["time_error_label"] and "fused" in row["error_detail"]
        else:  # published before regimes: nothing is borrowed, each label says its regime is not scored
            assert row["time_error"] == "±? (not scored)" and "not scored in" in row["time_error_label"]


def test_zero3s_micro_step_on_a_datasheet_gpu_lasts_its_hosts_time_where_that_outlasts_the_gpus():
    """On a GPU without a calibration, ZeRO-3's host time is its dispatch plus gpu.ZERO3_HOOK_S per
    collective, and its micro-step the longer of that and the GPU's; a machine whose loop measured
    ZeRO-3's sync has the hooks in it."""
    from suite.predict import machine, timing

    base = compose.trial(["model=pythia-160m", "hardware=h200", "hardware.count=1", "methods.precision=bf16"])
    tr = traced(base.model, "sdpa", "none", "bf16")
    m = machine.datasheet(base)
    for mb in (1, 16, 256):
        z0 = replace(base, methods=replace(base.methods, zero_stage=0, micro_batch=mb))
        z3 = replace(z0, methods=replace(z0.methods, zero_stage=3))
        p0, p3 = timing.step_parts(z0, tr, m), timing.step_parts(z3, tr, m)
        n = p3.detail["collectives_micro"]
        host = timing.host_seconds(tr, mb) + n * gpu.ZERO3_HOOK_S
        assert n > 0 and p3.detail["zero3_host_s"] == pytest.approx(host)
        assert p3.t_micro == pytest.approx(max(host, p0.t_micro), rel=0.01), mb
    assert p3.t_micro > 1.5 * host  # at 256 x 2048 tokens the GPU's time outlasts the host's
    measured = replace(m, step_scale={"zero3": {"sync": 1e-4}})
    assert "zero3_host_s" not in timing.step_parts(z3, tr, measured).detail


def test_fp32_without_tf32_is_predicted_at_the_gpus_fp32_rate():
    """fp32 matmuls on CUDA cores (TF32 off, PyTorch's default) run at the fp32 peak; with TF32 on,
    at the TF32 tensor-core peak: several times faster on an A100."""
    base = ["model=pythia-160m", "hardware=a100-80gb", "model.recipe.precision=fp32", "methods.micro_batch=4"]
    off, on = (Predictor().predict(make_trial([*base, f"methods.tf32={v}"])) for v in ("false", "true"))
    assert off.step_time_s > 2.5 * on.step_time_s
    assert 0 < on.mfu < 1 and 0 < off.mfu < 1
