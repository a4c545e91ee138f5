"""The fixed-point driver: sweep the program, fire rules, repeat until quiet.

Each sweep visits every block in program order (a nested block before the op
that owns it) and, for each op, the rules anchored on its type in order of
descending `benefit`, then load order. Decisions are taken against the graph
as it is at that moment, so an earlier rewrite in the same sweep is seen by
later ones. The result is deterministic: nothing depends on hashing order.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from rewrite.engine.conditions import Conditions, Failure, Tracer, lazy_rests
from rewrite.engine.guard import Refusal
from rewrite.engine.interfaces import Adapter, Block, Capability, Op, TypeChangedError, optional
from rewrite.engine.matcher import MATCH_BUDGET, Budget, MatchBudgetExceeded, Matcher
from rewrite.engine.operands import OperandTable
from rewrite.engine.rewriter import BuildFailed, Rewriter, RewriteRefused, Unavailable, Unevaluable, remove_dead
from rewrite.engine.steps import Steps
from rewrite.language import ast
from rewrite.language.logic import Truth
from rewrite.predicates import Predicate

DEFAULT_MAX_SWEEPS = 32


@dataclass
class RuleStatistics:
    """How often a rule was tried on an anchor of its type, and how often it fired."""

    rule: str
    attempts: int = 0
    fires: int = 0
    refused: int = 0  # matched and held, but the shape guard could not prove the rewrite
    unevaluable: int = 0  # matched and held, but an operand to build had no value (say `uniform` of NaNs),
    # or an op to build is not available at the program's target
    exhausted: int = 0  # anchors skipped: matching took more than the match budget's attempts there
    # Anchors of the result where it holds but assumes what the run did not
    # grant (`assume` clauses): counted in the last sweep, so each place once.
    kept: int = 0
    seconds: float = 0.0


@dataclass
class Statistics:
    """The outcome of one run of a rule set over a program."""

    rules: dict[str, RuleStatistics] = field(default_factory=dict)
    sweeps: int = 0
    removed_ops: int = 0
    ops_before: int | None = None  # when asked for and the adapter counts ops (`Adapter.count_ops`)
    ops_after: int | None = None

    @property
    def fires(self) -> int:
        return sum(r.fires for r in self.rules.values())

    @property
    def refused(self) -> int:
        """Rewrites the shape guard refused, over all rules."""
        return sum(r.refused for r in self.rules.values())

    @property
    def unevaluable(self) -> int:
        """Rewrites not made because an operand to build had no value, over all rules."""
        return sum(r.unevaluable for r in self.rules.values())

    @property
    def exhausted(self) -> int:
        """Anchors where a rule was skipped for its match budget, over all rules."""
        return sum(r.exhausted for r in self.rules.values())

    @property
    def kept(self) -> int:
        """Places left as they were for an assumption not granted, over all rules."""
        return sum(r.kept for r in self.rules.values())

    def fired(self, rule: str) -> int:
        return self.rules[rule].fires if rule in self.rules else 0

    def as_dict(self) -> dict:
        return {
            "sweeps": self.sweeps,
            "removed_ops": self.removed_ops,
            "ops_before": self.ops_before,
            "ops_after": self.ops_after,
            "rules": {
                name: {"attempts": r.attempts, "fires": r.fires, "refused": r.refused,
                       "unevaluable": r.unevaluable, "exhausted": r.exhausted, "kept": r.kept,
                       "seconds": round(r.seconds, 6)}
                for name, r in self.rules.items()
            },
        }


class Progress(Protocol):
    """Told how a run advances (the CLI shows it as a progress bar)."""

    def sweep(self, number: int) -> None:
        """Sweep `number` (from 1) starts."""

    def advance(self, ops: int) -> None:
        """`ops` more ops were visited in this sweep."""


class RewriteLimitError(RuntimeError):
    """The sweep cap was reached with rules still firing (likely rules that undo each other)."""

    def __init__(self, max_sweeps: int, firing: Sequence[str]):
        self.firing = tuple(firing)
        super().__init__(
            f"rules still firing after {max_sweeps} sweeps: {', '.join(self.firing)}; "
            "they may undo each other"
        )


class UnsoundRewriteError(RuntimeError):
    """A rule's rewrite changed a type it must keep (found in checked mode)."""

    def __init__(self, rule: str, detail: str):
        self.rule = rule
        super().__init__(f"rule '{rule}' changed a type it must keep: {detail}")


@dataclass(frozen=True)
class Decision:
    """What a rule would do on one anchor: fire, or not and why."""

    rule: ast.Rule
    anchor: Op
    matched: bool  # the `match` clauses fit
    truth: Truth  # the conditions' verdict (YES means it fires)
    failure: Failure | None  # the first condition that did not hold
    env: dict | None  # the bindings it would rewrite with
    exhausted: bool = False  # skipped: matching took more attempts than the match budget allows

    @property
    def fires(self) -> bool:
        return self.truth is Truth.YES


class Driver:
    """Runs rules over one program through its adapter."""

    def __init__(
        self,
        rules: Sequence[ast.Rule],
        adapter: Adapter,
        predicates: dict[str, Predicate],
        max_sweeps: int = DEFAULT_MAX_SWEEPS,
        progress: Progress | None = None,
        count_ops: bool = False,
        check_types: bool = False,
        match_budget: int = MATCH_BUDGET,
        steps: Steps | None = None,
        assume: frozenset[str] = frozenset(),
    ):
        if max_sweeps < 1:
            raise ValueError(f"max_sweeps must be at least 1, not {max_sweeps}")
        self.adapter = adapter
        # Counting walks a program the adapter may not index (MIL): only on request.
        self._count_ops = optional(adapter, Capability.COUNT_OPS) if count_ops else None
        self.progress = progress
        self._visited = 0
        self.max_sweeps = max_sweeps
        # A rule author asked to hear about a rewrite the guard refuses.
        self.check_types = check_types
        self.steps = steps
        # What the user grants; a rule assuming more holds but is kept (`missing`).
        self.assume = frozenset(assume)
        self._kept: dict[str, int] = {}  # per rule, in the current sweep
        # Rewrites not made although the rule held: the guard's refusals,
        # operands without a value, ops the target lacks and builds that
        # failed, with the rule and the anchor.
        self.refusals: list[tuple[str, Op, Refusal | Unevaluable | Unavailable | BuildFailed]] = []
        # (rule, anchor) where a rule was skipped: matching it took more than the match budget.
        self.exhausted: list[tuple[str, Op]] = []
        # Each anchor's decision starts the budget afresh; both matchers spend it.
        self.budget = Budget(match_budget)
        self.matcher = Matcher(adapter, budget=self.budget)
        # Summaries of the operands of wide ops (a Sum of thousands), shared by
        # every anchor that asks about one; kept only while `run` edits the graph.
        self.operand_table = OperandTable(adapter)
        # The rules' conditions, compiled once: as a run decides them, and the
        # same closures with a tracer for `explain`, which reports why not.
        self.conditions = Conditions(adapter, self.matcher, predicates, table=self.operand_table,
                                     lazy_rests=lazy_rests(rules))
        self.traced = Conditions(adapter, self.matcher, predicates, tracer=Tracer(),
                                 use_verdicts=self.conditions.use_verdicts)
        self.rewriter = Rewriter(adapter, self.conditions, self.operand_table)
        self.statistics = Statistics({rule.name: RuleStatistics(rule.name) for rule in rules})
        self._conditions = {rule.name: [c.expr for c in rule.conditions] for rule in rules}
        ordered = sorted(enumerate(rules), key=lambda item: (-item[1].benefit, item[0]))
        self.index: dict[str, list[ast.Rule]] = {}
        for _, rule in ordered:
            for op_type in sorted(rule.anchor.pattern.types):
                self.index.setdefault(op_type, []).append(rule)

    def run(self) -> Statistics:
        """Sweep until no rule fires. Raises `RewriteLimitError` at the cap."""
        count_ops = self._count_ops
        if count_ops is not None:
            self.statistics.ops_before = count_ops()
        self.operand_table.start()
        try:
            for _ in range(self.max_sweeps):
                self.statistics.sweeps += 1
                if self.progress is not None:
                    self.progress.sweep(self.statistics.sweeps)
                fired: list[str] = []
                self._kept.clear()
                for block in self.adapter.top_blocks():
                    self._sweep(block, fired)
                if self.progress is not None:
                    self.progress.advance(self._visited)
                    self._visited = 0
                if not fired:
                    for name, kept in self._kept.items():
                        self.statistics.rules[name].kept = kept
                    return self.statistics
            raise RewriteLimitError(self.max_sweeps, sorted(set(fired)))
        finally:
            self.operand_table.stop()
            self.adapter.finish()
            if count_ops is not None:
                self.statistics.ops_after = count_ops()

    def _sweep(self, block: Block, fired: list[str]) -> None:
        # The hot loop of a run: most ops have no rule and no nested block,
        # and cost one type lookup.
        adapter = self.adapter
        index = self.index
        progress = self.progress
        for op in adapter.operations(block):
            if progress is not None:
                self._visited += 1
                if self._visited == 1024:
                    progress.advance(1024)
                    self._visited = 0
            nested = adapter.nested_blocks(op)
            rules = index.get(adapter.op_type(op))
            if not (nested or rules) or not adapter.is_live(op):
                continue
            for inner in nested:
                self._sweep(inner, fired)
            for rule in rules or ():
                if not adapter.is_live(op):
                    break
                if self.try_rule(rule, op):
                    fired.append(rule.name)

    def decide(self, rule: ast.Rule, anchor: Op, traced: bool = False) -> Decision:
        """Whether `rule` fires on `anchor` as the graph is now; changes nothing.

        `traced`, the decision also says why not (`Decision.failure`): the
        same compiled conditions a run decides with, told to report. A match
        that takes more attempts than the budget is no firing (`Decision.exhausted`).
        """
        conditions = self.traced if traced else self.conditions
        matched = False
        truth = Truth.NO
        failure = None
        budget = self.budget
        budget.start()
        try:
            for env in self.matcher.match_rule(rule, anchor):
                budget.spend()
                matched = True
                truth, final = conditions.holds(self._conditions[rule.name], env)
                if final is not None:
                    return Decision(rule, anchor, True, Truth.YES, None, final)
                if failure is None:
                    failure = conditions.failure
        except MatchBudgetExceeded:
            return Decision(rule, anchor, matched, Truth.NO, None, None, exhausted=True)
        finally:
            budget.stop()
        return Decision(rule, anchor, matched, truth, failure, None)

    def _firing(self, rule: ast.Rule, anchor: Op) -> dict | None:
        """The bindings `rule` fires with on `anchor`, or None: what `decide` finds,
        without the record of why not, which only explaining reads. Raises
        `MatchBudgetExceeded` where `decide` says `exhausted`."""
        holds = self.conditions.holds
        conditions = self._conditions[rule.name]
        budget = self.budget
        budget.start()
        try:
            for env in self.matcher.match_rule(rule, anchor):
                budget.spend()
                final = holds(conditions, env)[1]
                if final is not None:
                    return final
        finally:
            budget.stop()
        return None

    def missing(self, rule: ast.Rule) -> frozenset[str]:
        """What `rule` assumes that this run does not grant (empty: it may fire)."""
        return rule.assumption_names - self.assume

    def try_rule(self, rule: ast.Rule, anchor: Op) -> bool:
        """Match, check and, if everything holds, rewrite. True if the rule fired."""
        statistics = self.statistics.rules[rule.name]
        statistics.attempts += 1
        start = time.perf_counter()
        try:
            try:
                env = self._firing(rule, anchor)
            except MatchBudgetExceeded:
                # Not firing is always sound: the rule is skipped here, and said so.
                statistics.exhausted += 1
                self.exhausted.append((rule.name, anchor))
                return False
            if env is None:
                return False
            if rule.assumptions and self.missing(rule):
                self._kept[rule.name] = self._kept.get(rule.name, 0) + 1
                return False
            if self.steps is not None:
                self.steps.take(rule.name)
            try:
                touched = self.rewriter.apply(rule, env, anchor)
            except TypeChangedError as error:
                raise UnsoundRewriteError(rule.name, str(error)) from None
            except RewriteRefused as refused:
                remove_dead(self.adapter, refused.built, self.operand_table, self.conditions.use_verdicts,
                            discarded=refused.built)
                self.refusals.append((rule.name, anchor, refused.refusal))
                if isinstance(refused.refusal, (Unevaluable, Unavailable)):
                    # The rule's own rewrite says "not here", as a condition
                    # would (no value to build with, or an op the target
                    # lacks): no type is at stake, so checked mode says nothing.
                    statistics.unevaluable += 1
                    return False
                statistics.refused += 1
                if self.check_types:
                    why = refused.refusal if isinstance(refused.refusal, BuildFailed) else (
                        f"the shape guard refused it: {refused.refusal}")
                    raise UnsoundRewriteError(rule.name, str(why)) from None
                return False
            self.statistics.removed_ops += remove_dead(self.adapter, touched, self.operand_table,
                                                       self.conditions.use_verdicts)
            statistics.fires += 1
            return True
        finally:
            statistics.seconds += time.perf_counter() - start

    def candidates(self, rule: ast.Rule):
        """Every live op the rule is anchored on, in program order, nested blocks first."""

        def walk(block):
            for op in self.adapter.operations(block):
                for nested in self.adapter.nested_blocks(op):
                    yield from walk(nested)
                if self.adapter.op_type(op) in rule.anchor.pattern.types:
                    yield op

        for block in self.adapter.top_blocks():
            yield from walk(block)
