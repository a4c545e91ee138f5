"""The safeguard: `optimize` (and `rewrite apply`) hand back nothing onnx's full checker rejects.

A model the checker passes must come out passing it; if a change breaks it,
the model is restored, the error names the change (a rule, the folding, the
pruning), and the CLI writes nothing. The faults here are planted in the
adapter or the folding, since a shipped rule that breaks a model is a bug
the other tests look for.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from rewrite.backends.onnx import adapter as onnx_adapter
from rewrite.backends.onnx import folding
from rewrite.backends.onnx.validation import InvalidOutputError, problem
from rewrite.cli import main
from rewrite.engine.steps import Steps, first_breaking_step
from rewrite.onnx import optimize


def _if_model() -> onnx.ModelProto:
    """The repro of the issue: `else` returns Mul(y, 1) of the main graph's `y`; `then`, Neg(y)."""
    one = numpy_helper.from_array(np.array(1.0, np.float32), "one_b")
    else_branch = helper.make_graph([helper.make_node("Mul", ["y", "one_b"], ["eo"])], "else", [],
                                    [helper.make_tensor_value_info("eo", TensorProto.FLOAT, [2])], [one])
    then_branch = helper.make_graph([helper.make_node("Neg", ["y"], ["to"])], "then", [],
                                    [helper.make_tensor_value_info("to", TensorProto.FLOAT, [2])])
    graph = helper.make_graph(
        [helper.make_node("Neg", ["y"], ["n"]),
         helper.make_node("If", ["c"], ["out"], then_branch=then_branch, else_branch=else_branch),
         helper.make_node("Add", ["out", "n"], ["z"])],
        "m",
        [helper.make_tensor_value_info("c", TensorProto.BOOL, []),
         helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, [2])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.fixture
def outer_value_returned(monkeypatch):
    """The adapter as it was: a body output replaced by whatever value comes, an outer one included."""
    original = onnx_adapter.OnnxAdapter._replace_output

    def replace_output(self, old, new):
        if old.pinned or self.main in old.output_of:
            return original(self, old, new)
        for graph in dict.fromkeys(old.output_of):
            for position, value in enumerate(graph.outputs):
                if value is old:
                    graph.outputs[position] = new
                    new.output_of += (graph,)
                    graph.dirty = True
        old.output_of = ()

    monkeypatch.setattr(onnx_adapter.OnnxAdapter, "_replace_output", replace_output)


def test_the_repro_comes_out_valid_with_its_values():
    model = _if_model()
    result = optimize(model)
    assert result.statistics.fired("onnx_remove_mul_by_one") == 1
    assert onnx.printer.to_text(model).count("Mul") == 0
    assert problem(model) is None
    import onnxruntime

    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    before = onnxruntime.InferenceSession(_if_model().SerializeToString(), providers=["CPUExecutionProvider"])
    for flag in (True, False):
        feeds = {"c": np.array(flag), "y": np.array([1.5, -2.0], np.float32)}
        np.testing.assert_array_equal(session.run(None, feeds)[0], before.run(None, feeds)[0])


def test_a_rewrite_that_breaks_the_model_is_named_and_undone(outer_value_returned):
    model = _if_model()
    original = model.SerializeToString()
    with pytest.raises(InvalidOutputError) as raised:
        optimize(model)
    assert raised.value.maker == "onnx_remove_mul_by_one"
    assert "rule 'onnx_remove_mul_by_one'" in str(raised.value)
    assert "is not an output of any node" in str(raised.value)
    assert model.SerializeToString() == original


def test_the_culprit_is_the_first_breaking_change_among_many(outer_value_returned):
    # Three harmless fires in the main graph before the one in the body.
    model = _if_model()
    graph = model.graph
    ones = numpy_helper.from_array(np.array(1.0, np.float32), "one_main")
    graph.initializer.append(ones)
    graph.node.insert(0, helper.make_node("Mul", ["y", "one_main"], ["y1"]))
    graph.node.insert(1, helper.make_node("Mul", ["y1", "one_main"], ["y2"]))
    graph.node.insert(2, helper.make_node("Mul", ["y2", "one_main"], ["y3"]))
    graph.node[3].input[0] = "y3"
    assert problem(model) is None
    with pytest.raises(InvalidOutputError) as raised:
        optimize(model)
    assert raised.value.maker == "onnx_remove_mul_by_one"
    assert raised.value.step == 4  # after the three in the main graph (nested blocks first is per op)


def test_a_fold_that_breaks_the_model_is_named(monkeypatch):
    # A fold that writes a constant of the wrong type: the checker's strict inference sees it.
    original = folding._known_contents

    def wrong_type(adapter, outputs):
        arrays = original(adapter, outputs)
        return None if arrays is None else [array.astype(np.float32) for array in arrays]

    monkeypatch.setattr(folding, "_known_contents", wrong_type)
    model = helper.make_model(helper.make_graph(
        [helper.make_node("Shape", ["w"], ["s"]), helper.make_node("Reshape", ["x", "s"], ["r"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3]),
         helper.make_tensor_value_info("w", TensorProto.FLOAT, [3, 2])],
        [helper.make_tensor_value_info("r", TensorProto.FLOAT, [3, 2])]), opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(InvalidOutputError) as raised:
        optimize(model, rules=None)
    assert raised.value.maker == "constant folding"
    assert str(raised.value).startswith("constant folding (change 1 of the run) made the model invalid")


def test_an_input_the_checker_rejects_is_no_promise_and_no_error():
    # An output typed wrongly from the start: the result fails as the input did, and is handed back.
    model = _if_model()
    model.graph.output[0].type.tensor_type.elem_type = TensorProto.INT64
    assert problem(model) is not None
    optimize(model)


def test_without_validation_nothing_is_checked(outer_value_returned):
    model = _if_model()
    optimize(model, validate=False)
    assert problem(model) is not None  # the planted fault went through: the safeguard is what stops it


def test_the_cli_exits_non_zero_names_the_rule_and_writes_nothing(outer_value_returned, tmp_path, capsys):
    source = tmp_path / "if.onnx"
    onnx.save(_if_model(), source)
    data = source.read_bytes()
    for extra in ([], ["--rules-only"], ["--rule", "onnx_remove_mul_by_one"]):
        target = tmp_path / "out.onnx"
        # A finding about the rules (one made the model invalid): exit 1.
        assert main(["apply", str(source), "-o", str(target), *extra]) == 1
        error = capsys.readouterr().err
        assert "rule 'onnx_remove_mul_by_one'" in error and "nothing was written" in error
        assert "Traceback" not in error
        assert not target.exists()
        assert sorted(p.name for p in tmp_path.iterdir()) == ["if.onnx"]
        assert source.read_bytes() == data


def test_bisection_finds_a_transition_in_few_replays():
    replays = []

    def replay(steps: Steps):
        made = 0
        for index in range(1000):
            try:
                steps.take(f"change {index + 1}")
            except Exception:
                break
            made += 1
        replays.append(steps.limit)
        return made

    found = first_breaking_step(replay, 1000, lambda made: "broken" if made >= 617 else None)
    assert found == (617, "change 617")
    assert len(replays) <= 12
