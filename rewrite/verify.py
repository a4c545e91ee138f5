"""`rewrite verify`: random instances of a rule's pattern, before against after.

The generator reads the rule itself; the rules file needs nothing extra. It
builds the anchor op with random operands (constants where the conditions
read a constant, inputs with literal or symbolic dims elsewhere), gives it
consumers drawn from the op classes its `every use` conditions expect (the
anchor sometimes twice in one consumer, sometimes a block output, sometimes
beside a consumer the rule does not expect), and keeps the instances on
which the rule fires. Each is evaluated before and after at several sizes of
its symbolic dims; a difference, or a backend's semantic objection, is a
counterexample, which is shrunk and printed as a rule example.

The necessity check drops each `where` clause in turn: a clause whose
removal no instance notices is possibly redundant, or guards a case the
generator does not reach.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field, replace

import numpy as np

from rewrite import backends
from rewrite.api import RuleSet
from rewrite.engine.driver import UnsoundRewriteError
from rewrite.engine.interfaces import NamedValue
from rewrite.examples import example_ops
from rewrite.language import ast

LITERAL_DIMS = (1, 1, 2, 3, 4)
SYMBOLS = ("B", "C")
BINDINGS = ({"B": 2, "C": 2}, {"B": 3, "C": 3}, {"B": 2, "C": 1}, {"B": 1, "C": 3})
EXTRA_CONSUMERS = {"mil": "exp", "onnx": "Exp"}
# Operands that are constants whatever the conditions say.
CONSTANT_NAMES = frozenset({
    "reps", "repeats", "shape", "perm", "dtype", "axes", "keep_dims", "begin", "end", "stride",
    "begin_mask", "end_mask", "squeeze_mask",
})
# Ops that contract their operands' matrix axes, per dialect spelling.
CONTRACTIONS = frozenset({"matmul", "MatMul"})
# The predicate input of a nested instance, as each backend wants it.
FLAG_INPUTS = {"mil": ("flag", "fp32", [1]), "onnx": ("flag", "bool", [])}
DTYPES = {"mil": ("fp32", "fp32", "fp16", "int32", "bool"), "onnx": ("fp32", "fp32", "fp16", "int64", "bool")}


@dataclass
class Instance:
    """A graph in the form `build_example` takes."""

    inputs: list = field(default_factory=list)  # (name, dtype, dims)
    ops: list = field(default_factory=list)  # (name, op type, operands)
    outputs: list = field(default_factory=list)
    nested: bool = False  # all ops inside both branches of a conditional

    def copy(self) -> Instance:
        return Instance(list(self.inputs), [(n, t, dict(o)) for n, t, o in self.ops], list(self.outputs),
                        self.nested)

    def as_example(self) -> str:
        lines = [f"    input %{n}: {d}[{', '.join(str(x) for x in dims)}]" for n, d, dims in self.inputs]
        for name, op_type, operands in self.ops:
            arguments = ", ".join(f"{k}={_show(v)}" for k, v in operands.items())
            lines.append(f"    %{name} = {op_type}({arguments})")
        lines.append("    output " + ", ".join(f"%{o}" for o in self.outputs))
        if self.nested:
            lines.insert(0, "    # inside both branches of a conditional on %flag")
        return "\n".join(lines)


def _show(value) -> str:
    if isinstance(value, NamedValue):
        return f"%{value.name}"
    if isinstance(value, tuple):
        return ", ".join(_show(v) for v in value)
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


@dataclass(frozen=True)
class Counterexample:
    graph: str
    problem: str


@dataclass(frozen=True)
class Necessity:
    condition: str
    location: str
    noticed: bool  # some instance failed once it was dropped
    extra_instances: int = 0  # instances that fired only once it was dropped (all fine, if not noticed)


@dataclass(frozen=True)
class Verdict:
    rule: str
    trials: int
    instances: int  # generated graphs on which the rule fired
    counterexample: Counterexample | None
    necessity: tuple[Necessity, ...] = ()
    nested_instances: int = 0  # of those, with every op inside a conditional's branches

    @property
    def passed(self) -> bool:
        """No counterexample. With no instance at all, that proves nothing: see `conclusive`."""
        return self.counterexample is None

    @property
    def conclusive(self) -> bool:
        return self.instances > 0


# ------------------------------------------------------------------ generation


class _Generator:
    def __init__(self, rule: ast.Rule, rng: random.Random):
        self.rule = rule
        self.rng = rng
        self.dialect = rule.dialect
        self.schema = backends.schema_for(rule.dialect)
        self.constants = _constant_vars(rule)
        self.consumer_patterns = _consumer_patterns(rule)

    def dims(self, rank: int) -> list:
        return [self.rng.choice(SYMBOLS) if self.rng.random() < 0.25 else self.rng.choice(LITERAL_DIMS)
                for _ in range(rank)]

    def instance(self) -> Instance | None:
        # Patterns that reach far through conditions (`unscaled(%v) is ...`)
        # are more than the operand generator can build, so half the
        # instances are the rule's own examples, mutated.
        if self.rule.examples and self.rng.random() < 0.5:
            return self._mutated_example()
        return self._generated()

    def _mutated_example(self) -> Instance:
        rng = self.rng
        example = rng.choice(self.rule.examples)
        # The example's own symbol names, renamed to the ones BINDINGS sizes.
        names = sorted({d for s in example.inputs for d in s.dims if isinstance(d, str)})
        renamed = {name: SYMBOLS[i % len(SYMBOLS)] for i, name in enumerate(names)}
        graph = Instance(
            [(s.var.lstrip("%"), s.dtype, [renamed.get(d, d) for d in s.dims]) for s in example.inputs],
            [(name, op_type, dict(operands)) for name, op_type, operands in example_ops(example.statements)],
            [var.lstrip("%") for var in example.outputs],
        )
        # One change at a time, as in mutation testing: an example changed in
        # many places at once is mostly no valid graph.
        change = rng.random()
        if change < 0.3:
            self._mutate_a_dim(graph)
        elif change < 0.6:
            self._mutate_a_constant(graph)
        elif change < 0.75 and graph.ops:  # an intermediate that is also an output
            name = rng.choice(graph.ops)[0]
            if name not in graph.outputs:
                graph.outputs.append(name)
        if rng.random() < 0.2:
            graph.nested = True
            graph.inputs.append(FLAG_INPUTS[self.dialect])
        return graph

    def _mutate_a_dim(self, graph: Instance) -> None:
        places = [(i, axis) for i, (_, _, dims) in enumerate(graph.inputs) for axis in range(len(dims))]
        if not places:
            return
        position, axis = self.rng.choice(places)
        name, dtype, dims = graph.inputs[position]
        dims = list(dims)
        dims[axis] = self.rng.choice((*LITERAL_DIMS, *SYMBOLS))
        graph.inputs[position] = (name, dtype, dims)

    def _mutate_a_constant(self, graph: Instance) -> None:
        places = [(i, key) for i, (_, _, operands) in enumerate(graph.ops)
                  for key, value in operands.items() if isinstance(value, float)]
        if not places:
            return
        position, key = self.rng.choice(places)
        value = graph.ops[position][2][key]
        # Just inside fp32 rounding, far outside any tolerance, a sign, or a special value.
        graph.ops[position][2][key] = self.rng.choice(
            (value * (1 + 1e-7), value * 1.01, -value, 0.0, float("inf"), float("-inf"), float("nan"))
        )

    def _generated(self) -> Instance | None:
        rng = self.rng
        graph = Instance()
        # Every dtype the ops might take: graphs an op refuses are not instances.
        self.dtype = rng.choice(DTYPES[self.dialect])
        contracting = any(t in CONTRACTIONS for p in self.consumer_patterns for t in p.types)
        self.rank = rng.randint(2, 3) if contracting else rng.randint(1, 3)
        # A constant int list as long as the data's rank (tile's reps, Expand's
        # shape) is read as a per-axis size: the data is mostly 1 where it
        # widens, and the full size is what other operands mostly carry.
        self.hint = [rng.choice((1, 1, 2, 3)) for _ in range(self.rank)]
        if contracting and rng.random() < 0.6:
            self.hint[-2:] = [1, 1]  # products broadcast only batch axes: widen those
        self.data_dims = [1 if size > 1 and rng.random() < 0.75 else d
                          for size, d in zip(self.hint, self.dims(self.rank))]
        full = [size if dim == 1 else dim for size, dim in zip(self.hint, self.data_dims)]
        producers = {clause.var: clause.pattern for clause in self.rule.matches[1:]}
        if self._op(graph, self.rule.anchor.pattern, "anchor", producers) is None:
            return None
        for index in range(rng.choice((1, 1, 2, 3))):
            self._consumer(graph, index, self.dtype, full)
        if rng.random() < 0.15:
            graph.ops.append(("extra", EXTRA_CONSUMERS[self.dialect], _unary_operand(self.schema, self.dialect)))
            graph.outputs.append("extra")
        if rng.random() < 0.15:
            graph.outputs.append("anchor")
        if rng.random() < 0.2:
            graph.nested = True
            graph.inputs.append(FLAG_INPUTS[self.dialect])
        return graph if graph.outputs else None

    def _op(self, graph: Instance, pattern: ast.OpPattern, name: str, producers: dict) -> str | None:
        """Add an op matching `pattern` (and the ops its operands' patterns want) to `graph`."""
        rng = self.rng
        op_type = rng.choice(sorted(pattern.types))
        signature = self.schema.signature(op_type)
        if signature is None:
            return None
        named = {o.name: o.pattern for o in pattern.operands if o.name is not None}
        optional = {o.name for o in pattern.operands if o.optional}
        operands = {}
        for position, spec in enumerate(signature.inputs):
            if spec.optional and spec.name not in named:
                continue
            if spec.name in optional and rng.random() < 0.5:
                continue  # `name=%v?`: try it absent too
            operand = named.get(spec.name)
            var = operand.var if isinstance(operand, ast.Bind) else None
            producer = producers.get(var) if var else None
            if producer is None and isinstance(operand, ast.Bind):
                producer = operand.producer
            if producer is None and isinstance(operand, ast.OpPattern):
                producer = operand
            if producer is not None:
                made = self._op(graph, producer, f"{name}_{spec.name}", producers)
                if made is None:
                    return None
                operands[spec.name] = NamedValue(made)
            elif position > 0 and (var in self.constants or spec.name in CONSTANT_NAMES or spec.name in optional):
                operands[spec.name] = self._constant(spec.name)
            else:
                input_name = f"in{len(graph.inputs)}"
                first = not any(isinstance(v, NamedValue) for v in operands.values())
                same_shape = first or spec.name == "update"  # an update covers what it writes
                dims = list(self.data_dims) if same_shape else self.dims(self.rank)
                dtype = "bool" if spec.name in ("cond", "condition") else self.dtype
                graph.inputs.append((input_name, dtype, dims))
                operands[spec.name] = NamedValue(input_name)
        graph.ops.append((name, op_type, operands))
        return name

    def _constant(self, operand: str):
        """A constant operand, shaped by what the operand means."""
        rng = self.rng
        if operand == "perm":
            perm = list(range(self.rank))
            rng.shuffle(perm)
            return perm
        if operand == "dtype":
            return rng.choice(("fp32", "fp16", "int32"))
        if operand in ("keep_dims", "keepdims"):
            return rng.random() < 0.5
        if operand == "begin":
            return [0 if rng.random() < 0.8 else 1 for _ in range(self.rank)]
        if operand == "end":
            return [d if isinstance(d, int) and rng.random() < 0.8 else 0 for d in self.data_dims]
        if operand.endswith("_mask"):
            return [rng.random() < 0.5 for _ in range(self.rank)]
        if operand == "stride":
            return [1 if rng.random() < 0.8 else 2 for _ in range(self.rank)]
        if operand == "axes":
            return [rng.randrange(self.rank)]
        if operand == "shape" and all(isinstance(d, int) for d in self.data_dims) and rng.random() < 0.5:
            return [-1] if rng.random() < 0.5 else list(reversed(self.data_dims))
        if operand not in CONSTANT_NAMES and self.dtype in ("fp32", "fp16"):
            # A data operand made constant: boundary scalars matter most.
            return rng.choice((float("-inf"), -1e9, 0.0, 1.0, float("inf")))
        return list(self.hint)

    def _other_dims(self, full: list) -> list:
        rng = self.rng

        def pick(d):
            draw = rng.random()
            if draw < 0.55:
                return d  # the full size
            if draw < 0.75:
                return 1
            if draw < 0.9:
                return rng.choice(SYMBOLS)
            return rng.choice(LITERAL_DIMS)

        dims = [pick(d) for d in full]
        drop = rng.choice((0, 0, 0, 1)) if len(dims) > 1 else 0
        return dims[drop:]

    def _contracted_dims(self, full: list, anchor_is_left: bool) -> list:
        # A matrix product contracts the anchor's last axis with the other's
        # second-to-last (or the reverse); only the batch axes broadcast.
        batch = [d if self.rng.random() < 0.6 else 1 for d in full[:-2]]
        if self.rng.random() < 0.2:
            batch = batch[1:]  # a lower-rank stack
        free = self.rng.choice(LITERAL_DIMS)
        return batch + ([full[-1], free] if anchor_is_left else [free, full[-2]])

    def _consumer(self, graph: Instance, index: int, dtype: str, full: list) -> None:
        rng = self.rng
        if not self.consumer_patterns:
            graph.outputs.append("anchor")
            return
        pattern = rng.choice(self.consumer_patterns)
        op_type = rng.choice(sorted(pattern.types))
        signature = self.schema.signature(op_type)
        variadic = any(s.variadic for s in signature.inputs)
        required = [s for s in signature.inputs if not s.optional]
        count = rng.choice((1, 2, 3)) if variadic else len(required)
        # A condition operand is bool; the anchor (of the data dtype) goes elsewhere.
        conditions = set() if variadic else {i for i, s in enumerate(required) if s.name in ("cond", "condition")}
        data_positions = [i for i in range(count) if i not in conditions]
        anchor_at = rng.choice(data_positions)
        twice = len(data_positions) > 1 and rng.random() < 0.15
        second = data_positions[(data_positions.index(anchor_at) + 1) % len(data_positions)]
        values = []
        for position in range(count):
            if position == anchor_at or (twice and position == second):
                values.append(NamedValue("anchor"))
                continue
            name = f"in{len(graph.inputs)}"
            if op_type in CONTRACTIONS and len(full) >= 2:
                dims = self._contracted_dims(full, anchor_is_left=anchor_at < position)
            else:
                dims = self._other_dims(full)
            graph.inputs.append((name, "bool" if position in conditions else dtype, dims))
            values.append(NamedValue(name))
        if variadic:
            operands = {signature.inputs[0].name: tuple(values)}
        else:
            operands = {spec.name: value for spec, value in zip(required, values)}
        name = f"use{index}"
        graph.ops.append((name, op_type, operands))
        graph.outputs.append(name)


def _unary_operand(schema, dialect: str) -> dict:
    return {"x": NamedValue("anchor")} if dialect == "mil" else {"input": NamedValue("anchor")}


def _constant_vars(rule: ast.Rule) -> set[str]:
    """Variables the conditions read a constant from: is_const(%v), const(%v), %v[i]."""
    found: set[str] = set()

    def visit(expr):
        if isinstance(expr, ast.Call) and expr.function in ("is_const", "const"):
            for argument in expr.arguments:
                if isinstance(argument, ast.ValueRef):
                    found.add(argument.var)
        if isinstance(expr, ast.Index) and isinstance(expr.base, ast.ValueRef):
            found.add(expr.base.var)
        if isinstance(expr, tuple):
            for item in expr:
                visit(item)
        elif hasattr(expr, "__dataclass_fields__") and not isinstance(expr, ast.Span):
            for name in expr.__dataclass_fields__:
                visit(getattr(expr, name))

    for condition in rule.conditions:
        visit(condition.expr)
    return found


def _consumer_patterns(rule: ast.Rule) -> list[ast.OpPattern]:
    """The op patterns `every use %u of <anchor>` expects `%u` to match."""
    anchor = rule.anchor.var
    patterns: list[ast.OpPattern] = []

    def visit(expr, use_var=None):
        if isinstance(expr, ast.EveryUse) and expr.of == anchor:
            visit(expr.body, expr.variable)
            return
        if isinstance(expr, ast.Matches) and isinstance(expr.subject, ast.ValueRef) and not expr.negated:
            if expr.subject.var == use_var:
                patterns.append(expr.pattern)
        if hasattr(expr, "__dataclass_fields__") and not isinstance(expr, ast.Span):
            for name in expr.__dataclass_fields__:
                child = getattr(expr, name)
                for item in child if isinstance(child, tuple) else (child,):
                    if hasattr(item, "__dataclass_fields__"):
                        visit(item, use_var)

    for condition in rule.conditions:
        visit(condition.expr)
    return patterns


# ------------------------------------------------------------------ checking


def _check(rule: ast.Rule, instance: Instance) -> tuple[bool, str | None]:
    """(fired, problem): whether the rule fired on `instance`, and what broke if it did."""
    backend = backends.backend_module(rule.dialect)
    try:
        program = backend.build_example(
            instance.inputs, instance.ops, instance.outputs, nested_by="flag" if instance.nested else None
        )
    except Exception:
        return False, None  # not a valid graph of this IR: not an instance
    original = backend.copy_program(program)
    objecting = getattr(backend, "semantic_problems", lambda program: [])
    before = {problem.key for problem in objecting(program)}
    try:
        # Checked: a rewrite the engine's shape guard refuses is the rule's
        # own soundness failing, hidden in a normal run by the guard.
        statistics = RuleSet((rule,)).apply(program, check_types=True)
    except UnsoundRewriteError as error:
        if not _runs_somewhere(backend, original, instance):
            return False, None  # not a valid graph to begin with: not an instance
        return True, f"the rule fired where its consumers' types are not proved to stay: {error}"
    except Exception as error:  # the IR refused what the rule built: a counterexample
        first = str(error).strip().splitlines()[0] if str(error).strip() else ""
        return True, f"the rewrite fails: {type(error).__name__}: {first}"
    if not statistics.fires:
        return False, None
    # Only what the rewrite introduced is its fault.
    objections = [problem for problem in objecting(program) if problem.key not in before]
    if objections:
        return True, objections[0].message
    rng = np.random.default_rng(0)
    compared = 0
    for binding in BINDINGS:
        feeds = _feeds(rng, instance, binding)
        try:
            expected = backend.evaluate_example(original, feeds)
        except Exception:
            continue  # these sizes do not broadcast in the original either
        compared += 1
        try:
            got = backend.evaluate_example(program, feeds)
        except Exception as error:
            return True, f"the rewritten graph fails where the original runs ({binding}): {error}"
        for name, value in expected.items():
            other = got.get(name)
            if other is None or other.shape != value.shape:
                shape = None if other is None else other.shape
                return True, f"output '{name}' has shape {shape} instead of {value.shape} at {binding}"
            # Exact for ints and bools; for floats, a dtype's own precision.
            if value.dtype.kind == "f":
                tolerance = 1e-3 if value.dtype == np.float16 else 1e-5
                same = np.allclose(value, other, rtol=tolerance, atol=tolerance, equal_nan=True)
            else:
                same = np.array_equal(value, other)
            if not same:
                return True, f"output '{name}' changed value at {binding}"
    return compared > 0, None


def _runs_somewhere(backend, program, instance: Instance) -> bool:
    """Whether `program` evaluates at any of the bindings tried."""
    rng = np.random.default_rng(0)
    for binding in BINDINGS:
        try:
            backend.evaluate_example(program, _feeds(rng, instance, binding))
        except Exception:
            continue
        return True
    return False


def _feeds(rng, instance: Instance, binding: dict) -> dict:
    """Random inputs for `instance` with its symbolic dims bound by `binding`."""
    feeds = {}
    for name, dtype, dims in instance.inputs:
        shape = tuple(binding[d] if isinstance(d, str) else d for d in dims)
        feeds[name] = _random_array(rng, dtype, shape)
    return feeds


def _random_array(rng, dtype: str, shape) -> np.ndarray:
    if dtype == "bool":
        return rng.random(shape) > 0.5
    if dtype.startswith("int"):
        return rng.integers(-3, 4, size=shape).astype(dtype)
    return rng.standard_normal(shape).astype(np.float16 if dtype == "fp16" else np.float32)


def _shrink(rule: ast.Rule, instance: Instance, problem: str) -> tuple[Instance, str]:
    """Smaller variants that still fail: fewer ops and outputs, smaller dims."""
    improved = True
    while improved:
        improved = False
        for candidate in _smaller(instance):
            fired, found = _check(rule, candidate)
            if fired and found:
                instance, problem, improved = candidate, found, True
                break
    return instance, problem


def _smaller(instance: Instance):
    used = lambda graph: {v.name for _, _, o in graph.ops for v in _values(o)}  # noqa: E731
    for output in instance.outputs:
        if len(instance.outputs) > 1:
            candidate = instance.copy()
            candidate.outputs.remove(output)
            candidate.ops = [op for op in candidate.ops if op[0] != output or op[0] == "anchor"]
            # The flag of a nested instance is read by the conditional, not by an op.
            candidate.inputs = [i for i in candidate.inputs if i[0] in used(candidate) or i[0] == "flag"]
            yield candidate
    for position, (name, dtype, dims) in enumerate(instance.inputs):
        for axis, dim in enumerate(dims):
            for smaller in ((1, 2) if isinstance(dim, str) or dim > 2 else ()):
                candidate = instance.copy()
                new_dims = list(dims)
                new_dims[axis] = smaller
                candidate.inputs[position] = (name, dtype, new_dims)
                yield candidate


def _values(operands: dict):
    for value in operands.values():
        for item in value if isinstance(value, tuple) else (value,):
            if isinstance(item, NamedValue):
                yield item


def verify_rule(
    rule: ast.Rule, trials: int = 50, seed: int = 0, necessity: bool = True, shaped_by: ast.Rule | None = None
) -> Verdict:
    """Try `trials` random instances of `rule`; stop at the first counterexample.

    Instances are shaped by `shaped_by` (default: the rule itself), so that a
    rule with a condition dropped is tried on the graphs the full rule expects.
    """
    instances, nested, counterexample = 0, 0, None
    generator = _Generator(shaped_by or rule, random.Random(seed))
    for _ in range(trials):
        instance = generator.instance()
        if instance is None:
            continue
        fired, problem = _check(rule, instance)
        instances += fired
        nested += fired and instance.nested
        if problem:
            small, problem = _shrink(rule, instance, problem)
            counterexample = Counterexample(small.as_example(), problem)
            break
    results = []
    if necessity and counterexample is None:
        for index, condition in enumerate(rule.conditions):
            weaker = replace(rule, conditions=rule.conditions[:index] + rule.conditions[index + 1:])
            verdict = verify_rule(weaker, trials, seed, necessity=False, shaped_by=rule)
            results.append(Necessity(condition.text, str(condition.span), verdict.counterexample is not None,
                                     max(verdict.instances - instances, 0)))
    return Verdict(rule.name, trials, instances, counterexample, tuple(results), nested)


def format_verdict(verdict: Verdict) -> str:
    if verdict.counterexample is not None:
        lines = [f"FAIL  {verdict.rule}: {verdict.counterexample.problem}", "  counterexample (as a rule example):",
                 verdict.counterexample.graph]
        return "\n".join(lines)
    if verdict.instances == 0:
        return f"NONE  {verdict.rule}: no instance in {verdict.trials} trials fired the rule; nothing was checked"
    lines = [f"PASS  {verdict.rule}: {verdict.instances} instances of {verdict.trials} trials "
             f"({verdict.nested_instances} in nested blocks), outputs equal"]
    for item in verdict.necessity:
        if item.noticed:
            lines.append(f"  needed: where {item.condition}  ({item.location})")
        elif item.extra_instances:
            lines.append(f"  possibly redundant: without it {item.extra_instances} more instances fired, all with "
                         f"equal outputs: where {item.condition}  ({item.location})")
        else:
            lines.append(f"  not exercised (the generator is too weak here): every instance already met "
                         f"where {item.condition}  ({item.location})")
    return "\n".join(lines)
