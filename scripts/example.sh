#!/usr/bin/env bash
# The main job on the embedded default: set up .venv, then run the small example sweep
# here (no cluster needed): plan, run units as local worker processes, merge into
# results/small_tiles.json and print the best config per problem.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-venv.sh
exec .venv/bin/tilesweep run examples/small.json "$@"
