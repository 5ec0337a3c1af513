"""Every architecture through one generic path: tasks, validation, FLOPs, kernels, own configs.

Real 2-process trials (marked slow) run the CPU-sized member of each task and of Mamba and
ConvNeXt under ZeRO-3, and a user's own config.json of an architecture the suite does not
ship; everything else builds nothing or builds tiny models in this process.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import textwrap
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from conftest import CPU_RUN, FACTS, MEMBERS, TINY, TINY_MEMBERS, make_trial, shipped
from torch.utils.flop_counter import FlopCounterMode

from analysis.load import recipe_label, row
from suite import launch, methods, paths
from suite.config.validate import problems
from suite.labels import describe
from suite.models.arch import attention, shape
from suite.models.build import batch, build
from suite.models.flops import _count, count_flops, flop_counter
from suite.models.kernels import kernel_path
from suite.runner import run_one, summary_line

ROOT = paths.CHECKOUT
# A tiny Qwen2-shaped config.json as a researcher brings it (the suite ships no Qwen2),
# with the metadata keys transformers writes.
QWEN2 = {
    "architectures": ["Qwen2ForCausalLM"],
    "model_type": "qwen2",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 1024,
    "max_position_embeddings": 256,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.45.0",
}


def run_cli(*args: str, timeout: int = 300, path: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    """`python ARGS` with this tree (and `path`) importable, as a user's shell runs it."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([*path, str(ROOT)]))
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=env)


# --- one path for every task -------------------------------------------------------------


@pytest.mark.parametrize("member", sorted(TINY_MEMBERS))
def test_each_member_builds_and_its_batch_trains_on_cpu(member):
    t = make_trial(TINY_MEMBERS[member])
    assert problems(t) == []
    torch.manual_seed(0)
    model = build(t.model, t.methods.attention, "none")
    inputs = batch(t.model, 2, torch.Generator().manual_seed(0), "cpu")
    loss = model(**inputs).loss
    loss.backward()
    assert math.isfinite(loss.item())
    if t.unit == "image":
        assert inputs["pixel_values"].shape == (2, 3, 32, 32) and t.tokens_per_sample == 1
    else:
        assert inputs["input_ids"].shape == (2, 64) and t.tokens_per_sample == 64
    if t.model.task == "masked-lm":
        assert 0 < (inputs["labels"] != -100).sum() < inputs["labels"].numel()


def test_attention_free_models_run_none_and_refuse_a_method_that_means_nothing_there():
    """Mamba and ConvNeXt run `none` at the default attention or at `none`; an attention kernel or
    selective recomputation asked of them is refused, naming why, rather than run as another
    trial's run under a second id."""
    for member in ("mamba", "convnext"):
        for asked in ("sdpa", "none"):
            t = make_trial(TINY_MEMBERS[member] + [f"methods.attention={asked}", "methods.precision=bf16"])
            assert attention(t) == "none" and problems(t) == [], (member, asked)
            assert "attn=none" in describe(t)
        for asked in ("eager", "flash_attention_2"):
            found = problems(make_trial(TINY_MEMBERS[member] + [f"methods.attention={asked}"]))
            assert len(found) == 1 and f"methods.attention={asked} means nothing for" in found[0], found
            assert "it has no attention" in found[0]
        found = problems(make_trial(TINY_MEMBERS[member] + ["methods.recompute=selective"]))
        assert len(found) == 1 and "has no attention: choose none or full" in found[0], found
        assert problems(make_trial(TINY_MEMBERS[member] + ["methods.recompute=full"])) == []
    t = make_trial(["model=mamba-2.8b", "hardware=h100-sxm-x4"])  # the default sdpa, on a GPU budget
    assert problems(t) == [] and attention(t) == "none"
    assert attention(make_trial(TINY_MEMBERS["image-classification"])) == "sdpa"  # ViT has attention


def test_recipe_precision_on_cpu_is_fp32_and_the_first_command_is_valid():
    t = make_trial(["model=pythia-14m", "hardware=cpu-x2"])  # `suite-bench model=pythia-14m hardware=cpu-x2`
    assert t.model.recipe.precision == "fp16"
    assert problems(t) == []
    assert t.precision == "fp32"
    assert "fp32 (recipe fp16; CPU trains fp32)" in describe(t)
    assert make_trial(["model=pythia-14m", "hardware=a100-80gb-x4"]).precision == "fp16"


def test_shape_facts_come_from_the_config_by_common_names():
    gpt2 = shape(make_trial(["model=gpt2-124m"]).model)
    assert (gpt2.hidden, gpt2.layers, gpt2.heads, gpt2.vocab, gpt2.max_positions) == (768, 12, 12, 50304, 1024)
    convnext = make_trial(["model=convnext-xlarge", "hardware=a100-80gb-x8"])
    s = shape(convnext.model)
    assert (s.hidden, s.layers, s.heads, s.patch_size, s.num_labels) == (2048, 36, 0, 4, 21841)
    assert methods.bucket_elements(convnext) == 2048 * 2048
    mamba = shape(make_trial(["model=mamba-2.8b"]).model)
    assert (mamba.hidden, mamba.layers, mamba.vocab, mamba.max_positions) == (2560, 64, 50280, 0)


def test_image_throughput_counts_images_and_says_so():
    t = make_trial(["model=convnext-xlarge", "hardware=a100-80gb-x8"])
    assert t.unit == "image" and t.tokens_per_sample == 1
    assert recipe_label(t) == "batch 4096 images of 224x224, 311,940 steps, fp32"


# --- validation that knows the architecture -----------------------------------------------

ARCH_RULES = [
    (["model=mamba-cpu", "model.task=masked-lm"], "model_type 'mamba' has no masked-lm model"),
    (["model=vit-cpu", "model.recipe.image_size=30"], "image_size=30 is not a multiple of the patch size 8"),
    (["model=vit-cpu", "model.recipe.image_size=0"], "model.recipe.image_size=0 must be > 0"),
    (["model=convnext-cpu", "model.config.depths=[1,0,2,1]"], "model.config.depths=[1, 0, 2, 1] must hold integers"),
    (["model=roberta-cpu", "model.recipe.seq_len=256"], "seq_len=256 exceeds the model's positions"),
    (["model=vit-cpu", "model.config.num_labels=0"], "model.config.num_labels=0 must be > 0"),
    (["model=mamba-cpu", "model.config.vocab_size=0"], "model.config.vocab_size=0 must be > 0"),
]


@pytest.mark.parametrize("overrides,expected", ARCH_RULES, ids=[r[1][:40] for r in ARCH_RULES])
def test_each_architecture_rule_names_its_value(overrides, expected):
    found = problems(make_trial(CPU_RUN + overrides))
    assert any(expected in p for p in found), found


def test_an_unshipped_architecture_is_validated_by_its_own_class():
    """GPT-1 (openai-gpt): attention with eager only, and no blocks named for recomputation."""
    t = make_trial(TINY)
    gpt1 = replace(t.model, model_type="openai-gpt", config={"n_embd": 64, "n_layer": 2, "n_head": 4, "vocab_size": 64})
    found = problems(replace(t, model=gpt1, methods=replace(t.methods, recompute="full")))
    assert "methods.recompute=full needs repeated blocks; OpenAIGPTLMHeadModel names none (_no_split_modules)" in found
    assert "methods.attention=sdpa is not supported by OpenAIGPTLMHeadModel; choose one of eager" in found
    assert problems(replace(t, model=gpt1, methods=replace(t.methods, attention="eager"))) == []


def test_problems_of_model_and_methods_are_listed_together():
    found = problems(make_trial(TINY + ["+model.config.hiden_size=8", "methods.zero_stage=7", "hardware.count=0"]))
    assert len(found) == 3, found


@pytest.mark.parametrize(
    "field", ["hardware.count", "methods.micro_batch", "cluster.nodes", "model.recipe.global_batch", "measure.seed"]
)
def test_degenerate_values_are_problems_not_tracebacks(field):
    for value in (0, -1):
        if field == "measure.seed" and value == 0:
            continue
        t = make_trial(TINY + [f"{field}={value}"])
        describe(t)  # shown before validation: must not raise
        assert any(field in p for p in problems(t)), (field, value)


# --- a user's own architecture: config.json or YAML ----------------------------------------


def test_a_local_config_json_is_inlined_and_a_hub_id_is_never_fetched(tmp_path):
    folder = tmp_path / "my-qwen"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(QWEN2))
    t = make_trial(["model=hf", f"model.hf_config={folder}", "model.task=causal-lm"])
    assert t.model.name == "my-qwen" and t.model.model_type == "qwen2" and t.model.hf_config == ""
    assert t.model.config["num_key_value_heads"] == 2 and "torch_dtype" not in t.model.config
    assert str(folder) in t.model.source
    over = make_trial(
        ["model=hf", f"model.hf_config={folder}", "model.task=causal-lm", "+model.config.num_hidden_layers=3"]
    )
    assert over.model.config["num_hidden_layers"] == 3 and over.id != t.id  # YAML fields win over the file
    hub = make_trial(["model=hf", "model.hf_config=Qwen/Qwen2-0.5B", "model.task=causal-lm"])
    assert any("never from the Hugging Face Hub" in p for p in problems(hub))


def test_no_suite_process_can_reach_the_hub():
    """suite/__init__.py turns the Hub off before transformers is imported, here and in workers."""
    import transformers
    from huggingface_hub import constants

    assert constants.HF_HUB_OFFLINE
    with pytest.raises(OSError, match="(?i)offline"):
        transformers.AutoConfig.from_pretrained("state-spaces/mamba-130m-hf")
    env = launch.worker_env(make_trial(TINY), 0, 12345)
    assert env["HF_HUB_OFFLINE"] == "1" and env["USE_HUB_KERNELS"] == "0"


def test_own_yaml_through_config_dir_composes(tmp_path):
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "my-llama.yaml").write_text(
        textwrap.dedent(
            """
            name: my-llama
            task: causal-lm
            model_type: llama
            config: {hidden_size: 64, num_hidden_layers: 2, num_attention_heads: 4, num_key_value_heads: 2,
                     intermediate_size: 128, vocab_size: 1024, max_position_embeddings: 256}
            recipe: {global_batch: 8, seq_len: 64, train_steps: 1000, precision: bf16, lr: 3.0e-4}
            """
        )
    )
    out = run_cli("-m", "cli.bench", "--config-dir", str(tmp_path), "model=my-llama", "--cfg", "job")
    assert out.returncode == 0, out.stderr[-2000:]
    assert "model_type: llama" in out.stdout and "num_key_value_heads: 2" in out.stdout


# --- FLOPs and kernels ----------------------------------------------------------------------


def test_grouped_convolution_backward_costs_twice_its_forward():
    """torch's formula counts a depthwise convolution's weight gradient `channels` times over."""
    conv = torch.nn.Conv2d(8, 8, 7, groups=8, padding=3, device="meta")
    x = torch.randn(2, 8, 14, 14, device="meta", requires_grad=True)
    with FlopCounterMode(display=False) as fwd:
        y = conv(x)
    with flop_counter() as bwd:
        y.sum().backward()
    assert bwd.get_total_flops() == 2 * fwd.get_total_flops()


def test_convnext_and_mamba_flops_match_their_papers():
    # ConvNeXt-XL at 224x224: Liu et al. 2022 give 60.9G FLOPs, a multiply-add counted as one,
    # so 3 x 2 x 60.9e9 with the backward. Mamba: 6 FLOPs per parameter and token (no attention).
    convnext = make_trial(["model=convnext-xlarge", "hardware=a100-80gb-x8"]).model
    flops, _ = count_flops(convnext, "sdpa", "none")
    assert flops == pytest.approx(6 * 60.9e9, rel=0.01)
    mamba = make_trial(["model=mamba-2.8b", "model.recipe.seq_len=512", "model.config.num_hidden_layers=4"]).model
    flops, n_params = count_flops(mamba, "sdpa", "none")
    assert flops / 512 == pytest.approx(6 * n_params, rel=0.01)


def test_extrapolated_flops_equal_a_full_count():
    t = make_trial(TINY_MEMBERS["mamba"] + ["model.recipe.seq_len=40"])
    with torch.device("meta"):
        model = build(t.model, "none", "full")
    assert count_flops(t.model, "sdpa", "full")[0] == _count(model, t.model, 1)


def test_kernel_path_without_the_packages_is_slow():
    mamba = build(make_trial(TINY_MEMBERS["mamba"]).model, "none", "none")
    assert kernel_path(mamba) == "slow (PyTorch reference; causal-conv1d, mamba-ssm not installed)"
    assert kernel_path(build(make_trial(TINY).model, "sdpa", "none")) is None


FUSED = "(*args, **kwargs):\n    raise RuntimeError('a fused kernel ran')\n"
FAKE_KERNELS = {
    "mamba_ssm/__init__.py": "",
    "mamba_ssm/ops/__init__.py": "",
    "mamba_ssm/ops/selective_scan_interface.py": f"def mamba_inner_fn{FUSED}def selective_scan_fn{FUSED}",
    "mamba_ssm/ops/triton/__init__.py": "",
    "mamba_ssm/ops/triton/selective_state_update.py": f"def selective_state_update{FUSED}",
    "causal_conv1d/__init__.py": f"def causal_conv1d_fn{FUSED}def causal_conv1d_update{FUSED}",
}


@pytest.mark.slow  # seconds of subprocesses: the full tier
def test_installed_fast_kernels_are_reported_and_flops_count_their_reference(tmp_path):
    """With mamba-ssm and causal-conv1d importable (stand-ins here: the real ones need CUDA),
    the trial says "fast", and FLOPs are still counted through the PyTorch reference."""
    for path, text in FAKE_KERNELS.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(text)
    t = make_trial(TINY_MEMBERS["mamba"])
    spec = tmp_path / "model.json"
    spec.write_text(json.dumps(t.to_json()))
    probe = textwrap.dedent(
        f"""
        import json, torch
        from suite.config import Trial
        from suite.models.build import build
        from suite.models.flops import count_flops
        from suite.models.kernels import kernel_path
        t = Trial.from_json(json.load(open({str(spec)!r})))
        with torch.device("meta"):
            model = build(t.model, "none", "none")
        print(kernel_path(model))
        print(count_flops(t.model, "none", "none")[0])
        """
    )
    out = run_cli("-c", probe, path=(str(tmp_path),))
    assert out.returncode == 0, out.stderr[-2000:]
    path, flops = out.stdout.strip().splitlines()[-2:]
    assert path == "fast (causal-conv1d, mamba-ssm)"
    assert float(flops) == count_flops(t.model, "none", "none")[0]


# --- newcomer papercuts ---------------------------------------------------------------------


@pytest.mark.parametrize("module,name", [("cli.bench", "suite-bench"), ("cli.search", "suite-search")])
def test_help_shows_the_suites_usage_groups_and_examples(module, name):
    out = run_cli("-m", module, "--help")
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.startswith(f"`{name}`")
    assert re.search(r"^model: .*mamba-2\.8b", out.stdout, re.M) and f"{name} model=" in out.stdout
    assert "cli is powered by Hydra" not in out.stdout


def test_the_project_cites_papers_not_files_outside_it():
    files = [*shipped("README.md"), *shipped("docs/*.md"), *shipped("conf/*.yaml")]
    files += [*shipped("suite/*.py"), *shipped("analysis/*.py"), *shipped("cli/*.py")]
    cited = [str(f.relative_to(ROOT)) for f in files if re.search(r"seed-paper\.md|shared/", f.read_text())]
    assert cited == []


def test_the_readme_lists_every_shipped_model():
    readme = (ROOT / "README.md").read_text()
    row = next(line for line in readme.splitlines() if line.startswith("| `model=` |"))
    listed = set(re.findall(r"`([a-z0-9.-]+)`", row)) - {"model="}
    assert listed == {p.stem for p in shipped("conf/model/*.yaml")}


# --- real trials: each task's member and both new architectures under ZeRO-3 -------------------


@pytest.fixture(scope="module")
def zero3(trial_store):
    """Each member's ZeRO-3 trial (conftest FACTS), from the session's store, as a Ran: its
    record and how it came."""
    from concurrent.futures import ThreadPoolExecutor

    trials = {member: make_trial(o) for member, o in zip(MEMBERS, FACTS["zero3"], strict=True)}
    with ThreadPoolExecutor(2) as pool:
        ran = pool.map(lambda t: run_one(t, str(trial_store), "test", in_sweep=True), trials.values())
        return {member: (t, r) for (member, t), r in zip(trials.items(), ran, strict=True)}


@pytest.mark.slow
@pytest.mark.parametrize("member", MEMBERS)
def test_each_member_trains_under_zero3_across_two_processes(zero3, member):
    t, ran = zero3[member]
    rec = ran.record
    assert rec.outcome == "ok", rec.message
    m = rec.metrics
    assert m["optimizer_wrapper"] == "DeepSpeedZeroOptimizer_Stage3" and len(m["memory_per_rank"]) == 2
    assert all(math.isfinite(x) for x in m["loss_per_step"])
    assert (m["precision"], m["attention"]) == ("fp32", attention(t))
    assert m["tokens_per_step"] == t.model.recipe.global_batch * t.tokens_per_sample
    flops, _ = count_flops(t.model, t.methods.attention, "none")
    assert m["model_flops_per_token"] == pytest.approx(flops / t.tokens_per_sample)
    expected = "slow (PyTorch reference; causal-conv1d, mamba-ssm not installed)" if member == "mamba" else None
    assert m.get("kernel_path") == expected
    if expected:  # the one-line summary and the tables' configuration label say which path was timed
        assert f"kernels {expected}" in summary_line(ran, t)
        assert expected in row(rec.to_json(), Path("x.json"))["config"]


@pytest.mark.slow
def test_own_config_json_of_an_unshipped_architecture_runs_from_the_cli(tmp_path):
    (tmp_path / "qwen-tiny.json").write_text(json.dumps(QWEN2))
    store = tmp_path / "store"
    out = run_cli(
        "-m",
        "cli.bench",
        "model=hf",
        f"model.hf_config={tmp_path / 'qwen-tiny.json'}",
        "model.task=causal-lm",
        "model.recipe.seq_len=64",
        "model.recipe.global_batch=8",
        *CPU_RUN,
        "hardware=cpu-x1",  # one rank: what is tested is the architecture, not the ranks
        f"store.dir={store}",
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "qwen-tiny cpu-x1" in out.stdout and "fp32 (recipe bf16; CPU trains fp32)" in out.stdout
    (rec,) = [json.loads(p.read_text()) for p in store.glob("*.json")]
    assert rec["outcome"] == "ok", rec["message"]
    model = rec["trial"]["model"]
    assert model["model_type"] == "qwen2" and model["config"]["num_key_value_heads"] == 2
    assert rec["metrics"]["precision"] == "fp32" and rec["metrics"]["attention"] == "sdpa"


def test_architecture_facts_are_kept_on_disk_by_config_and_read_back_equal(tmp_path, monkeypatch):
    """A command reads a model's facts from the cache instead of importing its modeling code; a
    config that differs gets an entry of its own, and an unreadable entry is read again."""
    from suite.models import arch as facts

    monkeypatch.setenv("SUITE_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(facts, "_archs", {})
    m = make_trial(TINY).model
    first = facts.arch(m)
    path = facts._arch_path(m, facts._arch_key(m))
    assert path.parent == tmp_path / "archs" and path.exists()
    monkeypatch.setattr(facts, "_archs", {})  # a new process: memory empty
    monkeypatch.setattr(facts, "_read_arch", lambda m: pytest.fail("read again though cached"))
    assert facts.arch(m) == first
    wider = replace(m, config={**m.config, "num_hidden_layers": m.config.get("num_hidden_layers", 2) + 1})
    assert facts._arch_path(wider, facts._arch_key(wider)) != path
    monkeypatch.undo()
    monkeypatch.setenv("SUITE_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(facts, "_archs", {})
    path.write_text("{not json")
    assert facts.arch(m) == first and facts._load_arch(path) == first  # read again, written again
