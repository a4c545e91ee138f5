"""A toy IR, its adapter and a numpy interpreter: the engine tested with no real backend.

If the engine only works through `Adapter`, these ~150 lines are all it takes
to run rules on a new IR.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from rewrite.api import RuleSet
from rewrite.engine.interfaces import Capability
from rewrite.language.loader import load_rule_files
from rewrite.language.logic import UNKNOWN, Symbol
from rewrite.language.schema import InputSpec, OpSignature
from rewrite.predicates import registered_predicates

_KERNELS = {
    "add": lambda x, y: x + y,
    "mul": lambda x, y: x * y,
    "sub": lambda x, y: x - y,
    "neg": lambda x: -x,
    "exp": np.exp,
    "tile": lambda x, reps: np.tile(x, reps),
    "sum": lambda *values: sum(values),
}
_INPUTS = {
    "add": ("x", "y"), "mul": ("x", "y"), "sub": ("x", "y"), "neg": ("x",), "exp": ("x",),
    "tile": ("x", "reps"), "const": (), "sum": ("values",), "branch": ("pred",),
}


class ToySchema:
    dialect = "toy"
    groups = ()

    def signature(self, op_type):
        if op_type not in _INPUTS:
            return None
        return OpSignature(op_type, tuple(InputSpec(n, variadic=(op_type == "sum")) for n in _INPUTS[op_type]))

    def op_types(self):
        return sorted(_INPUTS)


_serial = itertools.count()


@dataclass(eq=False)
class Value:
    name: str
    shape: tuple | None
    dtype: str = "fp32"
    constant: np.ndarray | None = None
    producer: Op | None = None
    block: Block | None = None
    uses: list = field(default_factory=list)


@dataclass(eq=False)
class Op:
    type: str
    inputs: dict
    outputs: list
    block: Block | None = None
    blocks: list = field(default_factory=list)
    name: str = ""


@dataclass(eq=False)
class Block:
    ops: list = field(default_factory=list)
    inputs: list = field(default_factory=list)
    outputs: list = field(default_factory=list)


class Graph:
    """A builder: `graph.op("add", x=a, y=b, shape=(4, 8))`."""

    def __init__(self):
        self.main = Block()

    def input(self, name, shape, block=None):
        block = block or self.main
        value = Value(name, shape, block=block)
        block.inputs.append(value)
        return value

    def const(self, array, block=None):
        array = np.asarray(array)
        return self.op("const", block=block, shape=array.shape, constant=array)

    def op(self, op_type, *, shape, block=None, constant=None, **inputs):
        block = block or self.main
        op = Op(op_type, dict(inputs), [], block, name=f"{op_type}_{next(_serial)}")
        for value in _flat(inputs.values()):
            value.uses.append(op)
        output = Value(op.name, shape, constant=constant, producer=op, block=block)
        op.outputs.append(output)
        block.ops.append(op)
        return output

    def count(self, op_type=None, block=None):
        block = block or self.main
        total = 0
        for op in block.ops:
            total += op_type is None or op.type == op_type
            for nested in op.blocks:
                total += self.count(op_type, nested)
        return total


def _flat(values):
    for value in values:
        if isinstance(value, tuple):
            yield from value
        else:
            yield value


class ToyAdapter:
    dialect = "toy"
    capabilities = frozenset({Capability.BROADCASTING})

    def __init__(self, graph: Graph):
        self.graph = graph

    def top_blocks(self):
        return [self.graph.main]

    def operations(self, block):
        return list(block.ops)

    def block_outputs(self, block):
        return list(block.outputs)

    def nested_blocks(self, op):
        return op.blocks

    def is_live(self, op):
        return op.block is not None

    def op_type(self, op):
        return op.type

    def op_name(self, op):
        return op.name

    def block_of(self, op):
        return op.block

    def has_side_effects(self, op):
        return False

    def operand(self, op, name):
        return op.inputs.get(name)

    def operand_names(self, op):
        return list(op.inputs)

    def operands(self, op):
        return list(_flat(op.inputs.values()))

    def outputs(self, op):
        return op.outputs

    def attribute(self, op, name):
        return None

    def producer(self, value):
        return value.producer

    def defining_block(self, value):
        return value.block

    def consumers(self, value):
        return list(dict.fromkeys(value.uses))

    def is_block_output(self, value):
        return any(value in b.outputs for b in _all_blocks(self.graph.main))

    def shape(self, value):
        if value.shape is None:
            return None
        return tuple(Symbol(d) if isinstance(d, str) else (UNKNOWN if d is None else d) for d in value.shape)

    def dtype(self, value):
        return value.dtype

    def broadcast_operands(self, op):
        # The binary ops and sum broadcast their operands numpy's way.
        if op.type in ("add", "mul", "sub"):
            return [op.inputs["x"], op.inputs["y"]]
        if op.type == "sum":
            return list(op.inputs["values"])
        return None

    def constant(self, value):
        return value.constant

    def value_name(self, value):
        return value.name

    def build(self, op_type, operands, before, name):
        block = before.block
        inputs = {}
        for key, operand in operands.items():
            if not isinstance(operand, Value):
                operand = _const_before(block, before, np.asarray(operand))
            inputs[key] = operand
        op = Op(op_type, inputs, [], block, name=name)
        for value in _flat(inputs.values()):
            value.uses.append(op)
        shape = np.broadcast_shapes(*[v.shape for v in _flat(inputs.values()) if v.shape is not None])
        op.outputs.append(Value(name, shape, producer=op, block=block))
        block.ops.insert(block.ops.index(before), op)
        return op.outputs[0]

    def replace_all_uses(self, old, new):
        for op in list(old.uses):
            for key, value in op.inputs.items():
                if isinstance(value, tuple):
                    op.inputs[key] = tuple(new if v is old else v for v in value)
                elif value is old:
                    op.inputs[key] = new
            new.uses.append(op)
        old.uses.clear()
        for block in _all_blocks(self.graph.main):
            block.outputs = [new if v is old else v for v in block.outputs]

    def finish(self):
        pass

    def replace_operand(self, op, old, new):
        for key, value in op.inputs.items():
            if value is old:
                op.inputs[key] = new
        old.uses = [use for use in old.uses if use is not op]
        new.uses.append(op)

    def remove_op(self, op):
        for value in _flat(op.inputs.values()):
            value.uses = [u for u in value.uses if u is not op]
        op.block.ops.remove(op)
        op.block = None


def _const_before(block, before, array):
    op = Op("const", {}, [], block, name=f"const_{next(_serial)}")
    op.outputs.append(Value(op.name, array.shape, constant=array, producer=op, block=block))
    block.ops.insert(block.ops.index(before), op)
    return op.outputs[0]


def _all_blocks(block):
    yield block
    for op in block.ops:
        for nested in op.blocks:
            yield from _all_blocks(nested)


def evaluate(graph: Graph, inputs: dict) -> list:
    """The main block's outputs for concrete inputs; `branch` ops run their first block."""
    values = {id(v): np.asarray(inputs[v.name]) for v in graph.main.inputs}

    def run(block):
        for op in block.ops:
            if op.type == "const":
                values[id(op.outputs[0])] = op.outputs[0].constant
            elif op.type == "branch":
                inner = op.blocks[0]
                run(inner)
                values[id(op.outputs[0])] = values[id(inner.outputs[0])]
            else:
                arguments = [values[id(v)] for v in _flat(op.inputs.values())]
                values[id(op.outputs[0])] = _KERNELS[op.type](*arguments)

    run(graph.main)
    return [values[id(v)] for v in graph.main.outputs]


def load_toy_rules(path: Path) -> RuleSet:
    predicates = {name: p.signature for name, p in registered_predicates().items()}
    loaded = load_rule_files([path], lambda dialect: ToySchema() if dialect == "toy" else None, predicates)
    return RuleSet(loaded.rules, loaded.warnings, loaded.files)
