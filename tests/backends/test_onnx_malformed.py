"""ONNX models that parse but are not valid graphs: refused in one line naming the node, or left alone.

The models here are built with onnx.helper and never given to onnx.checker,
which would refuse most of them before the adapter saw them.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from rewrite import cli, shipped_rules_path
from rewrite.backends.onnx import OnnxAdapter, OnnxError, count_nodes
from rewrite.engine.interfaces import ModelError

FLOAT, INT64, BOOL = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL


def _tensor(name, elem_type=FLOAT, shape=(4,)):
    return helper.make_tensor_value_info(name, elem_type, list(shape))


def _model(nodes, inputs=None, outputs=None, initializers=(), value_info=()):
    inputs = [_tensor("x")] if inputs is None else inputs
    outputs = [_tensor("y")] if outputs is None else outputs
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(initializers), value_info=list(value_info))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def _if(then_nodes, then_output="t", before=(), after=()):
    """x -> If(flag) whose then branch is `then_nodes` (it reads outer names) and else branch is Identity(x)."""
    then_branch = helper.make_graph(then_nodes, "then", [], [_tensor(then_output)])
    else_branch = helper.make_graph([helper.make_node("Identity", ["x"], ["e"], name="else_id")], "else", [],
                                    [_tensor("e")])
    node = helper.make_node("If", ["flag"], ["y"], name="if", then_branch=then_branch, else_branch=else_branch)
    return _model([*before, node, *after], [_tensor("flag", BOOL, []), _tensor("x")])


def _raw(name, data_type, dims, raw):
    tensor = onnx.TensorProto(name=name, data_type=data_type, dims=dims)
    tensor.raw_data = raw
    return tensor


def _ints(name, values):
    return numpy_helper.from_array(np.asarray(values, dtype=np.int64), name)


# ------------------------------------------------- reading before defining

NOT_TOPOLOGICAL = "before any node defines it (nodes out of topological order, or a cycle)"

UNDEFINED = {
    "a cycle": (
        _model([helper.make_node("Add", ["x", "b"], ["a"], name="add_a"),
                helper.make_node("Neg", ["a"], ["b"], name="neg_b"),
                helper.make_node("Relu", ["a"], ["y"], name="relu")]),
        f"node 'add_a' (Add) reads 'b' {NOT_TOPOLOGICAL}",
    ),
    "nodes out of order": (
        _model([helper.make_node("Relu", ["x7"], ["y"], name="relu"),
                helper.make_node("Mul", ["x", "x"], ["x7"], name="mul_3")]),
        f"node 'relu' (Relu) reads 'x7' {NOT_TOPOLOGICAL}",
    ),
    "a name nothing defines": (
        _model([helper.make_node("Add", ["x", "foo"], ["y"], name="n")]),
        "node 'n' (Add) reads 'foo', which nothing defines",
    ),
    "an unnamed node, told by its position": (
        _model([helper.make_node("Relu", ["x"], ["h"]), helper.make_node("Add", ["h", "foo"], ["y"])]),
        "node #1 (Add) reads 'foo', which nothing defines",
    ),
    "a graph output nothing defines": (
        _model([helper.make_node("Relu", ["x"], ["h"], name="relu")]),
        "graph output 'y' is not defined",
    ),
    "a subgraph reading a name nothing defines": (
        _if([helper.make_node("Add", ["x", "foo"], ["t"], name="sub_add")]),
        "node 'sub_add' (Add) in 'then_branch' of node 'if' (If) reads 'foo', which nothing defines",
    ),
    "a subgraph out of order": (
        _if([helper.make_node("Relu", ["q"], ["t"], name="sub_relu"),
             helper.make_node("Neg", ["x"], ["q"], name="sub_neg")]),
        f"node 'sub_relu' (Relu) in 'then_branch' of node 'if' (If) reads 'q' {NOT_TOPOLOGICAL}",
    ),
    "a subgraph reading an outer value defined after its node": (
        _if([helper.make_node("Add", ["x", "late"], ["t"], name="sub_add")],
            after=[helper.make_node("Neg", ["x"], ["late"], name="late_neg")]),
        f"node 'sub_add' (Add) in 'then_branch' of node 'if' (If) reads 'late' {NOT_TOPOLOGICAL}",
    ),
    "a subgraph reading what its own node produces": (
        _if([helper.make_node("Neg", ["y"], ["t"], name="sub_neg")]),
        f"node 'sub_neg' (Neg) in 'then_branch' of node 'if' (If) reads 'y' {NOT_TOPOLOGICAL}",
    ),
    "a subgraph output nothing defines": (
        _if([helper.make_node("Relu", ["x"], ["q"], name="sub_relu")]),
        "graph output 't' in 'then_branch' of node 'if' (If) is not defined",
    ),
}


@pytest.mark.parametrize("model, message", UNDEFINED.values(), ids=UNDEFINED.keys())
def test_a_name_read_before_it_is_defined_is_refused_naming_node_and_value(model, message):
    with pytest.raises(OnnxError) as raised:
        OnnxAdapter(model)
    assert str(raised.value) == message


def test_a_deep_subgraph_error_says_where_it_sits():
    inner = helper.make_graph([helper.make_node("Add", ["x", "foo"], ["t"])], "inner", [], [_tensor("t")])
    plain = helper.make_graph([helper.make_node("Identity", ["x"], ["u"])], "plain", [], [_tensor("u")])
    nested = helper.make_node("If", ["flag"], ["v"], then_branch=inner, else_branch=plain)
    outer = helper.make_graph([helper.make_node("Relu", ["x"], ["r"]), nested], "outer", [], [_tensor("v")])
    other = helper.make_graph([helper.make_node("Identity", ["x"], ["w"])], "other", [], [_tensor("w")])
    model = _model([helper.make_node("If", ["flag"], ["y"], name="top", then_branch=other, else_branch=outer)],
                   [_tensor("flag", BOOL, []), _tensor("x")])
    with pytest.raises(OnnxError) as raised:
        OnnxAdapter(model)
    assert str(raised.value) == (
        "node #0 (Add) in 'then_branch' of node #1 (If) in 'else_branch' of node 'top' (If)"
        " reads 'foo', which nothing defines"
    )


# ------------------------------------------------- single assignment

TWICE = {
    "two nodes writing one name": (
        _model([helper.make_node("Relu", ["x"], ["h"], name="r1"), helper.make_node("Neg", ["x"], ["h"], name="r2"),
                helper.make_node("Identity", ["h"], ["y"], name="id")]),
        "value 'h' is defined twice, by node 'r1' (Relu) and by node 'r2' (Neg)",
    ),
    "a node writing a graph input": (
        _model([helper.make_node("Relu", ["x"], ["x"], name="r1"), helper.make_node("Identity", ["x"], ["y"])]),
        "value 'x' is defined twice, by the graph input and by node 'r1' (Relu)",
    ),
    "a node writing an initializer": (
        _model([helper.make_node("Relu", ["x"], ["w"], name="r1"), helper.make_node("Add", ["w", "w"], ["y"])],
               initializers=[numpy_helper.from_array(np.ones(4, np.float32), "w")]),
        "value 'w' is defined twice, by the initializer and by node 'r1' (Relu)",
    ),
    "two unnamed nodes": (
        _model([helper.make_node("Relu", ["x"], ["h"]), helper.make_node("Neg", ["x"], ["h"]),
                helper.make_node("Identity", ["h"], ["y"])]),
        "value 'h' is defined twice, by node #0 (Relu) and by node #1 (Neg)",
    ),
    "two nodes of a subgraph writing one name": (
        _if([helper.make_node("Relu", ["x"], ["q"], name="s1"), helper.make_node("Neg", ["x"], ["q"], name="s2"),
             helper.make_node("Identity", ["q"], ["t"], name="s3")]),
        "value 'q' is defined twice, by node 's1' (Relu) in 'then_branch' of node 'if' (If)"
        " and by node 's2' (Neg) in 'then_branch' of node 'if' (If)",
    ),
    "a subgraph node shadowing an outer value": (
        _if([helper.make_node("Relu", ["x"], ["h"], name="sub_relu"), helper.make_node("Neg", ["h"], ["t"])],
            before=[helper.make_node("Neg", ["x"], ["h"], name="outer_neg")]),
        "value 'h' is defined twice, by node 'outer_neg' (Neg)"
        " and by node 'sub_relu' (Relu) in 'then_branch' of node 'if' (If)",
    ),
    "a subgraph node shadowing an outer graph input": (
        _if([helper.make_node("Relu", ["x"], ["x"], name="sub_relu"), helper.make_node("Neg", ["x"], ["t"])]),
        "value 'x' is defined twice, by the graph input"
        " and by node 'sub_relu' (Relu) in 'then_branch' of node 'if' (If)",
    ),
    "a graph input declared twice": (
        _model([helper.make_node("Relu", ["x"], ["y"])], [_tensor("x"), _tensor("x")]),
        "graph input 'x' is declared twice",
    ),
    "an initializer given twice": (
        _model([helper.make_node("Add", ["x", "w"], ["y"])],
               initializers=[numpy_helper.from_array(np.ones(4, np.float32), "w")] * 2),
        "initializer 'w' is given twice",
    ),
}


@pytest.mark.parametrize("model, message", TWICE.values(), ids=TWICE.keys())
def test_a_name_defined_twice_is_refused_naming_both_definers(model, message):
    with pytest.raises(OnnxError) as raised:
        OnnxAdapter(model)
    assert str(raised.value) == message


def test_onnx_errors_are_model_errors():
    # The CLI reports any backend's ModelError as a user mistake.
    assert issubclass(OnnxError, ModelError)


# ------------------------------------------------- what stays legal

def _loop_whose_body_input_shadows_an_outer_name():
    body = helper.make_graph(
        [helper.make_node("Neg", ["x"], ["x_next"]), helper.make_node("Identity", ["cond"], ["cond_next"])],
        "body", [_tensor("i", INT64, []), _tensor("cond", BOOL, []), _tensor("x")],
        [_tensor("cond_next", BOOL, []), _tensor("x_next")],
    )
    return _model([helper.make_node("Loop", ["n", "", "x"], ["y"], body=body)],
                  [_tensor("n", INT64, []), _tensor("x")])


LEGAL = {
    # An empty input name is an omitted optional input.
    "omitted optional inputs": _model(
        [helper.make_node("Clip", ["x", "", "hi"], ["y"])], [_tensor("x"), _tensor("hi", FLOAT, [])]),
    "an omitted optional output": _model(
        [helper.make_node("Dropout", ["x"], ["y", ""])]),
    "a subgraph reading outer values": _if(
        [helper.make_node("Add", ["x", "h"], ["t"])], before=[helper.make_node("Neg", ["x"], ["h"])]),
    "a loop body input named like an outer value": _loop_whose_body_input_shadows_an_outer_name(),
    "an initializer that is also a graph input (its default)": _model(
        [helper.make_node("Add", ["x", "w"], ["y"])], [_tensor("x"), _tensor("w")],
        initializers=[numpy_helper.from_array(np.ones(4, np.float32), "w")]),
    # Used to end in MemoryError: the declared length was taken for a rank.
    "a shape operand declared absurdly long": _model(
        [helper.make_node("Expand", ["x", "s"], ["y"])], [_tensor("x"), _tensor("s", INT64, [2**62])],
        [_tensor("y", FLOAT, ["n"])]),
    "two subgraphs using the same inner names": helper.make_model(
        helper.make_graph(
            [helper.make_node("If", ["flag"], ["y"],
                              then_branch=helper.make_graph([helper.make_node("Neg", ["x"], ["t"])], "a", [],
                                                            [_tensor("t")]),
                              else_branch=helper.make_graph([helper.make_node("Relu", ["x"], ["t"])], "b", [],
                                                            [_tensor("t")]))],
            "g", [_tensor("flag", BOOL, []), _tensor("x")], [_tensor("y")]),
        opset_imports=[helper.make_opsetid("", 18)]),
}


@pytest.mark.parametrize("model", LEGAL.values(), ids=LEGAL.keys())
def test_valid_models_are_still_indexed(model):
    onnx.checker.check_model(model, full_check=True)
    adapter = OnnxAdapter(model)
    assert adapter.count_ops() == count_nodes(model)


# ------------------------------------------------- tensors read only when needed

def _expand_model(shape_node_or_initializer):
    """Expand(x, s) feeding Mul, so that s's contents are read while indexing."""
    nodes, initializers = [], []
    if isinstance(shape_node_or_initializer, onnx.NodeProto):
        nodes.append(shape_node_or_initializer)
    else:
        initializers.append(shape_node_or_initializer)
    nodes += [helper.make_node("Expand", ["x", "s"], ["e"], name="expand"),
              helper.make_node("Mul", ["x", "e"], ["y"], name="mul")]
    return _model(nodes, initializers=initializers)


CORRUPT = {
    "an initializer's raw data too short": (
        _expand_model(_raw("s", INT64, [2], b"\0" * 7)),
        "initializer 's' cannot be read (its raw data holds 7 bytes where its shape and type need 16)",
    ),
    "a Constant's raw data too short": (
        _expand_model(helper.make_node("Constant", [], ["s"], name="const", value=_raw("v", INT64, [2], b"\0" * 9))),
        "node 'const' (Constant): its value 's' cannot be read"
        " (its raw data holds 9 bytes where its shape and type need 16)",
    ),
}


@pytest.mark.parametrize("model, message", CORRUPT.values(), ids=CORRUPT.keys())
def test_a_corrupt_tensor_that_is_read_is_refused_naming_it(model, message):
    with pytest.raises(OnnxError) as raised:
        OnnxAdapter(model)
    assert str(raised.value) == message


def test_a_tensor_of_an_unknown_data_type_is_refused_when_read():
    constant = helper.make_node("Constant", [], ["c"], name="const", value=_raw("v", 999, [1], b"\0" * 4))
    adapter = OnnxAdapter(_model([constant, helper.make_node("Add", ["x", "c"], ["y"], name="add")]))
    with pytest.raises(OnnxError, match=r"^node 'const' \(Constant\): its value 'c' cannot be read"
                                        r" \(unknown data type 999\)$"):
        adapter.constant(adapter.main.values["c"])


def test_a_tensor_of_an_unknown_data_type_that_a_rule_reads_is_refused_in_one_line(tmp_path, capsys):
    # Add(x, c) with c of data type 999: the cleanup rules read c (is it 0?).
    model = _model([helper.make_node("Constant", [], ["c"], name="const", value=_raw("v", 999, [1], b"\0" * 4)),
                    helper.make_node("Add", ["x", "c"], ["y"], name="add")])
    source, output = tmp_path / "model.onnx", tmp_path / "out.onnx"
    source.write_bytes(model.SerializeToString())
    code, err = _cli(capsys, "apply", source, "-o", output)
    assert code == cli.EXIT_USAGE and "Traceback" not in err
    assert err.strip().splitlines() == ["rewrite: error: node 'const' (Constant): its value 'c' cannot be read "
                                        "(unknown data type 999)"]
    assert not output.exists()


def test_a_corrupt_or_untyped_attribute_is_refused_when_read():
    attribute = helper.make_attribute("value", _raw("v", FLOAT, [2], b"\0" * 3))
    untyped = onnx.AttributeProto(name="odd")
    node = helper.make_node("ConstantOfShape", ["s"], ["y"], name="fill")
    node.attribute.extend([attribute, untyped])
    adapter = OnnxAdapter(_model([node], [_tensor("s", INT64, [1])]))
    fill = adapter.main.nodes[0]
    with pytest.raises(OnnxError, match=r"^node 'fill' \(ConstantOfShape\): attribute 'value' cannot be read"):
        adapter.attribute(fill, "value")
    with pytest.raises(OnnxError, match=r"^node 'fill' \(ConstantOfShape\): attribute 'odd' has no type$"):
        adapter.attribute(fill, "odd")


def test_a_big_int_initializer_is_not_read_while_indexing():
    # Only small shape-like vectors are read for their contents; a corrupt
    # big one is never looked at unless a rule asks for it.
    model = _model([helper.make_node("Identity", ["x"], ["y"])], [_tensor("x", INT64, [100])],
                   [_tensor("y", INT64, [100])], initializers=[_raw("big", INT64, [100], b"\0" * 7)])
    OnnxAdapter(model)


# ------------------------------------------------- the command line

def _cli(capsys, *arguments):
    code = cli.main([str(a) for a in arguments])
    captured = capsys.readouterr()
    return code, captured.err


def cli_rules():
    return shipped_rules_path()


# CLI-DEPENDENT: the adapter is built inside RuleSet.apply and inside explain,
# so these rely on rewrite/cli.py reporting a ModelError (OnnxError is one)
# raised there as one line with exit 2; a CLI that only converts errors from
# loading the file ends them in a traceback.
REFUSED = {
    "cycle": (UNDEFINED["a cycle"][0], "node 'add_a' (Add) reads 'b' before any node defines it"),
    "undefined": (UNDEFINED["a name nothing defines"][0], "node 'n' (Add) reads 'foo', which nothing defines"),
    "subgraph": (UNDEFINED["a subgraph reading a name nothing defines"][0], "node 'sub_add' (Add) in 'then_branch'"),
    "output": (UNDEFINED["a graph output nothing defines"][0], "graph output 'y' is not defined"),
    "twice": (TWICE["two nodes writing one name"][0], "by node 'r1' (Relu) and by node 'r2' (Neg)"),
    "corrupt": (CORRUPT["a Constant's raw data too short"][0], "node 'const' (Constant): its value 's'"),
}


@pytest.mark.parametrize("model, fragment", REFUSED.values(), ids=REFUSED.keys())
def test_apply_refuses_a_malformed_model_in_one_line(tmp_path, capsys, model, fragment):
    # CLI-DEPENDENT (see above REFUSED).
    source, output = tmp_path / "model.onnx", tmp_path / "out.onnx"
    source.write_bytes(model.SerializeToString())
    code, err = _cli(capsys, "apply", source, "-o", output)
    assert code == cli.EXIT_USAGE, err
    assert "Traceback" not in err
    assert len(err.strip().splitlines()) == 1 and fragment in err, err
    assert not output.exists()


@pytest.mark.parametrize("model, fragment", REFUSED.values(), ids=REFUSED.keys())
def test_explain_refuses_a_malformed_model_in_one_line(tmp_path, capsys, model, fragment):
    # CLI-DEPENDENT (see above REFUSED).
    source = tmp_path / "model.onnx"
    source.write_bytes(model.SerializeToString())
    code, err = _cli(capsys, "explain", cli_rules(), source)
    assert code == cli.EXIT_USAGE, err
    assert "Traceback" not in err
    assert len(err.strip().splitlines()) == 1 and fragment in err, err


# Not valid ONNX either, but nothing the engine needs is broken: it leaves
# what it does not understand alone and writes the rest back unchanged.
TOLERATED = {
    "an unknown op": _model([helper.make_node("Frobnicate", ["x"], ["y"], name="frob")]),
    "a domain with no opset import": _model([helper.make_node("Foo", ["x"], ["y"], name="foo", domain="com.acme")]),
    "an attribute of the wrong type": _model([helper.make_node("Transpose", ["x"], ["y"], name="tp", perm=1.5)]),
    "a Constant with no value": _model([helper.make_node("Constant", [], ["c"], name="const"),
                                        helper.make_node("Add", ["x", "c"], ["y"], name="add")]),
    "a Constant whose value is no tensor": _expand_model(helper.make_node("Constant", [], ["s"], name="c", value=7)),
    "a Constant with no value, declared a shape vector": _model(
        [helper.make_node("Constant", [], ["s"], name="const"), helper.make_node("Expand", ["x", "s"], ["y"])],
        value_info=[_tensor("s", INT64, ["n"])]),
    "a graph input with no type": _model([helper.make_node("Relu", ["x"], ["y"], name="relu")],
                                         [onnx.ValueInfoProto(name="x")]),
    # Used to end in StopIteration from shape inference.
    "Unsqueeze axes out of range": _model([helper.make_node("Unsqueeze", ["x", "axes"], ["y"], name="unsq")],
                                          initializers=[_ints("axes", [99])]),
}

# Invalid nodes whose outputs the model's own declarations give: the rules
# may take them at their word (an Expand declared to keep x's shape keeps it).
DECLARED = {"an attribute of the wrong type", "a Constant with no value, declared a shape vector",
            "Unsqueeze axes out of range"}


@pytest.mark.parametrize("name", TOLERATED)
def test_what_the_engine_does_not_understand_passes_through(tmp_path, capsys, name):
    model = TOLERATED[name]
    source, output = tmp_path / "model.onnx", tmp_path / "out.onnx"
    source.write_bytes(model.SerializeToString())
    code, err = _cli(capsys, "apply", source, "-o", output)
    assert code == 0, err
    assert "Traceback" not in err
    written = onnx.load(str(output))
    if name not in DECLARED:
        assert [n.op_type for n in written.graph.node] == [n.op_type for n in model.graph.node]
    code, err = _cli(capsys, "explain", cli_rules(), source)
    assert code == 0, err
