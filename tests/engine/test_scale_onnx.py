"""ONNX graphs where one op touches many: fan-out, wide variadic nodes, nested bodies.

Every case checks the node counts and the outputs (onnxruntime, at two batch
sizes) before and after the shipped rules run. The cost is checked without a
clock: the consumers the engine lists over a whole run must grow linearly
with the graph (cleaning up after each rewrite once listed every remaining
use of a shared value), and the adapter's use index must agree with a recount
from the nodes after any sequence of edits.
"""

from __future__ import annotations

import random
from collections import Counter

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import TensorProto, helper, numpy_helper

import rewrite
from rewrite.backends.onnx import OnnxAdapter
from rewrite.engine.rewriter import remove_dead

OPSET = 18
HIDDEN = 16
BATCHES = (3, 5)


@pytest.fixture(scope="module")
def rules():
    return rewrite.load_rules(dialects=["onnx"])


def _out(name: str, elem_type=TensorProto.FLOAT, shape=None):
    """A declared output: rank 2, dims left symbolic, unless `shape` says otherwise."""
    return helper.make_tensor_value_info(name, elem_type, ["batch", f"{name}_width"] if shape is None else shape)


def _model(nodes, outputs, initializers=(), inputs=None, check=True) -> onnx.ModelProto:
    inputs = inputs or [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", HIDDEN])]
    graph = helper.make_graph(
        nodes, "scale", inputs,
        [_out(name) for name in outputs],
        [numpy_helper.from_array(np.array([-1], np.int64), "axes"), *initializers],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    if check:
        onnx.checker.check_model(model)
    return model


def _statistic(x="x", suffix=""):
    """A per-row mean m [batch, 1] and the shape s of x, both to be shared."""
    return [
        helper.make_node("ReduceMean", [x, "axes"], ["m" + suffix], keepdims=1),
        helper.make_node("Shape", [x], ["s" + suffix]),
    ]


def fan_out(n: int) -> onnx.ModelProto:
    """One Shape value and one mean feed every layer: x = Mul(x, Expand(m, s)), n times."""
    nodes = _statistic()
    x = "x"
    for i in range(n):
        nodes.append(helper.make_node("Expand", ["m", "s"], [f"e{i}"]))
        nodes.append(helper.make_node("Mul", [x, f"e{i}"], [f"x{i}"]))
        x = f"x{i}"
    return _model(nodes, [x])


def wide(n: int, op_type: str) -> onnx.ModelProto:
    """One variadic node of x and n Expands of the shared mean."""
    nodes = _statistic()
    inputs = ["x"]
    for i in range(n):
        nodes.append(helper.make_node("Expand", ["m", "s"], [f"e{i}"]))
        inputs.append(f"e{i}")
    attributes = {"axis": 1} if op_type == "Concat" else {}
    nodes.append(helper.make_node(op_type, inputs, ["y"], **attributes))
    return _model(nodes, ["y"])


def mixed(n: int) -> onnx.ModelProto:
    """Shared values feeding Expands of which every other one must stay (a Concat's)."""
    nodes = _statistic()
    x, kept = "x", []
    for i in range(n):
        nodes.append(helper.make_node("Expand", ["m", "s"], [f"e{i}"]))
        if i % 2:
            kept.append(f"e{i}")  # Concat does not broadcast: this Expand is needed
        else:
            nodes.append(helper.make_node("Add", [x, f"e{i}"], [f"x{i}"]))
            x = f"x{i}"
    nodes.append(helper.make_node("Concat", [x, *kept], ["y"], axis=1))
    return _model(nodes, ["y"])


def _branch(name: str, n: int, outer: str) -> onnx.GraphProto:
    """A body of n layers reading the outer m, s and `outer` by name (no inputs of its own)."""
    nodes, x = [], outer
    for i in range(n):
        nodes.append(helper.make_node("Expand", ["m", "s"], [f"{name}_e{i}"]))
        nodes.append(helper.make_node("Mul", [x, f"{name}_e{i}"], [f"{name}_x{i}"]))
        x = f"{name}_x{i}"
    nodes.append(helper.make_node("Identity", [x], [f"{name}_out"]))
    return helper.make_graph(nodes, name, [], [_out(f"{name}_out")])


def nested(n: int) -> onnx.ModelProto:
    """An If whose branches, and a Loop whose body (inside the then branch too), use the outer m and s."""
    loop_body_nodes = [
        helper.make_node("Expand", ["m", "s"], ["body_e"]),
        helper.make_node("Mul", ["carried", "body_e"], ["body_x"]),
        helper.make_node("Identity", ["cond_in"], ["cond_out"]),
    ]
    loop_body = helper.make_graph(
        loop_body_nodes, "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         _out("carried", shape=["carried_batch", HIDDEN])],
        [_out("cond_out", TensorProto.BOOL, []), _out("body_x")],
    )
    then_branch = _branch("then", n, "x")
    then_branch.node.append(helper.make_node("Loop", ["trips", ""], ["looped"], body=loop_body))
    then_branch.node[-1].input[1] = "true"
    then_branch.node[-1].input.append("then_out")
    then_branch.output[0].name = "looped"
    nodes = [
        *_statistic(),
        helper.make_node("ReduceSum", ["x"], ["total"], keepdims=0),
        helper.make_node("Greater", ["total", "zero"], ["flag"]),
        helper.make_node("If", ["flag"], ["y"], then_branch=then_branch, else_branch=_branch("else", n, "x")),
    ]
    initializers = [
        numpy_helper.from_array(np.array(0.0, np.float32), "zero"),
        numpy_helper.from_array(np.array(3, np.int64), "trips"),
        numpy_helper.from_array(np.array(True), "true"),
    ]
    return _model(nodes, ["y"], initializers)


def _all_nodes(graph: onnx.GraphProto):
    for node in graph.node:
        yield node
        for attribute in node.attribute:
            if attribute.type == onnx.AttributeProto.GRAPH:
                yield from _all_nodes(attribute.g)
            for subgraph in attribute.graphs:
                yield from _all_nodes(subgraph)


def _counts(model: onnx.ModelProto) -> Counter:
    return Counter(node.op_type for node in _all_nodes(model.graph))


def _run(model: onnx.ModelProto) -> list[list[np.ndarray]]:
    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    return [session.run(None, {"x": rng.normal(size=(b, HIDDEN)).astype(np.float32) + 0.5}) for b in BATCHES]


class CountingAdapter:
    """An `OnnxAdapter` that adds up how many consumers it was asked to list."""

    def __init__(self, inner: OnnxAdapter):
        self._inner = inner
        self.listed = 0

    def consumers(self, value):
        found = self._inner.consumers(value)
        self.listed += len(found)
        return found

    def __getattr__(self, name):
        return getattr(self._inner, name)


def _rewrite(rules, model: onnx.ModelProto) -> tuple[Counter, Counter, int]:
    """Apply the rules; outputs must not change. Returns counts before, after, and consumers listed."""
    before, expected = _counts(model), _run(model)
    adapter = CountingAdapter(OnnxAdapter(model))
    rules.apply_with(adapter)
    adapter.release()
    onnx.checker.check_model(model)
    for old, new in zip(expected, _run(model)):
        for a, b in zip(old, new):
            assert a.shape == b.shape
            np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)
    return before, _counts(model), adapter.listed


@pytest.mark.parametrize("n", [50, 400])
def test_fan_out_removes_every_expand_listing_linearly(rules, n):
    before, after, listed = _rewrite(rules, fan_out(n))
    assert before["Expand"] == n and after["Expand"] == 0
    assert after["Shape"] == 0  # dead once the last Expand went
    assert after["Mul"] == n and after["ReduceMean"] == 1
    # Each anchor's `every use` lists its one consumer, and nothing lists the
    # n uses of m or s per removal (that was n^2/2 = 80,000 at n = 400).
    assert listed <= 4 * n


@pytest.mark.parametrize("op_type", ["Sum", "Max", "Mean"])
def test_wide_multidirectional_node(rules, op_type):
    before, after, _ = _rewrite(rules, wide(300, op_type))
    assert before["Expand"] == 300 and after["Expand"] == 0
    assert after[op_type] == 1 and after["Shape"] == 0


def test_wide_concat_keeps_its_expands(rules):
    before, after, listed = _rewrite(rules, wide(300, "Concat"))
    assert after == before
    assert listed <= 4 * 300


def test_kept_and_removed_anchors_share_values(rules):
    before, after, listed = _rewrite(rules, mixed(400))
    assert before["Expand"] == 400 and after["Expand"] == 200
    assert after["Shape"] == 1  # still used by the kept Expands
    assert listed <= 4 * 400


def test_nested_bodies_read_the_outer_values(rules):
    before, after, _ = _rewrite(rules, nested(20))
    assert before["Expand"] == 41 and after["Expand"] == 0
    assert after["Shape"] == 0 and after["Loop"] == 1 and after["If"] == 1


def test_removing_an_if_frees_what_only_its_bodies_read():
    # p is read inside a branch only; q is output by a branch as it is (which
    # onnx's checker refuses, and onnxruntime and this adapter take).
    then_branch = helper.make_graph(
        [helper.make_node("Neg", ["p"], ["t"])], "then", [], [_out("t")]
    )
    else_branch = helper.make_graph([], "else", [], [_out("q")])
    nodes = [
        helper.make_node("Relu", ["x"], ["p"]),
        helper.make_node("Abs", ["x"], ["q"]),
        helper.make_node("ReduceSum", ["x"], ["total"], keepdims=0),
        helper.make_node("Greater", ["total", "zero"], ["flag"]),
        helper.make_node("If", ["flag"], ["unused"], then_branch=then_branch, else_branch=else_branch),
        helper.make_node("Identity", ["x"], ["y"]),
    ]
    model = _model(nodes, ["y"], [numpy_helper.from_array(np.array(0.0, np.float32), "zero")], check=False)
    adapter = OnnxAdapter(model)
    if_node = next(node for node in adapter.main.nodes if node.type == "If")
    p, q = adapter.main.values["p"], adapter.main.values["q"]
    assert adapter.has_uses(p) and adapter.has_uses(q)
    removed = remove_dead(adapter, [if_node])
    # The If, its Neg, and what fed only them: Relu, Abs, Greater, ReduceSum.
    assert removed == 6
    assert not adapter.has_uses(p) and not adapter.has_uses(q)
    adapter.finish()
    assert [node.op_type for node in model.graph.node] == ["Identity"]
    onnx.checker.check_model(model)


# ---------------------------------------------------------------- the use index under edits


def _recount(adapter: OnnxAdapter, value) -> Counter:
    """The uses of `value` from the live nodes' inputs: node -> positions."""
    found: Counter = Counter()
    for graph in _graphs(adapter.main):
        for node in graph.nodes:
            if node.live:
                found[node] += sum(1 for v in node.inputs if v is value)
    return +found


def _graphs(graph):
    yield graph
    for node in graph.nodes:
        if node.live:
            for block in node.blocks:
                yield from _graphs(block)


@pytest.mark.parametrize("seed", range(4))
def test_use_index_agrees_with_a_recount_after_random_edits(seed):
    rng = random.Random(seed)
    # Three shared values read by many nodes, some twice, one node very wide.
    nodes = [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Neg", ["x"], ["b"]),
             helper.make_node("Abs", ["x"], ["c"])]
    for i in range(60):
        first, second = rng.choice("abc"), rng.choice("abc")
        nodes.append(helper.make_node("Add", [first, second], [f"n{i}"]))
    nodes.append(helper.make_node("Sum", [rng.choice("abc") for _ in range(40)], ["wide"]))
    nodes.append(helper.make_node("Sum", [f"n{i}" for i in range(60)] + ["wide"], ["y"]))
    adapter = OnnxAdapter(_model(nodes, ["y"]))
    values = [adapter.main.values[name] for name in "abc"]
    consumers = [node for node in adapter.main.nodes if node.type in ("Add", "Sum") and node.outputs[0].name != "y"]
    for _ in range(300):
        node = rng.choice(consumers)
        if not node.live:
            continue
        action = rng.random()
        old, new = rng.choice(values), rng.choice(values)
        if action < 0.6:
            adapter.replace_operand(node, old, new)
        elif action < 0.7:
            adapter.replace_all_uses(old, new)
        else:
            adapter.remove_op(node)
        for value in values:
            recount = _recount(adapter, value)
            assert set(adapter.consumers(value)) == set(recount)
            assert len(value.uses) - value.stale == sum(recount.values())
            assert adapter.has_uses(value) == bool(recount)
