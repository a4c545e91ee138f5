"""The ONNX adapter: schema, shape inference, scopes, names, opsets and files."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import TensorProto, helper, numpy_helper

import rewrite
from rewrite.backends.onnx import SCHEMA, OnnxAdapter, OnnxError, count_nodes, load_onnx, save_onnx
from rewrite.language.logic import UNKNOWN, Broadcast, Symbol

FLOAT, INT64 = TensorProto.FLOAT, TensorProto.INT64


def _model(nodes, inputs, outputs, initializers=(), opset=18, value_info=()):
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(initializers), value_info=list(value_info))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    onnx.checker.check_model(model, full_check=True)
    return model


def _tensor(name, elem_type, shape):
    return helper.make_tensor_value_info(name, elem_type, shape)


def _ints(name, values):
    return numpy_helper.from_array(np.asarray(values, dtype=np.int64), name)


def _run(model, feeds):
    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def test_schema_comes_from_onnx_defs():
    expand = SCHEMA.signature("Expand")
    assert [i.name for i in expand.inputs] == ["input", "shape"]
    assert SCHEMA.signature("Max").inputs[0].variadic
    assert "direction" in SCHEMA.signature("BitShift").attributes
    assert SCHEMA.signature("Expnad") is None


@pytest.mark.parametrize("line, message", [
    ('  match %e = Expnad(input=%x, shape=_)', "unknown onnx op or class 'Expnad'; did you mean 'Expand'?"),
    ('  match %e = Expand(inptu=%x, shape=_)', "op 'Expand' has no operand 'inptu'"),
])
def test_rules_are_checked_against_onnx_defs(write_rules, line, message):
    path = write_rules(f'dialect onnx\nrule r "d"\n{line}\n  rewrite %e -> %x\n')
    with pytest.raises(rewrite.RuleError) as raised:
        rewrite.load_rules(path)
    assert message in str(raised.value)
    assert f"{path}:3:" in str(raised.value)


def test_values_used_as_shapes_are_followed():
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Slice", ["s", "zero", "one"], ["batch"]),
        helper.make_node("Gather", ["s", "last"], ["width"], axis=0),
        helper.make_node("Unsqueeze", ["width", "zero"], ["width_1d"]),
        helper.make_node("Mul", ["width_1d", "two"], ["double"]),
        helper.make_node("Concat", ["batch", "double"], ["target"], axis=0),
        helper.make_node("ConstantOfShape", ["target"], ["y"]),
    ]
    model = _model(nodes, [_tensor("x", FLOAT, ["b", 8])], [_tensor("y", FLOAT, [None, None])],
                   [_ints("zero", [0]), _ints("one", [1]), _ints("last", -1), _ints("two", [2])])
    values = OnnxAdapter(model).main.values
    assert values["s"].contents == [Symbol("b"), 8]
    assert values["batch"].contents == [Symbol("b")]
    assert values["width"].contents == [8] and values["width"].shape == ()
    assert values["target"].contents == [Symbol("b"), 16]
    assert values["y"].shape == (Symbol("b"), 16)


def test_broadcast_of_two_symbols_is_canonical_and_exporter_names_are_value_local():
    nodes = [
        helper.make_node("Add", ["p", "q"], ["pq"]),
        helper.make_node("Add", ["q", "p"], ["qp"]),
        helper.make_node("Relu", ["pq"], ["r1"]),
        helper.make_node("Relu", ["qp"], ["r2"]),
        helper.make_node("Neg", ["u"], ["n1"]),
        helper.make_node("Neg", ["u"], ["n2"]),
    ]
    model = _model(
        nodes,
        [_tensor("p", FLOAT, ["P"]), _tensor("q", FLOAT, ["Q"]), _tensor("u", FLOAT, [None])],
        [_tensor(n, FLOAT, [None]) for n in ("r1", "r2", "n1", "n2")],
        # An exporter's placeholder reused for two unrelated values.
        value_info=[_tensor("n1", FLOAT, ["dim0"]), _tensor("n2", FLOAT, ["dim0"])],
    )
    values = OnnxAdapter(model).main.values
    assert values["r1"].shape == values["r2"].shape == (Broadcast((Symbol("P"), Symbol("Q"))),)
    assert values["n1"].shape[0] != values["n2"].shape[0]
    assert values["u"].shape == (UNKNOWN,)


def test_subgraphs_resolve_outer_names_and_count_as_uses():
    body = helper.make_graph([helper.make_node("Add", ["x", "outer"], ["then_y"])], "then", [],
                             [_tensor("then_y", FLOAT, [4])])
    other = helper.make_graph([helper.make_node("Identity", ["x"], ["else_y"])], "else", [],
                              [_tensor("else_y", FLOAT, [4])])
    nodes = [helper.make_node("Neg", ["x"], ["outer"]),
             helper.make_node("If", ["flag"], ["y"], then_branch=body, else_branch=other)]
    model = _model(nodes, [_tensor("flag", TensorProto.BOOL, []), _tensor("x", FLOAT, [4])],
                   [_tensor("y", FLOAT, [4])])
    adapter = OnnxAdapter(model)
    outer = adapter.main.values["outer"]
    (consumer,) = adapter.consumers(outer)
    assert adapter.op_type(consumer) == "Add"
    assert adapter.block_of(consumer) is not adapter.defining_block(outer)


IDENTITY_BYPASS = """
dialect onnx
rule drop_identity "an Identity is its input"
  match %i = Identity(input=%x)
  where not block_output(%x)
  rewrite %i -> %x
"""


def test_a_graph_output_keeps_its_name(write_rules):
    nodes = [helper.make_node("Relu", ["x"], ["hidden"]), helper.make_node("Identity", ["hidden"], ["y"])]
    model = _model(nodes, [_tensor("x", FLOAT, [3])], [_tensor("y", FLOAT, [3])])
    feeds = {"x": np.array([-1, 0, 2], np.float32)}
    before = _run(model, feeds)
    statistics = rewrite.load_rules(write_rules(IDENTITY_BYPASS)).apply(model)
    assert statistics.fires == 1
    onnx.checker.check_model(model, full_check=True)
    assert [n.op_type for n in model.graph.node] == ["Relu"]
    assert model.graph.node[0].output[0] == "y" and model.graph.output[0].name == "y"
    np.testing.assert_array_equal(_run(model, feeds)[0], before[0])


def test_an_input_cannot_become_an_output_without_a_bridge():
    nodes = [helper.make_node("Relu", ["x"], ["y"])]
    model = _model(nodes, [_tensor("x", FLOAT, [3])], [_tensor("y", FLOAT, [3])])
    adapter = OnnxAdapter(model)
    relu = adapter.main.nodes[0]
    adapter.replace_all_uses(relu.outputs[0], adapter.main.values["x"])
    adapter.remove_op(relu)
    adapter.finish()
    onnx.checker.check_model(model, full_check=True)
    assert [n.op_type for n in model.graph.node] == ["Identity"]
    assert model.graph.output[0].name == "y"
    np.testing.assert_array_equal(_run(model, {"x": np.array([-1, 0, 2], np.float32)})[0], [-1, 0, 2])


SQUEEZE_UNSQUEEZE = """
dialect onnx
rule reduce_over_unit_axis "a reduction that keeps the shape sums one element: squeeze and unsqueeze instead"
  match %m = ReduceSum(data=%x)
  where dim(%x, 0) == 1 and shape(%m) == shape(%x)
  rewrite
    %s = Squeeze(data=%x, axes=[0])
    %m -> Unsqueeze(data=%s, axes=[0])
"""


@pytest.mark.parametrize("opset", [11, 18])
def test_new_nodes_follow_the_models_opset(write_rules, opset):
    # Squeeze's and Unsqueeze's axes were attributes before opset 13 and are
    # inputs since: the same rule must build either form.
    if opset == 11:
        nodes = [helper.make_node("ReduceSum", ["x"], ["m"], axes=[0], keepdims=1)]
        initializers = []
    else:
        nodes = [helper.make_node("ReduceSum", ["x", "axes"], ["m"], keepdims=1)]
        initializers = [_ints("axes", [0])]
    model = _model(nodes, [_tensor("x", FLOAT, [1, 3])], [_tensor("m", FLOAT, [1, 3])], initializers, opset=opset)
    feeds = {"x": np.array([[1, -2, 3]], np.float32)}
    before = _run(model, feeds)[0]
    assert rewrite.load_rules(write_rules(SQUEEZE_UNSQUEEZE)).apply(model).fires == 1
    onnx.checker.check_model(model, full_check=True)
    assert [n.op_type for n in model.graph.node if n.op_type != "Constant"] == ["Squeeze", "Unsqueeze"]
    for built in (n for n in model.graph.node if n.op_type in ("Squeeze", "Unsqueeze")):
        if opset == 11:
            assert [a.name for a in built.attribute] == ["axes"] and len(built.input) == 1
        else:
            assert not built.attribute and len(built.input) == 2
    assert model.graph.output[0].name == "m"
    # Provenance: the nodes a rule creates carry its name.
    assert all(n.name.startswith("reduce_over_unit_axis") for n in model.graph.node)
    np.testing.assert_array_equal(_run(model, feeds)[0], before)


def test_external_data_round_trip(tmp_path):
    weight = np.arange(4096, dtype=np.float32).reshape(1, 4096)
    nodes = [helper.make_node("Shape", ["x"], ["s"]), helper.make_node("Expand", ["w", "s"], ["e"]),
             helper.make_node("Mul", ["x", "e"], ["y"])]
    model = _model(nodes, [_tensor("x", FLOAT, ["b", 4096])], [_tensor("y", FLOAT, ["b", 4096])],
                   [numpy_helper.from_array(weight, "w")])
    source = tmp_path / "in" / "model.onnx"
    source.parent.mkdir()
    onnx.save_model(model, str(source), save_as_external_data=True, location="weights.bin", size_threshold=0)
    loaded, external = load_onnx(source)
    assert external
    out = tmp_path / "out" / "rewritten.onnx"
    out.parent.mkdir()
    result = subprocess.run([sys.executable, "-m", "rewrite.cli", "apply", str(source), "-o", str(out)],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert (out.parent / "rewritten.onnx.data").exists()
    rewritten = onnx.load(str(out))
    assert count_nodes(rewritten, "Expand") == 0
    onnx.checker.check_model(str(out), full_check=True)
    feeds = {"x": np.ones((2, 4096), np.float32)}
    session = onnxruntime.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    np.testing.assert_array_equal(session.run(None, feeds)[0], _run(loaded, feeds)[0])


@pytest.mark.parametrize("content", [b"", b"\x08\x07garbage that is not protobuf", b"not onnx at all"])
def test_bad_files_are_one_line_errors(tmp_path, content):
    path = tmp_path / "bad.onnx"
    path.write_bytes(content)
    with pytest.raises(OnnxError, match="bad.onnx"):
        load_onnx(path)
    result = subprocess.run([sys.executable, "-m", "rewrite.cli", "apply", str(path), "-o", str(tmp_path / "o.onnx")],
                            capture_output=True, text=True)
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr
    assert not (tmp_path / "o.onnx").exists()


def test_truncated_model_is_a_clear_error(tmp_path):
    nodes = [helper.make_node("Relu", ["x"], ["y"])]
    model = _model(nodes, [_tensor("x", FLOAT, [3])], [_tensor("y", FLOAT, [3])])
    path = tmp_path / "cut.onnx"
    data = model.SerializeToString()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(OnnxError, match="cut.onnx"):
        load_onnx(path)


def test_save_writes_a_loadable_model(tmp_path):
    nodes = [helper.make_node("Relu", ["x"], ["y"])]
    model = _model(nodes, [_tensor("x", FLOAT, [3])], [_tensor("y", FLOAT, [3])])
    save_onnx(model, tmp_path / "m.onnx")
    assert Path(tmp_path / "m.onnx").stat().st_size > 0
    onnx.checker.check_model(str(tmp_path / "m.onnx"), full_check=True)


def _nested_identities():
    then_nodes = [helper.make_node("Identity", ["x"], ["t1"]), helper.make_node("Neg", ["t1"], ["then_y"])]
    body = helper.make_graph(then_nodes, "then", [], [_tensor("then_y", FLOAT, [4])])
    other = helper.make_graph([helper.make_node("Neg", ["x"], ["else_y"])], "else", [],
                              [_tensor("else_y", FLOAT, [4])])
    nodes = [helper.make_node("Identity", ["x"], ["i"]), helper.make_node("Relu", ["i"], ["r"]),
             helper.make_node("If", ["flag"], ["c"], then_branch=body, else_branch=other),
             helper.make_node("Add", ["r", "c"], ["y"])]
    return _model(nodes, [_tensor("flag", TensorProto.BOOL, []), _tensor("x", FLOAT, [4])],
                  [_tensor("y", FLOAT, [4])])


def test_the_run_counts_ops_from_its_index_nested_graphs_included(write_rules):
    model = _nested_identities()
    feeds = {"flag": np.array(True), "x": np.array([-1, 0, 2, 3], np.float32)}
    expected = _run(model, feeds)
    before = count_nodes(model)
    statistics = rewrite.load_rules(write_rules(IDENTITY_BYPASS)).apply(model, count_ops=True)
    assert statistics.fires == 2
    assert (statistics.ops_before, statistics.ops_after) == (before, count_nodes(model)) == (7, 5)
    np.testing.assert_array_equal(_run(model, feeds)[0], expected[0])


def test_release_leaves_nothing_for_the_cycle_collector(write_rules):
    import gc

    rules = rewrite.load_rules(write_rules(IDENTITY_BYPASS))
    model = _nested_identities()
    gc.collect()
    gc.disable()
    try:
        statistics = rules.apply(model)  # builds, runs and releases its adapter
        unreachable = gc.collect()
    finally:
        gc.enable()
    assert statistics.fires == 2
    assert unreachable == 0


def test_a_second_run_on_one_adapter_edits_the_nodes_the_first_one_built(write_rules):
    # After a write-back the built nodes must hold the model's own messages:
    # the second run rewires a Squeeze the first one built.
    from rewrite.engine.driver import Driver
    from rewrite.predicates import registered_predicates

    nodes = [helper.make_node("Identity", ["x"], ["i"]), helper.make_node("ReduceSum", ["i", "axes"], ["m"])]
    model = _model(nodes, [_tensor("x", FLOAT, [1, 3])], [_tensor("m", FLOAT, [1, 3])], [_ints("axes", [0])])
    feeds = {"x": np.array([[1, -2, 3]], np.float32)}
    before = _run(model, feeds)[0]
    adapter = OnnxAdapter(model)
    for text in (SQUEEZE_UNSQUEEZE, IDENTITY_BYPASS):
        rules = rewrite.load_rules(write_rules(text)).for_dialect("onnx")
        assert Driver(rules, adapter, registered_predicates()).run().fires == 1
    onnx.checker.check_model(model, full_check=True)
    assert [n.op_type for n in model.graph.node if n.op_type != "Constant"] == ["Squeeze", "Unsqueeze"]
    squeeze = next(n for n in model.graph.node if n.op_type == "Squeeze")
    assert squeeze.input[0] == "x"
    np.testing.assert_array_equal(_run(model, feeds)[0], before)


@pytest.mark.parametrize("domain", ["", "com.example"])
def test_an_unknown_op_with_a_graph_attribute_still_counts_its_uses(domain):
    # Attributes are skipped only for standard ops that never had a graph.
    body = helper.make_graph([helper.make_node("Neg", ["outer"], ["inner"])], "body", [],
                             [_tensor("inner", FLOAT, [4])])
    nodes = [helper.make_node("Relu", ["x"], ["outer"]),
             helper.make_node("MadeUpLoop", ["x"], ["y"], domain=domain, body=body)]
    graph = helper.make_graph(nodes, "g", [_tensor("x", FLOAT, [4])], [_tensor("y", FLOAT, [4])])
    opsets = [helper.make_opsetid("", 18)] + ([helper.make_opsetid(domain, 1)] if domain else [])
    model = helper.make_model(graph, opset_imports=opsets)
    adapter = OnnxAdapter(model)
    (consumer,) = adapter.consumers(adapter.main.values["outer"])
    assert adapter.op_type(consumer) == "Neg"
    assert adapter.count_ops() == count_nodes(model) == 3
