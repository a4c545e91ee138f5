"""The ONNX backend: `.onnx` files and `onnx.ModelProto`s.

The model stays raw protobuf. On top of it `OnnxAdapter` keeps a thin index
of its own: a `Node` per NodeProto, a `Value` per defined name, each value's
uses, and a `Graph` per (sub)graph with its parent scope. That index costs
about as much as loading the file; onnx-ir's conversion was measured at ten
times more (see the issue), and load and save count in what a user waits for.

Edits touch the index and the changed NodeProtos only; the graph's node
lists are rebuilt once, in `finish`, for the graphs that changed.
"""

from __future__ import annotations

import functools
import itertools
import math
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from sys import intern
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from rewrite.backends import pass_groups
from rewrite.backends.onnx import files as onnx_files
from rewrite.backends.onnx import shapes as onnx_shapes
from rewrite.engine.interfaces import (
    Capability,
    InputSpec,
    ModelError,
    OperandRejected,
    OpSignature,
    TypesUnknown,
    follow_unknown_dim,
)
from rewrite.engine.shapes import IncompatibleShapes

DIALECT = "onnx"
_FLOAT_DTYPES = frozenset({"fp16", "fp32", "fp64", "bf16"})


class OnnxError(ModelError):
    """An ONNX model could not be read, indexed or written; the message names the file, node or value."""


# ---------------------------------------------------------------- op schema


class OnnxSchema:
    """The default-domain operators of `onnx.defs`, at their newest version."""

    dialect = DIALECT
    groups = pass_groups(DIALECT)

    @functools.cached_property
    def _schemas(self) -> dict[str, Any]:
        return {s.name: s for s in onnx.defs.get_all_schemas() if s.domain == ""}

    @functools.cached_property
    def _signatures(self) -> dict[str, OpSignature | None]:
        return {}

    def signature(self, op_type: str) -> OpSignature | None:
        if op_type not in self._signatures:
            schema = self._schemas.get(op_type)
            self._signatures[op_type] = None if schema is None else _signature(schema)
        return self._signatures[op_type]

    def op_types(self) -> Sequence[str]:
        return sorted(self._schemas)


def _signature(schema) -> OpSignature:
    option = onnx.defs.OpSchema.FormalParameterOption
    inputs = tuple(
        InputSpec(p.name, p.option == option.Optional, p.option == option.Variadic) for p in schema.inputs
    )
    return OpSignature(schema.name, inputs, tuple(schema.attributes))


SCHEMA = OnnxSchema()


@functools.cache
def schema_at(op_type: str, opset: int, domain: str = ""):
    try:
        return onnx.defs.get_schema(op_type, opset, domain)
    except onnx.defs.SchemaError:
        return None


def _schema_input_index(op_type: str, opset: int, domain: str) -> dict[str, int | slice]:
    """Schema input names to positions; a variadic input takes the rest."""
    schema = schema_at(op_type, opset, domain)
    if schema is None:
        return {}
    option = onnx.defs.OpSchema.FormalParameterOption
    index: dict[str, int | slice] = {}
    for position, parameter in enumerate(schema.inputs):
        index[parameter.name] = slice(position, None) if parameter.option == option.Variadic else position
    return index


# ---------------------------------------------------------------- the index


class Value:
    """A name defined in one graph: a graph input, an initializer or a node output."""

    __slots__ = (
        "name", "graph", "producer", "uses", "stale", "detached", "readers", "output_of", "pinned", "initializer",
        "shape", "dtype", "contents", "_constant", "uses_version",
    )

    def __init__(self, name: str, graph: Graph, producer: Node | None = None):
        self.name = name
        self.graph = graph
        self.producer = producer
        # Nodes using the value, once per operand position, in order. Entries
        # go stale lazily (see "uses" below) so that a value shared by
        # thousands of nodes, such as one attention mask or one Shape feeding
        # every layer, loses a use in amortized O(1): `stale` counts them, so
        # "is it used?" is `len(uses) > stale`, O(1).
        self.uses: list[Node] = []
        self.stale = 0
        # Live nodes that stopped using the value at some positions (an
        # operand replaced in one consumer), with how many of their entries in
        # `uses` are stale; None when there are none.
        self.detached: dict[Node, int] | None = None
        # How many distinct live nodes read the value: counted the first time
        # `use_count` asks, kept up to date by every edit from then on; None before.
        self.readers: int | None = None
        # Bumped by every edit that makes a node start or stop reading the
        # value (`OnnxAdapter.uses_version`); compacting stale entries is none.
        self.uses_version = 0
        self.output_of: tuple[Graph, ...] = ()  # graphs (this one or nested ones) that output it
        # Read by name from outside the graphs (the model's training_info):
        # used, and its name stays, as a model output's does.
        self.pinned = False
        # The tensor of an initializer the engine may take as a constant (a
        # sparse one's too); None for one a user may override at run time,
        # which is an input like any other.
        self.initializer: onnx.TensorProto | onnx.SparseTensorProto | None = None
        self.shape: tuple | None = None
        self.dtype: str | None = None
        self.contents: list | None = None  # the dims a shape-like value holds, if known
        self._constant: np.ndarray | None = None

    def __repr__(self) -> str:
        return f"Value({self.name})"


class Node:
    """One NodeProto, with its operands resolved to `Value`s through the scopes."""

    __slots__ = ("proto", "type", "graph", "inputs", "outputs", "blocks", "live", "positions")

    def __init__(self, proto: onnx.NodeProto, graph: Graph):
        self.proto = proto
        # The engine asks for the type at every op of every sweep, and each
        # protobuf field read costs more than a slot read.
        # Interned: protobuf hands out a new string per read, and a million
        # nodes of a few types would hold a million copies of their names.
        domain, op_type = proto.domain, proto.op_type
        self.type = intern(op_type if domain in ("", "ai.onnx") else f"{domain}.{op_type}")
        self.graph = graph
        # Tuples, built once: at 100k nodes every list header counts.
        self.inputs: tuple[Value | None, ...] = ()
        self.outputs: tuple[Value | None, ...] = ()
        self.blocks: tuple[Graph, ...] = ()
        self.live = True
        # For a node with many inputs (a Concat or Sum of thousands), the
        # positions of each value among them, built at its first operand
        # replacement, so that replacing one operand does not walk them all.
        self.positions: dict[Value, list[int]] | None = None

    def __repr__(self) -> str:
        return f"Node({self.proto.op_type} {self.proto.name})"


class Graph:
    """A GraphProto and the names it defines; `parent` is the enclosing scope."""

    __slots__ = (
        "proto", "parent", "owner", "attribute", "nodes", "values", "outputs", "inserted", "added", "dirty",
    )

    def __init__(self, proto: onnx.GraphProto, parent: Graph | None, owner: Node | None, attribute: str = ""):
        self.proto = proto
        self.parent = parent
        self.owner = owner
        self.attribute = attribute  # the owner's attribute holding it, for messages
        self.nodes: list[Node] = []
        self.values: dict[str, Value] = {}
        self.outputs: list[Value | None] = []
        # New nodes waiting to be placed before an existing one (keyed by id).
        self.inserted: dict[int, list[Node]] = {}
        self.added: list[Node] = []  # built nodes whose protos are not in proto.node yet
        self.dirty = False

    def lookup(self, name: str) -> Value | None:
        scope: Graph | None = self
        while scope is not None:
            value = scope.values.get(name)
            if value is not None:
                return value
            scope = scope.parent
        return None


class OnnxAdapter:
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
                raise OnnxError(f"graph input '{info.name}'{_scope(graph)} is declared twice")
            value = self._define(graph, info.name, None)
            # Only the model's own inputs are the user's declaration; a
            # subgraph's (Loop and Scan bodies) were written by an exporter.
            onnx_shapes.declare(value, info, trusted=parent is None)
        stored: set[str] = set()
        sparse = [(tensor.values.name, tensor) for tensor in proto.sparse_initializer]
        for name, tensor in [(tensor.name, tensor) for tensor in proto.initializer] + sparse:
            if name in stored:
                raise OnnxError(f"initializer '{name}'{_scope(graph)} is given twice")
            stored.add(name)
            value = graph.values.get(name)
            if value is not None and self.overridable_initializers:
                continue  # listed as an input: the user's to give; this is only its default
            if value is None:
                value = self._define(graph, name, None)
            value.shape = tuple(int(d) for d in tensor.dims)
            value.dtype = onnx_shapes.dtype_name(
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
        flat = _flat_ops()
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
                    raise _undefined_input(graph, node_proto, len(nodes), name)
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
            raise _defined_twice(graph)
        if parent is not None:
            _check_no_shadowing(graph)
        for name, info in declared.items():
            value = graph.values.get(name)
            if value is not None:
                onnx_shapes.declare(value, info, trusted=False)
        for info in proto.output:
            value = graph.lookup(info.name)
            if value is None:
                raise OnnxError(f"graph output '{info.name}'{_scope(graph)} is not defined")
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
            known = self._side_effects[op.type] = _has_side_effects(
                op.proto.domain, op.proto.op_type, self.model, self._functions, self.opset, set())
        return known

    def _input_index(self, op: Node) -> dict[str, int | slice]:
        index = self._input_indexes.get(op.type)
        if index is None:
            index = _schema_input_index(op.proto.op_type, self.opset, op.proto.domain)
            self._input_indexes[op.type] = index
        return index

    def operand(self, op: Node, name: str):
        where = self._input_index(op).get(name)
        if where is None:
            return None
        if isinstance(where, slice):
            return _present(op.inputs[where])
        return op.inputs[where] if where < len(op.inputs) else None

    def operand_names(self, op: Node) -> Sequence[str]:
        return [name for name in self._input_index(op) if self.operand(op, name) is not None]

    def operands(self, op: Node) -> Sequence[Value]:
        return _present(op.inputs)

    def outputs(self, op: Node) -> Sequence[Value]:
        return _present(op.outputs)

    def attribute(self, op: Node, name: str):
        for attribute in op.proto.attribute:
            if attribute.name == name:
                if attribute.type == onnx.AttributeProto.UNDEFINED:
                    raise OnnxError(f"{_label(op)}: attribute '{name}' has no type")
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
                value = onnx_shapes.read_tensor(value, self.base_dir).tolist()
            except onnx_shapes.UnreadableTensor as error:
                raise OnnxError(f"{_label(op)}: attribute '{attribute.name}' cannot be read ({error})") from None
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
        return _live_uses(value)

    def uses_version(self, value: Value) -> int:
        """Changes whenever a node starts or stops using `value` (`Adapter.uses_version`)."""
        return value.uses_version

    def has_uses(self, value: Value) -> bool:
        """Whether a live node uses `value` or a graph outputs it: O(1) (see `Value.stale`)."""
        return len(value.uses) > value.stale or bool(value.output_of) or value.pinned

    def use_count(self, value: Value, limit: int | None = None) -> int:
        """How many distinct live nodes use `value`: counted once, then kept (see `Value.readers`)."""
        if value.readers is None:
            value.readers = len(_live_uses(value))
        return value.readers if limit is None else min(value.readers, limit)

    def is_block_output(self, value: Value) -> bool:
        return _is_output(value)

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
        since = _MULTIDIRECTIONAL_SINCE.get(op.type)
        if since is None or self.opset < since:
            return None
        return _present(op.inputs)

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
        return follow_unknown_dim(self, value, axis, onnx_shapes.carried_axes)

    def constant(self, value: Value):
        if value._constant is None:
            if self._too_big_to_read(value):
                return None
            try:
                value._constant = onnx_shapes.constant_of(value, self.base_dir)
            except onnx_shapes.UnreadableTensor as error:
                # Checked only here, when a tensor is first read: checking every
                # tensor up front would read all the weights of a big model.
                where = (
                    f"initializer '{value.name}'{_scope(value.graph)}" if value.producer is None
                    else f"{_label(value.producer)}: its value '{value.name}'"
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
            if scaled.dtype != output.dtype or scaled.shape is None or _is_stored_constant(scaled):
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

    def _fresh_name(self, hint: str) -> str:
        if self._names is None:
            self._names = set()
            _collect_names(self.model.graph, self._names)
        while True:
            name = f"{hint}_{next(self._serial)}"
            if name not in self._names:
                self._names.add(name)
                return name

    def build(self, op_type: str, operands: dict[str, Any], before: Node, name: str) -> Value:
        graph = before.graph
        schema = schema_at(op_type, self.opset)
        if schema is None:
            raise OnnxError(f"operator '{op_type}' does not exist at opset {self.opset}")
        input_names = [p.name for p in schema.inputs]
        inputs: list[str] = []
        attributes = {}
        for key, operand in operands.items():
            if key in schema.attributes:
                attributes[key] = attribute_operand(schema, key, operand, lambda key=key: self._fresh_name(key))
        for parameter in input_names:
            if parameter not in operands:
                inputs.append("")
                continue
            operand = operands[parameter]
            if isinstance(operand, tuple):
                inputs.extend(self._as_value(v, before, name).name for v in operand)
            else:
                inputs.append(self._as_value(operand, before, name).name)
        while inputs and inputs[-1] == "":
            inputs.pop()
        output = self._fresh_name(name)
        proto = helper.make_node(op_type, inputs, [output], name=self._fresh_name(name), **attributes)
        return self._insert(proto, graph, before).outputs[0]

    def rebuild(self, op: Node, changes: dict[str, Any], before: Node, name: str) -> Value:
        """A copy of `op`, attributes and all, with the operands and attributes named in `changes`
        replaced; returns its first output. (Building from operands alone would drop the
        attributes: a Transpose rebuilt without its perm reverses the axes.)"""
        schema = schema_at(op.proto.op_type, self.opset, op.proto.domain)
        if schema is None:
            raise OnnxError(f"operator '{op.proto.op_type}' does not exist at opset {self.opset}")
        index = self._input_index(op)
        inputs = list(op.proto.input)
        attributes = {a.name: a for a in op.proto.attribute}
        for key, operand in changes.items():
            where = index.get(key)
            if where is None:
                if key not in schema.attributes:
                    raise OnnxError(f"operator '{op.proto.op_type}' has no input or attribute '{key}'")
                operand = attribute_operand(schema, key, operand, lambda key=key: self._fresh_name(key))
                attributes[key] = helper.make_attribute(key, operand)
            elif isinstance(where, slice):
                operands = operand if isinstance(operand, tuple) else (operand,)
                inputs[where] = [self._as_value(v, before, name).name for v in operands]
            else:
                inputs.extend([""] * (where + 1 - len(inputs)))
                inputs[where] = "" if operand is None else self._as_value(operand, before, name).name
        while inputs and inputs[-1] == "":
            inputs.pop()
        outputs = [self._fresh_name(name) if output else "" for output in op.proto.output]
        proto = helper.make_node(op.proto.op_type, inputs, outputs, name=self._fresh_name(name),
                                 domain=op.proto.domain or None)
        proto.attribute.extend(attributes.values())
        return self._insert(proto, before.graph, before).outputs[0]

    def _as_value(self, operand, before: Node, name: str) -> Value:
        if isinstance(operand, Value):
            return operand
        array = np.asarray(operand)
        if array.dtype == np.float64:
            array = array.astype(np.float32)
        tensor = numpy_helper.from_array(array, self._fresh_name(name + "_value"))
        proto = helper.make_node("Constant", [], [tensor.name], name=self._fresh_name(name + "_constant"), value=tensor)
        return self._insert(proto, before.graph, before).outputs[0]

    def _insert(self, proto: onnx.NodeProto, graph: Graph, before: Node) -> Node:
        node = Node(proto, graph)
        node.inputs = tuple(graph.lookup(input_name) if input_name else None for input_name in proto.input)
        for value in node.inputs:
            if value is not None:
                value.uses.append(node)
                value.uses_version += 1
        for value in {id(v): v for v in node.inputs if v is not None and v.readers is not None}.values():
            value.readers += 1
        node.outputs = tuple(self._define(graph, output, node) for output in proto.output)
        graph.inserted.setdefault(id(before), []).append(node)
        graph.added.append(node)
        graph.dirty = True
        onnx_shapes.infer_node(self, node)
        return node

    def replace_all_uses(self, old: Value, new: Value) -> None:
        if old is new:
            return
        old.uses_version += 1
        new.uses_version += 1
        uses = new.uses
        for node in _live_uses(old):
            counted = new.readers is not None and not _reads(node, new)
            # One entry per position, as indexing makes them.
            uses.extend(itertools.repeat(node, _substitute(node, old, new)))
            if counted:
                new.readers += 1
        old.uses = []
        old.stale = 0
        old.detached = None
        if old.readers is not None:
            old.readers = 0
        if _is_output(old):
            self._replace_output(old, new)

    def replace_operand(self, op: Node, old: Value, new: Value) -> None:
        if old is new:
            return
        counted = new.readers is not None and not _reads(op, new)
        count = _substitute(op, old, new)
        if not count:
            return
        old.uses_version += 1
        new.uses_version += 1
        _detach_use(old, op, count)
        new.uses.extend(itertools.repeat(op, count))
        if old.readers is not None:
            old.readers -= 1  # it read old wherever it did, and reads it nowhere now
        if counted:
            new.readers += 1
        op.graph.dirty = True

    def _replace_output(self, old: Value, new: Value) -> None:
        graphs = dict.fromkeys(old.output_of)
        carrier = None
        if old.pinned or self.main in graphs:
            # The model's outputs, and what its training graphs read, are
            # its interface: the name stays.
            carrier = self._take_name(old, new)
            carrier.pinned, old.pinned = carrier.pinned or old.pinned, False
        for graph in graphs:
            for position, value in enumerate(graph.outputs):
                if value is not old:
                    continue
                if graph is self.main:
                    graph.outputs[position] = carrier
                    carrier.output_of += (graph,)
                elif new.producer is not None and new.graph is graph and graph not in new.output_of:
                    # Subgraph outputs bind by position; the name may change.
                    graph.outputs[position] = new
                    new.output_of += (graph,)
                else:
                    # A body may not return a value it did not compute: an
                    # enclosing scope's value, its own input or initializer
                    # ("Subgraph output (y) is an outer scope value being
                    # returned directly"), nor one value at two positions.
                    bridged = self._identity(graph, new, self._fresh_name(old.name + "_bridged"))
                    graph.outputs[position] = bridged
                    bridged.output_of += (graph,)
                graph.dirty = True
        old.output_of = ()

    def _take_name(self, old: Value, new: Value) -> Value:
        """Give `old`'s name, in its graph, to `new` (or to an Identity of it); return the value that has it."""
        graph = old.graph
        name = old.name
        self._rename(old, self._fresh_name(name + "_replaced"))
        graph.dirty = True
        renamable = (
            new.producer is not None
            and new.graph is graph
            and not _is_output(new)
            and all(use.graph is graph for use in _live_uses(new))
        )
        if renamable:
            self._rename(new, name)
            return new
        # An input, an initializer or another output cannot give up its name.
        return self._identity(graph, new, name)

    def _identity(self, graph: Graph, new: Value, name: str) -> Value:
        """A new Identity of `new` named `name`, placed last in `graph`; its output."""
        proto = helper.make_node("Identity", [new.name], [name], name=self._fresh_name(name + "_bridge"))
        node = Node(proto, graph)
        node.inputs = (new,)
        new.uses.append(node)
        new.uses_version += 1
        if new.readers is not None:
            new.readers += 1
        output = self._define(graph, name, node)
        output.shape, output.dtype, output.contents = new.shape, new.dtype, new.contents
        node.outputs = (output,)
        graph.nodes.append(node)
        graph.added.append(node)
        graph.dirty = True
        return output

    def _rename(self, value: Value, name: str) -> None:
        graph = value.graph
        graph.values.pop(value.name, None)
        if value.producer is not None:
            outputs = value.producer.proto.output
            for position, output in enumerate(outputs):
                if output == value.name:
                    outputs[position] = name
        for use in _live_uses(value):
            for position, input_name in enumerate(use.proto.input):
                if input_name == value.name and use.inputs[position] is value:
                    use.proto.input[position] = name
        value.name = name
        graph.values[name] = value

    def remove_op(self, op: Node) -> None:
        self._removed.append(op)
        self._retire(op)
        for value in op.outputs:
            if value is not None:
                op.graph.values.pop(value.name, None)
        op.graph.dirty = True

    def _retire(self, op: Node) -> None:
        """Mark `op` and every node of its subgraphs removed, and drop their uses.

        A body's nodes use values of enclosing scopes by name, and a body may
        output one: once the owner is gone neither is a use any longer, or a
        value only a removed body read would look used for ever.
        """
        pending = [op]
        while pending:
            node = pending.pop()
            node.live = False
            counted = None
            for value in node.inputs:
                if value is not None:
                    _drop_use(value, node)
                    value.uses_version += 1
                    if value.readers is not None:
                        if counted is None:
                            counted = set()
                        if id(value) not in counted:
                            counted.add(id(value))
                            value.readers -= 1
            for block in node.blocks:
                for value in block.outputs:
                    if value is not None:
                        value.output_of = tuple(graph for graph in value.output_of if graph is not block)
                self._place_inserted(block)
                pending.extend(inner for inner in block.nodes if inner.live)

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

    def finish(self) -> None:
        """Write the index's edits back into the protobuf graphs that changed."""
        self._write_back(self.main)

    def release(self) -> None:
        """Take the index apart; the adapter is not used after this.

        Nodes, values and graphs point at each other, so left alone the index
        waits for the cyclic collector, whose pass over 100k nodes costs more
        than a third of a second. Broken up, it is freed at once.
        """
        # Only the node-to-value edges are cut, and every graph's own lists:
        # what remains (value to node to graph) has no cycle left, and each
        # cut is one store per node instead of several per value.
        stack = [self.main, *(block for node in self._removed for block in node.blocks)]
        while stack:
            graph = stack.pop()
            for node in graph.nodes:
                if node.blocks:
                    stack.extend(node.blocks)
                node.inputs = node.outputs = ()
                node.positions = None
            graph.nodes, graph.values, graph.outputs, graph.inserted, graph.added = [], {}, [], {}, []
            graph.parent = graph.owner = None
        for node in self._removed:
            node.inputs = node.outputs = ()
        self._removed = []
        self.shape_pool = {}

    def _write_back(self, graph: Graph) -> None:
        for node in graph.nodes:
            for block in node.blocks:
                self._write_back(block)
        if not graph.dirty:
            return
        self._place_inserted(graph)
        graph.nodes = [node for node in graph.nodes if node.live]
        field = graph.proto.node
        added = [node for node in graph.added if node.live]
        graph.added = []
        if added:  # copied in at the end; the nodes hold the copies from now on
            start = len(field)
            field.extend(node.proto for node in added)
            for node, proto in zip(added, field[start:]):
                node.proto = proto
        # Sorting reorders the messages in place: every node keeps its proto,
        # none is copied, and the removed ones end up last, to be cut off.
        # (Clearing and re-extending would copy every message into the model's
        # arena a second time.) Every message has a wrapper alive, held by a
        # live or removed node, so ids are unique.
        order = {id(node.proto): index for index, node in enumerate(graph.nodes)}
        live = len(order)
        field.sort(key=lambda proto: order.get(id(proto), live))
        del field[live:]
        outputs = {info.name for info in graph.proto.output}
        for position, value in enumerate(graph.outputs):
            if value is not None and graph.proto.output[position].name != value.name:
                graph.proto.output[position].name = value.name
        if len(graph.proto.value_info):  # exporters often write none: then there is nothing to prune
            live_names = {value.name for node in graph.nodes for value in node.outputs if value is not None}
            live_names |= outputs
            kept = [info for info in graph.proto.value_info if info.name in live_names]
            if len(kept) != len(graph.proto.value_info):
                del graph.proto.value_info[:]
                graph.proto.value_info.extend(kept)
        graph.dirty = False


# ---- uses
#
# `Value.uses` holds one entry per (node, position) that reads the value. An
# entry goes stale when its node is removed (it is no longer `live`) or stops
# reading the value there (an operand replaced in that node alone: counted in
# `Value.detached`). Stale entries are only counted, in `Value.stale`, and
# filtered out when they are half the list, or when the uses are listed
# (which costs what listing costs anyway). So dropping a use is amortized
# O(1) however many nodes share the value, and "is it used?" is one
# comparison. Entries of one node are interchangeable, which is what lets a
# count stand for which ones are stale.

# Lists this short are edited at once: cheaper than the bookkeeping.
_SHORT = 8
# A node with more inputs than this gets a position index at its first
# operand replacement (see `Node.positions`).
_WIDE = 16


def attribute_operand(schema, key: str, operand, tensor_name: Callable[[], str]):
    """A rule's value for attribute `key` of an op of `schema` as onnx's helper
    takes it: a tensor attribute (`Constant(value=...)`,
    `ConstantOfShape(value=...)`) gets a tensor of the number or list (named
    by `tensor_name()`), a float64 one made fp32 as operands are; any other
    attribute takes the value as it is."""
    if schema.attributes[key].type != onnx.AttributeProto.TENSOR or isinstance(operand, onnx.TensorProto):
        return operand
    array = np.asarray(operand)
    if array.dtype == np.float64:
        array = array.astype(np.float32)
    return numpy_helper.from_array(array, tensor_name())


def _is_stored_constant(value: Value) -> bool:
    """Whether `value` is an initializer or a Constant's output (told without reading the tensor)."""
    return value.initializer is not None or (value.producer is not None and value.producer.type == "Constant")


def _present(inputs) -> tuple:
    """The inputs given (an absent optional one is None), as a tuple.

    Asked once or more per anchor of every node a rule looks at, a Sum of
    10,000 inputs included: `None in` and `tuple` run at C speed, a filter
    in Python five times slower, and absent inputs are rare.
    """
    if None not in inputs:
        return inputs if type(inputs) is tuple else tuple(inputs)
    return tuple(value for value in inputs if value is not None)


def _live_uses(value: Value) -> list[Node]:
    """The distinct live nodes using `value`, in order."""
    if value.stale:
        _compact(value)
    uses = value.uses
    if len(uses) < 2:
        return list(uses)
    return list(dict.fromkeys(uses))


def _reads(node: Node, value: Value) -> bool:
    """Whether `node` reads `value` at some position."""
    if node.positions is not None:
        return value in node.positions
    return any(input_value is value for input_value in node.inputs)


def _drop_use(value: Value, node: Node) -> None:
    """One entry of `node`, a node just removed, is stale now."""
    value.stale += 1
    if value.stale * 2 > len(value.uses):
        _compact(value)


def _detach_use(value: Value, node: Node, count: int) -> None:
    """`count` entries of `node`, a live node, are stale now: it reads something else there."""
    uses = value.uses
    if len(uses) <= _SHORT and value.detached is None:
        for _ in range(count):
            uses.remove(node)  # node is live: each of its entries is one of its current uses
        return
    if value.detached is None:
        value.detached = {}
    value.detached[node] = value.detached.get(node, 0) + count
    value.stale += count
    if value.stale * 2 > len(uses):
        _compact(value)


def _compact(value: Value) -> None:
    detached = value.detached
    if detached:
        owed = dict(detached)
        kept = []
        for use in value.uses:
            if not use.live:
                continue
            count = owed.get(use)
            if count:
                owed[use] = count - 1
                continue
            kept.append(use)
    else:
        kept = [use for use in value.uses if use.live]
    value.uses = kept
    value.stale = 0
    value.detached = None


def _substitute(node: Node, old: Value, new: Value) -> int:
    """Make `node` read `new` wherever it reads `old`; return at how many positions.

    Only the positions holding `old` are visited on a node with a position
    index, so that replacing each of the thousands of inputs of one Concat
    in turn is linear in all, not quadratic.
    """
    positions = node.positions
    if positions is None and len(node.inputs) > _WIDE:
        positions = {}
        for position, value in enumerate(node.inputs):
            if value is not None:
                positions.setdefault(value, []).append(position)
        node.positions = positions
        node.inputs = list(node.inputs)  # edited in place from now on
    field = node.proto.input
    if positions is not None:
        found = positions.pop(old, None)
        if not found:
            return 0
        inputs = node.inputs
        name = new.name
        for position in found:
            inputs[position] = new
            field[position] = name
        positions.setdefault(new, []).extend(found)
        return len(found)
    count = 0
    for position, value in enumerate(node.inputs):
        if value is old:
            field[position] = new.name
            count += 1
    if count:
        node.inputs = tuple(new if value is old else value for value in node.inputs)
    return count


def _is_output(value: Value) -> bool:
    return bool(value.output_of) or value.pinned


def _collect_names(graph: onnx.GraphProto, names: set[str]) -> None:
    names.update(info.name for info in graph.input)
    names.update(tensor.name for tensor in graph.initializer)
    for node in graph.node:
        names.update(node.output)
        if node.name:
            names.add(node.name)
        for attribute in node.attribute:
            if attribute.type == onnx.AttributeProto.GRAPH:
                _collect_names(attribute.g, names)
            elif attribute.type == onnx.AttributeProto.GRAPHS:
                for subgraph in attribute.graphs:
                    _collect_names(subgraph, names)


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


def _has_side_effects(domain: str, op_type: str, model: onnx.ModelProto, functions: dict, opset: int,
                      visiting: set) -> bool:
    """Whether an op of this type may do more than compute its outputs, so that it stays when they are unused.

    Pure are the ops whose schema onnx knows at the model's version of
    their domain (every standard op; a random one only draws numbers nobody
    reads), and a call of a model-local function whose body is all pure.
    Anything else, a custom domain's op above all (a `com.acme.Print`), may
    write, print or keep state: it stays.
    """
    if domain in ("", "ai.onnx"):
        return schema_at(op_type, opset) is None
    function = functions.get((domain, op_type))
    if function is not None:
        if (domain, op_type) in visiting:
            return True  # a function that calls itself: no claim made
        visiting.add((domain, op_type))
        versions = {entry.domain: entry.version for entry in function.opset_import}
        return any(
            not any(node.output) or _has_side_effects(
                node.domain, node.op_type, model, functions, versions.get(node.domain or "", opset), visiting)
            for node in function.node
        )
    version = next((entry.version for entry in model.opset_import if entry.domain == domain), None)
    return version is None or schema_at(op_type, version, domain) is None


# The opset from which each op broadcasts all its operands numpy's way.
_MULTIDIRECTIONAL_SINCE = {
    **dict.fromkeys(("Add", "Sub", "Mul", "Div", "Pow", "And", "Or", "Xor", "Equal", "Greater", "Less"), 7),
    **dict.fromkeys(("Sum", "Max", "Min", "Mean"), 8),
    "Where": 9, "Mod": 10, "BitShift": 11, "GreaterOrEqual": 12, "LessOrEqual": 12,
    **dict.fromkeys(("BitwiseAnd", "BitwiseOr", "BitwiseXor"), 18),
}


# ---- messages for a model that is not valid ONNX (built only when one is found)


def _node_label(proto: onnx.NodeProto, position: int) -> str:
    kind = proto.op_type if proto.domain in ("", "ai.onnx") else f"{proto.domain}.{proto.op_type}"
    return f"node '{proto.name}' ({kind})" if proto.name else f"node #{position} ({kind})"


def _label(node: Node) -> str:
    """The node as a user finds it in a viewer: its name, else its position, and where it sits."""
    nodes = node.graph.nodes
    # A node whose subgraph is being indexed is not in its list yet: it is next.
    position = next((i for i, other in enumerate(nodes) if other is node), len(nodes))
    return _node_label(node.proto, position) + _scope(node.graph)


def _scope(graph: Graph) -> str:
    """Where a subgraph sits (' in 'body' of node 'loop' (Loop)'); nothing for the main graph."""
    if graph.owner is None:
        return ""
    return f" in '{graph.attribute}' of {_label(graph.owner)}"


def _definer(value: Value) -> str:
    if value.producer is not None:
        return _label(value.producer)
    if value.initializer is not None and all(info.name != value.name for info in value.graph.proto.input):
        return f"the initializer{_scope(value.graph)}"
    return f"the graph input{_scope(value.graph)}"


def _undefined_input(graph: Graph, proto: onnx.NodeProto, position: int, name: str) -> OnnxError:
    reader = _node_label(proto, position) + _scope(graph)
    # Anything defining it in reach was not indexed yet, so it comes later.
    scope: Graph | None = graph
    while scope is not None:
        if any(name in other.output for other in scope.proto.node):
            return OnnxError(
                f"{reader} reads '{name}' before any node defines it (nodes out of topological order, or a cycle)"
            )
        scope = scope.parent
    return OnnxError(f"{reader} reads '{name}', which nothing defines")


def _defined_twice(graph: Graph) -> OnnxError:
    """The first name of `graph` a node defines again, with both definers."""
    where = _scope(graph)
    inputs = {info.name for info in graph.proto.input}
    first: dict[str, str] = {name: f"the graph input{where}" for name in inputs}
    for tensor in graph.proto.initializer:
        first.setdefault(tensor.name, f"the initializer{where}")
    for position, proto in enumerate(graph.proto.node):
        for name in proto.output:
            if not name:
                continue
            definer = _node_label(proto, position) + where
            if name in first:
                return OnnxError(f"value '{name}' is defined twice, by {first[name]} and by {definer}")
            first[name] = definer
    return OnnxError(f"a value{where} is defined twice")  # not reached: the count said so


def _check_no_shadowing(graph: Graph) -> None:
    # ONNX forbids a subgraph's nodes to redefine a name of an enclosing
    # scope (its inputs may). The enclosing scopes hold, at this point,
    # exactly the names defined before the subgraph's node.
    for name, value in graph.values.items():
        if value.producer is not None:
            outer = graph.parent.lookup(name)
            if outer is not None:
                raise OnnxError(f"value '{name}' is defined twice, by {_definer(outer)} and by {_definer(value)}")


# ---------------------------------------------------------------- files


def load_onnx(path: str | os.PathLike) -> tuple[onnx.ModelProto, bool]:
    """Read an `.onnx` file, external data included (see `onnx_files.read_onnx`).

    Returns the model and whether its tensors were stored as external data
    (so that `save_onnx` can store them that way again). A missing, truncated
    or non-ONNX file is an `OnnxError`.
    """
    try:
        # Read in: a caller of this function may hand the model to anything.
        model, source = onnx_files.read_onnx(path, lazy=False)
    except onnx_files.OnnxFileError as error:
        raise OnnxError(str(error)) from None
    return model, source.external_data


def save_onnx(model: onnx.ModelProto, path: str | os.PathLike, external_data: bool = False) -> None:
    """Write `model` to `path`; with `external_data`, large tensors go to `<path>.data` beside it.

    This writes in place; `rewrite apply` writes through `rewrite.output`,
    which also picks a data file name that replaces nothing.
    """
    onnx_files.write_onnx(model, path, Path(path).name + ".data" if external_data else None)


@functools.cache
def _flat_ops() -> frozenset[str]:
    """The standard ops that have no graph attribute at any opset."""
    graphs = (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
    nesting, names = set(), set()
    for schema in onnx.defs.get_all_schemas_with_history():
        if schema.domain not in ("", "ai.onnx"):
            continue
        names.add(schema.name)
        if any(attribute.type in graphs for attribute in schema.attributes.values()):
            nesting.add(schema.name)
    return frozenset(names - nesting)


def count_nodes(model: onnx.ModelProto, op_type: str | None = None) -> int:
    """Nodes (of `op_type`, if given) in the model, subgraphs included."""

    def count(graph: onnx.GraphProto) -> int:
        flat = _flat_ops()
        if op_type is None and not any(
            node.attribute for node in graph.node if node.op_type not in flat or node.domain not in ("", "ai.onnx")
        ):
            return len(graph.node)  # no node that may carry a subgraph
        total = 0
        for node in graph.node:
            total += op_type is None or node.op_type == op_type
            for attribute in node.attribute:
                if attribute.type == onnx.AttributeProto.GRAPH:
                    total += count(attribute.g)
                elif attribute.type == onnx.AttributeProto.GRAPHS:
                    total += sum(count(g) for g in attribute.graphs)
        return total

    return count(model.graph)
