"""`rewrite verify`: random instances of a rule's whole pattern, before against after.

The generator reads the rule itself; the rules file needs nothing extra
(`generator`: what an instance holds; `checking`: how one is compared).
Instances on which the rule fires are evaluated before and after; a
difference, or a backend's semantic objection, is a counterexample, which
is shrunk and printed as a rule example.

The necessity check drops each `where` clause in turn: a clause whose
removal lets more instances fire, each compared on every kind of input
(NaN, infinities, zeros and the largest values included), with no
difference, is possibly redundant. A clause whose removal changes nothing
the generator reached is said to be not exercised, never redundant.

A rule that no instance fires is not verified: its verdict is NONE, which
`rewrite verify` counts as a failure.
"""

from __future__ import annotations

import itertools
import logging
import random
from dataclasses import dataclass, replace

from rewrite.language import ast
from rewrite.verify.checking import check, shrink
from rewrite.verify.choices import Choices, plans, round_robin
from rewrite.verify.generator import Generator

__all__ = ["Counterexample", "Necessity", "Verdict", "format_verdict", "verify_rule"]


@dataclass(frozen=True)
class Counterexample:
    graph: str
    problem: str


@dataclass(frozen=True)
class Necessity:
    condition: str
    location: str
    noticed: bool  # some instance failed once it was dropped
    extra_instances: int = 0  # instances that fired only once it was dropped, each compared on every kind of input
    extra_partial: int = 0  # such instances that some kind of input could not reach (not evidence)


@dataclass(frozen=True)
class Verdict:
    rule: str
    trials: int
    instances: int  # generated graphs on which the rule fired
    counterexample: Counterexample | None
    necessity: tuple[Necessity, ...] = ()
    nested_instances: int = 0  # of those, with every op inside a conditional's branches
    complete_instances: int = 0  # of those, compared on every kind of input their dtypes have
    skipped_rounds: int = 0  # evaluations skipped because the original does not run there
    refused: int = 0  # generated graphs the backend refused to build (no instances)
    first_refusal: str | None = None
    unbuilt: tuple[tuple[str, int], ...] = ()  # (clause, how many instances could not be built for it)

    @property
    def passed(self) -> bool:
        """No counterexample and something checked: a verdict with no instance proves nothing."""
        return self.counterexample is None and self.instances > 0

    @property
    def conclusive(self) -> bool:
        return self.instances > 0

    @property
    def status(self) -> str:
        if self.counterexample is not None:
            return "FAIL"
        return "PASS" if self.instances else "NONE"


def verify_rule(
    rule: ast.Rule, trials: int = 50, seed: int = 0, necessity: bool = True, shaped_by: ast.Rule | None = None
) -> Verdict:
    """Try `trials` instances of `rule`; stop at the first counterexample.

    The first three fifths of the budget enumerate the small cases best-first
    (the plainest instance, then every single change to it, then pairs); the
    rest are sampled with `seed`. With `shaped_by`, half the instances are
    shaped by it and half by the rule itself, so that a rule with a
    condition dropped is tried on the graphs the full rule expects and on
    those only the weaker rule describes.
    """
    instances = nested = complete = skipped = refused = 0
    first_refusal = None
    counterexample = None
    # Shaped by another rule (the full rule, for a rule with a clause dropped),
    # half the budget is spent on its instances and half on the rule's own:
    # a dropped structural clause (`unscaled(%h) is %x`) lets through graphs
    # only the weaker rule's own shape has.
    shapes = [shaped_by, rule] if shaped_by is not None and shaped_by is not rule else [rule]
    generators = [Generator(shape) for shape in shapes]
    budgets = [trials // len(shapes) + (i < trials % len(shapes)) for i in range(len(shapes))]

    def candidates_of(generator: Generator, budget: int):
        rng = random.Random(seed)
        enumerated = budget * 3 // 5
        # Each source (the generator, each example) enumerated on its own,
        # in turn, so that no source's many single changes starve another's;
        # the generator, whose instances vary most, has every other turn.
        # The examples the rule rewrites have as many turns together as those
        # it leaves (listed again, since a rule may have dozens of the latter).
        sources = [plans(generator.instance, enumerated, root=((0, i),)) for i in range(generator.sources)]
        rewritten = sources[1:1 + generator.rewritten_examples]
        left = sources[1 + generator.rewritten_examples:]
        repeat = max(1, len(left) // max(1, len(rewritten)))
        others = [source for _ in range(repeat) for source in rewritten] + left
        yield from itertools.islice(round_robin(sources[0], others), enumerated)
        for _ in range(budget - enumerated):
            yield generator.instance(Choices(rng=rng))

    def candidates():
        for generator, budget in zip(generators, budgets):
            yield from candidates_of(generator, budget)

    seen: set[str] = set()
    quiet = _QuietBackends()
    for instance in quiet(candidates()):
        if instance is None:
            continue
        key = "\n".join(instance.body()) + f"\n{instance.nested}"
        if key in seen:
            continue
        seen.add(key)
        outcome = check(rule, instance)
        if outcome.refused is not None:
            refused += 1
            first_refusal = first_refusal or outcome.refused
        skipped += outcome.skipped
        if not outcome.fired:
            continue
        instances += 1
        nested += instance.nested
        complete += outcome.complete
        if outcome.problem:
            small, problem = shrink(rule, instance, outcome.problem)
            counterexample = Counterexample(small.as_example(f"counterexample: {problem}"), problem)
            break
    results = []
    if necessity and counterexample is None:
        for index, condition in enumerate(rule.conditions):
            weaker = replace(rule, conditions=rule.conditions[:index] + rule.conditions[index + 1:])
            verdict = verify_rule(weaker, trials, seed, necessity=False, shaped_by=rule)
            extra = max(verdict.complete_instances - complete, 0)
            partial = max(verdict.instances - instances, 0) - extra
            results.append(Necessity(condition.text, str(condition.span), verdict.counterexample is not None,
                                     extra, max(partial, 0)))
    unbuilt = tuple(sorted(generators[0].unbuilt.items(), key=lambda item: -item[1]))
    return Verdict(rule.name, trials, instances, counterexample, tuple(results), nested, complete, skipped,
                   refused, first_refusal, unbuilt)


class _QuietBackends:
    """Backend warnings about the constants of generated graphs (`Saving value
    type of float64 ...`) are noise here: hold them while instances run."""

    NAMES = ("coremltools",)

    def __call__(self, items):
        loggers = [logging.getLogger(name) for name in self.NAMES]
        levels = [logger.level for logger in loggers]
        for logger in loggers:
            logger.setLevel(logging.ERROR)
        try:
            yield from items
        finally:
            for logger, level in zip(loggers, levels):
                logger.setLevel(level)


def format_verdict(verdict: Verdict) -> str:
    """The verdict as `rewrite verify` prints it: FAIL, NONE or PASS, and why."""
    if verdict.counterexample is not None:
        lines = [f"FAIL  {verdict.rule}: {verdict.counterexample.problem}", "  counterexample (as a rule example):",
                 verdict.counterexample.graph]
        return "\n".join(lines)
    if verdict.instances == 0:
        lines = [f"NONE  {verdict.rule}: no instance in {verdict.trials} trials fired the rule; nothing was checked"]
        lines += _reasons(verdict)
        return "\n".join(lines)
    lines = [f"PASS  {verdict.rule}: {verdict.instances} instances of {verdict.trials} trials "
             f"({verdict.nested_instances} in nested blocks, {verdict.complete_instances} compared on every kind "
             f"of input), outputs equal"]
    if verdict.skipped_rounds:
        lines.append(f"  skipped: {verdict.skipped_rounds} evaluations where the original does not run")
    for item in verdict.necessity:
        if item.noticed:
            lines.append(f"  needed: where {item.condition}  ({item.location})")
        elif item.extra_instances:
            lines.append(f"  possibly redundant: without it {item.extra_instances} more instances fired, each "
                         f"compared on NaN, ±inf, ±0 and the largest values too, all equal: "
                         f"where {item.condition}  ({item.location})")
        elif item.extra_partial:
            lines.append(f"  not exercised: without it {item.extra_partial} more instances fired, but none was "
                         f"compared on every kind of input: where {item.condition}  ({item.location})")
        else:
            lines.append(f"  not exercised (the generator is too weak here): every instance already met "
                         f"where {item.condition}  ({item.location})")
    return "\n".join(lines)


def _reasons(verdict: Verdict) -> list[str]:
    lines = []
    for clause, count in verdict.unbuilt[:3]:
        lines.append(f"  not built: {count} instances, for {clause}")
    if verdict.refused:
        lines.append(f"  the backend refused {verdict.refused} generated graphs (first: {verdict.first_refusal})")
    if verdict.skipped_rounds:
        lines.append(f"  skipped: {verdict.skipped_rounds} evaluations where the original does not run")
    return lines
