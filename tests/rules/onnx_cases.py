"""Building small ONNX graphs and checking a rewrite with onnxruntime."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np
import onnx
import onnxruntime
from onnx import TensorProto, helper, numpy_helper

import rewrite

OPSET = 18
RULES = rewrite.load_rules()

FLOAT, INT64, BOOL = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL


def tensor(name, elem_type, shape):
    return helper.make_tensor_value_info(name, elem_type, shape)


def initializer(name, array):
    return numpy_helper.from_array(np.asarray(array), name)


def node(op_type, inputs, outputs, **attributes):
    return helper.make_node(op_type, inputs, outputs, **attributes)


def model(nodes, inputs, outputs, initializers=(), opset=OPSET, value_info=()):
    graph = helper.make_graph(
        nodes, "test", inputs, outputs, initializer=list(initializers), value_info=list(value_info)
    )
    built = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    onnx.checker.check_model(built, full_check=True)
    return built


def run(built: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    session = onnxruntime.InferenceSession(built.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def counts(built: onnx.ModelProto) -> Counter:
    return Counter(n.op_type for n in built.graph.node)


@dataclass
class Outcome:
    fired: int
    before: Counter
    after: Counter


def rewrite_and_compare(built: onnx.ModelProto, feeds_list: list[dict], rules=RULES) -> Outcome:
    """Apply `rules`; check the model, and that every feed gives the same outputs as before."""
    expected = [run(built, feeds) for feeds in feeds_list]
    names = [o.name for o in built.graph.output]
    before = counts(built)
    statistics = rules.apply(built)
    onnx.checker.check_model(built, full_check=True)
    assert [o.name for o in built.graph.output] == names  # the interface keeps its names
    for feeds, outputs in zip(feeds_list, expected):
        for old, new in zip(outputs, run(built, feeds)):
            assert old.shape == new.shape and old.dtype == new.dtype
            np.testing.assert_array_equal(old, new)
    return Outcome(statistics.fires, before, counts(built))


def floats(*shape, seed=0):
    return np.random.default_rng(seed).normal(size=shape).astype(np.float32)
