"""Running the examples rules carry: `rewrite test` and the test suite.

An example is a small graph and what the rule must make of it. Running one
builds the graph with its backend, applies the rule alone, and checks three
things: the rule fired (or, for `unchanged`, did not); the result has the
structure of the `becomes` graph; and it computes the same outputs as the
original, at two sizes for every symbolic dim.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from rewrite import backends
from rewrite.api import RuleSet
from rewrite.engine.driver import UnsoundRewriteError
from rewrite.engine.interfaces import NamedValue
from rewrite.language import ast
from rewrite.language.types import NAMED_CONSTANTS

# Every symbolic dim of an example takes each of these sizes in turn.
SYMBOLIC_SIZES = (2, 3)


@dataclass(frozen=True)
class ExampleResult:
    rule: str
    description: str
    location: str
    passed: bool
    message: str = ""


def run_examples(rule_set: RuleSet, rule_name: str | None = None) -> list[ExampleResult]:
    """Run every example of every rule (or of `rule_name`) in `rule_set`."""
    results = []
    for rule in rule_set.rules:
        if rule_name is not None and rule.name != rule_name:
            continue
        for example in rule.examples:
            try:
                results.append(run_example(rule, example))
            except Exception as error:  # a backend refusing the example graph is a failed example
                results.append(ExampleResult(rule.name, example.description, str(example.span), False,
                                             f"could not run: {type(error).__name__}: {error}"))
    return results


def run_example(rule: ast.Rule, example: ast.Example) -> ExampleResult:
    backend = backends.backend_module(rule.dialect)
    inputs = [(s.var.lstrip("%"), s.dtype, s.dims) for s in example.inputs]
    outputs = [var.lstrip("%") for var in example.outputs]
    program = backend.build_example(inputs, example_ops(example.statements), outputs)
    original = backend.copy_program(program)
    before = canonical(backends.adapter_for(program))

    def result(passed: bool, message: str = "") -> ExampleResult:
        return ExampleResult(rule.name, example.description, str(example.span), passed, message)

    try:
        # Checked: a rule whose own conditions let through what the engine's
        # shape guard then refuses is wrong, even where the guard saves the model.
        statistics = RuleSet((rule,)).apply(program, check_types=True)
    except UnsoundRewriteError as error:
        return result(False, str(error))
    after = canonical(backends.adapter_for(program))

    if example.expected is None:
        if statistics.fires or after != before:
            return result(False, f"expected no change; the rule fired {statistics.fires} time(s):\n"
                                 f"    before: {before}\n    after:  {after}")
        return result(True)
    expected = canonical(backends.adapter_for(backend.build_example(inputs, example_ops(example.expected), outputs)))
    if not statistics.fires:
        return result(False, "expected the rule to fire; it did not")
    if after != expected:
        return result(False, f"the rewritten graph differs:\n    expected: {expected}\n    got:      {after}")
    mismatch = _compare_values(backend, original, program, example)
    return result(mismatch is None, mismatch or "")


def example_ops(statements) -> list[tuple[str, str, dict[str, Any]]]:
    ops = []
    for statement in statements:
        if isinstance(statement, ast.ExampleOp):
            operands = {a.name: _operand(a.value) for a in statement.build.arguments}
            ops.append((statement.var.lstrip("%"), statement.build.op, operands))
    return ops


def _operand(expr) -> Any:
    """An example operand: a value by name, or a constant written in place."""
    if isinstance(expr, ast.ValueRef):
        return NamedValue(expr.var.lstrip("%"))
    if isinstance(expr, ast.Literal):
        return expr.value
    if isinstance(expr, ast.NameRef):
        return NAMED_CONSTANTS[expr.name][1]
    if isinstance(expr, ast.ListExpr):
        return [_operand(item) for item in expr.items]
    if isinstance(expr, ast.Arithmetic) and expr.operator == "-" and isinstance(expr.left, ast.Literal):
        return expr.left.value - _operand(expr.right)
    raise ValueError(f"{expr.span}: an example operand is a value, a literal or a list of literals")


def canonical(adapter) -> str:
    """The outputs as expressions over the inputs: names of intermediates do not matter."""
    memo: dict[int, str] = {}

    def show(value) -> str:
        if isinstance(value, tuple):
            return "(" + ", ".join(show(v) for v in value) + ")"
        key = id(value)
        if key not in memo:
            constant = adapter.constant(value)
            producer = adapter.producer(value)
            if constant is not None and (producer is None or adapter.op_type(producer) in ("const", "Constant")):
                memo[key] = repr(np.asarray(constant).tolist())
            elif producer is None:
                memo[key] = "%" + adapter.value_name(value)
            else:
                names = adapter.operand_names(producer)
                operands = ", ".join(f"{n}={show(adapter.operand(producer, n))}" for n in names)
                memo[key] = f"{adapter.op_type(producer)}({operands})"
        return memo[key]

    outputs = [value for block in adapter.top_blocks() for value in adapter.block_outputs(block)]
    return "; ".join(show(v) for v in outputs)


def _compare_values(backend, original, rewritten, example: ast.Example) -> str | None:
    rng = np.random.default_rng(0)
    for size in SYMBOLIC_SIZES:
        feeds = {}
        for statement in example.inputs:
            shape = tuple(size if isinstance(d, str) else d for d in statement.dims)
            feeds[statement.var.lstrip("%")] = random_input(rng, statement.dtype, shape)
        expected = backend.evaluate_example(original, feeds)
        got = backend.evaluate_example(rewritten, feeds)
        for name, value in expected.items():
            if name not in got:
                return f"output '{name}' is gone"
            if value.shape != got[name].shape:
                return f"output '{name}' changed shape from {value.shape} to {got[name].shape} at size {size}"
            if value.dtype.kind in "fc":
                # A fused op may round differently; fp16 has 11 bits to round in.
                rtol, atol = (2e-3, 2e-3) if value.dtype == np.float16 else (1e-5, 1e-6)
                same = np.allclose(value, got[name], rtol=rtol, atol=atol, equal_nan=True)
            else:
                same = np.array_equal(value, got[name])
            if not same:
                return f"output '{name}' changed value at size {size}"
    return None


def random_input(rng, dtype: str, shape) -> np.ndarray:
    """A random array for an example input of `dtype` (an example's type name)."""
    if dtype == "bool":
        return rng.random(shape) > 0.5
    if dtype.startswith(("int", "uint")):
        return rng.integers(0, 5, size=shape).astype(np.dtype(dtype))
    return rng.standard_normal(shape).astype({"fp16": np.float16, "fp64": np.float64}.get(dtype, np.float32))
