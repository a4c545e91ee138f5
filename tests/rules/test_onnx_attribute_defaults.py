"""`attribute(%n, "name")` of an attribute the node leaves unset reads the default
its schema gives it at the model's opset; `default=` stands in where the schema
gives none. Each rule below is checked on onnxruntime, before against after."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import numpy_helper
from onnx_cases import FLOAT, INT64, counts, floats, initializer, model, node, run, tensor

import rewrite

RULES = """
dialect onnx

rule softmax_as_exp_of_log_softmax
  "Softmax over the last axis is Exp(LogSoftmax) over it."
  match %s = Softmax(input=%x)
  where attribute(%s, "axis") == -1
  rewrite
    %l = LogSoftmax(input=%x, axis=-1)
    %s -> Exp(input=%l)

rule hard_sigmoid_written_out
  "HardSigmoid(x) is Clip(alpha·x + beta, 0, 1), with the op's own alpha and beta."
  match %h = HardSigmoid(X=%x)
  where dtype(%x) == fp32
  rewrite
    %scaled = Mul(A=%x, B=as_dtype(attribute(%h, "alpha"), fp32))
    %shifted = Add(A=%scaled, B=as_dtype(attribute(%h, "beta"), fp32))
    %h -> Clip(input=%shifted, min=as_dtype(0.0, fp32), max=as_dtype(1.0, fp32))

rule hard_sigmoid_of_beta_one_half
  "A default= gives way to the schema's default: an unset beta is 0.5, not 0.9."
  match %h = HardSigmoid(X=%x)
  where attribute(%h, "beta", default=0.9) == 0.5 and attribute(%h, "alpha") == 0.5
  rewrite %h -> HardSwish(X=%x)

rule static_shape
  "The Shape of a value of known dims is a constant."
  match %s = Shape(data=%x)
  where attribute(%s, "start", default=0) == 0
  where attribute(%s, "end", default=rank(%x)) == rank(%x)
  where forall d in shape(%x): is_known(d)
  rewrite %s -> Constant(value=as_dtype(shape(%x), int64))

rule static_shape_without_a_default
  "Without default=, the unset end (which no schema defaults) is unknown: never fires."
  match %s = Shape(data=%x)
  where attribute(%s, "end") == rank(%x)
  rewrite %s -> Constant(value=as_dtype(shape(%x), int64))
"""


@pytest.fixture(scope="module")
def rules(tmp_path_factory):
    path = tmp_path_factory.mktemp("defaults") / "defaults.rules"
    path.write_text(RULES)
    return rewrite.load_rules(path)


def _apply(rules, name, built, feeds, exact=False):
    """Apply rule `name`; the outputs before and after, compared on onnxruntime; the fires and counts."""
    before_counts = counts(built)
    expected = run(built, feeds)
    fires = rules.only(name).apply(built).fires
    for old, new in zip(expected, run(built, feeds)):
        assert old.shape == new.shape and old.dtype == new.dtype
        if exact:
            np.testing.assert_array_equal(new, old)
        else:
            np.testing.assert_allclose(new, old, rtol=1e-6, atol=1e-6)
    return fires, before_counts, counts(built)


def _softmax(opset):
    # Rank 3: Softmax-11's default axis 1 flattens axes 1 and 2, which is no softmax over the last.
    built = model([node("Softmax", ["x"], ["y"])], [tensor("x", FLOAT, [2, 3, 4])], [tensor("y", FLOAT, [2, 3, 4])],
                  opset=opset)
    return built, {"x": floats(2, 3, 4)}


def test_an_unset_axis_is_the_default_of_the_op_at_the_models_opset(rules):
    built, feeds = _softmax(13)  # Softmax-13: axis -1
    fires, before, after = _apply(rules, "softmax_as_exp_of_log_softmax", built, feeds)
    assert fires == 1 and before == {"Softmax": 1} and after == {"LogSoftmax": 1, "Exp": 1}


def test_before_opset_13_the_same_unset_axis_is_1_and_the_rule_stays_away(rules):
    built, feeds = _softmax(11)  # Softmax-11: axis 1
    fires, before, after = _apply(rules, "softmax_as_exp_of_log_softmax", built, feeds, exact=True)
    assert fires == 0 and after == before == {"Softmax": 1}


@pytest.mark.parametrize("attributes", [{}, {"alpha": 0.3}, {"beta": 0.25}, {"alpha": 0.1, "beta": 0.7}],
                         ids=["both unset", "alpha set", "beta set", "both set"])
def test_built_ops_take_the_defaults_of_unset_attributes(rules, attributes):
    # x spread over [-6, 6], so that both clip bounds and the slope between them are reached.
    x = np.linspace(-6, 6, 48, dtype=np.float32).reshape(4, 12)
    built = model([node("HardSigmoid", ["x"], ["y"], **attributes)], [tensor("x", FLOAT, [4, 12])],
                  [tensor("y", FLOAT, [4, 12])])
    fires, _, after = _apply(rules, "hard_sigmoid_written_out", built, {"x": x})
    assert fires == 1 and after == {"Mul": 1, "Add": 1, "Clip": 1, "Constant": 4}
    (mul,) = [n for n in built.graph.node if n.op_type == "Mul"]
    (alpha,) = [n for n in built.graph.node if n.output[0] == mul.input[1]]
    assert np.isclose(numpy_helper.to_array(alpha.attribute[0].t), attributes.get("alpha", 0.2))


@pytest.mark.parametrize(("beta", "fires"), [(None, 1), (0.9, 0), (0.5, 1)])
def test_a_default_given_in_the_rule_gives_way_to_the_schemas_and_the_nodes(rules, beta, fires):
    # HardSwish is HardSigmoid with alpha 1/6, beta 0.5, times x: not the same op, so only the
    # condition is looked at here, with alpha 0.5 to tell the rule's rewrite from a fusion.
    attributes = {"alpha": 0.5} | ({} if beta is None else {"beta": beta})
    built = model([node("HardSigmoid", ["x"], ["y"], **attributes)], [tensor("x", FLOAT, [4])],
                  [tensor("y", FLOAT, [4])], opset=14)
    statistics = rules.only("hard_sigmoid_of_beta_one_half").apply(built)
    assert statistics.fires == fires
    assert counts(built) == ({"HardSwish": 1} if fires else {"HardSigmoid": 1})


def _shape(opset, **attributes):
    built = model([node("Shape", ["x"], ["s"], **attributes)], [tensor("x", FLOAT, [2, 3, 5])],
                  [tensor("s", INT64, [None])], opset=opset)
    return built, {"x": floats(2, 3, 5)}


@pytest.mark.parametrize("opset", [13, 18], ids=["no start or end in Shape-13", "Shape-15 on"])
def test_a_default_in_the_rule_stands_in_where_the_schema_gives_none(rules, opset):
    built, feeds = _shape(opset)
    fires, before, after = _apply(rules, "static_shape", built, feeds, exact=True)
    assert fires == 1 and before == {"Shape": 1} and after == {"Constant": 1}
    np.testing.assert_array_equal(run(built, feeds)[0], [2, 3, 5])


@pytest.mark.parametrize("attributes", [{"end": 2}, {"start": 1}, {"end": -1}])
def test_an_attribute_the_node_sets_is_read_not_the_default(rules, attributes):
    built, feeds = _shape(18, **attributes)
    fires, before, after = _apply(rules, "static_shape", built, feeds, exact=True)
    assert fires == 0 and after == before == {"Shape": 1}


def test_without_a_default_an_attribute_no_schema_defaults_is_unknown(rules):
    built, feeds = _shape(18)
    fires, before, after = _apply(rules, "static_shape_without_a_default", built, feeds, exact=True)
    assert fires == 0 and after == before
    built, feeds = _shape(18, end=3)
    fires, _, after = _apply(rules, "static_shape_without_a_default", built, feeds, exact=True)
    assert fires == 1 and after == {"Constant": 1}


def test_the_shipped_batch_norm_fold_reads_the_default_epsilon_and_mode():
    # Neither epsilon nor training_mode set: 1e-5 and 0, by the schema of BatchNormalization-15.
    rng = np.random.default_rng(3)
    weights = rng.normal(size=(4, 3, 3, 3)).astype(np.float32)
    scale, bias, mean = (rng.normal(size=4).astype(np.float32) for _ in range(3))
    var = (rng.random(4) + 0.5).astype(np.float32)
    nodes = [node("Conv", ["x", "w"], ["c"]), node("BatchNormalization", ["c", "s", "b", "m", "v"], ["y"])]
    built = model(nodes, [tensor("x", FLOAT, [2, 3, 6, 6])], [tensor("y", FLOAT, [2, 4, 4, 4])],
                  [initializer("w", weights), initializer("s", scale), initializer("b", bias),
                   initializer("m", mean), initializer("v", var)], opset=15)
    feeds = {"x": floats(2, 3, 6, 6, seed=5)}
    expected = run(built, feeds)[0]
    statistics = rewrite.load_rules(dialects=["onnx"]).only("onnx_fold_batch_norm_into_conv").apply(built)
    assert statistics.fires == 1 and counts(built)["BatchNormalization"] == 0 and counts(built)["Conv"] == 1
    np.testing.assert_allclose(run(built, feeds)[0], expected, rtol=1e-5, atol=1e-5)
