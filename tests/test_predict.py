"""The predictor (suite.predict), its calibration, `suite-predict` and `suite-report accuracy`.

The slow tests share one quick calibration of this machine (a real minimal trial among its
microbenchmarks) and check predictions against real tiny trials; the others need no process.
"""

from __future__ import annotations

import json
import math
import re
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from suite.config import Trial
from suite.models.build import batch, build
from suite.models.flops import count_flops
from suite.predict import Predictor, comm, memory, timing
from suite.predict.machine import GIB, datasheet, interpolate, load_calibration
from suite.predict.recorder import build_fake, record
from suite.predict.trace import B1, B2, Trace, traced

FIXTURES = Path(__file__).parent / "fixtures" / "results"


@pytest.fixture(autouse=True)
def _isolated(calibration_dir, monkeypatch):
    """Calibrations in the run's folder (conftest's, which every test process shares; traces: the
    run's cache), whatever a test before changed."""
    monkeypatch.setenv("SUITE_CALIBRATION_DIR", calibration_dir)


def test_trace_is_affine_in_the_micro_batch_and_counts_the_flops_of_count_flops(tiny):
    """Traced at two micro-batches, the trace predicts a third exactly (memory and FLOPs), and
    its FLOPs are those FlopCounterMode counts (suite.models.flops.count_flops) within 2%: that one
    decomposes CPU flash attention into matrix multiplies, whose backward does not recompute
    the attention scores as the fused kernel does (one matmul of s x s x d less per layer)."""
    t = tiny()
    tr = traced(t.model, "sdpa", "full", "fp32")
    model, fake = build_fake(t.model, "sdpa", "full", "fp32")
    for b in (1, 3, 8):
        events, act, fresh, cum, _, _ = record(model, t.model, b, fake)
        assert tr.activation_bytes(b) == pytest.approx(max(a + f for a, f in zip(act, fresh, strict=True)))
        assert tr.activation_bytes_with_grads(b) == pytest.approx(max(a + g for a, g in zip(act, cum, strict=True)))
        assert tr.flops(b) == pytest.approx(sum(e.flops for e in events))
        allocated = sum(g.count * sum(g.allocs_at(b)) for g in tr.groups)
        # (at b = 1 the labels' copy is skipped: the line through 2 and 4 counts its bytes)
        assert allocated == pytest.approx(sum(sum(e.allocs) for e in events), abs=1024) and allocated > 0
    assert (B1, B2) == (2, 4)
    assert tr.flops(1) == pytest.approx(count_flops(t.model, "sdpa", "full")[0], rel=0.02)
    # Recomputation runs each block's forward again inside backward.
    plain = traced(t.model, "sdpa", "none", "fp32")
    assert tr.flops(1, "backward") > plain.flops(1, "backward")
    assert tr.activation_bytes(8) < plain.activation_bytes(8)
    assert Trace.from_json(json.loads(json.dumps(tr.to_json()))) == tr


def test_trace_equals_the_live_bytes_of_a_real_micro_step(tiny):
    """The fake trace's activation peak is what a real CPU forward and backward allocates,
    counted by glibc itself (mallinfo2) in the second step (the steady state)."""
    import ctypes

    class MallInfo(ctypes.Structure):
        _fields_ = [
            (n, ctypes.c_size_t)
            for n in (
                "arena",
                "ordblks",
                "smblks",
                "hblks",
                "hblkhd",
                "usmblks",
                "fsmblks",
                "uordblks",
                "fordblks",
                "keepcost",
            )
        ]

    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = MallInfo

    def used() -> int:
        m = libc.mallinfo2()
        return m.uordblks + m.hblkhd

    t = tiny()
    model = build(t.model, "sdpa", "none")
    inputs = batch(t.model, 4, torch.Generator().manual_seed(0), "cpu")
    from torch.utils._python_dispatch import TorchDispatchMode

    class Peak(TorchDispatchMode):
        peak = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            Peak.peak = max(Peak.peak, used())
            return out

    model(**inputs).loss.backward()  # gradients now exist, as in a later micro-step
    base = used()
    with Peak():
        model(**inputs).loss.backward()
    real = Peak.peak - base
    predicted = traced(t.model, "sdpa", "none", "fp32").activation_bytes(4)
    assert predicted == pytest.approx(real, rel=0.05)


def _synthetic_trace(n_params: int, tensors: int = 1000) -> Trace:
    each = n_params // tensors
    return Trace(
        key="synthetic",
        n_params=each * tensors,
        param_numels=(each,) * tensors,
        block_numels=(each * 10,) * (tensors // 10),
        module_params=((each,),) * tensors,
        envelope=((0.0, 0.0),),
        grads_envelope=((0.0, 0.0),),
        groups=(),
    )


@pytest.mark.parametrize("gpus", [4, 8, 64])
def test_model_states_agree_with_deepspeeds_own_estimators(gpus):
    """ZeRO-2 and ZeRO-3 model states per GPU at the optimizer step, for a 1B-parameter model
    under bf16 (buckets and activations aside), against DeepSpeed's own estimators, term by
    term. Their known differences: the ZeRO-2 estimate (2P + 18P/N) leaves out the flattened
    16-bit copy of the gradient partition that the step makes before converting it to fp32
    (+2P/N); the ZeRO-3 estimate (18P/N + 4 x largest layer) leaves out the 16-bit parameter
    partition (+2P/N) and the same flattened copy at its step (+2P/N), and stands for the
    gathered parameters with its largest-layer term, which the predictor counts apart (what
    stays gathered for reuse, here left out); with optimizer offload, ZeRO-2 keeps on the GPU,
    beyond the estimate's 16-bit parameters (2P), a staging buffer of the largest parameter and no
    gradient partition (each reduced gradient goes to the host's as it is made; an H200 trial,
    tests/test_gpu_kernels.py)."""
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

    from tests.conftest import make_trial

    p, largest = 1_000_000_000, 1_000_000
    tr = _synthetic_trace(p)
    nodes, per_node = (gpus // 8, 8) if gpus > 8 else (1, gpus)
    base = make_trial(["model=pythia-1b", f"hardware=a100-80gb-x{per_node}", f"cluster.nodes={nodes}"])

    def states(zero: int, offload: str = "none") -> float:
        t = replace(base, methods=replace(base.methods, zero_stage=zero, offload=offload, micro_batch=1))
        lay = memory.deepspeed_layout(t, tr)
        step = [x for x in lay.optimizer if "fp32 gradient" in x.name or "flattened" in x.name]
        buckets = [x for x in lay.steady if "bucket" in x.name]
        return lay.total(lay.steady) + lay.total(step) - lay.total(buckets)

    _, ds2 = estimate_zero2_model_states_mem_needs(p, per_node, nodes, cpu_offload=False)
    # ZeRO-2's gradient buffer holds the parameters that overlap the rank's partition whole
    # (stage_1_and_2.py:2183-2198): beyond P/N where a partition boundary cuts a parameter.
    whole = max(
        sum(tr.param_numels[i] for i in memory.zero12_partition(tr.param_numels, gpus, r)[0]) for r in range(gpus)
    )
    assert states(2) == pytest.approx(ds2 + 2 * p / gpus + 2 * (whole - p / gpus))
    _, ds3, layer = estimate_zero3_model_states_mem_needs(p, 0, per_node, nodes, cpu_offload=False)
    assert layer == 0 and states(3) == pytest.approx(ds3 + 4 * p / gpus)
    _, ds2_off = estimate_zero2_model_states_mem_needs(p, per_node, nodes, cpu_offload=True)
    assert states(2, "optimizer") == pytest.approx(ds2_off + 2 * largest)


@pytest.mark.parametrize("micro_batch", [1, 8])
def test_fsdp2s_gradient_shards_are_not_alive_with_the_activations(micro_batch):
    """FSDP2 makes its fp32 gradient shards in the boundary's reduce-scatter (as it frees the
    unsharded gradients it reduces) and the step's zero_grad(set_to_none=True) frees them: the
    backward holds parameter shards, moments, the gathered units and, before the boundary (gas > 1),
    the unsharded gradients; the step holds the shards with the gradient shards. Measured on the
    CPU (prediction_accuracy, five models): the peaks of FSDP2 exceeded DDP's error by 4P/N."""
    from tests.conftest import make_trial

    p, n = 1_000_000_000, 8
    tr = replace(_synthetic_trace(p), envelope=((2.0e9, 0.0),))  # 2 GB of activations at any micro-batch
    batch = "model.recipe.global_batch=64"  # gas 1 at micro-batch 8
    t = make_trial(["model=pythia-1b", f"hardware=a100-80gb-x{n}", batch, "methods.engine=fsdp2"])
    t = replace(t, methods=replace(t.methods, micro_batch=micro_batch, recompute="none", offload="none"))
    lay = memory.layout(t, tr)
    units = 2 * 2 * max(tr.block_numels)  # two units gathered whole, in bf16
    unsharded = 4 * p if t.gas_measured > 1 else 0  # no_sync's fp32 gradients, between boundaries
    assert lay.states() == pytest.approx(12 * p / n)  # fp32 parameter shards and moments
    assert lay.timed_peak() == pytest.approx(12 * p / n + 2.0e9 + units + unsharded)
    assert lay.total(lay.optimizer) == pytest.approx(4 * p / n)
    assert (micro_batch == 1) == (t.gas_measured > 1)


def test_collective_and_bucket_model():
    """DeepSpeed flushes its reduce bucket when the next gradient would overflow it, and sends
    a gradient larger than the bucket alone; a ring moves 2(N-1)/N of the buffer per rank."""
    assert comm.bucket_flushes([3, 3, 3, 10, 1], 7) == [6, 3, 10, 1]
    assert comm.bucket_flushes([1, 2], 0) == [3]
    from suite.predict.machine import Machine

    m = Machine(kind="cpu", source="test", ranks=4, collectives={"all_reduce": [1e-3, 1e9], "all_gather": [1e-3, 1e9]})
    assert comm.collective_seconds(m, "all_reduce", 4e9, 4) == pytest.approx(1e-3 + 4e9 * 6 / (4 * 1e9))
    assert comm.collective_seconds(m, "all_gather", 4e9, 4) == pytest.approx(1e-3 + 4e9 * 3 / (4 * 1e9))
    assert comm.collective_seconds(m, "all_reduce", 4e9, 1) == 0
    points = [[m_, n, k, float(m_ * n * k)] for m_ in (32, 512) for n in (32, 512) for k in (32, 512)]
    assert interpolate(points, (128, 128, 128)) == pytest.approx(128**3)


def test_first_touch_and_operator_pace():
    """A fresh allocation costs the measured first touch of the largest measured size not above
    it, only for operators paced by the add (into an existing tensor); an operator with a pace
    of its own (`op_curves`) streams at it, its allocations already in what was measured."""
    from suite.predict.machine import Machine
    from suite.predict.trace import OpGroup

    m = Machine(kind="cpu", source="test", ranks=1, memory_bps=1e10, op_overhead_s=0.0)
    m.first_touch = [[2**18, 1e-9], [2**24, 2e-9]]
    assert comm.first_touch_seconds(m, [2**17]) == 0.0
    assert comm.first_touch_seconds(m, [2**20]) == pytest.approx(2**20 * 1e-9)
    assert comm.first_touch_seconds(m, [2**24, 2**26]) == pytest.approx((2**24 + 2**26) * 2e-9)

    def trace_of(op):
        g = OpGroup(op, "forward", 2, (0.0, 0.0), (0.0, 1e8), (), ((0.0, 2**22),))
        return Trace("k", 0, (), (), (), ((0.0, 0.0),), ((0.0, 0.0),), (g,))

    fwd, _, _ = timing.compute_seconds(trace_of("aten.add"), 1, m, "fp32")
    assert fwd == pytest.approx(2 * (1e8 / 1e10 + 2**22 * 1e-9))
    m.op_curves = {"aten.gelu": [[1e6, 2e9], [1e9, 2e9]]}
    fwd, _, _ = timing.compute_seconds(trace_of("aten.gelu"), 1, m, "fp32")
    assert fwd == pytest.approx(2 * 1e8 / 2e9)


def test_engines_fill_fresh_buffers():
    """DeepSpeed flattens the gradients into a new buffer before reducing them (ZeRO-0: one),
    and ZeRO-3 gathers each module's parameters into a new one: their first touch is part of
    the communication."""
    from tests.conftest import make_trial

    for stage in (0, 3):
        t = make_trial(["model=pythia-160m", "hardware=a100-80gb-x8", f"methods.zero_stage={stage}"])
        tr = traced(t.model, t.methods.attention, t.methods.recompute, t.precision)
        m = replace(datasheet(t), kind="cpu")  # in line, as a CPU worker runs its collectives
        base = timing.step_parts(t, tr, m)
        touched = timing.step_parts(t, tr, replace(m, first_touch=[[2**18, 1e-9]]))
        w = memory.bytes_per_element(t.precision)
        if stage == 0:
            extra = touched.detail["boundary_comm_s"] - base.detail["boundary_comm_s"]
            assert extra == pytest.approx(w * tr.n_params * 1e-9)
        else:  # at least the largest module gathered once, in forward
            extra = touched.detail["micro_comm_s"] - base.detail["micro_comm_s"]
            assert extra >= w * max(sum(mod) for mod in tr.module_params) * 1e-9 > 0


def test_step_scale_multiplies_the_micro_step_and_the_optimizer_step():
    """A calibration's measured loop scales of the trial's engine (`Machine.step_scale`) multiply
    the micro-step (compute and the communication in it) and the engine step."""
    from tests.conftest import make_trial

    t = make_trial(["model=pythia-160m", "hardware=a100-80gb-x8", "methods.zero_stage=2", "methods.micro_batch=4"])
    me = t.methods
    tr = traced(t.model, me.attention, me.recompute, t.precision)
    m = datasheet(t)
    base = timing.step_parts(t, tr, m)
    scaled = timing.step_parts(t, tr, replace(m, step_scale={"zero2": {"compute": 2.0, "optimizer": 3.0}}))
    other = timing.step_parts(t, tr, replace(m, step_scale={"zero3": {"compute": 2.0, "optimizer": 3.0}}))
    fallback = timing.step_parts(t, tr, replace(m, step_scale={"zero0": {"compute": 2.0, "optimizer": 3.0}}))
    assert base.detail["micro_comm_s"] > 0 and base.detail["boundary_comm_s"] == 0  # ZeRO-2 reduces per micro-step
    assert scaled.t_micro == pytest.approx(2 * base.t_micro) and scaled.t_boundary == pytest.approx(2 * base.t_boundary)
    assert scaled.detail["micro_comm_s"] == pytest.approx(base.detail["micro_comm_s"])  # the collectives as measured
    assert scaled.t_optimizer == pytest.approx(3 * base.t_optimizer)
    assert base.detail["compute_scale"] == 1.0 and scaled.detail["optimizer_scale"] == 3.0
    # Another engine's scale is not this one's; zero0's stands in where this one's is missing.
    assert other.step_time_s == pytest.approx(base.step_time_s)
    assert fallback.step_time_s == pytest.approx(scaled.step_time_s)


def test_communication_takes_the_compute_scale_and_the_engine_its_optimizer_scale():
    """ZeRO-0's compute scale multiplies compute and communication alike; a calibration's
    per-engine "comm" scale is recorded for diagnosis and changes no prediction."""
    from tests.conftest import make_trial

    t = make_trial(["model=pythia-160m", "hardware=a100-80gb-x8", "methods.zero_stage=2", "methods.micro_batch=4"])
    me = t.methods
    tr = traced(t.model, me.attention, me.recompute, t.precision)
    m = datasheet(t)
    base = timing.step_parts(t, tr, m)
    scales = {"zero0": {"compute": 2.0, "optimizer": 1.0, "comm": 5.0}, "zero2": {"comm": 3.0, "optimizer": 4.0}}
    scaled = timing.step_parts(t, tr, replace(m, step_scale=scales))
    compute = base.detail["forward_s"] + base.detail["backward_s"]
    comm = base.detail["micro_comm_s"]
    assert comm > 0 and compute > 0
    assert scaled.t_micro == pytest.approx(2 * (compute + comm))
    assert scaled.t_optimizer == pytest.approx(4 * base.t_optimizer)
    assert scaled.detail["compute_scale"] == 2.0
    no_comm = {k: {p: v for p, v in s.items() if p != "comm"} for k, s in scales.items()}
    assert timing.step_parts(t, tr, replace(m, step_scale=no_comm)).step_time_s == pytest.approx(scaled.step_time_s)


def test_each_collective_adds_the_engines_sync():
    """An engine's measured cost per collective ("sync") is added once per collective: ZeRO-2's
    reductions in every micro-step; another engine's sync is not this one's."""
    from tests.conftest import make_trial

    t = make_trial(["model=pythia-160m", "hardware=a100-80gb-x8", "methods.zero_stage=2", "methods.micro_batch=4"])
    me = t.methods
    tr = traced(t.model, me.attention, me.recompute, t.precision)
    m = datasheet(t)
    base = timing.step_parts(t, tr, m)
    synced = timing.step_parts(t, tr, replace(m, step_scale={"zero2": {"sync": 0.01}}))
    n = base.detail["collectives_micro"]
    assert n == base.detail["reductions"] > 0 and base.detail["collectives_boundary"] == 0
    assert synced.t_micro == pytest.approx(base.t_micro + 0.01 * n)
    assert synced.t_boundary == pytest.approx(base.t_boundary + 0.01 * n)
    other = timing.step_parts(t, tr, replace(m, step_scale={"zero0": {"sync": 0.01}, "zero3": {"sync": 0.01}}))
    assert other.step_time_s == pytest.approx(base.step_time_s)


def test_bandwidth_fields_leave_trial_ids_unchanged():
    """The bandwidths describe the hardware to the predictor; stored trials keep their ids."""
    for path in sorted(FIXTURES.glob("*.json")):
        rec = json.loads(path.read_text())
        assert Trial.from_json(rec["trial"]).id == rec["trial_id"]


def test_suite_predict_answers_for_gpus_with_no_gpu(capsys, tmp_path, monkeypatch):
    """A GPU budget is predicted from its datasheet on a machine without one; every figure is
    labelled predicted, and its error is said to be not scored in its regime (nothing published)."""
    from analysis import predicted
    from cli import predict
    from tests.conftest import TINY

    monkeypatch.setattr(predict, "OUT_DIR", tmp_path)
    monkeypatch.setattr("suite.paths.accuracy_dir", lambda: tmp_path / "none")
    model = [o for o in TINY if o.startswith("model")]
    assert predict.main([*model, "hardware=a100-40gb", "hardware.count=1"]) == 0
    out = capsys.readouterr().out
    assert "PREDICTED, not measured: pythia-14m on a100-40gb-x1" in out
    assert "step time: not scored in datacenter-sxm · " in out
    rows = [line for line in out.splitlines() if re.match(r"\s+\d+  ", line)]
    assert rows and all(" yes " in r or " no " in r for r in rows)
    assert float(rows[0].split()[-6]) > 0  # s/step of the best configuration
    assert (tmp_path / "pythia-14m-a100-40gb-x1.csv").exists()
    assert len(predicted.budgets(["hardware=all"])) == 4 * len(predict.compose.gpu_profiles())  # GPU types x counts
    few = [["hardware=a6000", "hardware.count=4"], ["hardware=h100-sxm", "hardware.count=8"], ["hardware=v100-x1"]]
    one = predicted.budgets
    monkeypatch.setattr(predicted, "budgets", lambda o: [[*model, *h] for h in few] if "hardware=all" in o else one(o))
    assert predict.main([*model, "hardware=all"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in ("a6000-x4", "h100-sxm-x8", "v100-x1")) and "cpu-x2" not in out
    assert predict.main([*model, "hardware=nonsense"]) == 2


def test_gpu_datasheet_profiles_are_complete():
    """Every GPU profile carries the bandwidths and overheads the predictor needs."""
    from suite.config.compose import gpu_profiles
    from tests.conftest import make_trial

    for gpu in gpu_profiles():
        t = make_trial([f"hardware={gpu}"])
        m = datasheet(t)
        assert m.memory_bps > 0 and m.host_bps > 0 and m.collectives["all_reduce"][1] > 0, gpu
        assert all(v[0] >= 0 and v[1] for v in m.overhead.values()), gpu


# --- Slow: a real quick calibration (conftest's `calibrated`, the session's one), real tiny trials,
# the accuracy report from real records.


@pytest.mark.slow
def test_quick_calibration_measures_every_constant(calibrated, monkeypatch):
    monkeypatch.setenv("SUITE_CALIBRATION_DIR", str(calibrated))
    m = load_calibration("cpu-x2")
    assert m is not None and m.kind == "cpu" and m.ranks == 2
    # Bounds against a wrong unit, not against a slow spell: a loaded machine may run several times slower.
    assert m.memory_bps > 0 and 0 < m.op_overhead_s < 1
    assert all(row[3] > 0 for row in m.matmul["fp32"]) and all(r[2] > 0 and r[3] > 0 for r in m.attention)
    assert set(m.collectives) == {"all_reduce", "all_gather", "reduce_scatter"}
    assert all(lat > 0 and bw > 0 for lat, bw in m.collectives.values())
    assert m.adam_elements_per_s["torch"] > 0
    assert 0 < m.runtime_bytes["zero0"] < GIB and m.probe_flops > 0
    assert {"aten._log_softmax", "aten.gelu", "aten.native_layer_norm"} <= set(m.op_curves)
    assert all(bps > 0 for pts in m.op_curves.values() for _, bps in pts)
    # A worker's allocations from 128 KiB up come fresh from the kernel (suite.launch.worker_env):
    # their first touch costs page faults (seconds per byte: far below a second per MiB).
    assert [p[0] for p in m.first_touch] == [2**18, 2**24]
    # A small block's faults (64 pages) can drown in a loaded machine's noise: measured as 0, never below.
    assert all(0 <= p[1] * 2**20 < 1 for p in m.first_touch) and m.first_touch[-1][1] > 0
    # A real loop against its operators measured alone: ratios, positive and finite (a slow spell
    # during either side moves them, so no tighter bound holds on a shared machine).
    scales = m.step_scale["zero0"]
    assert set(m.step_scale) == {"zero0"} and set(scales) == {"compute", "comm", "optimizer", "sync"}
    assert all(0 < scales[k] < math.inf for k in ("compute", "comm", "optimizer"))
    assert 0 <= scales["sync"] < math.inf  # seconds per collective (ZeRO-0: one all-reduce a step)


@pytest.mark.slow
def test_predicts_memory_and_oom_of_real_tiny_trials(calibrated, monkeypatch, tiny):
    """Real small trials: a trial fits its budget and its peak memory is predicted within 10%;
    a budget 25% below the prediction runs out of memory, as predicted. (ZeRO-0: the quick
    calibration measures the runtime memory of that engine only.) The model is ~190 MiB a rank,
    so that 25% is ~48 MiB: at the test model's 20 MiB, 25% was 5 MiB, within what the
    budget's baseline (virtual memory mapped before the cap) varies from machine to machine,
    and CI ran that trial ok."""
    from suite.launch import run_trial

    monkeypatch.setenv("SUITE_CALIBRATION_DIR", str(calibrated))
    size = ("model.config.hidden_size=256", "model.config.vocab_size=16384")
    t = tiny("methods.zero_stage=0", "methods.micro_batch=2", *size)
    p = Predictor().predict(t)
    fit_trial = replace(t, hardware=replace(t.hardware, mem_gib=round(p.device_gib * 1.3 + 0.05, 2)))
    fit = run_trial(fit_trial)
    assert fit.outcome == "ok", fit.message
    assert p.peak_mem_gib == pytest.approx(fit.metrics["peak_mem_gib"], rel=0.10)
    assert p.step_time_s > 0 and not math.isnan(p.step_time_s)
    # The run and the calibration each carry the machine's speed (the probe); the accuracy
    # report sets one against the other, and scales the prediction by it in a column of its own.
    from analysis.accuracy import score

    probe = load_calibration("cpu-x2").probe_flops
    assert probe > 0 and fit.metrics["probe_flops"] > 0
    from suite.record import Record

    row = score([(Record.new(fit_trial, "test", "ok", "", fit.metrics, fit.wall_s), "fit")]).iloc[0]
    assert row.speed_ratio == pytest.approx(fit.metrics["probe_flops"] / probe)
    at_speed = 100 * (row.pred_step_time_s / row.speed_ratio / fit.metrics["step_time_s"] - 1)
    assert row.step_time_at_speed_err_pct == pytest.approx(at_speed)
    small = round(p.device_gib * 0.75, 3)
    tight = replace(t, hardware=replace(t.hardware, mem_gib=small))
    assert not Predictor().predict(tight).fits
    assert run_trial(tight).outcome == "oom"


@pytest.mark.slow
def test_accuracy_report_from_the_committed_records(calibrated, monkeypatch, tmp_path, capsys):
    """Every ok or oom fixture record is predicted from its own trial (with this machine's
    calibration: the records' host is not this one), and the summary is written; the records
    of cpu-x1, never calibrated here, are listed as not predicted, with the reason. Half the
    records are of the current schema (as the store writes them), half single-run ones."""
    from cli.report import main
    from suite import record

    monkeypatch.setenv("SUITE_CALIBRATION_DIR", str(calibrated))
    accuracy = tmp_path / "accuracy"
    monkeypatch.setattr("suite.paths.publish_dir", lambda: accuracy)
    results = tmp_path / "results"
    shutil.copytree(FIXTURES, results)
    for f in sorted(results.rglob("*.json"))[::2]:
        rec = json.loads(f.read_text())
        if rec.get("schema") == record.SINGLE_RUN_SCHEMA:
            f.write_text(json.dumps(record.Record.from_json(rec).to_json()))
    assert main(["accuracy", str(results), "--out", str(tmp_path / "out"), "--publish"]) == 0
    out = capsys.readouterr().out
    # What to expect, read from the fixture files: every ok or oom record is scored; this machine's
    # calibration (cpu-x2's) serves every budget of two workers; a budget of memory judges fit/oom.
    raw = [json.loads(p.read_text()) for p in sorted(FIXTURES.glob("*.json"))]
    scored = [r for r in raw if r["outcome"] in ("ok", "oom")]
    here = [r for r in scored if r["trial"]["hardware"]["count"] == 2]
    ok_here = [r for r in here if r["outcome"] == "ok"]
    budgeted = [r for r in here if r["trial"]["hardware"]["mem_gib"] > 0]
    assert len(here) < len(scored) and ok_here and budgeted  # the fixtures hold each case
    assert f"Prediction accuracy on {len(scored)} cpu record(s)" in out
    report = json.loads((tmp_path / "out" / "accuracy.json").read_text())
    s = report["summary"]["cpu"]
    assert s["peak_mem_err_pct"]["n"] == len(ok_here) and s["step_time_err_pct"]["n"] == len(ok_here)
    assert s["fit_n"] == len(budgeted) and len(s["not_predicted"]) == len(scored) - len(here)
    assert all("cpu-x1" in line and "calibrate" in line for line in s["not_predicted"])
    assert {sp["model"] for sp in s["spearman"]} == {r["trial"]["model"]["name"] for r in ok_here}
    assert json.loads((accuracy / "cpu.json").read_text())["n_records"] == len(scored)


def test_rank_correlation_of_the_measurement_against_itself():
    """Where every record of a (model, budget) holds two runs, the summary also ranks the first
    runs against the second: the ceiling a prediction scored against one run can reach. A
    group with a single-run record has none."""
    import pandas as pd

    from analysis.accuracy import as_text, spearman, summary

    first, second = [1.0, 2.0, 3.0, 4.0], [1.1, 2.2, 3.9, 3.8]  # the last two swap places
    rows = [
        {
            "model": "a",
            "budget": "cpu-x2",
            "outcome": "ok",
            "pred_step_time_s": p,
            "step_time_s": (x + y) / 2,
            "run_step_times_s": [x, y],
            "method": "ZeRO-0",
            "note": "",
            "trial_id": str(k),
        }
        for k, (p, x, y) in enumerate(zip([1, 2, 3, 4], first, second, strict=True))
    ]
    rows += [
        dict(r, model="b", run_step_times_s=[r["step_time_s"]] if k == 0 else r["run_step_times_s"])
        for k, r in enumerate(rows)
    ]
    df = pd.DataFrame(rows)
    got = {sp["model"]: sp for sp in spearman(df)}
    assert got["a"]["repeat_spearman"] == pytest.approx(0.8)  # 1 - 6 * (1 + 1) / (4 * 15)
    assert got["a"]["spearman"] == pytest.approx(
        pd.Series([1, 2, 3, 4]).rank().corr(pd.Series([1.05, 2.1, 3.45, 3.9]).rank())
    )
    assert got["b"]["repeat_spearman"] is None
    text = as_text(summary(df), "cpu")
    assert "rank correlation a on cpu-x2: 1.00 (4 trials; first run against second: 0.80)" in text
    assert "rank correlation b on cpu-x2: 1.00 (4 trials)" in text


def test_rescore_predicts_a_stored_result_again_from_each_calibration(tmp_path):
    """`python -m benchmarks.prediction_accuracy --rescore`: a result's measured step times against the
    predictions of a calibration given as a file, with the engine's loop scales and ZeRO-0's alone."""
    import json
    from pathlib import Path

    import pandas as pd

    from analysis.accuracy import method_label
    from benchmarks import prediction_accuracy as bench
    from suite.predict import Predictor
    from suite.predict.machine import Machine

    root = Path(__file__).resolve().parent.parent
    cal_path = sorted((root / "results/benchmarks/calibrations").glob("*.json"))[0]
    cal = Machine.from_json(json.loads(cal_path.read_text()))
    assert cal.step_scale["zero3"]["optimizer"] != cal.step_scale["zero0"]["optimizer"]

    picked = [
        (n, t) for n, t in bench.trials(False, 0.8) if t.methods.micro_batch == 2 and t.methods.recompute == "none"
    ]
    (n1, t1), (n2, t2) = picked[0], picked[3]
    assert n1 == n2 and (method_label(t1), method_label(t2)) == ("DDP", "ZeRO-3")
    records = []
    for n, t, factor in ((n1, t1, 1.25), (n2, t2, 0.8)):  # predictions 25% too slow, 20% too fast
        p = Predictor(machine=cal).predict(t).step_time_s
        records.append(
            {"model": n, "method": method_label(t), "recompute": "none", "micro_batch": 2, "outcome": "ok",
             "step_time_s": p / factor, "mem_budget_gib": 0.8}
        )  # fmt: skip
    records.append(dict(records[0], outcome="oom", step_time_s=None))
    result = tmp_path / "result.json"
    result.write_text(json.dumps({"records": records, "provenance": {"date": "2026-12-01T12:00:00+00:00"}}))
    rows = bench.rescore(result, [cal_path])
    assert [r["scales"] for r in rows] == ["per engine", "ZeRO-0 only"]
    engine = rows[0]
    assert engine["n"] == 2 and engine["calibration"] == cal.source
    assert engine["median_abs_err_pct"] == pytest.approx(22.5)
    assert engine["max_abs_err_pct"] == pytest.approx(25.0)
    assert engine["median_signed_err_pct"] == pytest.approx(2.5)
    assert rows[1]["median_abs_err_pct"] != pytest.approx(22.5)  # ZeRO-3 under ZeRO-0's scales predicts otherwise
    assert engine["spearman"] == {} and engine["spearman_min"] is None  # two trials of a model: no rank
    # A third trial of the model, measured at half the fastest: the rank of three predicted against measured.
    n3, t3 = picked[1]
    p3 = Predictor(machine=cal).predict(t3).step_time_s
    third = {**records[0], "method": method_label(t3), "step_time_s": 0.5 * min(r["step_time_s"] for r in records[:2])}
    predicted = [records[0]["step_time_s"] * 1.25, records[1]["step_time_s"] * 0.8, p3]
    measured = [records[0]["step_time_s"], records[1]["step_time_s"], third["step_time_s"]]
    result.write_text(json.dumps({"records": [*records, third], "provenance": {"date": "2026-12-01T12:00:00+00:00"}}))
    rank = bench.rescore(result, [cal_path])[0]["spearman"]
    assert n3 == n1 and rank == {n1: pytest.approx(pd.Series(predicted).rank().corr(pd.Series(measured).rank()))}
