#!/usr/bin/env bash
# The wheels the GPU test machine needs for `bench.gpu_check --passes wall,tokamax` (bench/gpu_tokamax.py
# gives the one prepared call that installs them): that machine has Python 3.12 and jax 0.11.2 but no
# tilesweep dependency beyond numpy, filelock and tqdm, no tokamax, and no package registry. Downloaded
# here (pip, Linux x86-64, Python 3.12, wheels only), each at the version installed in .venv: tilesweep's
# own (pydantic, submitit, orjson) and what importing tokamax's four attention ops imports (measured with
# sys.modules: qwix, flax, optax, xprof, ...), never jax, jaxlib, numpy or a CUDA plugin, so the
# machine's own stay. Each is installed with --no-deps (flax, tokamax would pull the rest of their 400 MB).
# A version the index has no wheel of is replaced by the newest below it, and said (xprof, 2026-12-03).
# About 32 MB. Usage: bash bench/gpu_wheels.sh [DIR]   (default: wheels; never commit it)
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-wheels}
dists=(
  pydantic pydantic_core annotated-types typing-inspection typing_extensions submitit cloudpickle orjson
  absl-py einshape etils fire flax immutabledict jaxtyping msgpack optax protobuf PyYAML Pygments qwix rich
  six termcolor treescope xprof tokamax
)
mkdir -p "$out"
: > "$out/requirements.txt"
for d in "${dists[@]}"; do
  v=$(.venv/bin/python -c "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))" "$d")
  # the installed version, else the newest the index has below it (said: the machine runs that one)
  for req in "$d==$v" "$d<=$v"; do
    if .venv/bin/python -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: \
      --python-version 3.12 --implementation cp --abi cp312 \
      --platform manylinux_2_35_x86_64 --platform manylinux_2_31_x86_64 --platform manylinux_2_28_x86_64 \
      --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d "$out" "$req" 2>/dev/null; then
      [ "$req" = "$d==$v" ] || echo "gpu_wheels: $d $v has no wheel on the index; took the newest below it" >&2
      [ "$d" = tokamax ] || echo "$req" >> "$out/requirements.txt"
      break
    fi
  done
done
du -sh "$out"
