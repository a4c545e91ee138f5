"""Programs from rule examples, whole-program copies, and the semantic checks of a built program."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from rewrite.backends.mil import shapes as mil_shapes
from rewrite.backends.mil.adapter import MilAdapter
from rewrite.backends.mil.pymil import (
    MilError,
    Program,
    ct,
    mb,
    types,
)
from rewrite.engine.interfaces import ExampleFacts, NamedValue, Scaling

EXAMPLE_FACTS = ExampleFacts(
    opsets=(None, "iOS15", "iOS16", "iOS17"),
    dtypes=("fp32", "fp16", "int32", "bool"),
    extra_consumer="exp",
    unary_operand="x",
    constant_operands=frozenset({
        "reps", "shape", "perm", "dtype", "axis", "axes", "keep_dims", "begin", "end", "stride", "begin_mask",
        "end_mask", "squeeze_mask",
    }),
    contractions=frozenset({"matmul", "scaled_dot_product_attention"}),
    flag_input=("flag", "fp32", [1]),
    # MilAdapter.scaling: a mul by k on either side, a real_div by 1/k.
    scalings=(Scaling("mul", "x", "y"), Scaling("mul", "y", "x"), Scaling("real_div", "x", "y", divides=True)),
)

# ---------------------------------------------------------------- examples


def build_example(inputs, ops, outputs, nested_by: str | None = None, opset: str | None = None) -> Program:
    """A program from a rule example: `inputs` are (name, dtype, dims) with
    named dims symbolic, `ops` are (name, op type, operands), operands being
    `NamedValue`s or constants; `outputs` are names.

    With `nested_by` (an fp32[1] input), the ops go into both branches of a
    `cond` on that input being positive, so they live in nested blocks.
    `opset` names the deployment target (`iOS15` to `iOS18`, the default).
    """
    from coremltools.converters.mil.mil import Function, get_new_symbol

    symbols: dict[str, Any] = {}

    def dim(d):
        return symbols.setdefault(d, get_new_symbol()) if isinstance(d, str) else int(d)

    placeholders = {
        name: mb.placeholder(shape=tuple(dim(d) for d in dims), dtype=types.string_to_builtin(dtype))
        for name, dtype, dims in inputs
    }
    program = Program()
    target = getattr(ct.target, opset or "iOS18", None)
    if target is None or not str(opset or "iOS18").startswith("iOS"):
        raise MilError(f"unknown deployment target '{opset}' (iOS15 to iOS18)")
    with Function(placeholders, opset_version=target) as function:
        inputs_by_name = {name: function.inputs[name] for name in placeholders}

        def body(suffix: str = ""):
            values = dict(inputs_by_name)
            for name, op_type, operands in ops:
                def resolve(value):
                    if isinstance(value, NamedValue):
                        return values[value.name]
                    if isinstance(value, tuple):  # a variadic operand: `values=(%a, %b)`
                        return tuple(resolve(item) for item in value)
                    return mil_shapes.as_mil_constant(value)

                arguments = {key: resolve(value) for key, value in operands.items()}
                result = getattr(mb, op_type)(**arguments, name=name + suffix)
                values[name] = result[0] if isinstance(result, (list, tuple)) else result
            return tuple(values[name] for name in outputs)

        if nested_by is None:
            results = body()
        else:
            predicate = mb.squeeze(x=mb.greater(x=inputs_by_name[nested_by], y=np.float32(0)))
            results = mb.cond(pred=predicate, _true_fn=lambda: body("_then"), _false_fn=lambda: body("_else"))
            results = tuple(results) if isinstance(results, (list, tuple)) else (results,)
        function.set_outputs(list(results))
    program.add_function("main", function)
    return program


def evaluate_example(program: Program, feeds: dict[str, np.ndarray],
                     engine: str | None = None) -> dict[str, np.ndarray]:
    """Outputs by name, from the project's reference evaluator (the one engine)."""
    from rewrite.backends.mil.reference import evaluate

    return evaluate(program, feeds)


@dataclass(frozen=True)
class SemanticProblem:
    """An objection to a program; `key` names the place, so that one that was
    there before a rewrite is recognized after it."""

    key: tuple
    message: str


def semantic_problems(program: Program) -> list[SemanticProblem]:
    """What Core ML's runtime refuses although the values would be right.

    A `select` whose operand broadcasts implicitly (its shape is not the
    output's) fails to load in a multifunction model ("Failed to
    PropagateInputTensorShapes ... select").
    """
    adapter = MilAdapter(program)
    problems = []

    def walk(block):
        for op in block.operations:
            for nested in op.blocks:
                walk(nested)
            if op.op_type != "select":
                continue
            output = adapter.proven_shape(op.outputs[0])
            for name in ("cond", "a", "b"):
                shape = adapter.proven_shape(op.inputs[name])
                if shape is None or output is None:
                    continue
                # Provably widened: fewer axes, a literal of another size, or a
                # literal 1 against a symbol. Two symbols may be one size.
                if len(shape) != len(output) or any(
                    (isinstance(x, int) and isinstance(y, int) and x != y) or (x == 1 and not isinstance(y, int))
                    for x, y in zip(shape, output)
                ):
                    problems.append(SemanticProblem(
                        # By what is widened, not by op or value names: a rule that
                        # rebuilds the select, or reads the same shape from another
                        # value, did not add the problem (checking counts them).
                        (name, tuple(map(str, shape)), tuple(map(str, output))),
                        f"select '{op.name}' broadcasts its operand '{name}' implicitly "
                        f"{tuple(map(str, shape))} -> {tuple(map(str, output))}; Core ML refuses that",
                    ))

    for function in program.functions.values():
        walk(function)
    return problems
