#!/usr/bin/env bash
# Create .venv in the checkout (Python >= 3.12) and install tilesweep into it, editable,
# with the test, plot and tokamax extras (tokamax: its kernels are what the tokamax tests test;
# about 400 MB and a minute and a half more). Idempotent: a venv that already has tilesweep is kept
# (its dependencies are re-checked by pip, which is quick when nothing changed).
set -euo pipefail
cd "$(dirname "$0")/.."

find_python() {
  local c v
  for c in "${TILESWEEP_PYTHON:-}" python3.13 python3.12 python3; do
    [ -n "$c" ] || continue
    if command -v "$c" >/dev/null 2>&1 && "$c" -c 'import sys; sys.exit(sys.version_info < (3, 12))' 2>/dev/null; then
      echo "$c"; return 0
    fi
  done
  if command -v pyenv >/dev/null 2>&1; then   # pyenv installs that are not the active version
    for v in "$(pyenv root)"/versions/3.1[2-9]*/bin/python3; do
      [ -x "$v" ] && "$v" -c 'import sys; sys.exit(sys.version_info < (3, 12))' 2>/dev/null && { echo "$v"; return 0; }
    done
  fi
  return 1
}

if [ ! -x .venv/bin/python ] || ! .venv/bin/python -c 'import sys; sys.exit(sys.version_info < (3, 12))' 2>/dev/null; then
  py=$(find_python) || { echo "setup-venv: need Python >= 3.12 (jax >= 0.11 requires it); set TILESWEEP_PYTHON=/path/to/python3.12" >&2; exit 2; }
  echo "setup-venv: creating .venv with $("$py" --version)" >&2
  rm -rf .venv
  "$py" -m venv .venv
fi
stamp=.venv/.tilesweep-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  echo "setup-venv: installing tilesweep and its dependencies into .venv" >&2
  .venv/bin/python -m pip install -q --disable-pip-version-check --upgrade pip >/dev/null
  .venv/bin/python -m pip install -q --disable-pip-version-check -e '.[test,plots,tokamax]'
  touch "$stamp"
fi
# Pre-flight lowering of jax's Mosaic GPU kernels on a CPU (tilesweep plan --lower) needs a CUDA plugin's
# version module; the plugin without its dependencies (22 MB, not the 465 MB PJRT runtime nor the CUDA
# libraries) is enough. Skipped where a CUDA plugin is installed already (pip install '.[cuda]' brings
# the whole one, and installs the runtime over this one too).
if ! .venv/bin/python -c 'import importlib.util as u, sys; sys.exit(not (u.find_spec("jax_cuda12_plugin") or u.find_spec("jax_cuda13_plugin")))'; then
  jaxlib=$(.venv/bin/python -c 'import jaxlib; print(jaxlib.__version__)')
  echo "setup-venv: installing jax-cuda12-plugin==$jaxlib without its dependencies (for lowering on a CPU)" >&2
  .venv/bin/python -m pip install -q --disable-pip-version-check --no-deps "jax-cuda12-plugin==$jaxlib"
fi
# The checkout's modules compiled once: an editable install compiles none, and where
# PYTHONDONTWRITEBYTECODE is set (as in many container images) every process would compile them
# again, about 0.15 s of each command's, task's and worker's start. Fast when already current.
.venv/bin/python -m compileall -q -j 0 orchestrator jobs kernels >/dev/null
