"""The spec's ``search`` section: what ``timing.strategy: search`` measures, round by round.

Apart from the other sections (``orchestrator.spec.sections``) because it is the one strategy
with settings of its own; its rules are ``orchestrator.planning.search``'s.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, model_validator

from orchestrator.spec.sections import SpecModel


class SearchSettings(SpecModel):
    """How ``timing.strategy: search`` chooses what to measure (docs/measuring.md; its rules:
    ``orchestrator.planning.search``). Ignored by the other strategies."""

    design: int = Field(
        default=6,
        ge=1,
        description="round 1: forced configs per problem, carried ones included: the configs that won the most "
        "problems in the reuse documents (the portfolio), filled up by a space-filling choice over the grid; at "
        "most one in 8 of the configs a problem can run (at least 2)",
    )
    budget: int | None = Field(
        default=None,
        ge=1,
        description="most forced configs measured per problem over all rounds (carried ones count); at least "
        "design (a budget below the default design, with no design given, is the design too); null: no cap but "
        "max_rounds",
    )
    max_rounds: int = Field(
        default=5,
        ge=1,
        description="most rounds of the search (1: the design alone); with screen each round is two rounds of "
        "units, a screen and the full timing of its survivors",
    )
    per_round: int | None = Field(
        default=3,
        ge=1,
        description="each round after the first: most forced configs a problem measures, those the other "
        "problems of its mode and implementation found fastest first (one none of them measured counts as "
        "fast), none they rate slower than its best, nor one the cost model prices at more than two of its typical "
        "configs unless they rate it faster; null: every winner of another problem and every neighbour of its leaders",
    )
    leaders: int = Field(
        default=2,
        ge=1,
        description="per problem, the configs whose grid neighbours a round measures: the best and those whose "
        "q1-q3 overlaps it, at most this many",
    )
    screen: bool = Field(
        default=False,
        description="screen each round's configs with one sample of timing.screen_ms first, then time the "
        "survivors in full (halving's rule, timing.keep and timing.noise); it drops a config only where a round "
        "measures more than timing.keep of a problem's configs, so set keep below per_round (plan notes it)",
    )

    @model_validator(mode="before")
    @classmethod
    def _budget_caps_the_default_design(cls, data: Any) -> Any:
        """A budget below the default design, with no design given, is the design too: round 1
        measures at most the budget (a design the user gave above the budget is refused)."""
        if isinstance(data, dict) and "design" not in data:
            budget = data.get("budget")
            default = cls.model_fields["design"].default
            if isinstance(budget, int) and not isinstance(budget, bool) and 1 <= budget < default:
                return {**data, "design": budget}
        return data

    @model_validator(mode="after")
    def _rounds_and_budget(self) -> SearchSettings:
        if self.budget is not None and self.budget < self.design:
            raise ValueError(
                f"budget={self.budget} is below design={self.design}: round 1 alone measures up to design configs "
                f"per problem (fewer only on a small grid); raise budget to at least {self.design}, or lower design"
            )
        return self
