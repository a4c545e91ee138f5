"""`replace_uses_in_block`: a bypass at the cost of the uses it moves.

It must leave the program as coremltools' own
`replace_uses_of_var_after_op(..., no_check_var_types=True)` does (the same
inputs, and the same uses of every value, whose order differs only in that
an entry that stays keeps its place), refuse without
changing anything where that call has to do the work (nested blocks, block
outputs, another dtype), and raise as coremltools does for an input it
would not take.
"""

from __future__ import annotations

import random
from collections import Counter

import numpy as np
import pytest
from coremltools.converters.mil.mil import Block, get_new_symbol

import rewrite
from rewrite.backends.mil import MilAdapter, copy_program, ct, mb
from rewrite.backends.mil.uses import UseList, replace_uses_in_block
from tests.engine.test_scale_mil import _counts, _outputs, fan_out, mixed, nested

SHAPE = (3, 4)


def _program(body, dtype=ct.converters.mil.mil.types.fp32):
    return mb.program(input_specs=[mb.TensorSpec(shape=SHAPE, dtype=dtype)], opset_version=ct.target.iOS18)(body)


def _ops(program):
    found = []
    pending = list(program.functions.values())
    while pending:
        block = pending.pop()
        for op in block.operations:
            found.append(op)
            pending.extend(op.blocks)
    return found


def _var(program, name):
    for op in _ops(program):
        for var in op.outputs:
            if var.name == name:
                return var
    for function in program.functions.values():
        for var in function.inputs.values():
            if var.name == name:
                return var
    raise KeyError(name)


def _state(program):
    """Each op's inputs by name, and each value's uses: enough to tell two programs apart."""
    inputs, uses, order = {}, {}, {}
    for op in _ops(program):
        inputs[op.name] = {name: tuple(v.name for v in value) if isinstance(value, (list, tuple)) else value.name
                           for name, value in op.inputs.items()}
        for var in op.outputs:
            uses[var.name] = Counter(child.name for child in var.child_ops)
            order[var.name] = [child.name for child in var.child_ops]
    for function in program.functions.values():
        for var in function.inputs.values():
            uses[var.name] = Counter(child.name for child in var.child_ops)
            order[var.name] = [child.name for child in var.child_ops]
    attributes = {op.name: {name: getattr(op, name).name for name, value in op.inputs.items()
                            if not isinstance(value, (list, tuple))} for op in _ops(program)}
    return inputs, uses, order, attributes


def _random_program(seed: int):
    """A value `old` read in every way an op can read one: twice by one op, in a
    tuple (twice), beside `new`, alongside values that stay; `new` made before it."""
    rng = random.Random(seed)

    def body(x):
        pool = [x]
        new = mb.relu(x=x, name="new")
        pool.append(new)
        for index in range(rng.randrange(0, 4)):
            pool.append(mb.sin(x=rng.choice(pool), name=f"before{index}"))
        old = mb.tanh(x=rng.choice(pool), name="old")
        reads = []
        for index in range(rng.randrange(1, 9)):
            kind = rng.choice(["twice", "beside", "other", "tuple", "tuple_twice", "with_new"])
            other = rng.choice(pool)
            name = f"use{index}"
            if kind == "twice":
                reads.append(mb.add(x=old, y=old, name=name))
            elif kind == "beside":
                reads.append(mb.mul(x=other, y=old, name=name))
            elif kind == "other":
                reads.append(mb.sub(x=old, y=other, name=name))
            elif kind == "tuple":
                reads.append(mb.concat(values=[other, old], axis=0, name=name))
            elif kind == "tuple_twice":
                reads.append(mb.concat(values=[old, other, old], axis=1, name=name))
            else:
                reads.append(mb.maximum(x=new, y=old, name=name))
            if rng.random() < 0.3 and reads[-1].shape == SHAPE:
                pool.append(reads[-1])
        return tuple(value for value in reads if not value.child_ops)

    return mb.program(input_specs=[mb.TensorSpec(shape=SHAPE)], opset_version=ct.target.iOS18)(body)


@pytest.mark.parametrize("seed", range(25))
def test_leaves_the_program_as_coremltools_does(seed):
    program = _random_program(seed)
    ours, theirs = copy_program(program), copy_program(program)
    old, new = _var(ours, "old"), _var(ours, "new")
    moved = [op.name for op in old.child_ops]
    kept = [op.name for op in new.child_ops]
    block = old.op.enclosing_block
    assert replace_uses_in_block(block, old, new, MilAdapter(ours).consumers(old))
    old, new = _var(theirs, "old"), _var(theirs, "new")
    old.op.enclosing_block.replace_uses_of_var_after_op(anchor_op=old.op, old_var=old, new_var=new,
                                                        no_check_var_types=True)
    (inputs, uses, order, attributes), (their_inputs, their_uses, _, their_attributes) = (
        _state(ours), _state(theirs))
    assert inputs == their_inputs and attributes == their_attributes
    assert uses == their_uses
    assert uses["old"] == Counter()
    # The moved uses come after the new value's own, in the old value's order;
    # coremltools also moves to the end the consumers that read it already.
    assert order["new"] == kept + moved
    ours.validate()
    rng = np.random.default_rng(seed)
    feed = {"x": rng.normal(size=SHAPE).astype(np.float32)}
    from rewrite.backends.mil.reference import evaluate

    want, got = evaluate(theirs, feed), evaluate(ours, feed)
    assert want.keys() == got.keys()
    for name in want:
        np.testing.assert_array_equal(want[name], got[name])


def test_moves_uses_into_and_out_of_use_lists():
    def body(x):
        new = mb.relu(x=x, name="new")
        old = mb.tanh(x=x, name="old")
        total = new
        for index in range(40):
            total = mb.add(x=total, y=mb.mul(x=old, y=new, name=f"use{index}"))
        return total

    program = _program(body)
    old, new = _var(program, "old"), _var(program, "new")
    old._child_ops, new._child_ops = UseList(old._child_ops), UseList(new._child_ops)
    before = list(new.child_ops)
    consumers = list(old.child_ops)
    assert replace_uses_in_block(old.op.enclosing_block, old, new, consumers)
    assert len(old.child_ops) == 0
    assert list(new.child_ops) == before + consumers
    assert all(op.y is new and op.inputs["y"] is new for op in consumers)


def _refused(program, old_name, new_name):
    old, new = _var(program, old_name), _var(program, new_name)
    before = _state(program)
    taken = replace_uses_in_block(old.op.enclosing_block, old, new, MilAdapter(program).consumers(old))
    assert _state(program) == before, "a refusal changed the program"
    return not taken


def test_refuses_a_consumer_in_a_nested_block():
    def body(x):
        new = mb.relu(x=x, name="new")
        old = mb.tanh(x=x, name="old")
        flag = mb.greater(x=mb.reduce_sum(x=x, axes=[0, 1]), y=np.float32(0.0))
        inner = mb.cond(pred=flag, _true_fn=lambda: mb.mul(x=old, y=new), _false_fn=lambda: mb.add(x=old, y=new))
        return mb.add(x=inner, y=old)

    assert _refused(_program(body), "old", "new")


def test_refuses_a_consumer_with_blocks():
    def body(x):
        new = mb.relu(x=x, name="new")
        old = mb.tanh(x=x, name="old")
        looped = mb.while_loop(
            _cond=lambda v: mb.less(x=mb.reduce_sum(x=v, axes=[0, 1]), y=np.float32(100.0)),
            _body=lambda v: [mb.add(x=v, y=np.float32(1.0))],
            loop_vars=(old,),
        )
        return mb.add(x=looped, y=new)

    assert _refused(_program(body), "old", "new")


def test_refuses_a_block_output():
    def body(x):
        new = mb.relu(x=x, name="new")
        old = mb.tanh(x=x, name="old")
        return mb.add(x=old, y=new), old

    assert _refused(_program(body), "old", "new")


def test_refuses_another_dtype():
    def body(x):
        new = mb.cast(x=x, dtype="fp16", name="new")
        old = mb.tanh(x=x, name="old")
        return mb.add(x=old, y=x), new

    assert _refused(_program(body), "old", "new")


def test_refuses_a_function_input():
    def body(x):
        new = mb.relu(x=x, name="new")
        return mb.add(x=x, y=new)

    program = _program(body)
    x, new = _var(program, "x"), _var(program, "new")
    assert not replace_uses_in_block(program.functions["main"], x, new, list(x.child_ops))


def test_an_input_coremltools_would_refuse_raises_before_any_change():
    # transpose's perm must be known at compile time: a shape read at run time is refused.
    def body(x):
        perm = mb.const(val=np.array([1, 0], dtype=np.int32), name="old")
        runtime = mb.shape(x=x, name="new")
        return mb.add(x=runtime, y=perm), mb.transpose(x=x, perm=perm)

    for replace in ("ours", "theirs"):
        spec = mb.TensorSpec(shape=(get_new_symbol(), 4))
        program = mb.program(input_specs=[spec], opset_version=ct.target.iOS18)(body)
        old, new = _var(program, "old"), _var(program, "new")
        before = _state(program)
        with pytest.raises(ValueError, match="must be const"):
            if replace == "ours":
                replace_uses_in_block(old.op.enclosing_block, old, new, MilAdapter(program).consumers(old))
            else:
                old.op.enclosing_block.replace_uses_of_var_after_op(anchor_op=old.op, old_var=old, new_var=new,
                                                                    no_check_var_types=True)
        if replace == "ours":
            assert _state(program) == before


@pytest.fixture(scope="module")
def rules():
    return rewrite.load_rules(dialects=["mil"]).only("remove_broadcast_tiles")


@pytest.mark.parametrize("build, tiles, kept", [(lambda: mixed(100), 100, 50), (lambda: fan_out(80), 80, 0),
                                                (lambda: nested(20), 60, 0)])
def test_a_run_bypasses_without_coremltools_replace(rules, monkeypatch, build, tiles, kept):
    calls = []
    original = Block.replace_uses_of_var_after_op

    def counting(self, *args, **kwargs):
        calls.append(kwargs.get("old_var"))
        return original(self, *args, **kwargs)

    monkeypatch.setattr(Block, "replace_uses_of_var_after_op", counting)
    program = build()
    before, expected = _counts(program), _outputs(program)
    reference = copy_program(program)
    monkeypatch.setattr("rewrite.backends.mil.editing.replace_uses_in_block", lambda *args: False)
    calls.clear()
    rules.apply(reference)
    assert len(calls) == tiles - kept  # the probe sees coremltools' path when it is taken
    monkeypatch.undo()
    monkeypatch.setattr(Block, "replace_uses_of_var_after_op", counting)
    calls.clear()
    rules.apply(program)
    assert calls == []
    assert before["tile"] == tiles and _counts(program) == _counts(reference)
    assert _counts(program)["tile"] == kept
    program.validate()
    for want, got in zip(expected, _outputs(program)):
        for name in want:
            np.testing.assert_allclose(want[name], got[name], rtol=1e-5, atol=1e-6)


def test_a_remembered_verdict_is_the_one_coremltools_gives():
    # Each input is offered values of several kinds, twice (the second time
    # from what was remembered): `_validate` raises exactly when
    # `InputSpec.validate_inputs` does.
    from rewrite.backends.mil.uses import _validate

    def body(x):
        values = [x, mb.relu(x=x), mb.cast(x=x, dtype="int32"), mb.cast(x=x, dtype="fp16"),
                  mb.reduce_sum(x=x, axes=[0, 1]), mb.shape(x=x), mb.const(val=np.array([1, 0], dtype=np.int32))]
        ops = [mb.add(x=x, y=x).op, mb.transpose(x=x, perm=[1, 0]).op, mb.tile(x=x, reps=[1, 2]).op,
               mb.cast(x=x, dtype="fp16").op, mb.logical_not(x=mb.cast(x=x, dtype="bool")).op]
        accepted: dict = {}
        verdicts = []
        for _ in range(2):
            for op in ops:
                for name in op.input_spec.input_types:
                    if op._input_vars.get(name) is None:
                        continue
                    for value in values:
                        try:
                            op.input_spec.validate_inputs(op.name, op.op_type, {name: value})
                            theirs = True
                        except ValueError:
                            theirs = False
                        try:
                            _validate(op, {name: value}, accepted)
                            ours = True
                        except ValueError:
                            ours = False
                        assert ours == theirs, (op.op_type, name, value.name)
                        verdicts.append(theirs)
        assert True in verdicts and False in verdicts
        assert accepted
        return x

    spec = mb.TensorSpec(shape=(get_new_symbol(), 4))
    mb.program(input_specs=[spec], opset_version=ct.target.iOS18)(body)
