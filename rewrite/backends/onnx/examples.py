"""Models from rule examples, their validation, copies and evaluation (onnxruntime)."""


from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from rewrite.backends.onnx import tensors as onnx_tensors
from rewrite.backends.onnx.graph import OnnxError
from rewrite.backends.onnx.schema import attribute_operand, schema_at
from rewrite.engine.interfaces import ExampleFacts, NamedValue, Scaling

EXAMPLE_FACTS = ExampleFacts(
    opsets=(None, 1, 6, 7, 8, 11, 13, 17, 21, 23),
    dtypes=("fp32", "fp16", "int64", "bool"),
    extra_consumer="Exp",
    unary_operand="input",
    constant_operands=frozenset({"repeats", "shape", "perm", "axes", "keepdims", "starts", "ends", "steps", "pads"}),
    contractions=frozenset({"MatMul", "Attention"}),
    flag_input=("flag", "bool", []),
    # OnnxAdapter.scaling: a Mul by k on either side, a Div by 1/k.
    scalings=(Scaling("Mul", "A", "B"), Scaling("Mul", "B", "A"), Scaling("Div", "A", "B", divides=True)),
    old_broadcast_below=7,
    engines=("onnxruntime", "reference"),
    attribute_values=(("keepdims", (0,)),),
)

_EXAMPLE_OPSET = 18


def build_example(inputs, ops, outputs, nested_by: str | None = None, opset: int | None = None) -> onnx.ModelProto:
    """A model from a rule example (see `rewrite.backends.mil.build_example`), at `opset` (default 18).

    With `nested_by` (a bool scalar input), the ops go into both branches of
    an `If` on it, so they live in subgraphs.
    """
    opset = _EXAMPLE_OPSET if opset is None else int(opset)
    if not 1 <= opset <= onnx.defs.onnx_opset_version():
        raise OnnxError(f"opset {opset} is not one this onnx knows (1 to {onnx.defs.onnx_opset_version()})")
    graph_inputs = [
        helper.make_tensor_value_info(name, onnx_tensors.ELEMENT_TYPES[dtype], list(dims))
        for name, dtype, dims in inputs
    ]
    nodes, initializers = [], []
    for name, op_type, operands in ops:
        schema = schema_at(op_type, opset)
        if schema is None:
            raise OnnxError(f"operator '{op_type}' does not exist at opset {opset}")
        node_inputs: list[str] = []
        for parameter in schema.inputs:
            operand = operands.get(parameter.name)
            for item in operand if isinstance(operand, tuple) else (operand,):
                if item is None:
                    node_inputs.append("")
                elif isinstance(item, NamedValue):
                    node_inputs.append(item.name)
                else:
                    array = np.asarray(item)
                    if not isinstance(item, (np.ndarray, np.generic)) and array.dtype.kind == "f":
                        array = array.astype(np.float32)  # a plain literal; a typed one keeps its dtype
                    constant = f"{name}_{parameter.name}_{len(initializers)}"
                    initializers.append(numpy_helper.from_array(array, constant))
                    node_inputs.append(constant)
        while node_inputs and node_inputs[-1] == "":
            node_inputs.pop()
        attributes = {
            key: attribute_operand(schema, key, value, lambda key=key, name=name: f"{name}_{key}")
            for key, value in operands.items() if key in schema.attributes
        }
        nodes.append(helper.make_node(op_type, node_inputs, [name], name=name, **attributes))
    flat = nodes
    if nested_by is not None:
        nodes = [_branching(nodes, outputs, nested_by)]

    def model_of(graph_nodes) -> onnx.ModelProto:
        graph = helper.make_graph(
            graph_nodes, "example", graph_inputs, [helper.make_empty_tensor_value_info(o) for o in outputs],
            initializers,
        )
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])

    model = model_of(nodes)
    # Let onnx type the outputs, so that the example needs to say nothing of them. A
    # nested graph is typed as its flat twin, whose outputs are the If's: onnx's
    # inference reads no constant of the outer scope in a branch (a ReduceMean's
    # axes input, say), and the checker refuses an output it leaves without a shape.
    inferred = onnx.shape_inference.infer_shapes(model if nested_by is None else model_of(flat))
    types = {info.name: info.type for info in list(inferred.graph.value_info) + list(inferred.graph.output)}
    for output in model.graph.output:
        if output.name in types and types[output.name].HasField("tensor_type"):
            output.type.CopyFrom(types[output.name])
    return model


def _branching(nodes, outputs, flag: str) -> onnx.NodeProto:
    """An If on `flag` whose branches both compute `nodes` (renamed apart, as SSA needs)."""
    produced = {output for node in nodes for output in node.output}

    def branch(suffix: str) -> onnx.GraphProto:
        renamed = []
        for node in nodes:
            copy = onnx.NodeProto()
            copy.CopyFrom(node)
            copy.name += suffix
            copy.input[:] = [name + suffix if name in produced else name for name in node.input]
            copy.output[:] = [name + suffix for name in node.output]
            renamed.append(copy)
        results = [helper.make_empty_tensor_value_info(name + suffix) for name in outputs]
        return helper.make_graph(renamed, "branch" + suffix, [], results)

    return helper.make_node("If", [flag], list(outputs), name="nest",
                            then_branch=branch("_then"), else_branch=branch("_else"))


def validate_example(model: onnx.ModelProto) -> None:
    """Raise if onnx's full checker rejects `model` (a type an op does not
    take, say int64 for Mean): such a graph is no instance to verify a rule
    on, however leniently onnx's reference evaluator runs it."""
    onnx.checker.check_model(model, full_check=True)


def copy_program(model: onnx.ModelProto) -> onnx.ModelProto:
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    return copy


def evaluate_example(model: onnx.ModelProto, feeds: dict[str, np.ndarray],
                     engine: str | None = None) -> dict[str, np.ndarray]:
    """Outputs by name: from onnxruntime where it is installed and takes the model,
    else from onnx's reference evaluator (e.g. untyped subgraph outputs). `engine`
    "onnxruntime" or "reference" asks for that one only (raising where it cannot)."""
    results = None
    if engine in (None, "onnxruntime"):
        try:
            import onnxruntime

            onnxruntime.set_default_logger_severity(4)  # shapes that do not broadcast are expected here
            options = onnxruntime.SessionOptions()
            options.log_severity_level = 4
            session = onnxruntime.InferenceSession(model.SerializeToString(), options,
                                                   providers=["CPUExecutionProvider"])
            results = session.run(None, feeds)
        except Exception:  # no onnxruntime, or one that refuses or cannot run the graph
            if engine == "onnxruntime":
                raise
    if results is None:
        from onnx.reference import ReferenceEvaluator

        results = ReferenceEvaluator(model).run(None, feeds)
    return {output.name: np.asarray(value) for output, value in zip(model.graph.output, results)}
