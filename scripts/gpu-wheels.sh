#!/usr/bin/env bash
# Prepare the wheels scripts/gpu-check.sh needs on a GPU machine that reaches no package
# registry and has CUDA torch, transformers, numpy, psutil, ninja, py-cpuinfo, msgpack,
# einops, PyYAML, packaging, tqdm, cloudpickle and nvidia-ml-py, but no DeepSpeed, Hydra,
# OmegaConf, submitit, hjson or pydantic. Run it here, where pip reaches PyPI, with a
# Python that has torch (DeepSpeed's build imports it); the wheels are for CPython 3.12 on
# manylinux x86-64, land in .whl/ (ignored by git) and travel with the working tree.
#   bash scripts/gpu-wheels.sh        # then: bash scripts/gpu-check.sh on the GPU machine
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
rm -rf .whl
mkdir .whl
# Binary wheels as PyPI has them, at the versions the suite's tests run with.
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl \
  hydra-core==1.3.8 omegaconf==2.3.1 hydra-submitit-launcher==1.2.0 submitit==1.5.4 hjson==3.1.0 \
  pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 typing-extensions==4.16.0
# Two have no wheel on PyPI. DeepSpeed's source builds a pure-Python wheel when no op is
# prebuilt (its CUDA ops compile on the GPU at first use); Hydra's parser runtime is pure Python.
"$PY" -m pip wheel -q --no-deps --no-build-isolation -w .whl deepspeed==0.19.8
"$PY" -m pip wheel -q --no-deps -w .whl antlr4-python3-runtime==4.9.3
ls -l .whl
du -sh .whl
