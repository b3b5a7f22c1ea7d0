"""tilesweep's control plane: spec, planning, dispatch, the sweep directory, analysis, the CLI."""

import os

# The command users type; messages name it when they say what to run next.
PROG = "tilesweep"


def word(path: str | os.PathLike[str]) -> str:
    """A path as a command a message suggests spells it, quoted where a shell would split it
    (a space in a folder's name): the command pastes and runs as shown."""
    import shlex  # here: the CLI's first import of this package loads nothing the interpreter has not

    return shlex.quote(os.fspath(path))
