"""Every shipped config composes and validates; each validation rule names its bad value."""

from __future__ import annotations

import functools
import os
import subprocess
import sys

import pytest
from conftest import TINY, make_trial, shipped

from suite import paths
from suite.config.validate import problems, unsupported

CONF = paths.conf_dir()


def names(group: str) -> list[str]:
    """The configs of a group the project ships (as git tracks them; a user's own file aside)."""
    return [p.stem for p in shipped(f"conf/{group}/*.yaml")]


SHIPPED = [m for m in names("model") if m != "hf"]  # hf.yaml is the template for a user's config.json


@pytest.mark.parametrize("model", SHIPPED)
def test_every_model_composes_and_is_valid_on_a_gpu_node(model):
    t = make_trial([f"model={model}", "hardware=a100-80gb-x8"])
    assert t.model.name == model
    assert problems(t) == []
    assert t.gas * t.methods.micro_batch * t.hardware.count == t.model.recipe.global_batch
    assert t.model.source and "seed-paper" not in t.model.source


@functools.cache
def _a6000():
    from suite.config import compose

    return compose.config(["hardware=a6000", "methods.precision=fp32"])


@pytest.mark.parametrize("hardware", names("hardware"))
def test_every_hardware_profile_composes_and_is_valid(hardware):
    from omegaconf import OmegaConf

    from suite.config import compose

    other = _a6000()
    for n in (1, 8) if hardware != "cpu-x2-1gb" else (2,):  # one device and a node of them: the ends
        cfg = compose.config([f"hardware={hardware}", f"hardware.count={n}", "methods.precision=fp32"])
        # suite-predict hardware=all's shortcut past Hydra gives the same config.
        swapped = compose.with_hardware(other, hardware, n)
        assert OmegaConf.to_container(swapped, resolve=True) == OmegaConf.to_container(cfg, resolve=True)
        t = compose.trial_from_cfg(cfg)
        assert problems(t) == [] and t.hardware.count == n
        assert t.hardware.name == (f"{hardware}-x{n}" if hardware != "cpu-x2-1gb" else hardware)
        # The older name of the same budget is the same trial.
        assert make_trial([f"hardware={t.hardware.name}", "methods.precision=fp32"]).id == t.id
        if t.hardware.device == "cuda":
            assert t.hardware.peak_tflops["fp16"] > 0 and t.hardware.mem_gib > 0 and t.hardware.datasheet


def test_a_sweep_of_old_hardware_names_is_rewritten_or_refused_with_the_new_form():
    from suite.config.compose import OverrideError, overrides

    assert overrides(["hardware=a6000-x4"]) == ["hardware=a6000", "hardware.count=4"]
    assert overrides(["hardware=a6000-x1,a6000-x4"]) == ["hardware=a6000", "hardware.count=1,4"]
    assert overrides(["hardware=a6000-x8,h100-sxm-x8"]) == ["hardware=a6000,h100-sxm", "hardware.count=8"]
    assert overrides(["hardware=cpu-x2-1gb", "model=x"]) == ["hardware=cpu-x2-1gb", "model=x"]
    with pytest.raises(OverrideError, match="hardware=a6000,h100-sxm hardware.count=1,8"):
        overrides(["hardware=a6000-x1,h100-sxm-x8"])


@pytest.mark.parametrize("experiment", names("experiment"))
def test_every_experiment_composes_and_is_valid(experiment):
    gpu = [] if experiment.startswith("cpu") else ["hardware=h200-x1"]  # GPU experiments name no GPU
    assert problems(make_trial([f"experiment={experiment}", *gpu])) == []


def test_pythia_1b_recipe_and_derived_batching():
    t = make_trial(["model=pythia-1b", "hardware=a100-80gb-x4", "methods.micro_batch=16"])
    assert (t.model.recipe.global_batch, t.model.recipe.seq_len, t.model.recipe.train_steps) == (1024, 2048, 143000)
    assert t.precision == "bf16"
    assert t.per_device_batch == 256 and t.gas == 16


RULES = [
    (["methods.zero_stage=5"], "methods.zero_stage=5"),
    (["methods.offload=disk"], "methods.offload='disk'"),
    (["methods.recompute=some"], "methods.recompute='some'"),
    (["methods.attention=xformers"], "methods.attention='xformers'"),
    (["methods.precision=fp8"], "methods.precision='fp8'"),
    (["methods.micro_batch=0"], "methods.micro_batch=0"),
    (["methods.micro_batch=3"], "methods.micro_batch=3 does not divide the per-device batch 4"),
    (["methods.offload=optimizer"], "methods.offload=optimizer needs sharding"),
    (["methods.zero_stage=2", "methods.offload=optimizer+params"], "needs methods.zero_stage=3 (got 2)"),
    (["methods.precision=fp16"], "precision fp16 does not train on CPU"),
    (["hardware=v100-x1", "methods.precision=bf16"], "precision bf16 is not supported by v100-x1"),
    (["methods.attention=flash_attention_2"], "flash_attention_2 needs bf16 or fp16"),
    (["model.recipe.global_batch=9"], "global_batch=9 is not divisible by hardware.count=2"),
    (["model.recipe.seq_len=4096"], "model.recipe.seq_len=4096 exceeds the model's positions"),
    (["model.config.num_attention_heads=3"], "hidden size is not divisible by the number of attention heads"),
    (["model.config.num_hidden_layers=0"], "model.config.num_hidden_layers=0 must be > 0"),
    (["+model.config.hiden_size=64"], "model.config.hiden_size is not a field of GPTNeoXConfig; did you mean hidden"),
    (["+model.config.torch_dtype=bfloat16"], "model.config.torch_dtype is set by the trial"),
    (["model.model_type=lama"], "model.model_type='lama' is not a model type of this transformers; did you mean llama"),
    (["model.task=seq2seq"], "model.task='seq2seq' is not allowed; choose one of causal-lm, masked-lm, image-"),
    (["model.task=image-classification"], "has no image-classification model in transformers"),
    (["model.hf_config=EleutherAI/pythia-14m"], "is not a local file or a folder with a config.json"),
    (["methods.attention=none"], "methods.attention=none is not supported by GPTNeoXForCausalLM"),
    (["model.recipe.lr=0"], "model.recipe.lr=0.0 must be > 0"),
    (["model.recipe.grad_clip=-1"], "model.recipe.grad_clip=-1.0 must be >= 0"),
    (["model.recipe.betas=[0.9,1.5]"], "model.recipe.betas=[0.9, 1.5] must be two values in [0, 1)"),
    (["debug.fault=kill", "debug.fault_rank=2"], "debug.fault_rank=2 is not a rank of the trial's 2 device(s)"),
    (["hardware.count=0"], "hardware.count=0 must be > 0"),
    (["hardware=a100-80gb-x4", "hardware.count=3"], "hardware.count=3 is not a GPU count"),
    (["hardware.device=tpu"], "hardware.device='tpu'"),
    (["measure.timed_steps=0"], "measure.timed_steps=0 must be > 0"),
    (["debug.fault=explode"], "debug.fault='explode'"),
]


@pytest.mark.parametrize("overrides,expected", RULES, ids=[r[1][:40] for r in RULES])
def test_each_rule_rejects_its_bad_input_naming_the_value(overrides, expected):
    found = problems(make_trial(TINY + overrides))
    assert any(expected in p for p in found), found


def test_all_problems_are_reported_at_once():
    found = problems(make_trial(TINY + ["methods.zero_stage=7", "methods.micro_batch=3", "methods.offload=x"]))
    assert len(found) == 3, found


def test_flash_attention_on_cpu_is_unsupported_not_invalid():
    t = make_trial(TINY + ["methods.attention=flash_attention_2", "methods.precision=bf16"])
    assert problems(t) == []
    assert "unavailable on CPU" in unsupported(t)


def test_cli_exits_2_listing_every_problem_without_traceback(tmp_path):
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "cli.bench",
            *TINY,
            "methods.zero_stage=9",
            "methods.offload=disk",
            "hardware.count=0",  # once a ZeroDivisionError traceback
            f"store.dir={tmp_path}",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ),
    )
    assert out.returncode == 2
    assert "methods.zero_stage=9" in out.stderr and "methods.offload='disk'" in out.stderr
    assert "hardware.count=0 must be > 0" in out.stderr
    assert "3 problems" in out.stderr
    assert "Traceback" not in out.stderr + out.stdout
    assert not list(tmp_path.glob("*.json"))  # nothing launched, nothing stored


def test_cli_unknown_key_or_wrong_type_fails_at_composition(tmp_path):
    for bad in ("methods.zero_stag=1", "methods.micro_batch=two"):
        out = subprocess.run(
            [sys.executable, "-m", "cli.bench", bad, f"store.dir={tmp_path}"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert out.returncode != 0
        assert bad.split("=")[0].split(".")[-1] in out.stderr
        assert "Traceback" not in out.stderr


def test_trial_id_is_stable_and_ignores_how_it_is_run():
    a = make_trial(TINY)
    assert a.id == make_trial(TINY).id
    assert a.id == make_trial(TINY + ["measure.rerun=true", "measure.timeout_s=5"]).id
    assert a.id != make_trial(TINY + ["methods.zero_stage=1"]).id


# Trial ids as the suite computed them before conf/hardware held one file per GPU type (each
# `<gpu>-x<n>` a file of its own): the store keys records by them, so they must not move.
PINNED_IDS = {
    "96e5b5c1d9216acd": [],
    "53da86bdf274b303": ["model=pythia-1b", "hardware=a6000-x4", "methods.zero_stage=1", "methods.micro_batch=16"],
    "93f0f153952aaacb": ["model=pythia-160m", "hardware=h100-sxm-x8", "methods.engine=fsdp2", "methods.recompute=full"],
    "be3c1b4c6ee64efc": [
        "model=tinyllama-1.1b", "hardware=a100-80gb-x8", "cluster.nodes=2", "methods.zero_stage=3",
        "methods.offload=optimizer+params",
    ],
    "b2bb6d450faafbcb": ["model=roberta-cpu", "hardware=cpu-x2-1gb"],
    "96cacda3d3a39277": ["model=mamba-cpu", "hardware=cpu-x1"],
}  # fmt: skip


@pytest.mark.parametrize("trial_id", PINNED_IDS)
def test_trial_ids_do_not_move(trial_id):
    overrides = PINNED_IDS[trial_id]
    assert make_trial(overrides).id == trial_id
    new_form = [o.replace("-x", " hardware.count=").split() if o.startswith("hardware=") else [o] for o in overrides]
    new_form = [x for o in new_form for x in o]
    if any("hardware.count=" in o for o in new_form) and "cpu-x2-1gb" not in " ".join(overrides):
        assert make_trial(new_form).id == trial_id  # hardware=<gpu> hardware.count=N is the same trial


def test_a_wheel_carries_every_config_group():
    """conf/ travels inside the package of a wheel (pyproject.toml maps it to suite/conf); each of
    its folders must be listed there, or a non-editable install would lack that group."""
    text = (paths.CHECKOUT / "pyproject.toml").read_text()
    folders = {p.parent.relative_to(CONF) for p in shipped("conf/*.yaml")}
    listed = {f"suite.conf.{'.'.join(f.parts)}" if f.parts else "suite.conf" for f in folders}
    assert all(f'"{pkg}"' in text for pkg in listed), sorted(p for p in listed if f'"{p}"' not in text)


def test_tf32_is_a_setting_in_the_id_only_where_it_runs():
    """TF32 off by default (PyTorch's default for matmuls); on where the GPU has TF32, it is in the
    trial id, the label and the peak MFU counts against; on a GPU or CPU without TF32 it changes
    nothing and is no part of the id."""
    from suite.labels import config_label, describe
    from suite.metrics import peak_flops

    fp32 = ["model=pythia-14m", "model.recipe.precision=fp32"]
    off, on = (make_trial([*fp32, "hardware=a100-80gb", f"methods.tf32={v}"]) for v in ("false", "true"))
    assert not off.tf32 and on.tf32 and off.id != on.id
    assert off.id == make_trial([*fp32, "hardware=a100-80gb"]).id  # the default: ids predate the setting
    assert peak_flops(off) == 19.5e12 and peak_flops(on) == 156e12
    assert "fp32 tf32" in config_label(on, on.gas) and "fp32 tf32" in describe(on) and "tf32" not in describe(off)
    for hw in ("v100", "cpu"):  # no TF32: the same trial either way
        a, b = (make_trial([*fp32, f"hardware={hw}", f"methods.tf32={v}"]) for v in ("false", "true"))
        assert not b.tf32 and a.id == b.id
    assert make_trial(["model=pythia-14m", "hardware=a100-80gb", "+lunch=on"]).methods.tf32
