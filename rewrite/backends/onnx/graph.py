"""The ONNX adapter's index of a model: a `Value` per defined name, a `Node` per NodeProto, a `Graph` per (sub)graph.

The model stays raw protobuf; the index on top of it holds each value's
uses, kept cheap to edit (see "uses" below), and says where a node or
value sits in words a user finds in a viewer, for the messages about a
model that is not valid ONNX.
"""

from __future__ import annotations

from sys import intern

import numpy as np
import onnx

from rewrite.engine.interfaces import ModelError


class OnnxError(ModelError):
    """An ONNX model could not be read, indexed or written; the message names the file, node or value."""


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


def is_stored_constant(value: Value) -> bool:
    """Whether `value` is an initializer or a Constant's output (told without reading the tensor)."""
    return value.initializer is not None or (value.producer is not None and value.producer.type == "Constant")


def present(inputs) -> tuple:
    """The inputs given (an absent optional one is None), as a tuple.

    Asked once or more per anchor of every node a rule looks at, a Sum of
    10,000 inputs included: `None in` and `tuple` run at C speed, a filter
    in Python five times slower, and absent inputs are rare.
    """
    if None not in inputs:
        return inputs if type(inputs) is tuple else tuple(inputs)
    return tuple(value for value in inputs if value is not None)


def live_uses(value: Value) -> list[Node]:
    """The distinct live nodes using `value`, in order."""
    if value.stale:
        _compact(value)
    uses = value.uses
    if len(uses) < 2:
        return list(uses)
    return list(dict.fromkeys(uses))


def reads(node: Node, value: Value) -> bool:
    """Whether `node` reads `value` at some position."""
    if node.positions is not None:
        return value in node.positions
    return any(input_value is value for input_value in node.inputs)


def drop_use(value: Value, node: Node) -> None:
    """One entry of `node`, a node just removed, is stale now."""
    value.stale += 1
    if value.stale * 2 > len(value.uses):
        _compact(value)


def detach_use(value: Value, node: Node, count: int) -> None:
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


def substitute(node: Node, old: Value, new: Value) -> int:
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


def is_output(value: Value) -> bool:
    return bool(value.output_of) or value.pinned


# ---- messages for a model that is not valid ONNX (built only when one is found)


def _node_label(proto: onnx.NodeProto, position: int) -> str:
    kind = proto.op_type if proto.domain in ("", "ai.onnx") else f"{proto.domain}.{proto.op_type}"
    return f"node '{proto.name}' ({kind})" if proto.name else f"node #{position} ({kind})"


def describe_node(node: Node) -> str:
    """The node as a user finds it in a viewer: its name, else its position, and where it sits."""
    nodes = node.graph.nodes
    # A node whose subgraph is being indexed is not in its list yet: it is next.
    position = next((i for i, other in enumerate(nodes) if other is node), len(nodes))
    return _node_label(node.proto, position) + describe_scope(node.graph)


def describe_scope(graph: Graph) -> str:
    """Where a subgraph sits (' in 'body' of node 'loop' (Loop)'); nothing for the main graph."""
    if graph.owner is None:
        return ""
    return f" in '{graph.attribute}' of {describe_node(graph.owner)}"


def _definer(value: Value) -> str:
    if value.producer is not None:
        return describe_node(value.producer)
    if value.initializer is not None and all(info.name != value.name for info in value.graph.proto.input):
        return f"the initializer{describe_scope(value.graph)}"
    return f"the graph input{describe_scope(value.graph)}"


def undefined_input(graph: Graph, proto: onnx.NodeProto, position: int, name: str) -> OnnxError:
    reader = _node_label(proto, position) + describe_scope(graph)
    # Anything defining it in reach was not indexed yet, so it comes later.
    scope: Graph | None = graph
    while scope is not None:
        if any(name in other.output for other in scope.proto.node):
            return OnnxError(
                f"{reader} reads '{name}' before any node defines it (nodes out of topological order, or a cycle)"
            )
        scope = scope.parent
    return OnnxError(f"{reader} reads '{name}', which nothing defines")


def defined_twice(graph: Graph) -> OnnxError:
    """The first name of `graph` a node defines again, with both definers."""
    where = describe_scope(graph)
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


def check_no_shadowing(graph: Graph) -> None:
    # ONNX forbids a subgraph's nodes to redefine a name of an enclosing
    # scope (its inputs may). The enclosing scopes hold, at this point,
    # exactly the names defined before the subgraph's node.
    for name, value in graph.values.items():
        if value.producer is not None:
            outer = graph.parent.lookup(name)
            if outer is not None:
                raise OnnxError(f"value '{name}' is defined twice, by {_definer(outer)} and by {_definer(value)}")
