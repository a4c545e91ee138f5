"""What an example's operands may be: values, tuples of values, and constants,
typed ones (`as_dtype(3.0, fp16)`) included; and what the checker refuses."""

from __future__ import annotations

import numpy as np
import pytest

import rewrite
from rewrite.engine.interfaces import NamedValue
from rewrite.examples import ExampleError, example_ops, run_examples
from rewrite.language import ast
from rewrite.language.errors import RuleError
from rewrite.language.parser import parse_rules


def _ops(body: str) -> list:
    """The ops of one example whose statements are `body`, as build_example takes them."""
    text = f'dialect mil\nrule r "d"\n  match %a = relu(x=%x)\n  rewrite %a -> %x\n  example "e"\n{body}\n  unchanged\n'
    (rule,) = parse_rules(text, "ops.rules").rules
    return example_ops(rule.examples[0].statements)


def _errors(write_rules, text: str) -> list[str]:
    """Each error as rendered, the file named without its folder."""
    path = write_rules(text)
    with pytest.raises(RuleError) as raised:
        rewrite.load_rules(path)
    return [d.render().replace(f"{path.parent}/", "") for d in raised.value.diagnostics]


# ---------------------------------------------------------------- parsing


def test_a_tuple_argument_parses_with_one_or_more_items_and_a_trailing_comma():
    text = """dialect mil
rule r "d"
  match %a = relu(x=%x)
  rewrite %a -> %x
  example "e"
    input %x: fp32[2]
    %c = concat(values=(%x, %x,), axis=0, interleave=false)
    %d = concat(values=(%c,), axis=0, interleave=false)
    %e = relu(x=(%d))
    output %e
  unchanged
"""
    statements = parse_rules(text, "t.rules").rules[0].examples[0].statements
    two, one, grouped = (s.build.arguments[0].value for s in statements[1:4])
    assert isinstance(two, ast.TupleExpr) and [i.var for i in two.items] == ["%x", "%x"]
    assert isinstance(one, ast.TupleExpr) and [i.var for i in one.items] == ["%c"]
    assert grouped == ast.ValueRef("%d", grouped.span)  # parentheses alone make no tuple
    # The tuple points at its "(".
    assert (two.span.line, two.span.column) == (7, 24)


def test_a_tuple_in_a_pattern_says_how_to_match_a_variadic_operand():
    text = 'dialect mil\nrule r "d"\n  match %c = concat(values=(%a, %b), axis=_, interleave=_)\n  rewrite %c -> %a\n'
    with pytest.raises(RuleError) as raised:
        parse_rules(text, "p.rules")
    (diagnostic,) = raised.value.diagnostics
    assert (diagnostic.span.line, diagnostic.span.column) == (3, 28)
    assert "a tuple is not a pattern" in diagnostic.message and "values=%values" in diagnostic.message


# ---------------------------------------------------------------- evaluation


def test_values_tuples_and_untyped_constants():
    ops = _ops("    input %x: fp32[2]\n"
               "    %c = concat(values=(%x, %x), axis=0 - 1, interleave=false)\n"
               "    %t = tile(x=%c, reps=[2 * 1])\n"
               "    %m = maximum(x=%t, y=-inf)\n"
               "    output %m")
    (_, _, concat), (_, _, tile), (_, _, maximum) = ops
    assert concat == {"values": (NamedValue("x"), NamedValue("x")), "axis": -1, "interleave": False}
    assert tile == {"x": NamedValue("c"), "reps": [2]}
    assert maximum["y"] == float("-inf") and type(maximum["y"]) is float


@pytest.mark.parametrize("written, dtype, value", [
    ("as_dtype(3.0, fp16)", np.float16, 3.0),
    ("as_dtype([1, 2], int8)", np.int8, [1, 2]),
    ("as_dtype(max_finite(fp16), fp16)", np.float16, 65504.0),
    ("zero_of(fp16)", np.float16, 0.0),
])
def test_typed_constants_keep_their_dtype(written, dtype, value):
    ((_, _, operands),) = _ops(f"    input %x: fp16[2]\n    %y = add(x=%x, y={written})\n    output %y")
    constant = operands["y"]
    assert isinstance(constant, (np.ndarray, np.generic)) and constant.dtype == dtype
    assert np.asarray(constant).tolist() == value


def test_an_operand_that_evaluates_to_no_constant_is_an_error_at_its_place():
    with pytest.raises(ExampleError) as raised:
        _ops("    input %x: fp16[2]\n    %y = add(x=%x, y=as_dtype(sqrt(0 - 1), fp16))\n    output %y")
    assert (raised.value.span.line, raised.value.span.column) == (7, 22)
    assert "does not evaluate to a constant" in raised.value.message


# ---------------------------------------------------------------- the checker


def test_an_example_operand_cannot_read_the_graph(write_rules):
    errors = _errors(write_rules, """
        dialect mil
        rule r "d"
          match %a = relu(x=%x)
          rewrite %a -> %x
          example "e"
            input %x: fp32[2]
            %b = add(x=%x, y=dim(%x, 0))
            %c = add(x=%b, y=[%x, %x])
            %d = add(x=%c, y=1 + const(%x))
            output %d
          unchanged
        """)
    assert errors[0].startswith("test.rules:7:22: error: 'dim' reads the graph, which an example cannot")
    assert errors[1].startswith("test.rules:8:22: error: a list holds constants, not values; "
                                "a variadic operand takes a tuple: (%a, %b)")
    assert errors[2].startswith("test.rules:9:26: error: 'const' reads the graph")
    assert len(errors) == 3
    assert errors[0].endswith("      %b = add(x=%x, y=dim(%x, 0))\n" + " " * 23 + "^")  # the caret under `dim`


def test_a_dtype_called_as_a_function_points_to_as_dtype(write_rules):
    (error,) = _errors(write_rules, """
        dialect mil
        rule r "d"
          match %a = relu(x=%x)
          rewrite %a -> %x
          example "e"
            input %x: fp16[2]
            %b = add(x=%x, y=fp16(3.0))
            output %b
          unchanged
        """)
    assert "unknown function 'fp16'; a constant of a dtype is written as_dtype(x, fp16)" in error


def test_a_tuple_only_where_a_variadic_operand_takes_one(write_rules):
    errors = _errors(write_rules, """
        dialect mil
        rule r "d"
          match %a = relu(x=%x)
          rewrite %a -> relu(x=(%x, %x))
          example "e"
            input %x: fp32[2]
            %b = relu(x=(%x, %x))
            output %b
          unchanged
        """)
    assert errors[0].startswith("test.rules:4:24: error: operand 'x' of 'relu' takes one value, not a tuple")
    assert errors[1].startswith("test.rules:7:17: error: operand 'x' of 'relu' takes one value, not a tuple")


def test_a_rewrite_builds_a_tuple_of_values_and_constants(write_rules):
    rewrite.load_rules(write_rules("""
        dialect mil
        rule r "d"
          match %c = concat(values=%v, axis=_, interleave=_)
          where len(%v) == 2
          rewrite
            %d = concat(values=(%v[1], 1, %v[0]), axis=0, interleave=false)
            %e = concat(values=(%v[i] for i in range(len(%v)) if i > 0), axis=0, interleave=false)
            %c -> %c with values=(%d, %e)
        """))


def test_a_tuple_in_a_rebuild_takes_a_variadic_operand_too(write_rules):
    (error,) = _errors(write_rules, """
        dialect mil
        rule r "d"
          match %a = relu(x=%x)
          rewrite %a -> %a with x=(%x,)
        """)
    assert error.startswith("test.rules:4:27: error: operand 'x' of 'relu' takes one value, not a tuple")


def test_an_example_lists_a_tuples_items(write_rules):
    (error,) = _errors(write_rules, """
        dialect mil
        rule r "d"
          match %a = relu(x=%x)
          rewrite %a -> %x
          example "e"
            input %x: fp32[2]
            %b = concat(values=(%x for i in [1, 2]), axis=0, interleave=false)
            output %b
          unchanged
        """)
    assert "an example lists a tuple's items: (%a, %b)" in error


def test_an_operand_given_twice_is_an_error(write_rules):
    (error,) = _errors(write_rules, """
        dialect mil
        rule r "d"
          match %a = relu(x=%x)
          rewrite %a -> add(x=%x, y=1.0, y=2.0)
        """)
    assert "operand 'y' given twice" in error


# ---------------------------------------------------------------- running them

FP16_RULE = """
dialect mil
rule add_typed_zero "x + 0 is x, in fp16"
  match %a = add(x=%x, y=%zero)
  where is_const(%zero) and const(%zero) == 0
  where dtype(%x) == dtype(%a) and shape(%x) == shape(%a)
  rewrite %a -> %x
  example "an fp16 zero"
    input %x: fp16[B, 3]
    %a = add(x=%x, y=as_dtype(0.0, fp16))
    %out = relu(x=%a)
    output %out
  becomes
    %out = relu(x=%x)
  example "an fp16 constant that is no zero"
    input %x: fp16[B, 3]
    %a = add(x=%x, y=as_dtype([0.0, 1.5, 0.0], fp16))
    output %a
  unchanged
"""


def test_an_fp16_constant_in_a_mil_example_is_built_as_fp16(write_rules):
    # Before, `as_dtype` in an example passed `check` and failed `test`.
    results = run_examples(rewrite.load_rules(write_rules(FP16_RULE)))
    assert [(r.description, r.passed, r.message) for r in results] == [
        ("an fp16 zero", True, ""), ("an fp16 constant that is no zero", True, "")
    ]


def test_a_becomes_graph_with_an_fp32_constant_where_fp16_was_built_differs(write_rules):
    # The constant a rule builds is compared with its dtype: fp32 0.5 is not fp16 0.5.
    text = """
        dialect mil
        rule halve "x / 2 is x * 0.5"
          match %d = real_div(x=%x, y=%two)
          where is_const(%two) and const(%two) == 2 and dtype(%x) == fp16
          rewrite %d -> mul(x=%x, y=as_dtype(0.5, fp16))
          example "e"
            input %x: fp16[3]
            %d = real_div(x=%x, y=as_dtype(2.0, fp16))
            output %d
          becomes
            %d = mul(x=%x, y=as_dtype(0.5, {dtype}))
        """
    (passing,) = run_examples(rewrite.load_rules(write_rules(text.replace("{dtype}", "fp16"))))
    assert passing.passed, passing.message
    (failing,) = run_examples(rewrite.load_rules(write_rules(text.replace("{dtype}", "fp32"), "other.rules")))
    assert not failing.passed


SUM_RULE = """
dialect onnx
rule sum_of_one "A Sum of one input is that input."
  match %s = Sum(%x)
  rewrite %s -> %x
  example "a Sum of two inputs stays"
    input %a: fp32[B, 3]
    input %b: fp32[B, 3]
    %s = Sum(data_0=(%a, %b))
    %c = Concat(inputs=(%s, %a), axis=0)
    output %c
  unchanged
  example "a Sum of one input goes"
    input %a: fp32[B, 3]
    %s = Sum(data_0=(%a,))
    %r = Relu(X=%s)
    output %r
  becomes
    %r = Relu(X=%a)
"""


def test_tuples_of_values_in_onnx_examples(write_rules):
    results = run_examples(rewrite.load_rules(write_rules(SUM_RULE)))
    assert [(r.passed, r.message) for r in results] == [(True, ""), (True, "")]


CONCAT_RULE = """
dialect mil
rule concat_of_one "A concat of one value is the value."
  match %c = concat(%only, _, _)
  where shape(%only) == shape(%c)
  rewrite %c -> %only
  example "two values stay"
    input %a: fp32[2, 3]
    input %b: fp32[2, 3]
    %c = concat(values=(%a, %b), axis=0, interleave=false)
    output %c
  unchanged
  example "one value goes"
    input %a: fp32[2, 3]
    %c = concat(values=(%a,), axis=0, interleave=false)
    %d = relu(x=%c)
    output %d
  becomes
    %d = relu(x=%a)
"""


def test_tuples_of_values_in_mil_examples(write_rules):
    results = run_examples(rewrite.load_rules(write_rules(CONCAT_RULE)))
    assert [(r.passed, r.message) for r in results] == [(True, ""), (True, "")]


ONNX_FP16_RULE = """
dialect onnx
rule add_typed_zero "x + 0 is x, in fp16"
  match %a = Add(%x, %zero)
  where is_const(%zero) and const(%zero) == 0
  where dtype(%x) == dtype(%a) and shape(%x) == shape(%a)
  rewrite %a -> %x
  example "an fp16 zero"
    input %x: fp16[B, 3]
    %a = Add(A=%x, B=as_dtype(0.0, fp16))
    %r = Relu(X=%a)
    output %r
  becomes
    %r = Relu(X=%x)
"""


def test_an_fp16_constant_in_an_onnx_example_is_built_as_fp16(write_rules):
    (result,) = run_examples(rewrite.load_rules(write_rules(ONNX_FP16_RULE)))
    assert result.passed, result.message
