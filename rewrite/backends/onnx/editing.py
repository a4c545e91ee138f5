"""Editing an ONNX model for the ONNX adapter: building nodes, replacing uses, removing nodes, writing back.

Edits touch the index and the changed NodeProtos only; the graph's node
lists are rebuilt once, in `finish`, for the graphs that changed.
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from rewrite.backends.onnx import shapes as onnx_shapes
from rewrite.backends.onnx.graph import (
    Graph,
    Node,
    OnnxError,
    Value,
    detach_use,
    drop_use,
    is_output,
    live_uses,
    reads,
    substitute,
)
from rewrite.backends.onnx.schema import attribute_operand, schema_at


class OnnxEditing:
    """The edits of `OnnxAdapter`, the half of it that changes the model.

    A base class of `OnnxAdapter`, which sets up the state used here:
    `model`, `opset`, `main`, `_serial`, `_names`, `_removed`, `shape_pool`,
    and `_define`, `_input_index` and `_place_inserted`.
    """

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
        for node in live_uses(old):
            counted = new.readers is not None and not reads(node, new)
            # One entry per position, as indexing makes them.
            uses.extend(itertools.repeat(node, substitute(node, old, new)))
            if counted:
                new.readers += 1
        old.uses = []
        old.stale = 0
        old.detached = None
        if old.readers is not None:
            old.readers = 0
        if is_output(old):
            self._replace_output(old, new)

    def replace_operand(self, op: Node, old: Value, new: Value) -> None:
        if old is new:
            return
        counted = new.readers is not None and not reads(op, new)
        count = substitute(op, old, new)
        if not count:
            return
        old.uses_version += 1
        new.uses_version += 1
        detach_use(old, op, count)
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
            and not is_output(new)
            and all(use.graph is graph for use in live_uses(new))
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
        for use in live_uses(value):
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
                    drop_use(value, node)
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


def _collect_names(graph: onnx.GraphProto, names: set[str]) -> None:
    # Every name a new one must not take: values, node names, subgraphs' too.
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
