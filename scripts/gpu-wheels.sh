#!/usr/bin/env bash
# Prepare the wheels scripts/gpu-check.sh installs on a GPU machine that reaches no package registry:
# every one scripts/gpu-wheels.txt lists (what the check imports that such a machine lacks), for
# CPython 3.12 on manylinux x86-64, in .whl/. Run it here, where pip reaches PyPI, with a Python
# that has torch (DeepSpeed's build imports it).
#   bash scripts/gpu-wheels.sh     # then carry .whl/ to the GPU machine and run scripts/gpu-check.sh there
# .whl/ is ignored by git (.gitignore): it does not travel with a commit or a push. Copy it along
# with the working tree, or name it in what carries the tree to the GPU machine.
# Each wheel installs by name from the folder, e.g.
#   pip install --no-index --no-deps --find-links .whl --target /tmp/site deepspeed==0.19.8
# Those with no wheel on PyPI are built here: DeepSpeed's source builds a pure-Python wheel when no
# op is prebuilt (its ops compile on the GPU at first use), and Hydra's parser runtime is pure Python.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
rm -rf .whl
mkdir .whl
platforms=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64; do
  platforms+=(--platform "$p")
done
grep -v '^\s*#' scripts/gpu-wheels.txt | grep -v '^\s*$' | while read -r req; do
  if ! "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
      "${platforms[@]}" -d .whl "$req" 2>/dev/null; then
    echo "no wheel of $req on the index: building one"
    "$PY" -m pip wheel -q --no-deps --no-build-isolation -w .whl "$req"
  fi
done
ls -l .whl
du -sh .whl
