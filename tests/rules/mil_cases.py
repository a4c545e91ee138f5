"""Shared helpers for the MIL rule tests: build inputs, count ops, and check a
rewrite against the reference evaluator (numbers before == numbers after)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from rewrite.backends.mil import Program, ct
from rewrite.backends.mil.reference import evaluate
from rewrite.engine.driver import Statistics

IOS18 = ct.target.iOS18
RULE = "remove_broadcast_tiles"

# Runtime sizes a symbolic dimension is evaluated at: two, so that a rewrite
# that only holds for one size is caught.
SIZES = (2, 5)


def op_counts(program: Program) -> Counter:
    """Op types -> how many, over every function and nested block (consts included)."""
    counts: Counter = Counter()

    def walk(block):
        for op in block.operations:
            counts[op.op_type] += 1
            for nested in op.blocks:
                walk(nested)

    for function in program.functions.values():
        walk(function)
    return counts


def total_ops(program: Program) -> int:
    return sum(op_counts(program).values())


def ops_of_type(program: Program, op_type: str) -> list:
    found = []

    def walk(block):
        for op in block.operations:
            if op.op_type == op_type:
                found.append(op)
            for nested in op.blocks:
                walk(nested)

    for function in program.functions.values():
        walk(function)
    return found


def random_feeds(
    shapes: Mapping[str, tuple],
    dtypes: Mapping[str, type] | None = None,
    sizes: Sequence[int] = SIZES,
    seed=0,
) -> list[dict[str, np.ndarray]]:
    """Concrete inputs for each runtime size. A dim given as a string is symbolic
    and takes the size; every string names the same runtime dimension (MIL's
    differently-named symbols for one dimension are one size at run time).
    Without any symbolic dim, one feed is returned."""
    dtypes = dict(dtypes or {})
    symbolic = any(isinstance(d, str) for shape in shapes.values() for d in shape)
    rng = np.random.default_rng(seed)
    feeds = []
    for size in sizes if symbolic else sizes[:1]:
        feed = {}
        for name, shape in shapes.items():
            concrete = tuple(size if isinstance(d, str) else d for d in shape)
            dtype = dtypes.get(name, np.float32)
            if dtype is bool:
                feed[name] = rng.random(concrete) < 0.5
            elif np.issubdtype(dtype, np.integer):
                feed[name] = rng.integers(1, 5, concrete).astype(dtype)
            else:
                feed[name] = rng.uniform(0.5, 2.0, concrete).astype(dtype)
        feeds.append(feed)
    return feeds


def output_names(program: Program, function: str = "main") -> list[str]:
    return [v.name for v in program.functions[function].outputs]


def assert_same_outputs(expected: Mapping[str, np.ndarray], actual: Mapping[str, np.ndarray]) -> None:
    assert list(actual) == list(expected), "output names changed"
    for name, want in expected.items():
        got = actual[name]
        assert got.shape == want.shape, f"{name}: shape {got.shape} != {want.shape}"
        assert got.dtype == want.dtype, f"{name}: dtype {got.dtype} != {want.dtype}"
        if np.issubdtype(want.dtype, np.floating):
            np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6, err_msg=name)
        else:
            np.testing.assert_array_equal(got, want, err_msg=name)


@dataclass
class Outcome:
    """What one run of a rule set did to a program."""

    statistics: Statistics
    before: Counter  # op counts before the rewrite
    after: Counter  # op counts after it
    outputs: list[dict[str, np.ndarray]]  # the (equal) outputs after, one per feed

    def fired(self, rule: str = RULE) -> int:
        return self.statistics.fired(rule)

    @property
    def removed(self) -> Counter:
        """Op types -> how many fewer there are now (only decreases)."""
        return self.before - self.after

    @property
    def added(self) -> Counter:
        return self.after - self.before


def rewrite_and_compare(program: Program, rules, feeds: Sequence[Mapping[str, np.ndarray]]) -> Outcome:
    """Apply `rules` to `program` in place, validate it, and check that every
    feed gives the same outputs (names, shapes, dtypes, values) before and after."""
    assert feeds, "a rewrite is checked on at least one concrete input"
    names = output_names(program)
    expected = [evaluate(program, feed) for feed in feeds]
    before = op_counts(program)
    statistics = rules.apply(program, check_types=True)
    program.validate()
    after = op_counts(program)
    assert output_names(program) == names, "function output names must be preserved"
    actual = [evaluate(program, feed) for feed in feeds]
    for want, got in zip(expected, actual):
        assert_same_outputs(want, got)
    return Outcome(statistics, before, after, actual)
