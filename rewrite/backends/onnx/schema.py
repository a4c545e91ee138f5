"""The ONNX operator schemas, as the adapter and the engine use them: signatures, input positions,
attribute defaults, which ops are pure, which broadcast, which carry subgraphs.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from rewrite.backends import pass_groups
from rewrite.language.schema import InputSpec, OpSignature

DIALECT = "onnx"


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
    """onnx's schema of `op_type` in `domain` at version `opset`; None if the op has none there."""
    try:
        return onnx.defs.get_schema(op_type, opset, domain)
    except onnx.defs.SchemaError:
        return None


def schema_input_index(op_type: str, opset: int, domain: str) -> dict[str, int | slice]:
    """Schema input names to positions; a variadic input takes the rest."""
    schema = schema_at(op_type, opset, domain)
    if schema is None:
        return {}
    option = onnx.defs.OpSchema.FormalParameterOption
    index: dict[str, int | slice] = {}
    for position, parameter in enumerate(schema.inputs):
        index[parameter.name] = slice(position, None) if parameter.option == option.Variadic else position
    return index


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


def has_side_effects(domain: str, op_type: str, model: onnx.ModelProto, functions: dict, opset: int,
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
            not any(node.output) or has_side_effects(
                node.domain, node.op_type, model, functions, versions.get(node.domain or "", opset), visiting)
            for node in function.node
        )
    version = next((entry.version for entry in model.opset_import if entry.domain == domain), None)
    return version is None or schema_at(op_type, version, domain) is None


# The opset from which each op broadcasts all its operands numpy's way.
MULTIDIRECTIONAL_SINCE = {
    **dict.fromkeys(("Add", "Sub", "Mul", "Div", "Pow", "And", "Or", "Xor", "Equal", "Greater", "Less"), 7),
    **dict.fromkeys(("Sum", "Max", "Min", "Mean"), 8),
    "Where": 9, "Mod": 10, "BitShift": 11, "GreaterOrEqual": 12, "LessOrEqual": 12,
    **dict.fromkeys(("BitwiseAnd", "BitwiseOr", "BitwiseXor"), 18),
}


@functools.cache
def flat_ops() -> frozenset[str]:
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
        flat = flat_ops()
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
