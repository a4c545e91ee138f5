"""The changes of a run, counted, and the bisection that finds the change that broke an output.

A backend checks what a run leaves (ONNX's checker, MIL's own validation).
When the output fails where the input passed, the engine's runs being
deterministic, a replay of the same run stopped after its first k changes
leaves exactly the model those k changes make, and bisecting over k finds a
change that turns a passing model into a failing one: the rule to blame.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


class StepLimitReached(Exception):
    """A run was stopped at its `Steps.limit`."""


@dataclass
class Steps:
    """The changes a run makes, in order, by what made each (a rule's name, "constant folding", ...).

    With `limit`, the run stops before change `limit + 1`: `take` raises
    `StepLimitReached`, which the runner catches once the changes so far
    are written back.
    """

    limit: int | None = None
    taken: list[str] = field(default_factory=list)

    def take(self, maker: str) -> None:
        """Record a change `maker` is about to make, or stop the run if the limit is reached."""
        if self.limit is not None and len(self.taken) >= self.limit:
            raise StepLimitReached(maker)
        self.taken.append(maker)


def first_breaking_step(
    replay: Callable[[Steps], Any], total: int, problem: Callable[[Any], str | None]
) -> tuple[int, str] | None:
    """The change after which a run's output first has a `problem`: (its number from 1, its maker).

    `replay(steps)` runs again from the same input, stopping at `steps.limit`,
    and returns what it leaves; the whole run made `total` changes and its
    output had a problem, where the input had none. The bisection keeps
    "the first `low` changes leave no problem, the first `high` do", so it
    ends at a change that turns a sound model into a broken one, in about
    log2(total) replays. None if the full replay shows no problem (a run
    that is not deterministic, which would be a bug of its own).
    """
    low, high = 0, total
    steps = Steps(high)
    if problem(replay(steps)) is None:
        return None
    makers = steps.taken
    while high - low > 1:
        middle = (low + high) // 2
        if problem(replay(Steps(middle))) is None:
            low = middle
        else:
            high = middle
    return high, makers[high - 1]
