"""The winner of a (model, budget), ready to launch the real pretraining run.

A DeepSpeed winner exports its DeepSpeed JSON, `suite.methods.deepspeed_config` at the recipe's
full gradient accumulation (the trial measured at most `measure.max_micro_steps`); an FSDP2
winner its `fsdp_config` (`suite.methods.fsdp_config`: FSDP version 2, the block class to wrap,
reshard_after_forward, activation checkpointing). The Hugging Face `TrainingArguments` say the
same thing in the Trainer's terms (for DeepSpeed the Trainer checks that the two agree), and the
launch command runs a Trainer script with them under `torchrun`.
The model's architecture goes along as a `transformers` config, so the run starts from
the same random-init model that was measured.
"""

from __future__ import annotations

import dataclasses
import json
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from analysis import ReportError
from analysis.tables import best_per_budget, interval
from suite import methods
from suite.config import Trial
from suite.models.arch import arch, attention
from suite.models.config import hf_config
from suite.record import interval_phrase

DS_CONFIG, FSDP_CONFIG = "ds_config.json", "fsdp_config.json"
TRAINING_ARGS, LAUNCH, MODEL_DIR = "training_args.json", "launch.sh", "model"
# Hugging Face's example Trainer scripts (transformers/examples/pytorch/) for each task.
SCRIPTS = {
    "causal-lm": "run_clm.py",
    "masked-lm": "run_mlm.py",
    "image-classification": "run_image_classification.py",
}


def _flag(value: Any) -> str:
    if isinstance(value, dict):
        return json.dumps(value, separators=(",", ":"))
    return str(value)


@dataclass(frozen=True)
class Winner:
    row: pd.Series
    """The measured trial's row, with its estimates."""
    trial: Trial
    ds_config: dict[str, Any] | None
    """The DeepSpeed JSON (engine deepspeed), else None."""
    fsdp_config: dict[str, Any] | None
    """TrainingArguments' fsdp_config (engine fsdp2), else None."""
    training_args: dict[str, Any]
    script: str
    """The Trainer script the launch command runs."""

    @property
    def engine_file(self) -> tuple[str, str, dict[str, Any]]:
        """The engine's settings file: what it is, its name and its content."""
        if self.ds_config is not None:
            return "DeepSpeed config", DS_CONFIG, self.ds_config
        return "FSDP config (TrainingArguments' fsdp_config)", FSDP_CONFIG, self.fsdp_config

    @property
    def launch_env(self) -> dict[str, str]:
        cpu_deepspeed = self.trial.hardware.device == "cpu" and self.trial.methods.engine == "deepspeed"
        return {"DS_ACCELERATOR": "cpu"} if cpu_deepspeed else {}

    @property
    def launcher(self) -> list[str]:
        """torchrun with one process per device of the budget, then the script (shell words, unquoted)."""
        per_node = f"--nproc_per_node={self.trial.hardware.count}"
        if self.trial.nodes == 1:
            return ["torchrun", "--standalone", per_node, self.script]
        # Run on every node, with MASTER_ADDR set to node 0's address.
        rdzv = '--rdzv_endpoint="${MASTER_ADDR:?set MASTER_ADDR to the first node}:29500"'
        return ["torchrun", f"--nnodes={self.trial.nodes}", per_node, "--rdzv_backend=c10d", rdzv, self.script]

    @property
    def flags(self) -> list[tuple[str, ...]]:
        """The script's arguments: the model config, then the TrainingArguments. `fsdp` is a bare
        flag: the Trainer reads a value given to it as a legacy option string (training_args.py,
        `_apply_legacy_fsdp_to_config`), and "True" is not one."""
        flags: list[tuple[str, ...]] = [("--config_name", MODEL_DIR)]
        for k, v in self.training_args.items():
            flags.append(("--fsdp",) if k == "fsdp" else (f"--{k}", _flag(v)))
        return flags

    @property
    def launch_command(self) -> str:
        flags = [shlex.join(pair) for pair in self.flags]
        return " ".join([f"{k}={v}" for k, v in self.launch_env.items()] + self.launcher + flags)


def _checkpointing_arg() -> str:
    """The installed TrainingArguments' name for activation recomputation (renamed in transformers 5)."""
    from transformers import TrainingArguments

    names = {f.name for f in dataclasses.fields(TrainingArguments)}
    return "activation_checkpointing" if "activation_checkpointing" in names else "gradient_checkpointing"


def training_arguments(t: Trial) -> dict[str, Any]:
    """`transformers.TrainingArguments` keyword arguments equivalent to the trial at the full recipe.

    Under DeepSpeed its JSON names the optimizer; under FSDP2 `optim` does, and activation
    checkpointing is FSDP's own (fsdp_config), as the Trainer advises (training_args.py,
    `_process_fsdp_args`: the Trainer's flag would all-gather again in backward)."""
    r, me, hw = t.model.recipe, t.methods, t.hardware
    args: dict[str, Any] = {
        "output_dir": "checkpoints",
        "max_steps": r.train_steps,
        "per_device_train_batch_size": me.micro_batch,
        "gradient_accumulation_steps": t.gas,
        "learning_rate": r.lr,
        "adam_beta1": r.betas[0],
        "adam_beta2": r.betas[1],
        "weight_decay": r.weight_decay,
        "max_grad_norm": r.grad_clip,
        "bf16": t.precision == "bf16",
        "fp16": t.precision == "fp16",
        "torch_compile": me.compile,
    }
    if me.engine == "fsdp2":
        args.update(fsdp=True, fsdp_config=FSDP_CONFIG, optim="adamw_torch_fused")
    else:
        args["deepspeed"] = DS_CONFIG
    if me.recompute == "full" and me.engine == "deepspeed":
        name = _checkpointing_arg()
        args[name] = True
        args[f"{name}_kwargs"] = {"use_reentrant": False}
    if hw.device == "cuda":
        args["tf32"] = t.tf32
    else:
        args["use_cpu"] = True
    return args


def _selector(model: str, hardware: str, nodes: int) -> str:
    return f"model={model} hardware={hardware}" + (f" nodes={nodes}" if nodes != 1 else "")


def _available(best: pd.DataFrame) -> str:
    found = sorted({_selector(*key) for key in zip(best["model"], best["hardware"], best["n_nodes"], strict=True)})
    return "\n  ".join(found) if found else "(no trial ran ok)"


def find_winner(
    df: pd.DataFrame, model: str | None, hardware: str | None, nodes: int = 1, trial_id: str | None = None
) -> pd.Series:
    """The fastest `ok` row of (model, hardware on `nodes` nodes), or the `ok` row of `trial_id`."""
    if trial_id:
        hit = df[(df["trial_id"] == trial_id) & (df["outcome"] == "ok")]
        if hit.empty:
            raise ReportError(f"no trial {trial_id} that ran ok in these results")
        return hit.iloc[0]
    best = best_per_budget(df)
    hit = best[(best["model"] == model) & (best["hardware"] == hardware) & (best["n_nodes"] == nodes)]
    asked = _selector(model, hardware, nodes)
    if hit.empty:
        raise ReportError(f"no configuration of {asked} ran ok in these results; available:\n  {_available(best)}")
    if len(hit) > 1:
        choices = "\n  ".join(f"trial={r.trial_id}  ({r.recipe})" for r in hit.itertuples())
        raise ReportError(f"{asked} was measured with {len(hit)} recipes; choose one:\n  {choices}")
    return hit.iloc[0]


def export_winner(
    df: pd.DataFrame,
    model: str | None,
    hardware: str | None,
    nodes: int = 1,
    trial_id: str | None = None,
    script: str | None = None,
) -> Winner:
    """The winner of (model, hardware, nodes), or the trial `trial_id`, as DeepSpeed, Trainer and launch settings."""
    row = find_winner(df, model, hardware, nodes, trial_id)
    t = Trial.from_json(row["trial"])
    untranslatable = [
        what
        for what, on in (
            ("selective recomputation", t.methods.recompute == "selective"),
            ("FSDP2's reduce-scatter at every micro-step", t.methods.reduce_every_micro_step),
        )
        if on
    ]
    if untranslatable:
        raise ReportError(
            f"trial {row['trial_id']} uses {' and '.join(untranslatable)}, which Hugging Face's Trainer has no "
            "setting for; export a trial without it (trial=ID)"
        )
    if t.methods.recompute != "none" and not arch(t.model).gradient_checkpointing:
        raise ReportError(
            f"trial {row['trial_id']} recomputes every block, which the Trainer cannot do for "
            f"{arch(t.model).model_class} (transformers marks it as not supporting gradient "
            "checkpointing); export a trial without recomputation (trial=ID)"
        )
    script = script or SCRIPTS[t.model.task]
    if t.methods.engine == "fsdp2":
        fsdp = methods.fsdp_config(t, _block_class_name(t))
        return Winner(row, t, None, fsdp, training_arguments(t), script)
    return Winner(row, t, methods.deepspeed_config(t, t.gas), None, training_arguments(t), script)


def _block_class_name(t: Trial) -> str:
    """The class FSDP wraps, one unit per instance: the model's block (built on the meta device)."""
    import torch

    from suite.models.build import build  # deferred: imports torch, like this function
    from suite.models.recompute import block_class

    with torch.device("meta"):
        model = build(t.model, attention(t), "none")
    return block_class(model).__name__


def measured(r: pd.Series) -> str:
    """What was measured for a winner's row: median step, its interval and runs, days; and its ties."""
    step = f"step {r['step_time_s']:.3f} s ({interval_phrase(interval(r))}) -> {r['days']:,.2f} days"
    if r["runs"] > 1:
        step += f" ({r['days_lo']:,.2f}-{r['days_hi']:,.2f})"
    tied = r.get("tied_configs")
    return step + (f"; tied with {r['n_tied']} (intervals overlap): {tied}" if isinstance(tied, str) and tied else "")


def _script_text(w: Winner) -> str:
    r, t = w.row, w.trial
    lines = [
        "#!/usr/bin/env bash",
        f"# {t.model.name} on {r['budget']}: {r['config']}",
        f"# measured: {measured(r)}",
        f"# trial {r['trial_id']} ({r['file']})",
        f"# {w.script} is a Hugging Face Trainer script (transformers/examples/pytorch/); put its data",
        "# arguments after this script's name: bash launch.sh --dataset_name ... --tokenizer_name ...",
        f"# Build the model with attn_implementation={attention(t)!r}, as measured."
        if attention(t) != "none"
        else "# The model has no attention implementation to choose.",
        "# The recipe record holds no learning-rate schedule: add the original run's (--lr_scheduler_type, warm-up).",
    ]
    if r.get("kernel_path"):
        lines.append(f"# Measured with kernels {r['kernel_path']}: install the same packages for the same speed.")
    lines += [
        "set -euo pipefail",
        'cd "$(dirname "$0")"',
    ]
    head = " ".join([f"{k}={v}" for k, v in w.launch_env.items()] + w.launcher)
    pairs = [f"  {shlex.join(pair)}" for pair in w.flags]
    return "\n".join(lines + [" \\\n".join([head] + pairs + ['  "$@"'])]) + "\n"


def write_export(w: Winner, out_dir: str | Path) -> list[Path]:
    """ds_config.json or fsdp_config.json, training_args.json, launch.sh and model/config.json in `out_dir`."""
    d = Path(out_dir)
    d.mkdir(parents=True, exist_ok=True)
    _, name, settings = w.engine_file
    files = {
        d / name: json.dumps(settings, indent=2) + "\n",
        d / TRAINING_ARGS: json.dumps(w.training_args, indent=2) + "\n",
        d / LAUNCH: _script_text(w),
    }
    for p, text in files.items():
        p.write_text(text)
    (d / LAUNCH).chmod(0o755)
    hf_config(w.trial.model).save_pretrained(d / MODEL_DIR)
    return list(files) + [d / MODEL_DIR / "config.json"]
