"""Every error tilesweep raises on purpose lives here and derives from one base.

The CLI turns a ``TilesweepError`` into one line on stderr and exit code 2; anything
else is a bug and keeps its traceback. The classes pickle (they travel back from
worker processes through submitit), so each keeps its message in ``args``.
"""

from __future__ import annotations


class TilesweepError(Exception):
    """Base of every expected failure: bad input, a broken environment, a refused action."""

    exit_code = 2

    def __init__(self, message: str) -> None:
        super().__init__(message)

    @property
    def message(self) -> str:
        return str(self.args[0]) if self.args else self.__class__.__name__


class SpecError(TilesweepError):
    """A spec file is missing, unparsable, or has an invalid field."""


class PlanError(TilesweepError):
    """A spec is valid but cannot be planned as asked (for example more units than items)."""


class SweepDirError(TilesweepError):
    """A sweep directory is missing, not a sweep directory, or damaged."""


class MismatchError(TilesweepError):
    """A sweep directory, partial or document belongs to another spec or environment."""


class PartialError(TilesweepError):
    """A partial file cannot be used (foreign, damaged, unknown schema version)."""


class ResultsError(TilesweepError):
    """A file is not a results document, or one that cannot be merged into."""


class LockTimeout(TilesweepError):
    """A lock could not be taken in time; the message names the lock file."""


class DispatchError(TilesweepError):
    """Submitting, polling or cancelling jobs failed (no sbatch, unknown partition, ...)."""


class WorkerEnvironmentError(TilesweepError):
    """The worker's environment cannot run the sweep (no GPU where one is required, ...)."""


class LeaseHeld(TilesweepError):
    """A unit (or a sweep's ``run``) is held by another live worker: starting a second one
    beside it would redo its work, so nothing is started."""


class UnitsFailed(TilesweepError):
    """Workers of a SLURM task failed; the message gives each unit's own one-line reason."""
