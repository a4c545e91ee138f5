"""Rewrite actions on MIL: new ops before the anchor, rebuilding the anchor, output names."""

from __future__ import annotations

import numpy as np
import pytest

import rewrite
from rewrite.backends.mil import count_ops, ct, mb
from rewrite.backends.mil.reference import evaluate

WIDEN_SELECT = """
dialect mil
rule widen_select_operand "select's a operand is widened to b's shape by adding zeros"
  match %s = select(cond=%c, a=%a, b=%b)
  where rank(%a) < rank(%b)
  rewrite
    %zero = fill_like(ref_tensor=%b, value=0.0)
    %wide = add(x=%a, y=%zero)
    %s -> %s with a=%wide
"""

SQUARE = """
dialect mil
rule square_as_pow "mul(x, x) becomes pow(x, 2)"
  match %m = mul(x=%x, y=%x)
  rewrite %m -> pow(x=%x, y=2.0)
"""


def _select_program():
    @mb.program(input_specs=[mb.TensorSpec(shape=(4, 8), dtype=ct.converters.mil.mil.types.bool),
                             mb.TensorSpec(shape=(8,)), mb.TensorSpec(shape=(4, 8))],
                opset_version=ct.target.iOS18)
    def program(mask, a, b):
        return mb.select(cond=mask, a=a, b=b, name="picked")

    return program


def test_build_before_the_anchor_and_rebuild_it(write_rules):
    program = _select_program()
    rng = np.random.default_rng(0)
    inputs = {"mask": rng.random((4, 8)) > 0.5, "a": rng.normal(size=8), "b": rng.normal(size=(4, 8))}
    before = evaluate(program, inputs)
    statistics = rewrite.load_rules(write_rules(WIDEN_SELECT)).apply(program, check_types=True)
    program.validate()
    assert statistics.fired("widen_select_operand") == 1
    assert count_ops(program, "select") == 1 and count_ops(program, "fill_like") == 1
    assert count_ops(program, "add") == 1
    function = program.functions["main"]
    assert [v.name for v in function.outputs] == ["picked"]  # the output keeps its name
    (select,) = [op for op in function.operations if op.op_type == "select"]
    assert select.a.op.op_type == "add" and select.a.shape == (4, 8)
    assert select.name.startswith("widen_select_operand")  # new ops carry the rule's name
    # Rebuilt ops come before their uses, so the program still reads in order.
    order = [op.op_type for op in function.operations if op.op_type != "const"]
    assert order.index("fill_like") < order.index("add") < order.index("select")
    after = evaluate(program, inputs)
    np.testing.assert_array_equal(after["picked"], before["picked"])
    # Once widened, the rule no longer applies.
    assert rewrite.load_rules(write_rules(WIDEN_SELECT)).apply(program).fires == 0


def test_replace_with_a_new_op_and_literal_operands(write_rules):
    @mb.program(input_specs=[mb.TensorSpec(shape=(3,))], opset_version=ct.target.iOS18)
    def program(x):
        return mb.add(x=mb.mul(x=x, y=x), y=1.0, name="out")

    inputs = {"x": np.array([1.0, -2.0, 3.0])}
    before = evaluate(program, inputs)["out"]
    statistics = rewrite.load_rules(write_rules(SQUARE)).apply(program, check_types=True)
    program.validate()
    assert statistics.fired("square_as_pow") == 1
    assert count_ops(program, "mul") == 0 and count_ops(program, "pow") == 1
    np.testing.assert_allclose(evaluate(program, inputs)["out"], before)


def test_negative_mul_of_two_values_is_left_alone(write_rules):
    @mb.program(input_specs=[mb.TensorSpec(shape=(3,)), mb.TensorSpec(shape=(3,))],
                opset_version=ct.target.iOS18)
    def program(x, y):
        return mb.mul(x=x, y=y, name="out")

    assert rewrite.load_rules(write_rules(SQUARE)).apply(program).fires == 0
    assert count_ops(program, "mul") == 1


UNSOUND_TILE_BYPASS = """
dialect mil
rule drop_every_tile "drops tiles with no condition at all: unsound"
  match %t = tile(x=%x, reps=%reps)
  rewrite %t -> %x
"""


def test_checked_mode_names_an_unsound_rule(write_rules):
    @mb.program(input_specs=[mb.TensorSpec(shape=(4, 1))], opset_version=ct.target.iOS18)
    def program(x):
        # exp keeps its operand's shape, so bypassing the tile shrinks it to (4, 1).
        # (A consumer such as reduce_sum over the tiled axis would keep its
        # shape and change only values: type checks cannot see that.)
        return mb.exp(x=mb.tile(x=x, reps=[1, 8]), name="out")

    rules = rewrite.load_rules(write_rules(UNSOUND_TILE_BYPASS))
    with pytest.raises(rewrite.UnsoundRewriteError, match=r"rule 'drop_every_tile' changed a type") as raised:
        rules.apply(program, check_types=True)
    assert "out" in str(raised.value)


def test_an_absent_optional_operand_matches_no_op_pattern(write_rules):
    # `%r is neg(...)` of an operand that is absent: no op produces it, so it
    # is simply no match (it crashed on the absent marker's missing producer).
    from rewrite.backends.mil import build_example
    from rewrite.engine.interfaces import NamedValue

    rules = rewrite.load_rules(write_rules("""
        dialect mil
        rule r "a slice_update whose stride is a relu"
          match %s = slice_update(x=%x, update=%u, begin=%b, end=%e, stride=%st?)
          where %st is relu(x=_)
          rewrite %s -> %x
    """))
    program = build_example(
        [("x", "fp32", [4]), ("u", "fp32", [2])],
        [("s", "slice_update", {"x": NamedValue("x"), "update": NamedValue("u"), "begin": [0], "end": [2]})],
        ["s"],
    )
    assert rules.apply(program).fires == 0


def test_replacing_an_operand_in_one_consumer_removes_what_that_left_dead(write_rules):
    """`%rows -> %narrow in %sum` changes one operand of one op; where that was the old
    value's last use, its producer (and what only it read) goes with the rewrite, as it does
    for a replacement of every use, instead of waiting for a dead-code pass: a later rule's
    one_use of the range the old gather read would otherwise see the dead gather."""
    @mb.program(input_specs=[mb.TensorSpec(shape=(1, 3, 2))], opset_version=ct.target.iOS18)
    def program(tokens):
        positions = mb.range_1d(start=0, end=3, step=1)
        expanded = mb.expand_dims(x=positions, axes=[0])
        table = np.arange(8.0, dtype=np.float32).reshape(4, 2)
        rows = mb.gather(x=table, indices=expanded, axis=0, batch_dims=0)
        return mb.add(x=tokens, y=rows, name="out")

    before = evaluate(program, {"tokens": np.ones((1, 3, 2), np.float32)})["out"]
    rules = rewrite.load_rules().only("add_rows_without_leading_axes")
    statistics = rules.apply(program)
    assert statistics.fired("add_rows_without_leading_axes") == 1
    operations = [op.op_type for op in program.functions["main"].operations if op.op_type != "const"]
    assert operations == ["range_1d", "gather", "add"]  # no expand_dims, no second gather
    after = evaluate(program, {"tokens": np.ones((1, 3, 2), np.float32)})["out"]
    np.testing.assert_array_equal(after, before)
