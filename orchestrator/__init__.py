"""tilesweep's control plane: spec, planning, dispatch, the sweep directory, analysis, the CLI."""

import os

# The command users type; messages name it when they say what to run next.
PROG = "tilesweep"


def counted(n: int, noun: str, plural: str | None = None) -> str:
    """``n`` things as a line says them: "1 unit", "3 units" (``plural`` where adding an s is
    not how the word takes it: "processes")."""
    return f"{n} {noun if n == 1 else plural or noun + 's'}"


def word(path: str | os.PathLike[str]) -> str:
    """A path as a command a message suggests spells it, quoted where a shell would split it
    (a space in a folder's name): the command pastes and runs as shown."""
    import shlex  # here: the CLI's first import of this package loads nothing the interpreter has not

    return shlex.quote(os.fspath(path))
