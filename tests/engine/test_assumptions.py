"""`assume` clauses: a rule exact only under an assumption runs only where it is granted.

Checked when rules load; kept (and counted) by the driver where not granted;
said so by `explain`; granted by `apply --assume`, `RuleSet.apply(assume=)`,
`optimize(assume=)` and the MIL pipeline's pass option; and `verify` compares
with exactly the allowance the assumption gives, so the rule without its
clause is caught.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import TensorProto, helper, numpy_helper

import rewrite
from rewrite import RuleError, cli
from rewrite.backends import adapter_for
from rewrite.backends.mil import count_ops, ct, mb
from rewrite.backends.mil.reference import evaluate
from rewrite.engine.explain import ASSUMED, explain
from rewrite.language.assumptions import ASSUMPTIONS, granted
from rewrite.language.fast_parser import parse_fast
from rewrite.language.parser import parse_rules
from rewrite.mil import GROUPS, build_pass_pipeline
from rewrite.onnx import optimize
from rewrite.predicates import registered_predicates
from rewrite.verify import verify_rule
from rewrite.verify.checking import compare

ADD_ZERO = """\
dialect onnx
rule add_zero "x + 0.0 is x but for the sign of a zero."
  match %a = Add(A=%x, B=%zero)
  assume no_signed_zeros
  where uniform(%zero) == 0
  where dtype(%x) == fp32 and shape(%a) == shape(%x)
  rewrite %a -> %x
"""


def zero_bias_model() -> onnx.ModelProto:
    nodes = [helper.make_node("Add", ["x", "zero"], ["a"], name="bias"),
             helper.make_node("Div", ["one", "a"], ["out"], name="reciprocal")]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["n", 4])],
        [numpy_helper.from_array(np.zeros(4, np.float32), "zero"),
         numpy_helper.from_array(np.ones((), np.float32), "one")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def run(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]


@pytest.fixture
def add_zero(tmp_path):
    path = tmp_path / "add_zero.rules"
    path.write_text(ADD_ZERO)
    return rewrite.load_rules(str(path))


# ---------------------------------------------------------------- the language


def test_both_parsers_read_the_clause_alike():
    lark, fast = parse_rules(ADD_ZERO, "a.rules"), parse_fast(ADD_ZERO, "a.rules", ADD_ZERO.splitlines())
    assert lark == fast and lark.rules[0].assumption_names == {"no_signed_zeros"}
    assert fast.rules[0].assumptions[0].name_spans[0].column == 10


def test_an_unknown_assumption_is_an_error_at_its_name(tmp_path):
    path = tmp_path / "bad.rules"
    path.write_text(ADD_ZERO.replace("assume no_signed_zeros", "assume no_signed_zero, no_nans, no_nans"))
    with pytest.raises(RuleError) as raised:
        rewrite.load_rules(str(path))
    text = str(raised.value)
    assert "bad.rules:4:10: error: unknown assumption 'no_signed_zero'" in text
    assert "did you mean 'no_signed_zeros'" in text
    assert "bad.rules:4:35: error: rule 'add_zero' assumes 'no_nans' already" in text


def test_user_spellings_are_checked():
    assert granted(["no-nans", "no_signed_zeros"]) == {"no_nans", "no_signed_zeros"}
    with pytest.raises(ValueError, match="unknown assumption 'fast-math'.*no-nans, no-signed-zeros"):
        granted(["fast-math"])


# ---------------------------------------------------------------- the driver and explain


def test_not_granted_it_is_kept_and_counted(add_zero):
    model = zero_bias_model()
    before = onnx.ModelProto.FromString(model.SerializeToString())
    statistics = add_zero.apply(model)
    assert statistics.fires == 0 and statistics.rules["add_zero"].kept == 1 and statistics.kept == 1
    assert [n.op_type for n in model.graph.node] == ["Add", "Div"]
    x = np.array([[-0.0, 1.0, 2.0, -3.0]], np.float32)
    np.testing.assert_array_equal(run(model, x), run(before, x))  # 1/(-0 + 0) is +inf both sides


def test_granted_it_fires_and_changes_only_the_sign_of_a_zero(add_zero):
    model = zero_bias_model()
    before = onnx.ModelProto.FromString(model.SerializeToString())
    statistics = add_zero.apply(model, assume={"no_signed_zeros"})
    assert statistics.fires == 1 and statistics.kept == 0
    assert [n.op_type for n in model.graph.node] == ["Div"]
    x = np.array([[-0.0, 1.0, 2.0, -3.0]], np.float32)
    expected, got = run(before, x), run(model, x)
    assert expected[0, 0] == np.inf and got[0, 0] == -np.inf  # what the assumption gives away
    np.testing.assert_array_equal(got[0, 1:], expected[0, 1:])


def test_explain_says_what_is_assumed_and_how_to_grant_it(add_zero):
    (rule,) = add_zero.rules
    adapter = adapter_for(zero_bias_model())
    (said,) = explain([rule], adapter, registered_predicates())
    assert not said.fired and said.reason == ASSUMED and said.failed == "no_signed_zeros"
    assert "--assume no-signed-zeros" in said.note
    (granted_said,) = explain([rule], adapter_for(zero_bias_model()), registered_predicates(),
                              assume=frozenset({"no_signed_zeros"}))
    assert granted_said.fired


def test_optimize_grants_what_it_is_given(add_zero):
    model = zero_bias_model()
    before = onnx.ModelProto.FromString(model.SerializeToString())
    assert optimize(model, rules=add_zero, fold=False).statistics.rules["add_zero"].kept == 1
    result = optimize(model, rules=add_zero, fold=False, assume=["no-signed-zeros"])
    assert result.statistics.fires == 1 and [n.op_type for n in model.graph.node] == ["Div"]
    x = np.array([[0.5, 1.0, 2.0, -3.0]], np.float32)  # no -0.0: what the grant gives away
    np.testing.assert_array_equal(run(model, x), run(before, x))


# ---------------------------------------------------------------- the CLI


def test_apply_notes_what_it_kept_and_grants_on_request(tmp_path, capsys, add_zero):
    rules = tmp_path / "add_zero.rules"
    rules.write_text(ADD_ZERO)
    source = tmp_path / "m.onnx"
    onnx.save(zero_bias_model(), str(source))
    code = cli.main(["apply", str(source), "--rules", str(rules), "-o", str(tmp_path / "kept.onnx")])
    out, err = capsys.readouterr()
    assert code == 0 and "no rule fired" in out
    assert "note: 1 place kept where rule 'add_zero' holds but assumes no_signed_zeros; " \
           "--assume no-signed-zeros rewrites it" in err
    code = cli.main(["apply", str(source), "--rules", str(rules), "-o", str(tmp_path / "fired.onnx"),
                     "--assume", "no-signed-zeros"])
    out, err = capsys.readouterr()
    assert code == 0 and "add_zero  fired 1" in out and "kept" not in err
    fired = onnx.load(str(tmp_path / "fired.onnx"))
    assert [n.op_type for n in fired.graph.node] == ["Div"]
    x = np.array([[0.5, 1.0, 2.0, -3.0]], np.float32)
    np.testing.assert_array_equal(run(fired, x), run(zero_bias_model(), x))
    np.testing.assert_array_equal(run(onnx.load(str(tmp_path / "kept.onnx")), x), run(zero_bias_model(), x))


def test_an_unknown_grant_is_a_usage_error(tmp_path, capsys):
    source = tmp_path / "m.onnx"
    onnx.save(zero_bias_model(), str(source))
    with pytest.raises(SystemExit) as exited:  # argparse's own exit, as for any bad option
        cli.main(["apply", str(source), "-o", str(tmp_path / "o.onnx"), "--assume", "fast-math"])
    _, err = capsys.readouterr()
    assert exited.value.code == cli.EXIT_USAGE and "unknown assumption 'fast-math'" in err and "Traceback" not in err
    assert not (tmp_path / "o.onnx").exists()


# ---------------------------------------------------------------- verify


def test_verify_allows_what_is_assumed_and_nothing_more(add_zero):
    (rule,) = add_zero.rules
    assert verify_rule(rule, trials=100, seed=0, necessity=False).passed
    # Without its clause the same rule is caught on a -0.0 input.
    verdict = verify_rule(replace(rule, assumptions=()), trials=100, seed=0, necessity=False)
    assert verdict.status == "FAIL" and "-0.0" in verdict.counterexample.problem


# (rule, what it assumes, a seed at which verify finds the rule without its clause out)
@pytest.mark.parametrize("name, assumed, seed", [
    ("onnx_fuse_attention", "no_nans", 1), ("onnx_fuse_attention_additive_mask", "no_fully_masked_rows", 0),
    ("onnx_fuse_attention_bool_mask", "no_fully_masked_rows", 0),
    ("onnx_fuse_attention_masked_fill", "no_fully_masked_rows", 0),
    ("onnx_remove_float_add_zero", "no_signed_zeros", 0), ("onnx_remove_float_sub_zero", "no_signed_zeros", 0),
])
def test_the_shipped_rules_need_their_assumption(name, assumed, seed):
    (rule,) = rewrite.load_rules(dialects=["onnx"]).only(name).rules
    assert rule.assumption_names == {assumed}
    assert verify_rule(rule, trials=200, seed=seed, necessity=False).passed
    verdict = verify_rule(replace(rule, assumptions=()), trials=200, seed=seed, necessity=False)
    assert verdict.status == "FAIL", verdict.status


def test_each_assumption_widens_the_comparison_by_what_it_says_only():
    expected = np.array([np.nan, -0.0, 1.0, 2.0], np.float32)
    got = np.array([0.0, 0.0, 1.0, 0.0], np.float32)
    assert compare("y", expected, got) is not None
    assert compare("y", expected, got, assumed=frozenset({"no_nans", "no_signed_zeros"})) is not None  # 2 -> 0
    assert compare("y", expected[:3], got[:3], assumed=frozenset({"no_nans", "no_signed_zeros"})) is None
    assert compare("y", expected[:3], got[:3], assumed=frozenset({"no_nans"})) is not None  # -0.0 -> 0.0
    assert compare("y", expected, got, assumed=frozenset({"no_fully_masked_rows"})) is None  # every change is a 0
    assert compare("y", expected, np.array([np.nan, -0.0, 1.5, 2.0], np.float32),
                   assumed=frozenset(ASSUMPTIONS)) is not None


# ---------------------------------------------------------------- the MIL pipeline

MIL_ADD_ZERO = """\
dialect mil
rule mil_add_zero "x + 0.0 is x but for the sign of a zero."
  match %a = add(x=%x, y=%zero)
  assume no_signed_zeros
  where uniform(%zero) == 0
  where dtype(%x) == fp32 and shape(%a) == shape(%x)
  group cleanup
  rewrite %a -> %x
"""


def test_the_pipeline_grants_through_its_pass_option(tmp_path):
    from coremltools.converters.mil.mil.passes.pass_pipeline import PassPipelineManager

    path = tmp_path / "mil_add_zero.rules"
    path.write_text(MIL_ADD_ZERO)
    rules = rewrite.load_rules(str(path))

    def program():
        @mb.program(input_specs=[mb.TensorSpec(shape=(2, 3))], opset_version=ct.target.iOS18)
        def prog(x):
            return mb.relu(x=mb.add(x=x, y=np.zeros(3, np.float32)), name="out")

        return prog

    inputs = {"x": np.array([[-0.0, 1.0, -2.0], [3.0, -4.0, 5.0]], np.float32)}
    cleanup = next(group.pass_name for group in GROUPS if group.group == "cleanup")
    for assume, adds in [((), 1), (("no_signed_zeros",), 0)]:
        prog = program()
        before = evaluate(prog, inputs)["out"]
        pipeline = build_pass_pipeline(ct.PassPipeline.EMPTY, rules=rules, assume=assume)
        assert (pipeline.get_options(cleanup) is not None) == bool(assume)
        PassPipelineManager.apply_pipeline(prog, pipeline)
        assert count_ops(prog, "add") == adds and count_ops(prog, "relu") == 1
        np.testing.assert_array_equal(evaluate(prog, inputs)["out"], before)
