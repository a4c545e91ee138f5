"""The shipped MIL rules as coremltools graph passes, placed in a pipeline.

    import coremltools as ct
    from rewrite.mil import build_pass_pipeline

    model = ct.convert(program, pass_pipeline=build_pass_pipeline(), ...)

The rules run in five groups, each registered as one graph pass and placed
relative to coremltools' default passes, the way a converter places its
hand-written passes: cleanups before constants are folded, fusions before
matmul/bias fusion, a late group after `reduce_mean` is formed (which can
expose reductions to fuse again), a settling group after coremltools
first merges duplicate ops (which makes equal values identical), and the
index guards coremltools adds last, removed where the indices are proved
non-negative. A rule joins groups with its `group` clause (`group cleanup,
fusion`); a rule in no group is not in the pipeline.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from rewrite.api import RuleSet, load_rules
from rewrite.backends.mil import Program, ct, register_graph_pass
from rewrite.backends.mil import validation as mil_validation
from rewrite.engine.driver import Statistics
from rewrite.engine.steps import StepLimitReached, Steps, first_breaking_step
from rewrite.language import assumptions


@dataclass(frozen=True)
class PassGroup:
    group: str  # the group rules name in their `group` clauses
    pass_name: str  # the graph pass's registered name
    anchor: str  # a default pass to place the group next to
    after: bool  # after the anchor (else before its first occurrence)


# Where each of MIL's groups (`rewrite.backends.pass_groups("mil")`) runs; its
# rules are those whose `group` clauses name it. A rule in several groups runs
# again where coremltools' passes may have exposed more for it: runtime fills
# proved scalar, reductions given their axes back, the softmax steps that need
# both, a flexible input's length read from one place once duplicate ops are
# merged.
GROUPS = (
    PassGroup("cleanup", "rewrite::cleanup", "common::const_elimination", after=False),
    PassGroup("fusion", "rewrite::fusion", "common::fuse_matmul_weight_bias", after=False),
    # coremltools' reduction passes can expose a keep_dims max shift only now.
    PassGroup("late", "rewrite::late", "common::fuse_reduce_mean", after=True),
    # Once coremltools has merged duplicate ops (two selects by one mask, say),
    # values that were merely equal are the same value, which rules can see.
    PassGroup("settle", "rewrite::settle", "common::remove_redundant_ops", after=True),
    # coremltools guards every gather's indices against negative values only
    # now; the guards of indices proved non-negative go again at once.
    PassGroup("index_guards", "rewrite::index_guards", "common::guard_negative_gather_indices", after=True),
)


def register_groups(rules: RuleSet | None = None) -> tuple[str, ...]:
    """Register every group as a coremltools graph pass; return their pass names."""
    rules = rules if rules is not None else load_rules(dialects=["mil"])
    for group in GROUPS:
        register_graph_pass(rules.group(group.group), group.pass_name)
    return tuple(group.pass_name for group in GROUPS)


def build_pass_pipeline(
    base: ct.PassPipeline | None = None, rules: RuleSet | None = None, assume: Iterable[str] = (),
) -> ct.PassPipeline:
    """`base` (default: coremltools' default pipeline) with the rule groups placed in it.

    `base` itself is not changed, and a pipeline that already has the groups
    comes back as it is: calling this twice adds nothing.

    Only the groups are added, no pass of coremltools': a rule removes what
    its rewrite made dead itself, so where no rule fires the program every
    later pass sees is the one the default pipeline would give it. (An extra
    `dead_code_elimination` after each group removed the frontend's dead ops
    earlier than the default pipeline does, which changed what
    `add_int16_cast` and `guard_negative_gather_indices` made of the rest.)

    `assume` grants rules that state assumptions (`RuleSet.apply`'s
    `assume`), as each group pass's `assume` option.
    """
    granting = ",".join(sorted(assumptions.granted(assume)))
    pipeline = copy.deepcopy(base) if base is not None else ct.PassPipeline.DEFAULT
    register_groups(rules)
    for group in GROUPS:
        if group.pass_name in pipeline.passes:
            continue
        passes = list(pipeline.passes)
        if group.anchor in passes:
            index = passes.index(group.anchor) + (1 if group.after else 0)
        else:
            index = 0 if not group.after else len(passes)
        pipeline.insert_pass(index, group.pass_name)
    if granting:
        for group in GROUPS:
            pipeline.set_options(group.pass_name, {"assume": granting})
    return pipeline


def apply(
    program: Program,
    rules: RuleSet | None = None,
    *,
    validate: bool = True,
    original: Callable[[], Program] | None = None,
    **apply_options,
) -> Statistics:
    """Rewrite `program` in place with `rules` (default: the shipped MIL rules), as `RuleSet.apply` does.

    With `validate`, the result must pass coremltools' `Program.validate`
    if the program did; if it does not, `InvalidProgramError` names the rule
    whose rewrite broke it, found by replaying the run on `original()` (the
    program again, as it was: the CLI loads its package again). Without
    `original` the error names only the rules that fired. The program is
    then not to be used.
    """
    rules = rules if rules is not None else load_rules(dialects=["mil"])
    statistics = rules.apply(program, **apply_options)
    if not validate or not statistics.fires:
        return statistics  # nothing changed: whatever validation finds is no change of ours
    found = mil_validation.problem(program)
    if found is None:
        return statistics
    fired = ", ".join(name for name, rule in statistics.rules.items() if rule.fires)
    if original is None:
        raise mil_validation.InvalidProgramError(found, None, None, f"the run, in which fired {fired}")
    if mil_validation.problem(original()) is not None:
        return statistics  # it was not valid to begin with: no promise to keep
    quiet = {**apply_options, "progress": None}

    def replay(steps: Steps) -> Program:
        copy = original()
        try:
            rules.apply(copy, steps=steps, **quiet)
        except StepLimitReached:
            pass
        return copy

    culprit = first_breaking_step(replay, statistics.fires, mil_validation.problem)
    step, maker = culprit if culprit is not None else (None, None)
    raise mil_validation.InvalidProgramError(found, maker, step)
