"""`%v -> %v with ...` on ONNX: the op is copied with its attributes, only the named operands change."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime
from onnx import TensorProto, helper

import rewrite

RULE = """dialect onnx

# Moves a Relu from after a Transpose to before it (elementwise, so the order
# does not matter); the Transpose is rebuilt on the Relu's output.
rule relu_before_transpose
  "Relu(Transpose(x)) is Transpose(Relu(x))."
  match %out = Relu(X=%t)
  match %t = Transpose(data=%x)
  where one_use(%t)
  rewrite
    %r = Relu(X=%x)
    %out -> %t with data=%r
"""


def run(model, x):
    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]


def test_a_rebuilt_transpose_keeps_its_perm(tmp_path):
    path = tmp_path / "r.rules"
    path.write_text(RULE)
    rules = rewrite.load_rules(path)
    nodes = [helper.make_node("Transpose", ["x"], ["t"], perm=[1, 0, 2], name="tp"),
             helper.make_node("Relu", ["t"], ["out"], name="relu")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3, 4])],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, [3, "n", 4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    x = np.random.default_rng(0).standard_normal((2, 3, 4)).astype(np.float32)
    before = run(model, x)
    assert rules.apply(model).fired("relu_before_transpose") == 1
    onnx.checker.check_model(model, full_check=True)
    assert [n.op_type for n in model.graph.node] == ["Relu", "Transpose"]
    (transpose,) = [n for n in model.graph.node if n.op_type == "Transpose"]
    assert helper.get_attribute_value(transpose.attribute[0]) == [1, 0, 2]
    np.testing.assert_array_equal(run(model, x), before)
    # Without its perm a Transpose reverses the axes: (4, 3, 2), not (3, 2, 4).
    assert before.shape == (3, 2, 4)
