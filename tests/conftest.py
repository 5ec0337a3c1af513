"""Shared test helpers: compose a trial from the real conf/ with Hydra's compose API."""

from __future__ import annotations

import os

import pytest

from suite.config import Trial
from suite.config.compose import compose, trial

# How a CPU test trial is run: two CPU workers, few steps.
CPU_RUN = [
    "hardware=cpu-x2",
    "methods.micro_batch=2",
    "measure.warmup_steps=1",
    "measure.timed_steps=3",
    "measure.max_micro_steps=2",
    "measure.timeout_s=180",
]
# Pythia-14M's recipe shrunk to CPU size, on two CPU workers.
CPU_RECIPE = [
    "model=pythia-14m",
    "model.recipe.seq_len=64",
    "model.recipe.global_batch=8",
    "model.recipe.precision=fp32",
    *CPU_RUN,
]
# A smaller Pythia (GPT-NeoX) for real multi-process trials: seconds each on 2 CPU cores.
TINY = CPU_RECIPE + [
    "model.config.hidden_size=64",
    "model.config.num_hidden_layers=2",
    "model.config.num_attention_heads=4",
    "model.config.intermediate_size=256",
    "model.config.vocab_size=1024",
]
# The CPU-sized member of each task and architecture, at test size (batch 8; 64 tokens or 32x32 images).
TINY_MEMBERS = {
    "causal-lm": TINY,
    "masked-lm": ["model=roberta-cpu", "model.recipe.seq_len=64", "model.recipe.global_batch=8", *CPU_RUN],
    "image-classification": ["model=vit-cpu", "model.recipe.global_batch=8", *CPU_RUN],
    "convnext": ["model=convnext-cpu", "model.recipe.global_batch=8", *CPU_RUN],
    "mamba": ["model=mamba-cpu", "model.recipe.seq_len=64", "model.recipe.global_batch=8", *CPU_RUN],
}


def single_rank_env(**extra: str) -> dict[str, str]:
    """The environment of a one-process DeepSpeed job on the CPU, on a free port."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    rank = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    return os.environ | {"DS_ACCELERATOR": "cpu", **rank, **extra}


def pytest_collection_modifyitems(config, items):
    """Tests marked `gpu` skip where torch sees no CUDA GPU (`pytest -m gpu` runs them on one)."""
    gpu = [item for item in items if item.get_closest_marker("gpu")]
    if gpu:
        import torch

        if not torch.cuda.is_available():
            for item in gpu:
                item.add_marker(pytest.mark.skip(reason="needs a CUDA GPU"))


@pytest.fixture(autouse=True, scope="session")
def calibration_dir(tmp_path_factory):
    """Calibrations a test makes (a CPU search measures this machine's constants first) go to
    one folder of the session, never the repository's results/; subprocesses inherit it."""
    os.environ["SUITE_CALIBRATION_DIR"] = str(tmp_path_factory.getbasetemp() / "calibration")
    return os.environ["SUITE_CALIBRATION_DIR"]


def compose_cfg(overrides: list[str]):
    return compose(overrides)


def make_trial(overrides: list[str]) -> Trial:
    return trial(overrides)


@pytest.fixture
def tiny():
    return lambda *extra: make_trial(TINY + list(extra))
