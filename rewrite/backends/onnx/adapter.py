"""The ONNX backend's adapter: `onnx.ModelProto`s as the engine sees them.

The model stays raw protobuf. On top of it `OnnxAdapter` keeps a thin index
of its own (`graph`): a `Node` per NodeProto, a `Value` per defined name,
each value's uses, and a `Graph` per (sub)graph with its parent scope. That
index costs about as much as loading the file; onnx-ir's conversion was
measured at ten times more (see the issue), and load and save count in what
a user waits for. This module builds the index and answers the engine's
questions; the edits are `editing`, a base class of the adapter.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

import numpy as np
import onnx
from onnx import helper

from rewrite.backends.onnx import files as onnx_files
from rewrite.backends.onnx import shapes as onnx_shapes
from rewrite.backends.onnx import tensors as onnx_tensors
from rewrite.backends.onnx.editing import OnnxEditing
from rewrite.backends.onnx.graph import (
    Graph,
    Node,
    OnnxError,
    Value,
    check_no_shadowing,
    defined_twice,
    describe_node,
    describe_scope,
    is_output,
    is_stored_constant,
    live_uses,
    present,
    undefined_input,
)
from rewrite.backends.onnx.schema import (
    DIALECT,
    MULTIDIRECTIONAL_SINCE,
    flat_ops,
    has_side_effects,
    schema_at,
    schema_input_index,
)
from rewrite.backends.onnx.shape_rules import carried_axes
from rewrite.engine.interfaces import (
    Capability,
    OperandRejected,
    TypesUnknown,
    follow_unknown_dim,
)
from rewrite.engine.shapes import IncompatibleShapes

_FLOAT_DTYPES = frozenset({"fp16", "fp32", "fp64", "bf16"})


class OnnxAdapter(OnnxEditing):
    """The engine's view of an `onnx.ModelProto`, rewritten in place."""

    dialect = DIALECT
    capabilities = frozenset({
        Capability.USE_INDEX, Capability.USES_VERSION, Capability.BROADCASTING, Capability.INFERRED_TYPES,
        Capability.SHAPE_VALUES, Capability.SCALINGS, Capability.TARGETS, Capability.ATTRIBUTE_DEFAULTS,
        Capability.REBUILD, Capability.UNKNOWN_DIM_ORIGINS, Capability.COUNT_OPS, Capability.RELEASE,
    })

    def __init__(
        self, model: onnx.ModelProto, base_dir: str | None = None, *, overridable_initializers: bool | None = None
    ):
        """Index `model`; `base_dir` is the folder its external tensors are read from.

        An initializer the graph also lists as an input may be overridden at
        run time from IR version 4 on, and is then no constant; below IR 4
        the format requires every initializer to be listed so, and
        onnxruntime takes them as constants. `overridable_initializers`
        decides it either way (None: by the IR version, `initializer_semantics`).
        """
        self.model = model
        self.base_dir = base_dir
        if overridable_initializers is None:
            overridable_initializers = model.ir_version >= 4 or model.ir_version == 0
        self.overridable_initializers = overridable_initializers
        # Names the training graphs read, bind or update: kept, and not constants.
        self.training_names = training_names(model)
        self._functions = {(f.domain, f.name): f for f in model.functions}
        self._side_effects: dict[str, bool] = {}
        self.opset = next(
            (o.version for o in model.opset_import if o.domain in ("", "ai.onnx")),
            onnx.defs.onnx_opset_version(),
        )
        self._serial = itertools.count()
        self._names: set[str] | None = None
        self._input_indexes: dict[str, dict[str, int | slice]] = {}  # by op type; the opset is fixed
        self._removed: list[Node] = []  # for `release`: removed nodes sit in reference cycles too
        # Inferred shapes, each distinct one held once (`shapes.infer_node`).
        self.shape_pool: dict[tuple, tuple] = {}
        self.main = self._index_graph(model.graph, None, None)
        for name in self.training_names:
            value = self.main.values.get(name)
            if value is not None:
                value.pinned = True
        onnx_shapes.infer(self, self.main)

    # ---- building the index

    def _index_graph(
        self, proto: onnx.GraphProto, parent: Graph | None, owner: Node | None, attribute: str = ""
    ) -> Graph:
        """Index one graph, its subgraphs included, refusing what is not valid ONNX.

        The validation falls out of the one pass: a name that does not resolve
        when read is read out of topological order (a cycle is one) or never
        defined; fewer names than definitions means one was defined twice,
        against single assignment. What went wrong is worked out only then.
        """
        graph = Graph(proto, parent, owner, attribute)
        declared = {info.name: info for info in proto.value_info}
        for info in proto.input:
            if info.name in graph.values:
                raise OnnxError(f"graph input '{info.name}'{describe_scope(graph)} is declared twice")
            value = self._define(graph, info.name, None)
            # Only the model's own inputs are the user's declaration; a
            # subgraph's (Loop and Scan bodies) were written by an exporter.
            onnx_shapes.declare(value, info, trusted=parent is None)
        stored: set[str] = set()
        sparse = [(tensor.values.name, tensor) for tensor in proto.sparse_initializer]
        for name, tensor in [(tensor.name, tensor) for tensor in proto.initializer] + sparse:
            if name in stored:
                raise OnnxError(f"initializer '{name}'{describe_scope(graph)} is given twice")
            stored.add(name)
            value = graph.values.get(name)
            if value is not None and self.overridable_initializers:
                continue  # listed as an input: the user's to give; this is only its default
            if value is None:
                value = self._define(graph, name, None)
            value.shape = tuple(int(d) for d in tensor.dims)
            value.dtype = onnx_tensors.dtype_name(
                tensor.values.data_type if isinstance(tensor, onnx.SparseTensorProto) else tensor.data_type)
            if parent is None and name in self.training_names:
                continue  # training rewrites it: no constant, as far as the engine is concerned
            value.initializer = tensor
        # The hot loop of loading: names in the top graph resolve with one dict
        # lookup; only subgraphs walk their enclosing scopes.
        find = graph.values.get if parent is None else graph.lookup
        values = graph.values
        nodes = graph.nodes
        # Counting definitions costs less than looking each new name up first
        # (a measured 1% of indexing at 1M nodes), and tells the same.
        defined = len(values)
        # A standard op that no opset gave a graph attribute carries no
        # subgraph; reading its attributes anyway would make protobuf keep a
        # container for them (30 MB at 100k nodes). Unknown ops are read.
        flat = flat_ops()
        for node_proto in proto.node:
            node = Node(node_proto, graph)
            inputs = []
            # Slicing copies a repeated field out in one call, cheaper than
            # iterating it through protobuf.
            for name in node_proto.input[:]:
                if not name:
                    inputs.append(None)
                    continue
                value = find(name)
                if value is None:
                    raise undefined_input(graph, node_proto, len(nodes), name)
                inputs.append(value)
                value.uses.append(node)
            node.inputs = tuple(inputs)
            # Subgraphs before the node's own outputs: a body that reads what
            # its node produces is a cycle, so those names must not resolve.
            if node.type not in flat and len(node_proto.attribute):
                blocks = []
                for attribute_proto in node_proto.attribute:
                    if attribute_proto.type == onnx.AttributeProto.GRAPH:
                        blocks.append(self._index_graph(attribute_proto.g, graph, node, attribute_proto.name))
                    elif attribute_proto.type == onnx.AttributeProto.GRAPHS:
                        blocks.extend(
                            self._index_graph(g, graph, node, attribute_proto.name) for g in attribute_proto.graphs
                        )
                node.blocks = tuple(blocks)
            outputs = []
            for name in node_proto.output[:]:
                if name:
                    value = Value(name, graph, node)
                    values[name] = value
                    outputs.append(value)
                    defined += 1
                else:
                    outputs.append(None)
            node.outputs = tuple(outputs)
            nodes.append(node)
        if len(values) != defined:
            raise defined_twice(graph)
        if parent is not None:
            check_no_shadowing(graph)
        for name, info in declared.items():
            value = graph.values.get(name)
            if value is not None:
                onnx_shapes.declare(value, info, trusted=False)
        for info in proto.output:
            value = graph.lookup(info.name)
            if value is None:
                raise OnnxError(f"graph output '{info.name}'{describe_scope(graph)} is not defined")
            graph.outputs.append(value)
            value.output_of += (graph,)
            onnx_shapes.declare(value, info, trusted=False)
        return graph

    def _define(self, graph: Graph, name: str, producer: Node | None) -> Value:
        value = Value(name, graph, producer)
        graph.values[name] = value
        return value

    # ---- structure

    def top_blocks(self) -> Sequence[Graph]:
        return [self.main]

    def operations(self, block: Graph) -> Sequence[Node]:
        self._place_inserted(block)
        return list(block.nodes)

    def _place_inserted(self, graph: Graph) -> None:
        if not graph.inserted:
            return
        ordered = []
        for node in graph.nodes:
            ordered.extend(graph.inserted.get(id(node), ()))
            ordered.append(node)
        graph.nodes = ordered
        graph.inserted.clear()

    def block_outputs(self, block: Graph) -> Sequence[Value]:
        return [value for value in block.outputs if value is not None]

    def nested_blocks(self, op: Node) -> Sequence[Graph]:
        return op.blocks

    def is_live(self, op: Node) -> bool:
        return op.live

    def op_type(self, op: Node) -> str:
        return op.type

    def op_name(self, op: Node) -> str:
        return op.proto.name or f"{op.proto.op_type}({', '.join(op.proto.output)})"

    def block_of(self, op: Node) -> Graph:
        return op.graph

    def has_side_effects(self, op: Node) -> bool:
        """Whether removing `op` unused could change what the model does (see `side_effects`)."""
        if not any(op.proto.output):
            return True  # an op that computes nothing is there for what else it does
        known = self._side_effects.get(op.type)
        if known is None:
            known = self._side_effects[op.type] = has_side_effects(
                op.proto.domain, op.proto.op_type, self.model, self._functions, self.opset, set())
        return known

    def _input_index(self, op: Node) -> dict[str, int | slice]:
        index = self._input_indexes.get(op.type)
        if index is None:
            index = schema_input_index(op.proto.op_type, self.opset, op.proto.domain)
            self._input_indexes[op.type] = index
        return index

    def operand(self, op: Node, name: str):
        where = self._input_index(op).get(name)
        if where is None:
            return None
        if isinstance(where, slice):
            return present(op.inputs[where])
        return op.inputs[where] if where < len(op.inputs) else None

    def operand_names(self, op: Node) -> Sequence[str]:
        return [name for name in self._input_index(op) if self.operand(op, name) is not None]

    def operands(self, op: Node) -> Sequence[Value]:
        return present(op.inputs)

    def outputs(self, op: Node) -> Sequence[Value]:
        return present(op.outputs)

    def attribute(self, op: Node, name: str):
        for attribute in op.proto.attribute:
            if attribute.name == name:
                if attribute.type == onnx.AttributeProto.UNDEFINED:
                    raise OnnxError(f"{describe_node(op)}: attribute '{name}' has no type")
                return self._attribute_value(op, attribute)
        return None

    def attribute_default(self, op: Node, name: str):
        """The value the op's schema, at the version this model's opset gives
        the op, says attribute `name` has where the node does not set it (the
        `axis` of a Softmax: 1 before opset 13, -1 from 13); None where the
        schema gives it none (it is required, or its default is prose)."""
        domain = op.proto.domain
        if domain in ("", "ai.onnx"):
            opset = self.opset
        else:
            opset = next((o.version for o in self.model.opset_import if o.domain == domain), None)
            if opset is None:
                return None
        schema = schema_at(op.proto.op_type, opset, "" if domain == "ai.onnx" else domain)
        found = None if schema is None else schema.attributes.get(name)
        if found is None or found.default_value.type == onnx.AttributeProto.UNDEFINED:
            return None
        return self._attribute_value(op, found.default_value)

    def _attribute_value(self, op: Node, attribute: onnx.AttributeProto):
        """An attribute as a rule reads it: a number, a string, a list, a tensor as a (nested) list."""
        value = helper.get_attribute_value(attribute)
        if isinstance(value, onnx.TensorProto):
            if self._left_on_disk(value):
                return None  # see `_left_on_disk`
            try:
                value = onnx_tensors.read_tensor(value, self.base_dir).tolist()
            except onnx_tensors.UnreadableTensor as error:
                raise OnnxError(f"{describe_node(op)}: attribute '{attribute.name}' cannot be read ({error})") from None
        if isinstance(value, bytes):
            return value.decode("utf-8", "replace")
        if isinstance(value, (list, tuple)):
            return [v.decode("utf-8", "replace") if isinstance(v, bytes) else v for v in value]
        return value

    # ---- values

    def producer(self, value: Value) -> Node | None:
        return value.producer

    def defining_block(self, value: Value) -> Graph:
        return value.graph

    def consumers(self, value: Value) -> Sequence[Node]:
        return live_uses(value)

    def uses_version(self, value: Value) -> int:
        """Changes whenever a node starts or stops using `value` (`Adapter.uses_version`)."""
        return value.uses_version

    def has_uses(self, value: Value) -> bool:
        """Whether a live node uses `value` or a graph outputs it: O(1) (see `Value.stale`)."""
        return len(value.uses) > value.stale or bool(value.output_of) or value.pinned

    def use_count(self, value: Value, limit: int | None = None) -> int:
        """How many distinct live nodes use `value`: counted once, then kept (see `Value.readers`)."""
        if value.readers is None:
            value.readers = len(live_uses(value))
        return value.readers if limit is None else min(value.readers, limit)

    def is_block_output(self, value: Value) -> bool:
        return is_output(value)

    def shape(self, value: Value):
        return value.shape

    def dtype(self, value: Value) -> str | None:
        return value.dtype

    def shape_value(self, value: Value) -> list | None:
        """The dims a shape-like value holds, as shape inference followed them (`Value.contents`)."""
        return None if value.contents is None else list(value.contents)

    def op_available(self, op_type: str) -> bool | None:
        """Whether the default domain has `op_type` at this model's opset."""
        if self.SCHEMA_NAMES is None:
            OnnxAdapter.SCHEMA_NAMES = frozenset(s.name for s in onnx.defs.get_all_schemas() if s.domain == "")
        if op_type not in self.SCHEMA_NAMES:
            return None
        return schema_at(op_type, self.opset) is not None

    SCHEMA_NAMES: frozenset[str] | None = None

    def broadcast_operands(self, op: Node) -> tuple[Value, ...] | None:
        """The operands an op broadcasts multidirectionally into its output, at this model's opset.

        An op broadcasts that way only from the version that says so: Add and
        its kind from opset 7 (before, only one way and with an attribute),
        Sum, Max, Min and Mean from 8. Anything else, or an op of another
        domain, is None.
        """
        if op.proto.domain not in ("", "ai.onnx"):
            return None
        since = MULTIDIRECTIONAL_SINCE.get(op.type)
        if since is None or self.opset < since:
            return None
        return present(op.inputs)

    def inferred_output_types(self, op: Node, old: Value, new: Value) -> list:
        """The (dtype, dims) the inference that typed the graph (`onnx_shapes`: its own
        rules, else onnx's inference of the op at this opset) gives `op`'s outputs were
        its operand `old` replaced by `new`; the node is left as it was. For the shape
        guard's refusals to say what would change (`Adapter.inferred_output_types`):
        no proof, since that inference is written for valid graphs and need not
        refuse an operand the op does not take (Sum-6 of shapes that differ).

        Raises `OperandRejected` for a new operand the op cannot combine with its
        others (shapes that do not broadcast), and `TypesUnknown`, saying why,
        where the inference cannot tell.
        """
        if op.blocks:
            raise TypesUnknown(f"'{op.type}' has subgraphs, which type its outputs and are not inferred again")
        if new.dtype is None:
            raise TypesUnknown(f"the dtype of '{new.name}' is not known")
        if new.shape is None:
            raise TypesUnknown(f"the rank of '{new.name}' is not known")
        if "." in op.type:
            raise TypesUnknown(f"no type inference is known for the ops of the domain '{op.proto.domain}'")
        inputs = op.inputs
        # Swapped in for the inference only, which reads a node's inputs and writes nothing.
        op.inputs = tuple(new if value is old else value for value in inputs)
        try:
            results = onnx_shapes.inferred_outputs(self, op)
        except IncompatibleShapes as error:
            raise OperandRejected(str(error) or "the shapes do not combine") from None
        finally:
            op.inputs = inputs
        if results is None:
            raise TypesUnknown(f"the inference of '{op.type}' at opset {self.opset} gives no type with it")
        outputs = [value for value in op.outputs if value is not None]
        found = [(dtype, None if shape is None else tuple(shape)) for shape, dtype in results[: len(outputs)]]
        return found + [(None, None)] * (len(outputs) - len(found))  # outputs it says nothing of: unknown

    def unknown_dim_origin(self, value: Value, axis: int) -> Node | None:
        """The node whose shape inference (`onnx_shapes`) lost dim `axis` of `value`.

        Followed through the axes the inference rules map (elementwise,
        broadcasting, Concat, Transpose, Slice, Tile, Expand, Gather); None
        when an input was declared so.
        """
        return follow_unknown_dim(self, value, axis, carried_axes)

    def constant(self, value: Value):
        if value._constant is None:
            if self._too_big_to_read(value):
                return None
            try:
                value._constant = onnx_tensors.constant_of(value, self.base_dir)
            except onnx_tensors.UnreadableTensor as error:
                # Checked only here, when a tensor is first read: checking every
                # tensor up front would read all the weights of a big model.
                where = (
                    f"initializer '{value.name}'{describe_scope(value.graph)}" if value.producer is None
                    else f"{describe_node(value.producer)}: its value '{value.name}'"
                )
                raise OnnxError(f"{where} cannot be read ({error})") from None
        return value._constant

    def value_name(self, value: Value) -> str:
        return value.name

    def scaling(self, op: Node) -> tuple[Value, float] | None:
        """(x, k) when `op` computes k·x for a finite k, in a float dtype: a Mul or
        Div (multidirectional, opset 7 on) by a constant that holds k everywhere
        and cannot widen x (one element and no more axes than x, or x's own
        literal shape), or a Neg (k = -1). The builtins `unscaled` and
        `scale_of` walk chains of these."""
        if op.proto.domain not in ("", "ai.onnx") or op.type not in ("Mul", "Div", "Neg"):
            return None
        output = op.outputs[0] if op.outputs else None
        if output is None or output.dtype not in _FLOAT_DTYPES:
            return None
        if op.type == "Neg":
            x = op.inputs[0] if op.inputs else None
            return (x, -1.0) if x is not None and x.dtype == output.dtype else None
        if self.broadcast_operands(op) is None or len(op.inputs) != 2 or None in op.inputs:
            return None
        a, b = op.inputs
        for scaled, factor in [(a, b)] if op.type == "Div" else [(a, b), (b, a)]:
            if scaled.dtype != output.dtype or scaled.shape is None or is_stored_constant(scaled):
                continue
            k = self._uniform_factor(factor, scaled)
            if k is None or not math.isfinite(k) or (op.type == "Div" and k == 0.0):
                continue  # inf·x is no scaling one could fold (0·inf is NaN); nor is x/0
            return scaled, (1.0 / k if op.type == "Div" else k)
        return None

    def _uniform_factor(self, factor: Value, scaled: Value) -> float | None:
        """The one float constant `factor` holds, if it cannot widen `scaled` when broadcast."""
        shape = factor.shape
        if shape is None or not (all(d == 1 for d in shape) and len(shape) <= len(scaled.shape)
                                 or tuple(shape) == tuple(scaled.shape)):
            return None  # decided before reading the tensor: a weight it multiplies is no scaling
        constant = self.constant(factor)
        if constant is None:
            return None
        array = np.asarray(constant)
        if array.dtype.kind != "f" or array.size == 0:
            return None
        flat = array.reshape(-1)
        if not (flat == flat[0]).all():
            return None
        if not (array.size == 1 and array.ndim <= len(scaled.shape)) and array.shape != scaled.shape:
            return None
        return float(flat[0])

    def _too_big_to_read(self, value: Value) -> bool:
        """Whether `value` is an initializer or Constant whose tensor stays on disk (`_left_on_disk`)."""
        tensor = value.initializer
        if tensor is None and value.producer is not None and value.producer.type == "Constant":
            tensor = next((a.t for a in value.producer.proto.attribute if a.name == "value" and a.HasField("t")),
                          None)
        if isinstance(tensor, onnx.SparseTensorProto):
            return self._left_on_disk(tensor.values) or self._left_on_disk(tensor.indices)
        return tensor is not None and self._left_on_disk(tensor)

    def _left_on_disk(self, tensor: onnx.TensorProto) -> bool:
        """Whether `tensor` is external data no rule gets to read: larger than a rule ever needs, or homeless.

        External tensors stay where they are (see `onnx_files`): a rule asks
        for constants to read shapes, repeats, axes and scalars, and reading
        a weight only to find it is none of those would bring gigabytes in.
        Such a tensor reads as no constant: no rule can depend on its value.
        Without the model's folder there is nowhere to read one from (never
        the working directory).
        """
        if tensor.data_location != onnx.TensorProto.EXTERNAL:
            return False
        if self.base_dir is None:
            return True
        size = onnx_files.external_size(tensor)
        return size is None or size > onnx_files.EXTERNAL_READ_LIMIT

    # ---- mutation

    def count_ops(self) -> int:
        """Live nodes, subgraphs included."""
        total = 0
        stack = [self.main]
        while stack:
            graph = stack.pop()
            self._place_inserted(graph)
            for node in graph.nodes:
                if node.live:
                    total += 1
                    if node.blocks:
                        stack.extend(node.blocks)
        return total


def training_names(model: onnx.ModelProto) -> frozenset[str]:
    """The names of the main graph the model's training_info reads or binds.

    A training graph may read any name of the inference graph, and each
    binding names an initializer that training (or its initialization)
    writes: none of them may be removed or renamed, nor such an initializer
    taken as a constant.
    """
    names: set[str] = set()
    for training in model.training_info:
        for graph in (training.initialization, training.algorithm):
            names.update(_free_names(graph))
        names.update(binding.key for binding in training.initialization_binding)
        names.update(binding.key for binding in training.update_binding)
    return frozenset(names)


def _free_names(graph: onnx.GraphProto) -> set[str]:
    """The names `graph`'s nodes (and their subgraphs') read that it does not define."""
    defined = {info.name for info in graph.input} | {tensor.name for tensor in graph.initializer}
    defined.update(tensor.values.name for tensor in graph.sparse_initializer)
    read: set[str] = set()
    for node in graph.node:
        read.update(name for name in node.input if name and name not in defined)
        for attribute in node.attribute:
            for subgraph in ([attribute.g] if attribute.type == onnx.AttributeProto.GRAPH else attribute.graphs):
                read.update(name for name in _free_names(subgraph) if name not in defined)
        defined.update(node.output)
    return read
