"""`UseList`: a value's consumers with O(1) removal, swapped in only while a run edits.

The sequence must answer as the plain list it stands for, and a run over a
value with many consumers must never scan a long list to drop one (every
other tile of a shared mean kept made that quadratic in coremltools' list).
"""

from __future__ import annotations

import random

import numpy as np
import pytest
from coremltools.converters.mil.mil import get_new_symbol

import rewrite
from rewrite.backends.mil import MilAdapter, ct, mb
from rewrite.backends.mil.pymil import Var
from rewrite.backends.mil.uses import MANY_USES, UseList, truncate_uses
from tests.engine.test_scale_mil import _counts, _outputs, fan_out, mixed, nested


class Op:
    """Hashable by identity, like coremltools' Operation."""

    def __init__(self, name):
        self.name = name

    def __repr__(self):
        return self.name


@pytest.mark.parametrize("seed", range(20))
def test_answers_as_the_plain_list(seed):
    rng = random.Random(seed)
    ops = [Op(f"op{i}") for i in range(6)]
    start = [rng.choice(ops) for _ in range(rng.randrange(0, 60))]
    plain, uses = list(start), UseList(start)
    for _ in range(300):
        action = rng.random()
        op = rng.choice(ops)
        if action < 0.4:
            plain.append(op)
            uses.append(op)
        elif action < 0.8:
            if op in plain:
                plain.remove(op)
                uses.remove(op)
            else:
                with pytest.raises(ValueError):
                    uses.remove(op)
        elif action < 0.9 and plain:
            position = rng.randrange(len(plain))
            assert uses[position] is plain[position]
            assert uses[-1] is plain[-1]
            assert uses[1:3] == plain[1:3] and type(uses[1:3]) is list
            assert uses.index(plain[position]) == plain.index(plain[position])
        else:
            length = rng.randrange(0, len(plain) + 1)
            del plain[length:]
            uses.truncate(length)
        assert list(uses) == plain and uses.as_list() == plain
        assert len(uses) == len(plain) and bool(uses) == bool(plain)
        assert [uses.count(o) for o in ops] == [plain.count(o) for o in ops]
        assert [o in uses for o in ops] == [o in plain for o in ops]
        assert uses == plain


def test_truncate_on_a_plain_list_too():
    class Holder:
        _child_ops = [1, 2, 3, 4]

    holder = Holder()
    truncate_uses(holder, 2)
    assert holder._child_ops == [1, 2]


def _long_scans(monkeypatch, front_limit=None):
    """Record each removal of a consumer from a long plain list that is not its first entry
    (with `front_limit`, also a first entry of a list longer than that: the rest moves)."""
    scans = []
    original = Var.remove_child_op

    def remove_child_op(self, target_op, no_check=False):
        children = self._child_ops
        if type(children) is list and len(children) >= MANY_USES and children and (
                children[0] is not target_op or (front_limit is not None and len(children) > front_limit)):
            scans.append((self.name, len(children)))
        return original(self, target_op, no_check)

    monkeypatch.setattr(Var, "remove_child_op", remove_child_op)
    return scans


def _child_lists(program):
    found = []

    def walk(block):
        for op in block.operations:
            found.extend(type(v._child_ops) for v in op.outputs)
            for inner in op.blocks:
                walk(inner)

    for function in program.functions.values():
        found.extend(type(v._child_ops) for v in function.inputs.values())
        walk(function)
    return found


@pytest.fixture(scope="module")
def rules():
    return rewrite.load_rules(dialects=["mil"]).only("remove_broadcast_tiles")


@pytest.mark.parametrize("build, tiles, kept", [(lambda: mixed(400), 400, 200), (lambda: fan_out(300), 300, 0),
                                                (lambda: nested(60), 180, 0)])
def test_a_run_never_scans_a_long_list_to_drop_a_use(rules, monkeypatch, build, tiles, kept):
    program = build()
    before, expected = _counts(program), _outputs(program)
    scans = _long_scans(monkeypatch)
    rules.apply(program)
    assert scans == []
    assert before["tile"] == tiles and _counts(program)["tile"] == kept
    assert set(_child_lists(program)) == {list}  # plain lists again once the run is over
    program.validate()
    for want, got in zip(expected, _outputs(program)):
        for name in want:
            np.testing.assert_allclose(want[name], got[name], rtol=1e-5, atol=1e-6)


def test_without_the_swap_the_kept_tiles_are_scanned(rules, monkeypatch):
    # The probe above can fail: with the swap off, each tile removed scans
    # past the kept ones before it in the mean's list.
    monkeypatch.setattr("rewrite.backends.mil.uses.MANY_USES", 10**9)
    program = mixed(400)
    scans = _long_scans(monkeypatch)
    rules.apply(program)
    assert _counts(program)["tile"] == 200
    assert len(scans) >= 150


def test_a_failed_build_leaves_a_long_use_list_as_it_was():
    program = fan_out(MANY_USES + 8)
    adapter = MilAdapter(program)
    block = program.functions["main"]
    mean = next(op for op in block.operations if op.op_type == "reduce_mean").outputs[0]
    adapter._use_lists.prepare(mean)
    assert type(mean._child_ops) is UseList
    before = list(mean.child_ops)
    with pytest.raises(ValueError):
        # Core ML's attention takes rank >= 3; coremltools refuses the rank-2 mean.
        adapter.build("scaled_dot_product_attention", {"query": mean, "key": mean, "value": mean},
                      block.operations[-1], "bad")
    assert list(mean.child_ops) == before
    adapter.finish()
    assert type(mean._child_ops) is list and mean.child_ops == before


def test_removing_a_cond_drops_its_bodies_uses_without_a_scan(monkeypatch):
    # The ops of a removed cond's branches read the outer mean, whose list
    # starts with kept tiles: each of their entries goes without a scan too.
    def body(x):
        m = mb.reduce_mean(x=x, axes=[1], keep_dims=True)
        kept = [mb.tile(x=m, reps=[1, 8]) for _ in range(MANY_USES + 4)]
        flag = mb.greater(x=mb.reduce_sum(x=x, axes=[0, 1]), y=np.float32(0.0))
        mb.cond(pred=flag, _true_fn=lambda: mb.mul(x=x, y=m), _false_fn=lambda: mb.add(x=x, y=m))
        return mb.concat(values=[x, *kept], axis=1)

    program = mb.program(input_specs=[mb.TensorSpec(shape=(get_new_symbol(), 8))],
                         opset_version=ct.target.iOS18)(body)
    block = program.functions["main"]
    cond = next(op for op in block.operations if op.op_type == "cond")
    mean = next(op for op in block.operations if op.op_type == "reduce_mean").outputs[0]
    uses_before = len(mean.child_ops)
    adapter = MilAdapter(program)
    scans = _long_scans(monkeypatch)
    adapter.remove_op(cond)
    assert scans == []
    assert len(mean.child_ops) == uses_before - 2  # the branches' mul and add
    assert all(op.op_type == "tile" for op in mean.child_ops)
    adapter.finish()
    assert type(mean._child_ops) is list
    program.validate()


@pytest.mark.parametrize("front, moved", [(64, False), (10**9, True)])
def test_a_long_list_loses_no_first_entry_either(rules, monkeypatch, front, moved):
    # Dropping a list's first entry moves all the others: past CHEAP_FRONT
    # (64 here) the list is swapped too; with no limit, the probe sees it.
    monkeypatch.setattr("rewrite.backends.mil.uses.CHEAP_FRONT", front)
    program = fan_out(300)
    expected = _outputs(program)
    scans = _long_scans(monkeypatch, front_limit=64)
    rules.apply(program)
    assert _counts(program)["tile"] == 0
    assert bool(scans) is moved
    for want, got in zip(expected, _outputs(program)):
        for name in want:
            np.testing.assert_allclose(want[name], got[name], rtol=1e-5, atol=1e-6)
