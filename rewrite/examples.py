"""Running the examples rules carry: `rewrite test` and the test suite.

An example is a small graph and what the rule must make of it. Running one
builds the graph with its backend, applies the rule alone, and checks three
things: the rule fired (or, for `unchanged`, did not); the result has the
structure of the `becomes` graph; and it computes the same outputs as the
original, at two sizes for every symbolic dim.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from rewrite import backends
from rewrite.api import RuleSet
from rewrite.engine.conditions import Conditions
from rewrite.engine.driver import UnsoundRewriteError
from rewrite.engine.interfaces import NamedValue
from rewrite.engine.matcher import Matcher
from rewrite.language import ast
from rewrite.language.errors import Diagnostic
from rewrite.language.loader import UnreadableRules, read_rules_text
from rewrite.language.logic import Truth

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
    program = backend.build_example(inputs, example_ops(example.statements), outputs, opset=example.opset)
    original = backend.copy_program(program)
    before = canonical(backends.adapter_for(program))

    def result(passed: bool, message: str = "") -> ExampleResult:
        return ExampleResult(rule.name, example.description, str(example.span), passed, message)

    try:
        # Checked: a rule whose own conditions let through what the engine's
        # shape guard then refuses is wrong, even where the guard saves the model.
        statistics = RuleSet((rule,)).apply(program, check_types=True, assume=rule.assumption_names)
    except UnsoundRewriteError as error:
        return result(False, str(error))
    after = canonical(backends.adapter_for(program))

    if example.expected is None:
        if statistics.fires or after != before:
            return result(False, f"expected no change; the rule fired {statistics.fires} time(s):\n"
                                 f"    before: {before}\n    after:  {after}\n"
                                 f"why, on the example as written:\n{_trace(rule, backend.copy_program(original))}")
        return result(True)
    expected = canonical(backends.adapter_for(
        backend.build_example(inputs, example_ops(example.expected), outputs, opset=example.opset)))
    if not statistics.fires:
        # Nothing changed: the program is the example as written, which explain reads.
        return result(False, f"expected the rule to fire; it did not:\n{_trace(rule, program)}")
    if after != expected:
        return result(False, f"the rewritten graph differs:\n    expected: {expected}\n    got:      {after}")
    mismatch = _compare_values(backend, original, program, example)
    return result(mismatch is None, mismatch or "")


def _trace(rule: ast.Rule, program) -> str:
    """`rewrite explain` of `rule` on an example's program: at each candidate anchor,
    the condition that failed (file:line, the values it saw) or what held."""
    from rewrite.engine.explain import explain, format_text
    from rewrite.predicates import registered_predicates

    explanations = explain([rule], backends.adapter_for(program), registered_predicates())
    if not explanations:
        return f"no op of the example is a candidate anchor: none is a '{rule.anchor.pattern.op}'"
    return format_text(explanations, held=True)


class ExampleError(ValueError):
    """An example statement that cannot become part of a graph; `span` is where."""

    def __init__(self, span: ast.Span, message: str):
        super().__init__(f"{span}: {message}")
        self.span = span
        self.message = message


def example_ops(statements) -> list[tuple[str, str, dict[str, Any]]]:
    """The ops of example statements as `build_example` takes them: (name, op type, operands).

    An operand is a `NamedValue`, a tuple of operands (a variadic input), or a
    constant: a Python number, bool, string or list, or a numpy array or
    scalar when the rule typed it (`as_dtype(3.0, fp16)`), which the backend
    builds with that dtype. Raises `ExampleError` for an operand that does
    not evaluate to a constant.
    """
    ops = []
    for statement in statements:
        if isinstance(statement, ast.ExampleOp):
            operands = {a.name: _operand(a.value) for a in statement.build.arguments}
            ops.append((statement.var.lstrip("%"), statement.build.op, operands))
    return ops


def _operand(expr) -> Any:
    if isinstance(expr, ast.ValueRef):
        return NamedValue(expr.var.lstrip("%"))
    if isinstance(expr, ast.TupleExpr):
        return tuple(_operand(item) for item in expr.items)
    return _plain(_constants().value(expr, {}), expr)


class _NoProgram:
    """The adapter of no program: example operands are graph-free (the checker sees to it)."""

    dialect = ""
    capabilities: frozenset = frozenset()


@functools.lru_cache(maxsize=1)
def _constants() -> Conditions:
    program = _NoProgram()
    return Conditions(program, Matcher(program), {})


def _plain(value, expr) -> Any:
    """`value` as a backend takes a constant; typed numpy values stay typed."""
    if isinstance(value, Truth):
        if value is Truth.UNKNOWN:
            raise ExampleError(expr.span, "this example operand is neither true nor false")
        return value is Truth.YES
    if isinstance(value, list):
        return [_plain(item, expr) for item in value]
    if isinstance(value, (bool, int, float, str, np.ndarray, np.generic)):
        return value
    raise ExampleError(expr.span, "this example operand does not evaluate to a constant")


def example_errors(rules: Iterable[ast.Rule]) -> list[Diagnostic]:
    """Build every example of `rules`, and its `becomes` graph, with the backend of
    its dialect; one error for each that cannot be built, at the statement that
    the backend refused where that can be told.

    This is what `rewrite check` adds to loading: a graph the backend refuses
    (a bad dtype for an op, shapes it will not combine) is a mistake in the
    rule file, not a failed test. Nothing is run.
    """
    sources: dict[str, list[str] | None] = {}
    errors = []
    for rule in rules:
        for example in rule.examples:
            found = _build_error(rule, example)
            if found is not None:
                span, message = found
                errors.append(Diagnostic(span, message, "error", _source_line(sources, span)))
    return errors


def _build_error(rule: ast.Rule, example: ast.Example) -> tuple[ast.Span, str] | None:
    backend = backends.backend_module(rule.dialect)
    inputs = [(s.var.lstrip("%"), s.dtype, s.dims) for s in example.inputs]
    outputs = [var.lstrip("%") for var in example.outputs]
    graphs = [("", example.statements)]
    if example.expected is not None:
        graphs.append(("the 'becomes' graph of ", example.expected))
    for which, statements in graphs:
        try:
            ops = example_ops(statements)
        except ExampleError as error:
            return error.span, error.message
        try:
            backend.build_example(inputs, ops, outputs, opset=example.opset)
        except Exception as error:  # whatever the IR library raises for a graph it refuses
            span = _refused_statement(backend, inputs, ops, statements, example.opset) or example.span
            return span, f"{which}example '{example.description}' cannot be built: {_first_line(error)}"
    return None


def _refused_statement(backend, inputs, ops, statements, opset=None) -> ast.Span | None:
    """The first op statement the backend refuses, found by building ever longer
    prefixes of the graph (only for an example already known to fail)."""
    op_statements = [s for s in statements if isinstance(s, ast.ExampleOp)]
    for count in range(1, len(ops) + 1):
        try:
            backend.build_example(inputs, ops[:count], [ops[count - 1][0]], opset=opset)
        except Exception:  # the same refusal as the whole graph's, now pinned to one op
            return op_statements[count - 1].build.span
    return None


def _first_line(error: BaseException) -> str:
    lines = [line.strip() for line in str(error).strip().splitlines() if line.strip()]
    return lines[0] if lines else type(error).__name__


def _source_line(cache: dict[str, list[str] | None], span: ast.Span) -> str:
    if span.file not in cache:
        try:
            cache[span.file] = read_rules_text(span.file).split("\n")
        except UnreadableRules:
            cache[span.file] = None
    lines = cache[span.file]
    if lines is None or not 1 <= span.line <= len(lines):
        return ""
    return lines[span.line - 1].removesuffix("\r")


def canonical(adapter) -> str:
    """The outputs as expressions over the inputs: names of intermediates do not matter."""
    memo: dict[int, str] = {}

    def show(value) -> str:
        if isinstance(value, (tuple, list)):  # a variadic operand: MIL holds a list, ONNX a tuple
            return "(" + ", ".join(show(v) for v in value) + ")"
        key = id(value)
        if key not in memo:
            constant = adapter.constant(value)
            producer = adapter.producer(value)
            if constant is not None and (producer is None or adapter.op_type(producer) in ("const", "Constant")):
                memo[key] = _show_constant(np.asarray(constant))
            elif producer is None:
                memo[key] = "%" + adapter.value_name(value)
            else:
                names = adapter.operand_names(producer)
                operands = ", ".join(f"{n}={show(adapter.operand(producer, n))}" for n in names)
                memo[key] = f"{adapter.op_type(producer)}({operands})"
        return memo[key]

    outputs = [value for block in adapter.top_blocks() for value in adapter.block_outputs(block)]
    return "; ".join(show(v) for v in outputs)


# The dtypes an untyped literal gets in some backend; any other is shown.
_PLAIN_DTYPES = frozenset({"float32", "int32", "int64", "bool"})
_DTYPE_NAMES = {"float16": "fp16", "float64": "fp64"}


def _show_constant(array: np.ndarray) -> str:
    """A constant as written; with its dtype when a rule had to type it (`6.0:fp16`),
    so that an fp32 constant where the `becomes` graph has an fp16 one differs."""
    text = repr(array.tolist())
    if array.dtype.name in _PLAIN_DTYPES:
        return text
    return f"{text}:{_DTYPE_NAMES.get(array.dtype.name, array.dtype.name)}"


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
