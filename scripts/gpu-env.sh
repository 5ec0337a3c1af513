# Sourced by scripts/gpu-check.sh and scripts/gpu-grid.sh from the checkout's root, with NAME (the
# script's name, for its messages), VERB (what it would do: check, run) and DRY (1: a dry run, which
# needs no GPU) set. It picks the Python (PYTHON, else .venv/bin/python, else python3); exits 3 when
# that Python sees no CUDA GPU (not for a dry run); installs each package scripts/gpu-wheels.txt lists
# that is absent or at another version, by name from .whl/ (made by scripts/gpu-wheels.sh where pip
# reaches PyPI), into a folder of its own (GPU_CHECK_SITE, default /tmp/gpu-check-site), or exits 2
# naming the absent ones when there is no .whl/; and exports the environment the suite's trials run
# in from this checkout (PYTHONPATH).
if [ -z "${PYTHON:-}" ]; then
  PYTHON=python3
  [ -x .venv/bin/python ] && PYTHON=.venv/bin/python
fi
if [ "$DRY" = 0 ] && ! "$PYTHON" -c "import sys, torch; sys.exit(not torch.cuda.is_available())" 2>/dev/null; then
  echo "$NAME: no CUDA GPU usable by $PYTHON (torch.cuda.is_available() is not True): nothing to $VERB" >&2
  exit 3
fi
# Each listed distribution that is absent here or at another version: "name==version absent|other".
wanted=$("$PYTHON" - <<'PY'
import importlib.metadata as md
for line in open("scripts/gpu-wheels.txt"):
    req = line.split("#")[0].strip()
    if req:
        name, version = req.split("==")
        try:
            have = md.version(name)
        except md.PackageNotFoundError:
            print(req, "absent")
            continue
        if have != version:
            print(req, "other")
PY
)
if [ -n "$wanted" ]; then
  if ! ls .whl/*.whl >/dev/null 2>&1; then
    absent=$(echo "$wanted" | awk '$2 == "absent" {print $1}' | tr '\n' ' ')
    if [ -n "$absent" ]; then
      echo "$NAME: missing $absent and no .whl/ to install them from: run scripts/gpu-wheels.sh" >&2
      echo "  where pip reaches a registry and carry .whl/ along (or pip install -e . here)" >&2
      exit 2
    fi
  else
    site=${GPU_CHECK_SITE:-/tmp/gpu-check-site}
    names=$(echo "$wanted" | awk '{print $1}' | tr '\n' ' ')
    echo "$NAME: installing $names from .whl/ into $site"
    # shellcheck disable=SC2086
    "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --find-links .whl --target "$site" $names
    export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
  fi
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 WANDB_MODE=disabled
export DS_ACCELERATOR=cuda
