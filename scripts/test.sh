#!/usr/bin/env bash
# The whole test suite: set up .venv, check lint, format and types (ruff, mypy), install
# chromium for the report page's browser tests and start the local SLURM cluster the dispatch
# tests use (both as root; otherwise those tests say why they are skipped), then run pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-venv.sh
# Lint, format and types of the whole tree (settings in pyproject.toml; mypy's files are there)
.venv/bin/ruff check .
.venv/bin/ruff format --check .
# mypy checks the types beside the set-up below (its output waits in a file until pytest starts)
types=$(mktemp)
.venv/bin/mypy > "$types" 2>&1 &
mypy_pid=$!
# a Ctrl-C during the set-up stops mypy too (a background job ignores SIGINT)
trap '[ -z "$mypy_pid" ] || kill "$mypy_pid" 2>/dev/null || true; rm -f "$types"' EXIT
if [ "$(id -u)" = 0 ]; then
  # the report page's tests open it in a real headless browser
  if bash scripts/install-browser.sh; then
    export TILESWEEP_REQUIRE_BROWSER=${TILESWEEP_REQUIRE_BROWSER:-1}
  else
    echo "test.sh: chromium could not be installed; the browser tests will fail (TILESWEEP_REQUIRE_BROWSER=1)" >&2
    export TILESWEEP_REQUIRE_BROWSER=1
  fi
  if bash slurm/start-local-slurm.sh; then
    export TILESWEEP_REQUIRE_SLURM=${TILESWEEP_REQUIRE_SLURM:-1}
  else
    echo "test.sh: the local SLURM cluster did not start; SLURM tests will fail (TILESWEEP_REQUIRE_SLURM=1)" >&2
    export TILESWEEP_REQUIRE_SLURM=1
  fi
else
  echo "test.sh: not root, so the local SLURM cluster cannot be started (nor chromium installed); SLURM tests" \
       "(and the browser tests, without chromium) will be skipped" >&2
fi
mypy_rc=0
wait "$mypy_pid" || mypy_rc=$?
mypy_pid=
if [ "$mypy_rc" != 0 ]; then
  cat "$types" >&2
  exit 1
fi
cat "$types"
rm -f "$types"
# Two test processes (pytest-xdist); the SLURM tests stay together on one of them (tests/conftest.py).
# TILESWEEP_TEST_PROCESSES=0 runs the suite in one process.
exec .venv/bin/python -m pytest -n "${TILESWEEP_TEST_PROCESSES:-2}" --dist loadgroup "$@"
