"""tilesweep's control plane: spec, planning, dispatch, the sweep directory, analysis, the CLI."""

# The command users type; messages name it when they say what to run next.
PROG = "tilesweep"
