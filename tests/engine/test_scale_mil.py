"""MIL programs where one op touches many: fan-out, wide concats, cond and while_loop bodies.

Every case checks op counts, and outputs before and after with the reference
evaluator (at two batch sizes). The cost is checked without a clock: the
consumers listed over a whole run grow linearly with the program (cleaning
up after each rewrite once listed every use of the shared statistic).
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from coremltools.converters.mil.mil import get_new_symbol

import rewrite
from rewrite.backends.mil import MilAdapter, ct, mb
from rewrite.backends.mil.reference import evaluate
from rewrite.engine.builtins import _one_use, _use_count
from rewrite.language.logic import Truth

HIDDEN = 8
BATCHES = (2, 5)


@pytest.fixture(scope="module")
def rules():
    return rewrite.load_rules(dialects=["mil"]).only("remove_broadcast_tiles")


def _program(body, *extra_specs):
    batch = get_new_symbol()
    specs = [mb.TensorSpec(shape=(batch, HIDDEN)), *extra_specs]
    return mb.program(input_specs=specs, opset_version=ct.target.iOS18)(body)


def fan_out(n: int):
    """One mean tiled into every layer of a mul chain."""

    def body(x):
        m = mb.reduce_mean(x=x, axes=[1], keep_dims=True)
        for _ in range(n):
            x = mb.mul(x=x, y=mb.tile(x=m, reps=[1, HIDDEN]))
        return x

    return _program(body)


def mixed(n: int):
    """Tiles of one mean: every other one feeds a concat (kept), the rest an add (removed)."""

    def body(x):
        m = mb.reduce_mean(x=x, axes=[1], keep_dims=True)
        kept = []
        for i in range(n):
            tiled = mb.tile(x=m, reps=[1, HIDDEN])
            if i % 2:
                kept.append(tiled)
            else:
                x = mb.add(x=x, y=tiled)
        return mb.concat(values=[x, *kept], axis=1)

    return _program(body)


def nested(n: int):
    """A cond whose branches, and a while_loop whose body, tile the outer mean into muls."""

    def layers(x, m):
        for _ in range(n):
            x = mb.mul(x=x, y=mb.tile(x=m, reps=[1, HIDDEN]))
        return x

    def body(x):
        m = mb.reduce_mean(x=x, axes=[1], keep_dims=True)
        flag = mb.greater(x=mb.reduce_sum(x=x, axes=[0, 1]), y=np.float32(0.0))
        branched = mb.cond(
            pred=flag,
            _true_fn=lambda: layers(x, m),
            _false_fn=lambda: layers(mb.mul(x=x, y=np.float32(-1.0)), m),
        )

        def loop_body(i, carried):
            return mb.add(x=i, y=np.int32(1)), layers(carried, m)

        _, looped = mb.while_loop(
            _cond=lambda i, carried: mb.less(x=i, y=np.int32(2)),
            _body=loop_body,
            loop_vars=(np.int32(0), branched),
        )
        return looped

    return _program(body)


def _counts(program) -> Counter:
    found: Counter = Counter()

    def walk(block):
        for op in block.operations:
            found[op.op_type] += 1
            for inner in op.blocks:
                walk(inner)

    for function in program.functions.values():
        walk(function)
    return found


def _outputs(program):
    rng = np.random.default_rng(0)
    feeds = [{"x": rng.normal(size=(b, HIDDEN)).astype(np.float32) + 0.5} for b in BATCHES]
    return [evaluate(program, feed) for feed in feeds]


class CountingAdapter:
    """A `MilAdapter` that adds up how many consumers it was asked to list."""

    def __init__(self, inner: MilAdapter):
        self._inner = inner
        self.listed = 0

    def consumers(self, value):
        found = self._inner.consumers(value)
        self.listed += len(found)
        return found

    def __getattr__(self, name):
        return getattr(self._inner, name)


def _rewrite(rules, program):
    before, expected = _counts(program), _outputs(program)
    adapter = CountingAdapter(MilAdapter(program, check_types=True))
    rules.apply_with(adapter)
    program.validate()
    for want, got in zip(expected, _outputs(program)):
        assert want.keys() == got.keys()
        for name in want:
            assert want[name].shape == got[name].shape
            np.testing.assert_allclose(want[name], got[name], rtol=1e-5, atol=1e-6)
    return before, _counts(program), adapter.listed


@pytest.mark.parametrize("n", [40, 300])
def test_fan_out_removes_every_tile_listing_linearly(rules, n):
    before, after, listed = _rewrite(rules, fan_out(n))
    assert before["tile"] == n and after["tile"] == 0
    assert after["mul"] == n and after["reduce_mean"] == 1
    # Each anchor's `every use` lists its one consumer; nothing lists the n
    # uses of the mean per removal (that was n^2/2 = 45,000 at n = 300).
    assert listed <= 4 * n


def test_kept_and_removed_tiles_share_the_mean(rules):
    before, after, listed = _rewrite(rules, mixed(300))
    assert before["tile"] == 300 and after["tile"] == 150
    assert after["concat"] == 1
    assert listed <= 4 * 300


def test_cond_and_while_loop_bodies(rules):
    before, after, _ = _rewrite(rules, nested(10))
    assert before["tile"] == 30 and after["tile"] == 0
    assert after["cond"] == 1 and after["while_loop"] == 1


def test_has_uses_needs_no_consumer_list():
    program = fan_out(3)
    adapter = MilAdapter(program)
    block = program.functions["main"]
    mean = next(op for op in block.operations if op.op_type == "reduce_mean").outputs[0]
    assert adapter.has_uses(mean)
    assert adapter.has_uses(block.outputs[0])  # a function output, used by nothing
    with block:
        lone = mb.const(val=np.zeros((1,), dtype=np.float32), before_op=block.operations[0])
    assert not adapter.has_uses(lone)


def test_one_use_counts_no_further_than_two():
    # The mean feeds 300 tiles; one_use is asked of it without listing them.
    program = fan_out(300)
    adapter = MilAdapter(program)
    block = program.functions["main"]
    mean = next(op for op in block.operations if op.op_type == "reduce_mean").outputs[0]
    tile = next(op for op in block.operations if op.op_type == "tile")
    assert adapter.use_count(mean) == len(adapter.consumers(mean)) == 300
    assert adapter.use_count(mean, 2) == 2
    assert _one_use(adapter, mean) is Truth.NO and _use_count(adapter, mean) == 300
    assert _one_use(adapter, tile.outputs[0]) is Truth.YES  # its one mul
    with block:
        # An op that reads a value twice is one use.
        twice = mb.add(x=tile.outputs[0], y=tile.outputs[0], before_op=block.operations[-1])
    assert adapter.use_count(tile.outputs[0]) == 2 and adapter.use_count(twice.op.inputs["x"], 1) == 1
