"""Every decision the instance generator makes, drawn at random or enumerated best-first."""

from __future__ import annotations

import heapq
import random


class Choices:
    """Every decision the generator makes: drawn at random, or replayed from a plan.

    A plan maps a decision's position (its index in the order the generator
    asks) to the option taken there; every other decision takes its first
    option. Options are listed typical case first, so the empty plan is the
    plainest instance and a plan of one entry changes one thing about it.
    Enumerating plans by size (`plans`) exhausts the small cases, one
    change and then two, before anything is sampled.
    """

    def __init__(self, rng: random.Random | None = None, plan: dict[int, int] | None = None):
        self.rng = rng
        self.plan = plan or {}
        self.sizes: list[int] = []  # how many options each decision had, in order

    def choice(self, options, weights=None):
        options = list(options)
        position = len(self.sizes)
        self.sizes.append(len(options))
        if self.rng is None:
            index = self.plan.get(position, 0)
            return options[index if index < len(options) else 0]
        if weights is None:
            return self.rng.choice(options)
        return self.rng.choices(options, weights)[0]

    def flag(self, probability: float) -> bool:
        """True with `probability` when sampling; enumerated likelier answer first."""
        likely = probability >= 0.5
        weight = max(probability, 1 - probability)
        return self.choice((likely, not likely), (weight, 1 - weight))


def plans(generate, budget: int, root: tuple = ()):
    """Results of `generate(choices)` for plans best-first: fewest changes, then smallest options.

    A plan's children change one more decision after its last change, so each
    plan is reached once; the decisions after a change are read from the run
    that made it, because a change (a higher rank, say) can add decisions.
    Every plan extends `root`, which is not counted as a change.
    """
    queue = [(0, 0, root)]
    while queue and budget > 0:
        _, _, items = heapq.heappop(queue)
        choices = Choices(plan=dict(items))
        result = generate(choices)
        budget -= 1
        last = items[-1][0] if items else -1
        for position in range(last + 1, len(choices.sizes)):
            for index in range(1, choices.sizes[position]):
                plan = (*items, (position, index))
                heapq.heappush(queue, (len(plan) - len(root), sum(i for _, i in plan), plan))
        yield result


def round_robin(first, others):
    """Items of `first` and of `others` in turn, `first` at every other turn."""
    others = list(others)
    turn = 0
    while first is not None or others:
        if first is not None and (turn % 2 == 0 or not others):
            stream = first
        else:
            stream = others[(turn // 2) % len(others)]
        turn += 1
        try:
            yield next(stream)
        except StopIteration:
            if stream is first:
                first = None
            else:
                others.remove(stream)
