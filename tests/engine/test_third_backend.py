"""A third backend, written from `rewrite.engine.interfaces` and `rewrite.language.schema` alone:
the contract is all it takes.

`ListAdapter` is the least an IR can give the engine: a list of ops in
one block, the core methods of `Adapter` and no optional capability. A
rules file loads against its schema and rewrites its programs; what the
optional capabilities would add (kept verdicts, shape proofs, ...) the
engine does without. The real adapters declare what they have, and have
what they declare.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from rewrite.api import RuleSet
from rewrite.engine.interfaces import Adapter, Capability, missing_methods
from rewrite.language.loader import load_rule_files
from rewrite.language.schema import InputSpec, OpSignature
from rewrite.predicates import registered_predicates

SIGNATURES = {
    "neg": OpSignature("neg", (InputSpec("x"),)),
    "exp": OpSignature("exp", (InputSpec("x"),)),
    "add": OpSignature("add", (InputSpec("x"), InputSpec("y"))),
}


class ListSchema:
    dialect = "list"
    groups = ()

    def signature(self, op_type: str):
        return SIGNATURES.get(op_type)

    def op_types(self):
        return sorted(SIGNATURES)


@dataclass(eq=False)
class Value:
    name: str
    producer: Op | None = None


@dataclass(eq=False)
class Op:
    type: str
    inputs: dict
    output: Value = None  # type: ignore[assignment]
    live: bool = True


@dataclass
class Program:
    inputs: list[Value]
    ops: list[Op] = field(default_factory=list)
    outputs: list[Value] = field(default_factory=list)

    def op(self, op_type: str, **inputs) -> Value:
        op = Op(op_type, inputs)
        op.output = Value(f"v{len(self.ops)}", op)
        self.ops.append(op)
        return op.output

    def run(self, x: float) -> list[float]:
        import math

        values = {id(self.inputs[0]): x}
        for op in self.ops:
            args = [values[id(v)] for v in op.inputs.values()]
            values[id(op.output)] = {"neg": lambda a: -a, "exp": math.exp, "add": lambda a, b: a + b}[op.type](*args)
        return [values[id(v)] for v in self.outputs]


class ListAdapter:
    """The core of `Adapter`, nothing optional."""

    dialect = "list"
    capabilities: frozenset[Capability] = frozenset()

    def __init__(self, program: Program):
        self.program = program

    def top_blocks(self):
        return [self.program]

    def operations(self, block):
        return [op for op in block.ops if op.live]

    def block_outputs(self, block):
        return list(block.outputs)

    def nested_blocks(self, op):
        return []

    def is_live(self, op):
        return op.live

    def op_type(self, op):
        return op.type

    def op_name(self, op):
        return op.output.name

    def block_of(self, op):
        return self.program

    def has_side_effects(self, op):
        return False

    def operand(self, op, name):
        return op.inputs.get(name)

    def operand_names(self, op):
        return list(op.inputs)

    def operands(self, op):
        return list(op.inputs.values())

    def outputs(self, op):
        return [op.output]

    def attribute(self, op, name):
        return None

    def producer(self, value):
        return value.producer

    def defining_block(self, value):
        return self.program

    def consumers(self, value):
        return [op for op in self.program.ops if op.live and any(v is value for v in op.inputs.values())]

    def is_block_output(self, value):
        return any(v is value for v in self.program.outputs)

    def shape(self, value):
        return ()

    def dtype(self, value):
        return "fp32"

    def constant(self, value):
        return None

    def value_name(self, value):
        return value.name

    def build(self, op_type, operands, before, name):
        op = Op(op_type, dict(operands))
        op.output = Value(name, op)
        self.program.ops.insert(self.program.ops.index(before), op)
        return op.output

    def replace_all_uses(self, old, new):
        for op in self.program.ops:
            op.inputs = {k: (new if v is old else v) for k, v in op.inputs.items()}
        self.program.outputs = [new if v is old else v for v in self.program.outputs]

    def replace_operand(self, op, old, new):
        op.inputs = {k: (new if v is old else v) for k, v in op.inputs.items()}

    def remove_op(self, op):
        op.live = False

    def finish(self):
        self.program.ops = [op for op in self.program.ops if op.live]


def _adapter_methods() -> set[str]:
    return {name for name in vars(Adapter) if not name.startswith("_") and callable(vars(Adapter)[name])}


def test_the_list_adapter_has_every_core_method_and_nothing_optional():
    optional = {name for capability in Capability for name in capability.methods}
    core = _adapter_methods() - optional
    assert core <= set(vars(ListAdapter))
    assert not (optional & set(vars(ListAdapter)))


def test_a_rules_file_rewrites_a_program_of_the_third_backend(tmp_path):
    path = tmp_path / "list.rules"
    path.write_text(
        'dialect list\n'
        'rule remove_double_neg "-(-x) is x"\n'
        '  match %n = neg(x=neg(x=%x))\n'
        '  where one_use(%x) or true\n'
        '  rewrite %n -> %x\n'
        'rule keep_exp "exp of an input stays: a rule that must not fire"\n'
        '  match %e = exp(x=%x)\n'
        '  where op_type(%x) == "neg"\n'
        '  rewrite %e -> %x\n',
        encoding="utf-8")
    predicates = {name: p.signature for name, p in registered_predicates().items()}
    loaded = load_rule_files([path], lambda dialect: ListSchema() if dialect == "list" else None, predicates,
                             known_dialects=["list"])
    rules = RuleSet(loaded.rules)
    x = Value("x")
    program = Program([x])
    twice = program.op("neg", x=program.op("neg", x=x))
    program.outputs = [program.op("add", x=twice, y=program.op("exp", x=x))]
    before = program.run(0.5)
    statistics = rules.apply_with(ListAdapter(program), count_ops=True)
    assert statistics.fired("remove_double_neg") == 1 and statistics.fired("keep_exp") == 0
    assert [op.type for op in program.ops] == ["exp", "add"]
    assert program.run(0.5) == pytest.approx(before)
    assert statistics.ops_before is None  # no COUNT_OPS: the engine counts nothing


def test_each_real_adapter_has_what_it_declares():
    from onnx import TensorProto, helper

    from rewrite.backends.mil import MilAdapter, mb, types
    from rewrite.backends.onnx import OnnxAdapter
    from tests.engine.toy_ir import Graph, ToyAdapter

    model = helper.make_model(helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])]))

    @mb.program(input_specs=[mb.TensorSpec(shape=(2,), dtype=types.fp32)])
    def program(x):
        return mb.relu(x=x)

    for adapter in (OnnxAdapter(model), MilAdapter(program), ToyAdapter(Graph())):
        assert missing_methods(adapter) == [], type(adapter).__name__
        assert adapter.capabilities, type(adapter).__name__
