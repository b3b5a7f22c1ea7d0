"""A sweep strategy with rounds, as ``control.rounds`` drives it.

A strategy's rules (how an item is timed in a round, which configs go on) live in
``orchestrator.planning``; what a strategy adds here is the part that reads the sweep
directory: which round it has still to plan, what that round holds once the rounds before it
have their records, and its own record of the decision. ``control.rounds`` does the rest for
every strategy alike: the units of the round, their place in the unit index, submitting them
or running them here, and the final merge job that advances the sweep again.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from orchestrator.planning import Unit, WorkItem
from orchestrator.store.sweepdir import SweepDir


@dataclass
class RoundChoice:
    """What a strategy chose for its next round: the round's number, its items in plan order
    (none when nothing goes on) and its account of the choice (for the CLI, and for its record)."""

    number: int
    items: list[WorkItem] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)


class RoundPlanner(Protocol):
    """The sweep-directory side of a strategy with more than one round."""

    def pending(self, sd: SweepDir) -> int | None:
        """The number of the round still to plan, or None when every round is planned; cheap
        (from the files alone), since every wait and every merge job asks."""
        ...

    def choose(self, sd: SweepDir) -> RoundChoice | None:
        """The next round, read from the records of the rounds before it; None while those
        still lack records (``resume`` redoes them first). Writes nothing."""
        ...

    def record(self, sd: SweepDir, choice: RoundChoice, units: list[Unit]) -> None:
        """Write the strategy's record of a planned round (its units are in the index already):
        written last, so that its presence means the round is planned."""
        ...

    def forget(self, sd: SweepDir, number: int) -> None:
        """Forget a planned round whose units could not be submitted (the caller has taken them
        out of the index): the next wait, resume or merge job plans it again."""
        ...
