"""rewrite.language.cycles: rules that undo each other are a warning of `rewrite check`, at file:line:col.

Each positive case is a cycle `apply` really goes round until its sweep cap
(one is run to show it); each negative case is one a rule's text rules out:
a replacement the other's pattern cannot match, a condition it cannot meet,
or a cycle that shrinks the graph.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import TensorProto, helper

import rewrite
from rewrite import cli

RELU_AS_LEAKY = """
dialect onnx

rule relu_as_leaky
  "A Relu is a LeakyRelu of slope 0."
  match %y = Relu(X=%x)
  rewrite %y -> LeakyRelu(X=%x, alpha=0.0)
"""

PAIR = RELU_AS_LEAKY + """
rule leaky_as_relu
  "A LeakyRelu of slope 0 is a Relu."
  match %y = LeakyRelu(X=%x)
  where attribute(%y, "alpha") == 0.0
  rewrite %y -> Relu(X=%x)
"""

THREE = RELU_AS_LEAKY + """
rule leaky_as_thresholded
  "A lint test: each rule's op the next one's anchor."
  match %y = LeakyRelu(X=%x)
  rewrite %y -> ThresholdedRelu(X=%x, alpha=0.0)

rule thresholded_as_relu
  "A lint test."
  match %y = ThresholdedRelu(X=%x)
  rewrite %y -> Relu(X=%x)
"""


def _relu_over(first: str) -> str:
    """A Relu over a `first` becomes a LeakyRelu over it; a LeakyRelu over an Exp becomes a Relu over it."""
    return f"""
dialect onnx

rule relu_over_{first.lower()}_as_leaky
  "A lint test."
  match %y = Relu(X=%v = {first}(X=_))
  rewrite %y -> LeakyRelu(X=%v, alpha=0.0)

rule leaky_over_exp_as_relu
  "A lint test."
  match %y = LeakyRelu(X=%e = Exp(input=_))
  rewrite %y -> Relu(X=%e)
""".replace("Exp(X=_)", "Exp(input=_)")


# The Exp the first rule matched is the one the second asks for, and back.
THROUGH_A_MATCHED_OP = _relu_over("Exp")

# The second is anchored on the LeakyRelu the first builds, but only over an
# Exp, and the first builds it over the Sigmoid it matched.
PATTERN_CANNOT_MATCH = _relu_over("Sigmoid")

# Each builds the other's anchor, over anything; but the second gives the
# first a constant `repeats`, which the first asks not to be one.
CONDITION_CANNOT_HOLD = """
dialect onnx

rule tile_as_expand
  "A lint test, not a sound rule."
  match %y = Tile(input=%x, repeats=%r)
  where not is_const(%r)
  rewrite %y -> Expand(input=%x, shape=[1, 2])

rule expand_as_tile
  "A lint test."
  match %y = Expand(input=%x, shape=%s)
  rewrite %y -> Tile(input=%x, repeats=%s)
"""

# Two Relus become one LeakyRelu, which becomes one Relu: fewer ops each time round.
SHRINKS = """
dialect onnx

rule two_relus_as_leaky
  "A lint test."
  match %y = Relu(X=Relu(X=%x))
  rewrite %y -> LeakyRelu(X=%x, alpha=0.0)

rule leaky_as_relu
  "A lint test."
  match %y = LeakyRelu(X=%x)
  rewrite %y -> Relu(X=%x)
"""


def _cycle_warnings(rules):
    return [w for w in rules.warnings if "may undo each other" in w.message]


def test_two_rules_that_undo_each_other_are_a_warning_at_the_first(write_rules):
    path = write_rules(PAIR)
    (warning,) = _cycle_warnings(rewrite.load_rules(path))
    assert warning.severity == "warning"
    assert (warning.span.file, warning.span.line, warning.span.column) == (str(path), 3, 6)
    assert warning.message.startswith(f"rules 'relu_as_leaky' and 'leaky_as_relu' ({path}:8:6) may undo each other")
    assert "'relu_as_leaky' builds a LeakyRelu that 'leaky_as_relu' is anchored on" in warning.message
    assert "'leaky_as_relu' a Relu that 'relu_as_leaky' is" in warning.message
    assert warning.render().startswith(f"{path}:3:6: warning: rules 'relu_as_leaky'")


def test_three_rules_in_turn_are_one_warning_naming_all_three(write_rules):
    path = write_rules(THREE)
    (warning,) = _cycle_warnings(rewrite.load_rules(path))
    assert (warning.span.line, warning.span.column) == (3, 6)
    assert warning.message.startswith(
        f"rules 'relu_as_leaky', 'leaky_as_thresholded' ({path}:8:6), and 'thresholded_as_relu' ({path}:13:6) "
        "may undo each other in turn"
    )
    assert "'thresholded_as_relu' a Relu that 'relu_as_leaky' is" in warning.message


def test_rules_in_two_files_are_a_warning_naming_both_files(write_rules):
    one = write_rules(RELU_AS_LEAKY, "one.rules")
    other = write_rules("dialect onnx\n" + PAIR.removeprefix(RELU_AS_LEAKY), "other.rules")
    (warning,) = _cycle_warnings(rewrite.load_rules(one, other))
    assert warning.span.file == str(one)
    assert f"'leaky_as_relu' ({other}:3:6)" in warning.message


def test_a_cycle_through_an_op_the_rules_match_is_a_warning(write_rules):
    (warning,) = _cycle_warnings(rewrite.load_rules(write_rules(THROUGH_A_MATCHED_OP)))
    assert "'relu_over_exp_as_leaky' and 'leaky_over_exp_as_relu'" in warning.message


@pytest.mark.parametrize("text", [PATTERN_CANNOT_MATCH, CONDITION_CANNOT_HOLD, SHRINKS],
                         ids=["pattern", "condition", "shrinks"])
def test_rules_whose_text_rules_the_cycle_out_are_no_warning(write_rules, text):
    rules = rewrite.load_rules(write_rules(text))
    assert len(rules.rules) == 2
    assert _cycle_warnings(rules) == []


def test_the_shipped_library_has_no_such_warning():
    assert _cycle_warnings(rewrite.load_rules()) == []


def test_check_prints_the_warning_and_exits_0(write_rules, capsys):
    path = write_rules(PAIR)
    assert cli.main(["check", str(path)]) == 0
    captured = capsys.readouterr()
    assert f"{path}:3:6: warning: rules 'relu_as_leaky' and 'leaky_as_relu' ({path}:8:6)" in captured.err
    assert "2 rule(s) in 1 file(s): no errors, 1 warning(s)" in captured.out


def test_the_pair_warned_about_does_go_round_until_the_sweep_cap(write_rules, tmp_path, capsys):
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
    )
    model = tmp_path / "relu.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), str(model))
    before = model.read_bytes()
    output = tmp_path / "out.onnx"
    # Rules that never settle are a finding about the rules: exit 1, and nothing is written.
    assert cli.main(["apply", "--rules", str(write_rules(PAIR)), str(model), "-o", str(output)]) == 1
    assert "rules still firing after 32 sweeps" in capsys.readouterr().err
    assert not output.exists() and model.read_bytes() == before
    # Either rule alone fires once and stops, the values unchanged.
    first = write_rules(RELU_AS_LEAKY, "first.rules")
    assert cli.main(["apply", "--rules", str(first), str(model), "-o", str(output)]) == 0
    rewritten = onnx.load(str(output))
    assert [node.op_type for node in rewritten.graph.node] == ["LeakyRelu"]
    x = np.random.default_rng(0).normal(size=(2, 3)).astype(np.float32)
    outputs = [onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
               for path in (model, output)]
    np.testing.assert_array_equal(outputs[1], outputs[0])
