#!/usr/bin/env bash
# The whole test suite: set up .venv, check lint, format and types (ruff, mypy), start the
# local SLURM cluster the dispatch tests use (as root; otherwise those tests say why they are
# skipped), then run pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-venv.sh
# Lint, format and types of the kernels and the storage package (settings in pyproject.toml).
.venv/bin/ruff check kernels orchestrator/store
.venv/bin/ruff format --check --quiet kernels orchestrator/store
.venv/bin/mypy
if [ "$(id -u)" = 0 ]; then
  if bash slurm/start-local-slurm.sh; then
    export TILESWEEP_REQUIRE_SLURM=${TILESWEEP_REQUIRE_SLURM:-1}
  else
    echo "test.sh: the local SLURM cluster did not start; SLURM tests will fail (TILESWEEP_REQUIRE_SLURM=1)" >&2
    export TILESWEEP_REQUIRE_SLURM=1
  fi
else
  echo "test.sh: not root, so the local SLURM cluster cannot be started; SLURM tests will be skipped" >&2
fi
exec .venv/bin/python -m pytest "$@"
