"""Issue 11's unsound ONNX rewrites: each is refused by the engine's shape guard,
also with the rule's own conditions taken away (the guard stands alone)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper
from onnx_cases import FLOAT, counts, floats, initializer, model, node, run, tensor

import rewrite

# The shipped rules with their consumer conditions deleted: only the guard stands.
RECKLESS = """
dialect onnx
rule drop_expand "drops any Expand"
  match %e = Expand(input=%x, shape=_)
  rewrite %e -> %x
rule drop_tile "drops any Tile"
  match %t = Tile(input=%x, repeats=_)
  rewrite %t -> %x
"""


def _rank_increasing_expand():
    nodes = [node("Expand", ["x", "shape"], ["e"]), node("Add", ["e", "y"], ["out"])]
    return model(nodes, [tensor("x", FLOAT, [4]), tensor("y", FLOAT, [4])], [tensor("out", FLOAT, [1, 4])],
                 [initializer("shape", np.array([1, 4]))]), {"x": floats(4), "y": floats(4, seed=1)}


def _rank_increasing_expand_3d():
    nodes = [node("Expand", ["x", "shape"], ["e"]), node("Mul", ["e", "y"], ["out"])]
    return model(nodes, [tensor("x", FLOAT, [1, 16]), tensor("y", FLOAT, [4, 16])],
                 [tensor("out", FLOAT, [1, 4, 16])], [initializer("shape", np.array([1, 4, 16]))]), {
        "x": floats(1, 16), "y": floats(4, 16, seed=1)}


def _zero_repeat_tile():
    nodes = [node("Tile", ["x", "repeats"], ["t"]), node("Add", ["t", "y"], ["out"])]
    return model(nodes, [tensor("x", FLOAT, [1, 16]), tensor("y", FLOAT, [1, 16])], [tensor("out", FLOAT, [0, 16])],
                 [initializer("repeats", np.array([0, 1]))]), {"x": floats(1, 16), "y": floats(1, 16, seed=1)}


def _tile_into_sum_at_opset_7():
    nodes = [node("Tile", ["x", "repeats"], ["t"]), node("Sum", ["t", "y"], ["out"])]
    built = model(nodes, [tensor("x", FLOAT, [1, 16]), tensor("y", FLOAT, [4, 16])], [tensor("out", FLOAT, [4, 16])],
                  [initializer("repeats", np.array([4, 1]))], opset=7)
    return built, {"x": floats(1, 16), "y": floats(4, 16, seed=1)}


CASES = {
    "rank-increasing Expand [4] -> [1, 4] into Add": _rank_increasing_expand,
    "rank-increasing Expand [1, 16] -> [1, 4, 16] into Mul": _rank_increasing_expand_3d,
    "Tile with a zero repeat on a size-1 axis": _zero_repeat_tile,
    "Tile into Sum at opset 7 (Sum-6 does not broadcast)": _tile_into_sum_at_opset_7,
}


@pytest.mark.parametrize("rules", ["shipped", "reckless"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_the_guard_refuses_every_unsound_case(case, rules, tmp_path):
    built, feeds = CASES[case]()
    expected = run(built, feeds)
    before = counts(built)
    if rules == "shipped":
        rule_set = rewrite.load_rules(dialects=["onnx"])
    else:
        path = tmp_path / "reckless.rules"
        path.write_text(RECKLESS)
        rule_set = rewrite.load_rules(path)
    statistics = rule_set.apply(built)
    assert statistics.fires == 0 and counts(built) == before, case
    if rules == "reckless":
        assert statistics.refused >= 1  # the guard, not the rule, said no
    for old, new in zip(expected, run(built, feeds)):
        assert old.shape == new.shape
        np.testing.assert_array_equal(old, new)


def test_checked_mode_names_the_rule_the_guard_refused(tmp_path):
    built, _ = _rank_increasing_expand()
    path = tmp_path / "reckless.rules"
    path.write_text(RECKLESS)
    refused = "rule 'drop_expand'.*shape guard refused.*rank 2 would become 1"
    with pytest.raises(rewrite.UnsoundRewriteError, match=refused):
        rewrite.load_rules(path).apply(built, check_types=True)


def test_the_guard_lets_the_sound_case_through(tmp_path):
    nodes = [node("Expand", ["x", "shape"], ["e"]), node("Add", ["e", "y"], ["out"])]
    built = model(nodes, [tensor("x", FLOAT, [1, 4]), tensor("y", FLOAT, [3, 4])], [tensor("out", FLOAT, [3, 4])],
                  [initializer("shape", np.array([3, 4]))])
    feeds = {"x": floats(1, 4), "y": floats(3, 4, seed=2)}
    expected = run(built, feeds)
    path = tmp_path / "reckless.rules"
    path.write_text(RECKLESS)
    statistics = rewrite.load_rules(path).apply(built)
    assert statistics.fires == 1 and counts(built)["Expand"] == 0
    np.testing.assert_array_equal(run(built, feeds)[0], expected[0])


def test_explain_says_which_consumer_and_axis_the_guard_refused(tmp_path):
    from rewrite.backends.onnx import OnnxAdapter
    from rewrite.engine.explain import explain, format_text
    from rewrite.predicates import registered_predicates

    built, _ = _zero_repeat_tile()
    path = tmp_path / "reckless.rules"
    path.write_text(RECKLESS)
    rules = rewrite.load_rules(path).only("drop_tile").rules
    (explanation,) = explain(rules, OnnxAdapter(built), registered_predicates())
    assert not explanation.fired and explanation.reason == "the shape guard refuses the rewrite"
    assert "axis = 0" in explanation.path and "output dim 0 is not proved to stay" in explanation.failed
    assert "shape guard refuses" in format_text([explanation])


def test_a_constant_in_external_data_is_read_beside_the_model_never_the_working_directory(tmp_path):
    import subprocess
    import sys

    import onnx

    # Repeats [2, 16] into an Add whose other operand is 1 on axis 0: must stay.
    nodes = [
        node("Constant", [], ["repeats"], value=initializer("r", np.array([2, 16], dtype=np.int64))),
        node("Tile", ["m", "repeats"], ["t"]),
        node("Add", ["t", "x"], ["out"]),
    ]
    built = model(nodes, [tensor("m", FLOAT, [1, 1]), tensor("x", FLOAT, [1, 16])], [tensor("out", FLOAT, [2, 16])])
    folder, elsewhere = tmp_path / "model", tmp_path / "elsewhere"
    folder.mkdir()
    elsewhere.mkdir()
    onnx.save_model(built, str(folder / "m.onnx"), save_as_external_data=True, all_tensors_to_one_file=True,
                    location="weights.bin", size_threshold=0, convert_attribute=True)
    stored = onnx.load(str(folder / "m.onnx"), load_external_data=False)
    assert stored.graph.node[0].attribute[0].t.data_location == onnx.TensorProto.EXTERNAL
    # A decoy of the same name where the user stands: repeats [1, 16] would let the rule fire.
    (elsewhere / "weights.bin").write_bytes(np.array([1, 16], dtype=np.int64).tobytes())
    result = subprocess.run([sys.executable, "-m", "rewrite.cli", "apply", str(folder / "m.onnx"), "-o",
                             str(folder / "out.onnx")], cwd=elsewhere, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "no rule fired" in result.stdout
    feeds = {"m": floats(1, 1), "x": floats(1, 16, seed=3)}
    np.testing.assert_array_equal(run(onnx.load(str(folder / "out.onnx")), feeds)[0],
                                  run(onnx.load(str(folder / "m.onnx")), feeds)[0])


def test_a_tile_with_more_repeats_than_axes_is_left_alone(tmp_path):
    # Invalid by the spec (onnxruntime refuses it), yet onnx's reference
    # evaluator puts out (1, 2, 2): the Tile's rank is not known to be its
    # input's, so no rule may assume it. Found by verify's enumeration.
    from onnx.reference import ReferenceEvaluator

    nodes = [node("Tile", ["x", "repeats"], ["t"]), node("Add", ["t", "y"], ["out"])]
    graph = helper.make_graph(nodes, "test", [tensor("x", FLOAT, [2, 2]), tensor("y", FLOAT, [2, 2])],
                              [tensor("out", FLOAT, None)], [initializer("repeats", np.array([1, 1, 1]))])
    built = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    feeds = {"x": floats(2, 2), "y": floats(2, 2, seed=1)}
    (expected,) = ReferenceEvaluator(built).run(None, feeds)
    assert expected.shape == (1, 2, 2)
    path = tmp_path / "reckless.rules"
    path.write_text(RECKLESS)
    for rule_set in (rewrite.load_rules(dialects=["onnx"]), rewrite.load_rules(path)):
        statistics = rule_set.apply(built)
        assert statistics.fires == 0 and counts(built) == {"Tile": 1, "Add": 1}
    (after,) = ReferenceEvaluator(built).run(None, feeds)
    np.testing.assert_array_equal(expected, after)


# ---------------------------------------------------------------- what a refusal says

RECKLESS_CAST = 'dialect onnx\nrule drop_cast "drops any Cast"\n  match %c = Cast(input=%x)\n  rewrite %c -> %x\n'


def _expand_into(consumer: str, x_shape, out_shape, target, opset=18, **attributes):
    """Expand(x, target) into one `consumer` node (named after its type, lower case)."""
    nodes = [node("Expand", ["x", "shape"], ["e"], name="widen"),
             node(consumer, ["e"], ["out"], name=consumer.lower(), **attributes)]
    return model(nodes, [tensor("x", FLOAT, x_shape)], [tensor("out", FLOAT, out_shape)],
                 [initializer("shape", np.array(target))], opset=opset)


def _cast_into_relu():
    nodes = [node("Cast", ["x"], ["c"], name="cast", to=FLOAT), node("Relu", ["c"], ["out"], name="relu")]
    return model(nodes, [tensor("x", helper.np_dtype_to_tensor_dtype(np.dtype(np.float16)), [2, 8])],
                 [tensor("out", FLOAT, [2, 8])])


# (model, its feeds, the reckless rules, what the refusal says). The consumers do not
# broadcast, so no proof covers them: the refusal quotes the backend's shape inference.
SAID = {
    "a rank": (lambda: _expand_into("Relu", [], [2, 8], [2, 8]), {"x": floats()}, RECKLESS,
               "consumer 'relu': output rank 2 would become 0"),
    "a dim": (lambda: _expand_into("Relu", [2, 1], [2, 8], [2, 8]), {"x": floats(2, 1)}, RECKLESS,
              "consumer 'relu' at axis 1: output dim 8 would become 1"),
    "a dtype": (_cast_into_relu, {"x": floats(2, 8).astype(np.float16)}, RECKLESS_CAST,
                "consumer 'relu': dtype fp32 would become fp16"),
    # Max over the copies Expand made is the max over x: the inference gives the output its
    # type unchanged, but it does not check operands, so it proves nothing, and the refusal says so.
    "no proof": (lambda: _expand_into("ReduceMax", [1, 8], [8], [2, 8], opset=17, axes=[0], keepdims=0),
                 {"x": floats(1, 8)}, RECKLESS,
                 "consumer 'reducemax': its output types with operand data 'e' replaced by 'x' are not known "
                 "(ReduceMax): the shape inference gives the same types, but it is written for valid graphs and "
                 "does not check the new operand, so it proves nothing"),
}


def _refusals(text: str, built, tmp_path) -> tuple[rewrite.RuleSet, list[str]]:
    """The rules of `text`, and what explain says the guard refused of them on `built`."""
    from rewrite.backends.onnx import OnnxAdapter
    from rewrite.engine.explain import explain
    from rewrite.predicates import registered_predicates

    path = tmp_path / "reckless.rules"
    path.write_text(text)
    rules = rewrite.load_rules(path)
    explanations = explain(rules.rules, OnnxAdapter(built), registered_predicates())
    return rules, [e.failed for e in explanations if not e.fired]


@pytest.mark.parametrize("case", sorted(SAID))
def test_a_refusal_names_what_would_change_or_why_it_is_not_known(case, tmp_path):
    make, feeds, text, said = SAID[case]
    built = make()
    expected, before = run(built, feeds), counts(built)
    rules, refused = _refusals(text, built, tmp_path)
    assert refused == [said]
    statistics = rules.apply(built)
    assert statistics.fires == 0 and statistics.refused == 1 and counts(built) == before
    for old, new in zip(expected, run(built, feeds)):
        np.testing.assert_array_equal(old, new)
    with pytest.raises(rewrite.UnsoundRewriteError, match="shape guard refused") as raised:
        rules.apply(built, check_types=True)
    assert said in str(raised.value)


def test_a_consumer_of_another_domain_is_named_with_its_operand_and_why(tmp_path):
    nodes = [node("Expand", ["x", "shape"], ["e"], name="widen"),
             helper.make_node("Scale", ["e"], ["out"], name="scale", domain="com.acme")]
    graph = helper.make_graph(nodes, "g", [tensor("x", FLOAT, [2, 1])], [tensor("out", FLOAT, [2, 8])],
                              [initializer("shape", np.array([2, 8]))])
    built = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("com.acme", 1)])
    rules, refused = _refusals(RECKLESS, built, tmp_path)
    assert refused == ["consumer 'scale': its output types with the operand 'e' replaced by 'x' are not "
                       "known (com.acme.Scale): no type inference is known for the ops of the domain 'com.acme'"]
    assert rules.apply(built).fires == 0 and counts(built) == {"Expand": 1, "Scale": 1}


def test_a_consumer_with_subgraphs_is_named_with_why(tmp_path):
    def branch(value: float) -> onnx.GraphProto:
        constant = node("Constant", [], ["v"], value=initializer("c", np.array([value], dtype=np.float32)))
        return helper.make_graph([constant], "branch", [], [tensor("v", FLOAT, [1])])

    nodes = [node("Expand", ["flag", "shape"], ["e"], name="widen"),
             node("If", ["e"], ["out"], name="choose", then_branch=branch(1.0), else_branch=branch(2.0))]
    built = model(nodes, [tensor("flag", helper.np_dtype_to_tensor_dtype(np.dtype(bool)), [])],
                  [tensor("out", FLOAT, [1])], [initializer("shape", np.array([1]))])
    feeds = {"flag": np.array(True)}
    expected = run(built, feeds)
    rules, refused = _refusals(RECKLESS, built, tmp_path)
    assert refused == ["consumer 'choose': its output types with operand cond 'e' replaced by 'flag' are not known "
                       "(If): 'If' has subgraphs, which type its outputs and are not inferred again"]
    assert rules.apply(built).fires == 0 and counts(built) == {"Expand": 1, "If": 1}
    np.testing.assert_array_equal(run(built, feeds)[0], expected[0])
