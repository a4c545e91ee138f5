"""Constant folding and dead-value pruning for ONNX models, over the adapter's index.

Two kinds of node become `Constant`s:

- a node whose every input is a constant, evaluated by onnx's reference
  evaluator (`onnx.reference`) at the model's opset;
- a node whose output the shape inference knows element by element as
  literal ints (`Value.contents`): `Shape -> Gather/Slice -> Concat/Unsqueeze`
  chains over dims that are numbers, whatever the rest of the shape is.

A folded value larger than `limit_bytes` is left alone, so that a weight
transposed or cast at load time is not stored twice. Tensors left on disk
(external data too large to read) are no constants here, so they are
never brought into memory. Nodes with subgraphs, of other domains, or whose
evaluation fails, are left as they are: folding is an optimization, never a
reason to fail.

`prune` then removes every node none of whose outputs is used, and the
initializers no node of any graph reads.
"""

from __future__ import annotations

import warnings

import numpy as np
import onnx
from onnx import helper, numpy_helper

from rewrite.backends.onnx.adapter import OnnxAdapter, training_names
from rewrite.backends.onnx.graph import Node, Value
from rewrite.engine.interfaces import ModelError
from rewrite.engine.steps import Steps

# Folded values up to this size become constants (1 MiB).
DEFAULT_LIMIT_BYTES = 1 << 20

# Ops that are not functions of their inputs alone; and DequantizeLinear,
# which is: but a quantized model keeps its weights quantized, each
# dequantized at its use (the QDQ format a quantizing runtime fuses), and
# folding would store them as floats four times the size (onnxruntime's own
# folding leaves it too).
_NOT_FOLDED = frozenset({
    "RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike", "Multinomial", "Bernoulli",
    "Constant", "If", "Loop", "Scan", "SequenceConstruct", "SequenceEmpty", "Optional", "OptionalGetElement",
    "DequantizeLinear",
})
_INTEGER_KINDS = "iu"


FOLDING = "constant folding"
PRUNING = "dead-node pruning"


def fold_constants(adapter: OnnxAdapter, limit_bytes: int = DEFAULT_LIMIT_BYTES, steps: Steps | None = None) -> int:
    """Replace every foldable node of every graph by `Constant`s; return how many were folded.

    `steps` records each fold (and stops at its limit, see `Steps`).
    """
    folded = 0
    pending = list(adapter.top_blocks())
    while pending:
        graph = pending.pop()
        for node in list(adapter.operations(graph)):
            pending.extend(adapter.nested_blocks(node))
            if adapter.is_live(node) and _fold(adapter, node, limit_bytes, steps):
                folded += 1
    return folded


def _fold(adapter: OnnxAdapter, node: Node, limit_bytes: int, steps: Steps | None) -> bool:
    if node.proto.domain not in ("", "ai.onnx") or node.type in _NOT_FOLDED or node.blocks:
        return False
    outputs = [v for v in node.outputs if v is not None]
    if not outputs or not any(adapter.has_uses(v) for v in outputs):
        return False  # dead: pruning removes it
    arrays = _known_contents(adapter, outputs)
    if arrays is None:
        arrays = _evaluated(adapter, node)
    if arrays is None or sum(a.nbytes for a in arrays) > limit_bytes:
        return False
    if steps is not None:
        steps.take(FOLDING)
    for value, array in zip(outputs, arrays):
        if adapter.has_uses(value):
            tensor = numpy_helper.from_array(array, value.name + "_folded")
            constant = adapter.build("Constant", {"value": tensor}, before=node, name=value.name + "_folded")
            adapter.replace_all_uses(value, constant)
    adapter.remove_op(node)
    return True


def _known_contents(adapter: OnnxAdapter, outputs: list[Value]) -> list[np.ndarray] | None:
    """The outputs as arrays, where shape inference knows every element as a literal int."""
    if len(outputs) != 1:
        return None
    value = outputs[0]
    contents, shape, dtype = value.contents, adapter.shape(value), adapter.dtype(value)
    if contents is None or shape is None or len(shape) > 1 or dtype not in ("int64", "int32"):
        return None
    if not all(isinstance(d, int) and not isinstance(d, bool) for d in contents):
        return None
    if len(shape) == 1 and shape[0] != len(contents) or len(shape) == 0 and len(contents) != 1:
        return None
    array = np.asarray(contents, dtype=np.int64 if dtype == "int64" else np.int32)
    return [array.reshape(()) if len(shape) == 0 else array]


def _evaluated(adapter: OnnxAdapter, node: Node) -> list[np.ndarray] | None:
    """The node's outputs, computed by onnx's reference evaluator from its constant inputs."""
    inputs = []
    for value in node.inputs:
        if value is None:
            inputs.append(None)
            continue
        try:
            constant = adapter.constant(value)
        except ModelError:
            return None  # a tensor that cannot be read folds nothing; a rule that reads it says so
        if constant is None:
            return None
        inputs.append(np.asarray(constant))
    names = [f"input_{i}" if array is not None else "" for i, array in enumerate(inputs)]
    initializers = [numpy_helper.from_array(array, name) for name, array in zip(names, inputs) if array is not None]
    outputs = [f"output_{i}" if v is not None else "" for i, v in enumerate(node.outputs)]
    proto = helper.make_node(node.proto.op_type, names, outputs, domain=node.proto.domain)
    proto.attribute.extend(node.proto.attribute)
    graph = helper.make_graph(
        [proto], "fold", [],
        [helper.make_value_info(name, onnx.TypeProto()) for name in outputs if name], initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", adapter.opset)])
    model.ir_version = onnx.IR_VERSION
    try:
        from onnx.reference import ReferenceEvaluator

        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            results = ReferenceEvaluator(model).run(None, {})
    except Exception:
        return None  # an op the evaluator lacks, or inputs it refuses: the node stays
    arrays = [np.asarray(r) for r in results]
    for value, array in zip([v for v in node.outputs if v is not None], arrays):
        expected = adapter.dtype(value)
        if expected is not None and expected != _dtype_name(array):
            return None  # the evaluator's numpy promotion disagrees with the op's output type
    return arrays


def _dtype_name(array: np.ndarray) -> str:
    name = array.dtype.name
    return {"float32": "fp32", "float16": "fp16", "float64": "fp64", "bool": "bool"}.get(name, name)


def prune(adapter: OnnxAdapter, steps: Steps | None = None) -> int:
    """Remove nodes none of whose outputs is used and that have no side effects, last first; return how many.

    `steps` records each removal (and stops at its limit, see `Steps`).
    """
    removed = 0
    pending = list(adapter.top_blocks())
    while pending:
        graph = pending.pop()
        nodes = list(adapter.operations(graph))
        for node in nodes:
            pending.extend(adapter.nested_blocks(node))
        for node in reversed(nodes):
            if adapter.is_live(node) and not adapter.has_side_effects(node) and not any(
                v is not None and adapter.has_uses(v) for v in node.outputs
            ):
                if steps is not None:
                    steps.take(PRUNING)
                adapter.remove_op(node)
                removed += 1
    return removed


def _graphs(model: onnx.ModelProto) -> list[onnx.GraphProto]:
    """The main graph and every subgraph, at any depth."""
    found, pending = [], [model.graph]
    while pending:
        graph = pending.pop()
        found.append(graph)
        for node in graph.node:
            for attribute in node.attribute:
                if attribute.type == onnx.AttributeProto.GRAPH:
                    pending.append(attribute.g)
                elif attribute.type == onnx.AttributeProto.GRAPHS:
                    pending.extend(attribute.graphs)
    return found


def initializers_are_inputs(model: onnx.ModelProto) -> bool:
    """Whether the model's IR version requires every initializer to be listed as a graph input (below 4)."""
    return 0 < model.ir_version < 4


def prune_model(model: onnx.ModelProto, overridable_initializers: bool | None = None) -> int:
    """Drop the initializers (sparse ones too) that no node of any graph, no graph output and no
    training graph reads, and the value_info of names no graph defines any more; return how many
    initializers went.

    An initializer the graph lists as an input stays when it may be
    overridden (`overridable_initializers`; None: from IR version 4 on): it
    is then an input of the model with a default. Below IR 4, where every
    initializer is listed so and each is a constant, an unread one goes
    with its listing. Entries are deleted where they are, never copied: a
    kept initializer may be a large weight.
    """
    if overridable_initializers is None:
        overridable_initializers = not initializers_are_inputs(model)
    graphs = _graphs(model)
    read: set[str] = set()
    defined: set[str] = set()
    for graph in graphs:
        read.update(output.name for output in graph.output)
        defined.update(i.name for i in graph.input)
        defined.update(t.name for t in graph.initializer)
        defined.update(t.values.name for t in graph.sparse_initializer)
        for node in graph.node:
            read.update(node.input)
            defined.update(node.output)
    read |= training_names(model)
    removed = 0
    for graph in graphs:
        inputs = {i.name for i in graph.input}
        # Only the main graph's listings are the user's; a body's inputs are its op's to bind.
        unlisted = not overridable_initializers and graph is model.graph
        gone: set[str] = set()
        for field, name_of in ((graph.initializer, _tensor_name), (graph.sparse_initializer, _sparse_name)):
            for index in reversed(range(len(field))):
                name = name_of(field[index])
                if name not in read and (name not in inputs or unlisted):
                    del field[index]
                    defined.discard(name)
                    gone.add(name)
                    removed += 1
        if gone & inputs:
            for index in reversed(range(len(graph.input))):
                if graph.input[index].name in gone:
                    del graph.input[index]
    for graph in graphs:
        for index in reversed(range(len(graph.value_info))):
            if graph.value_info[index].name not in defined:
                del graph.value_info[index]
    return removed


def _tensor_name(tensor: onnx.TensorProto) -> str:
    return tensor.name


def _sparse_name(tensor: onnx.SparseTensorProto) -> str:
    return tensor.values.name


def constants_to_initializers(model: onnx.ModelProto) -> int:
    """Move every `Constant` node's tensor into its graph's initializers, as onnx's own tools do;
    return how many moved. A constant is then data, not a node to run (nor to count).

    Only `value` tensors move (sparse and attribute-referencing constants
    stay); the tensor takes the node's output name, so every reader finds it.
    Below IR version 4 an initializer must be listed as a graph input: the
    main graph's are, and a body's Constants stay nodes (its inputs are its
    op's to bind). Nodes are deleted where they are, never copied.
    """
    listed = initializers_are_inputs(model)
    moved = 0
    for graph in [model.graph] if listed else _graphs(model):
        positions = []
        for index, node in enumerate(graph.node):
            if node.op_type != "Constant" or node.domain not in ("", "ai.onnx") or len(node.attribute) != 1:
                continue
            attribute = node.attribute[0]
            if attribute.name != "value" or attribute.type != onnx.AttributeProto.TENSOR or attribute.ref_attr_name:
                continue
            initializer = graph.initializer.add()
            initializer.CopyFrom(attribute.t)
            initializer.name = node.output[0]
            if listed:
                graph.input.append(helper.make_tensor_value_info(
                    initializer.name, initializer.data_type, list(initializer.dims)))
            positions.append(index)
        for index in reversed(positions):
            del graph.node[index]
        moved += len(positions)
    return moved
