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

import heapq
import itertools
import logging
import random
from dataclasses import dataclass, field, replace

import numpy as np

from rewrite import backends
from rewrite.api import RuleSet
from rewrite.engine.driver import UnsoundRewriteError
from rewrite.engine.interfaces import NamedValue
from rewrite.examples import example_ops
from rewrite.language import ast

SYMBOLS = ("B", "C")
# Dims and ranks, typical first (the order small-scope enumeration tries them in).
DIMS = (2, 1, "B", 3, 0, "C")
DIM_WEIGHTS = (4, 5, 3, 3, 1, 1)
MAX_RANK = 4
RANKS = (2, 1, 3, 0, 4)
RANK_WEIGHTS = (5, 4, 4, 1, 1)
# Sizes each symbol takes when an instance is evaluated.
BINDINGS = ({"B": 2, "C": 2}, {"B": 3, "C": 3}, {"B": 2, "C": 1}, {"B": 1, "C": 3}, {"B": 0, "C": 2})
FP32_MAX = float(np.finfo(np.float32).max)
# Float constants: the plain ones, then the edges (signed zero, specials, the
# largest finite value of fp32 and fp16, the smallest subnormal).
FLOAT_EDGES = (1.0, 0.0, -1.0, 2.0, -1e9, float("inf"), float("-inf"), float("nan"), FP32_MAX, -FP32_MAX,
               65504.0, 1e-45, -0.0)
FLOAT_EDGE_WEIGHTS = (4, 3, 2, 1, 2, 2, 2, 1, 1, 2, 1, 1, 1)
# Opsets, the default first, then from the oldest the backend supports to the newest.
OPSETS = {"mil": (None, "iOS15", "iOS16", "iOS17"), "onnx": (None, 1, 6, 7, 8, 11, 13, 21)}
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
DTYPES = {"mil": ("fp32", "fp16", "int32", "bool"), "onnx": ("fp32", "fp16", "int64", "bool")}


@dataclass
class Instance:
    """A graph in the form `build_example` takes."""

    inputs: list = field(default_factory=list)  # (name, dtype, dims)
    ops: list = field(default_factory=list)  # (name, op type, operands)
    outputs: list = field(default_factory=list)
    nested: bool = False  # all ops inside both branches of a conditional
    opset: int | str | None = None  # None: the backend's default

    def copy(self) -> Instance:
        return Instance(list(self.inputs), [(n, t, dict(o)) for n, t, o in self.ops], list(self.outputs),
                        self.nested, self.opset)

    def body(self) -> list[str]:
        """The graph as the statements of a rule example."""
        lines = [] if self.opset is None else [f"opset {self.opset}"]
        lines += [f"input %{n}: {d}[{', '.join(str(x) for x in dims)}]" for n, d, dims in self.inputs]
        for name, op_type, operands in self.ops:
            arguments = ", ".join(f"{k}={_show(v)}" for k, v in operands.items())
            lines.append(f"%{name} = {op_type}({arguments})")
        lines.append("output " + ", ".join(f"%{o}" for o in dict.fromkeys(self.outputs)))
        return lines

    def as_example(self, description: str) -> str:
        """An `unchanged` example: pasted under the rule, `rewrite test` fails until the rule is fixed."""
        description = " ".join(description.replace('"', "'").split())
        lines = [f'  example "{description}"']
        if self.nested:
            lines.append("    # found inside both branches of a conditional on %flag")
        lines += ["    " + line for line in self.body()]
        lines.append("  unchanged")
        return "\n".join(lines)


def _show(value) -> str:
    if isinstance(value, NamedValue):
        return f"%{value.name}"
    if isinstance(value, tuple):  # `(%a,)`: one item needs the comma, or it is a parenthesized value
        return "(" + ", ".join(_show(v) for v in value) + ("," if len(value) == 1 else "") + ")"
    if isinstance(value, list):
        return "[" + ", ".join(_show(v) for v in value) + "]"
    if isinstance(value, (bool, np.bool_)):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, (np.ndarray, np.generic)):  # a typed constant
        dtype = _DTYPE_NAMES.get(value.dtype.name, value.dtype.name)
        return f"as_dtype({_show(value.tolist())}, {dtype})"
    return str(value)


_DTYPE_NAMES = {"float16": "fp16", "float32": "fp32", "float64": "fp64"}


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


# ------------------------------------------------------------------ decisions


class Choices:
    """Every decision the generator makes: drawn at random, or replayed from a plan.

    A plan maps a decision's position (its index in the order the generator
    asks) to the option taken there; every other decision takes its first
    option. Options are listed typical case first, so the empty plan is the
    plainest instance and a plan of one entry changes one thing about it.
    Enumerating plans by size (`_plans`) exhausts the small cases, one
    change and then two, before anything is sampled.
    """

    def __init__(self, rng: random.Random | None = None, plan: dict[int, int] | None = None):
        self.rng = rng
        self.plan = plan or {}
        self.sizes: list[int] = []  # how many options each decision had, in order

    def choice(self, options, weights=None):
        options = list(options)
        position = len(self.sizes)
        self.sizes.append(len(options))
        if self.rng is None:
            index = self.plan.get(position, 0)
            return options[index if index < len(options) else 0]
        if weights is None:
            return self.rng.choice(options)
        return self.rng.choices(options, weights)[0]

    def flag(self, probability: float) -> bool:
        """True with `probability` when sampling; enumerated likelier answer first."""
        likely = probability >= 0.5
        weight = max(probability, 1 - probability)
        return self.choice((likely, not likely), (weight, 1 - weight))


def _plans(generate, budget: int, root: tuple = ()):
    """Results of `generate(choices)` for plans best-first: fewest changes, then smallest options.

    A plan's children change one more decision after its last change, so each
    plan is reached once; the decisions after a change are read from the run
    that made it, because a change (a higher rank, say) can add decisions.
    Every plan extends `root`, which is not counted as a change.
    """
    queue = [(0, 0, root)]
    while queue and budget > 0:
        _, _, items = heapq.heappop(queue)
        choices = Choices(plan=dict(items))
        result = generate(choices)
        budget -= 1
        last = items[-1][0] if items else -1
        for position in range(last + 1, len(choices.sizes)):
            for index in range(1, choices.sizes[position]):
                plan = (*items, (position, index))
                heapq.heappush(queue, (len(plan) - len(root), sum(i for _, i in plan), plan))
        yield result


def _round_robin(first, others):
    """Items of `first` and of `others` in turn, `first` at every other turn."""
    others = list(others)
    turn = 0
    while first is not None or others:
        if first is not None and (turn % 2 == 0 or not others):
            stream = first
        else:
            stream = others[(turn // 2) % len(others)]
        turn += 1
        try:
            yield next(stream)
        except StopIteration:
            if stream is first:
                first = None
            else:
                others.remove(stream)


# ------------------------------------------------------------------ generation


class _Generator:
    """Instances of a rule's pattern, each built from one `Choices`.

    Every value in the pattern gets its own rank (0 to 4) and dims (0, 1, 2,
    3 or a symbol); constants come in every length, wider than the anchor
    too, with zeros; float constants take the edge values; inner pattern
    values get extra uses, aliases and block outputs; and the opset runs
    from the oldest the backend supports to the newest.
    """

    def __init__(self, rule: ast.Rule):
        self.rule = rule
        self.dialect = rule.dialect
        self.schema = backends.schema_for(rule.dialect)
        self.constants = _constant_vars(rule)
        self.consumer_patterns = _consumer_patterns(rule)
        self.contracting = any(t in CONTRACTIONS for p in self.consumer_patterns for t in p.types)
        self.sources = 1 + len(rule.examples)  # the first decision: generated, or which example
        self.rewritten_examples = sum(example.expected is not None for example in rule.examples)

    def instance(self, choices: Choices) -> Instance | None:
        self.c = choices
        # Patterns that reach far through conditions (`unscaled(%v) is ...`)
        # are more than the operand generator can build, so half the
        # instances are the rule's own examples, changed in one place: those
        # the rule rewrites first, whose changes cross the conditions' edges.
        # Those it rewrites count as much together as those it leaves
        # (a rule may have dozens of the latter, one per condition).
        examples = sorted(self.rule.examples, key=lambda example: example.expected is None)
        rewritten = sum(example.expected is not None for example in examples)
        weight = max(1, (len(examples) - rewritten) // max(1, rewritten))
        weights = [weight if example.expected is not None else 1 for example in examples]
        source = choices.choice(["generated", *range(len(examples))], [sum(weights) or 1] + weights)
        opsets = OPSETS[self.dialect]
        self.opset = choices.choice(opsets, [2 * len(opsets)] + [1] * (len(opsets) - 1))
        graph = self._generated() if source == "generated" else self._mutated_example(examples[source])
        if graph is None:
            return None
        if self.opset is not None:
            graph.opset = self.opset
        if choices.flag(0.2):
            graph.nested = True
            graph.inputs.append(FLAG_INPUTS[self.dialect])
        return graph

    # ---- dims and constants

    def dims(self, rank: int) -> list:
        return [self.c.choice(DIMS, DIM_WEIGHTS) for _ in range(rank)]

    def _rank_near(self, rank: int) -> int:
        """Another value's rank: mostly the anchor's, else any other from 0 to 4."""
        options = [rank] + [r for r in (rank - 1, rank + 1, 0, MAX_RANK) if r != rank and 0 <= r <= MAX_RANK]
        return self.c.choice(dict.fromkeys(options), [6] + [1] * (len(dict.fromkeys(options)) - 1))

    def _int_list(self, base: list) -> list:
        """A per-axis constant (reps, a shape): as the anchor wants it, or wider, narrower, or with a 0."""
        c = self.c
        change = c.choice(("as is", "wider", "two wider", "a zero", "narrower", "empty"), (12, 3, 1, 2, 2, 1))
        values = list(base)
        if change == "wider":
            values = [c.choice((1, 2, 3))] + values
        elif change == "two wider":
            values = [c.choice((1, 2)), c.choice((1, 3))] + values
        elif change == "a zero" and values:
            values[c.choice(range(len(values)))] = 0
        elif change == "narrower" and values:
            values = values[1:]
        elif change == "empty":
            values = []
        return values

    def _float_constant(self):
        """A data operand made constant: boundary values matter most, at any rank."""
        c = self.c
        value = c.choice(FLOAT_EDGES, FLOAT_EDGE_WEIGHTS)
        shape = c.choice(("scalar", "ones", "ones wider", "full"), (6, 2, 1, 1))
        if shape == "scalar":
            return value
        dims = {"ones": [1] * self.rank, "ones wider": [1] * (self.rank + 1),
                "full": [d if isinstance(d, int) else 1 for d in self.full]}[shape]
        return np.full(dims, value, dtype=np.float32).tolist()

    def _constant(self, operand: str):
        """A constant operand, shaped by what the operand means."""
        c = self.c
        if operand == "perm":
            perms = list(itertools.islice(itertools.permutations(range(self.rank)), 6))
            return list(c.choice(perms)) if perms else []
        if operand == "dtype":
            return c.choice(("fp32", "fp16", "int32"))
        if operand in ("keep_dims", "keepdims"):
            return c.flag(0.5)
        if operand == "begin":
            return [0 if c.flag(0.8) else 1 for _ in range(self.rank)]
        if operand == "end":
            return [d if isinstance(d, int) and c.flag(0.8) else 0 for d in self.data_dims]
        if operand.endswith("_mask"):
            return [c.flag(0.5) for _ in range(self.rank)]
        if operand == "stride":
            return [1 if c.flag(0.8) else 2 for _ in range(self.rank)]
        if operand == "axes":
            return [c.choice(range(self.rank))] if self.rank else [0]
        if operand == "shape" and all(isinstance(d, int) for d in self.data_dims):
            form = c.choice(("per axis", "-1", "reversed"), (4, 1, 1))
            if form == "-1":
                return [-1]
            if form == "reversed":
                return list(reversed(self.data_dims))
        if operand not in CONSTANT_NAMES and self.dtype in ("fp32", "fp16"):
            return self._float_constant()
        return self._int_list(self.hint)

    # ---- graphs

    def _generated(self) -> Instance | None:
        c = self.c
        graph = Instance()
        # Every dtype the ops might take: graphs an op refuses are not instances.
        self.dtype = c.choice(DTYPES[self.dialect], (4, 1, 1, 1))
        self.rank = c.choice((2, 3, 4)) if self.contracting else c.choice(RANKS, RANK_WEIGHTS)
        # A constant int list as long as the data's rank (tile's reps, Expand's
        # shape) is read as a per-axis size: the data is mostly 1 where it
        # widens, and the full size is what other operands mostly carry.
        # (The plainest instance widens every axis by 2: what such rules are for.)
        self.hint = [c.choice((2, 1, 3, 0), (3, 6, 3, 1)) for _ in range(self.rank)]
        if self.contracting and c.flag(0.6):
            self.hint[-2:] = [1, 1]  # products broadcast only batch axes: widen those
        dims = self.dims(self.rank)
        self.data_dims = [1 if size != 1 and c.flag(0.75) else d for size, d in zip(self.hint, dims)]
        self.full = [size if dim == 1 else dim for size, dim in zip(self.hint, self.data_dims)]
        # What a tile by the hint makes of the data, where it is not the full size.
        self.tiled = [size * dim if isinstance(dim, int) else dim for size, dim in zip(self.hint, self.data_dims)]
        producers = {clause.var: clause.pattern for clause in self.rule.matches[1:]}
        if self._op(graph, self.rule.anchor.pattern, "anchor", producers) is None:
            return None
        for index in range(c.choice((1, 2, 3), (3, 1, 1))):
            self._consumer(graph, index)
        if c.flag(0.15):
            graph.ops.append(("extra", EXTRA_CONSUMERS[self.dialect], _unary_operand(self.dialect, "anchor")))
            graph.outputs.append("extra")
        if c.flag(0.15):
            graph.outputs.append("anchor")
        return graph if graph.outputs else None

    def _op(self, graph: Instance, pattern: ast.OpPattern, name: str, producers: dict) -> str | None:
        """Add an op matching `pattern` (and the ops its operands' patterns want) to `graph`."""
        c = self.c
        op_type = c.choice(sorted(pattern.types))
        signature = self.schema.signature(op_type)
        if signature is None:
            return None
        named = {o.name: o.pattern for o in pattern.operands if o.name is not None}
        # Positional patterns take the schema's operands in order (either
        # order, for `in any order`), after those named.
        positional = [o.pattern for o in pattern.operands if o.name is None and not o.rest]
        if pattern.any_order and len(positional) > 1 and c.flag(0.5):
            positional.reverse()
        free = [spec.name for spec in signature.inputs if spec.name not in named and not spec.variadic]
        named.update(zip(free, positional))
        optional = {o.name for o in pattern.operands if o.optional}
        operands = {}
        for position, spec in enumerate(signature.inputs):
            if spec.optional and spec.name not in named:
                continue
            if spec.name in optional and c.flag(0.5):
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
                self._inner_uses(graph, made)
            elif position > 0 and (var in self.constants or spec.name in CONSTANT_NAMES or spec.name in optional):
                operands[spec.name] = self._constant(spec.name)
            else:
                operands[spec.name] = self._data_operand(graph, spec.name, operands)
        graph.ops.append((name, op_type, operands))
        return name

    def _data_operand(self, graph: Instance, operand: str, so_far: dict) -> NamedValue:
        c = self.c
        dtype = "bool" if operand in ("cond", "condition") else self.dtype
        first = not any(isinstance(v, NamedValue) for v in so_far.values())
        # The same value in two places: a value the op already reads (an
        # inner pattern value included), where its dtype may fit.
        earlier = [v for v in so_far.values() if isinstance(v, NamedValue)
                   and all(d == dtype for n, d, _ in graph.inputs if n == v.name)]
        if earlier and c.flag(0.1):
            return c.choice(earlier)
        if first or operand == "update":  # an update covers what it writes
            dims = list(self.data_dims)
        elif c.flag(0.6):
            dims = self._other_dims()  # the full size, mostly, as other operands of broadcasting ops carry
        else:
            dims = self.dims(self._rank_near(self.rank))
        input_name = f"in{len(graph.inputs)}"
        graph.inputs.append((input_name, dtype, dims))
        return NamedValue(input_name)

    def _inner_uses(self, graph: Instance, value: str) -> None:
        """An inner pattern value the rule sees once may have other uses, or be a block output."""
        use = self.c.choice(("none", "output", "another use"), (8, 1, 1))
        if use == "output":
            graph.outputs.append(value)
        elif use == "another use":
            self._inner_uses_of(graph, value)

    def _inner_uses_of(self, graph: Instance, value: str) -> None:
        name = f"{value}_use"
        if all(op[0] != name for op in graph.ops):
            graph.ops.append((name, EXTRA_CONSUMERS[self.dialect], _unary_operand(self.dialect, value)))
            graph.outputs.append(name)

    def _other_dims(self) -> list:
        c = self.c
        tiled = getattr(self, "tiled", self.full)
        dims = [c.choice((d, 1, "B", 2, 3, 0, t), (11, 4, 2, 1, 1, 1, 2)) for d, t in zip(self.full, tiled)]
        change = c.choice((0, 1, -1, -2), (14, 3, 2, 1)) if dims else c.choice((0, -1), (3, 1))
        if change > 0:
            return dims[change:]
        return [c.choice((1, 2, "B")) for _ in range(-change)] + dims

    def _contracted_dims(self, anchor_is_left: bool) -> list:
        # A matrix product contracts the anchor's last axis with the other's
        # second-to-last (or the reverse); only the batch axes broadcast.
        c = self.c
        full = self.full
        batch = [d if c.flag(0.6) else 1 for d in full[:-2]]
        if c.flag(0.2):
            batch = batch[1:]  # a lower-rank stack
        free = c.choice((2, 1, 3))
        return batch + ([full[-1], free] if anchor_is_left else [free, full[-2]])

    def _consumer(self, graph: Instance, index: int) -> None:
        c = self.c
        if not self.consumer_patterns:
            graph.outputs.append("anchor")
            return
        pattern = c.choice(self.consumer_patterns)
        op_type = c.choice(sorted(pattern.types))
        signature = self.schema.signature(op_type)
        variadic = any(s.variadic for s in signature.inputs)
        required = [s for s in signature.inputs if not s.optional]
        count = c.choice((2, 1, 3)) if variadic else len(required)
        # A condition operand is bool; the anchor (of the data dtype) goes elsewhere.
        conditions = set() if variadic else {i for i, s in enumerate(required) if s.name in ("cond", "condition")}
        data_positions = [i for i in range(count) if i not in conditions]
        anchor_at = c.choice(data_positions)
        twice = len(data_positions) > 1 and c.flag(0.15)
        second = data_positions[(data_positions.index(anchor_at) + 1) % len(data_positions)]
        values = []
        for position in range(count):
            if position == anchor_at or (twice and position == second):
                values.append(NamedValue("anchor"))
                continue
            name = f"in{len(graph.inputs)}"
            if op_type in CONTRACTIONS and len(self.full) >= 2:
                dims = self._contracted_dims(anchor_is_left=anchor_at < position)
            else:
                dims = self._other_dims()
            graph.inputs.append((name, "bool" if position in conditions else self.dtype, dims))
            values.append(NamedValue(name))
        if variadic:
            operands = {signature.inputs[0].name: tuple(values)}
        else:
            operands = {spec.name: value for spec, value in zip(required, values)}
        if self.dialect == "onnx" and self.opset is not None and self.opset < 7 and c.flag(0.8):
            operands["broadcast"] = 1  # before opset 7 an op broadcasts only when told to
        name = f"use{index}"
        graph.ops.append((name, op_type, operands))
        graph.outputs.append(name)

    # ---- the rule's own examples, changed in one place

    def _mutated_example(self, example: ast.Example) -> Instance:
        # The example's own symbol names, renamed to the ones BINDINGS sizes.
        names = sorted({d for s in example.inputs for d in s.dims if isinstance(d, str)})
        renamed = {name: SYMBOLS[i % len(SYMBOLS)] for i, name in enumerate(names)}
        graph = Instance(
            [(s.var.lstrip("%"), s.dtype, [renamed.get(d, d) for d in s.dims]) for s in example.inputs],
            [(name, op_type, dict(operands)) for name, op_type, operands in example_ops(example.statements)],
            [var.lstrip("%") for var in example.outputs],
            opset=example.opset,
        )
        # One change at a time, as in mutation testing (an example changed in
        # many places at once is mostly no valid graph), chosen in a single
        # decision, so that enumeration tries every single change of every
        # example before any pair.
        mutation = self.c.choice(_mutations(graph, self.dialect))
        _mutate(graph, mutation, self)
        return graph


def _mutations(graph: Instance, dialect: str) -> list[tuple]:
    """Every single change to `graph`: kinds interleaved, so that a prefix tries each kind."""
    kinds: list[list[tuple]] = [[] for _ in range(9)]
    for i, (_, dtype, dims) in enumerate(graph.inputs):
        for axis, dim in enumerate(dims):
            kinds[0] += [("dim", i, axis, d) for d in DIMS if d != dim]
        kinds[1] += [("rank", i, "wider"), ("rank", i, "narrower")]
        kinds[2] += [("dtype", i, d) for d in DTYPES[dialect] if d != dtype]
    values = [n for n, _, _ in graph.inputs]
    for position, (name, _, operands) in enumerate(graph.ops):
        for key, value in operands.items():
            if isinstance(value, bool):
                kinds[3].append(("flip", position, key))
            elif isinstance(value, float):
                nearby = (value * 1.01, -value, value * (1 + 1e-7), *FLOAT_EDGES)
                kinds[4] += [("float", position, key, v) for v in dict.fromkeys(nearby) if repr(v) != repr(value)]
            elif isinstance(value, list) and value and all(type(v) is int for v in value):
                kinds[5] += [("list", position, key, change) for change in
                             ("wider", "narrower", *(("zero", j) for j in range(len(value))),
                              *(("plus one", j) for j in range(len(value))))]
            elif isinstance(value, NamedValue):
                # The same value in two places: another value of the graph here.
                kinds[6] += [("alias", position, key, other) for other in values if other != value.name]
        kinds[7].append(("output", name))
        kinds[8].append(("use", name))
        values.append(name)
    # Constants, flags and lists first: changing those in an example the rule
    # rewrites is what crosses a condition's edge; dims and dtypes mostly
    # make graphs the ops refuse.
    kinds = [kinds[4], kinds[3], kinds[5], kinds[6], kinds[8], kinds[7], kinds[1], kinds[2], kinds[0]]
    interleaved = [item for group in itertools.zip_longest(*kinds) for item in group if item is not None]
    return [("none",), *interleaved]


def _mutate(graph: Instance, mutation: tuple, generator: _Generator) -> None:
    kind = mutation[0]
    if kind in ("dim", "rank", "dtype"):
        name, dtype, dims = graph.inputs[mutation[1]]
        dims = list(dims)
        if kind == "dim":
            dims[mutation[2]] = mutation[3]
        elif kind == "rank":
            dims = [1] + dims if mutation[2] == "wider" else dims[1:]
        else:
            dtype = mutation[2]
        graph.inputs[mutation[1]] = (name, dtype, dims)
    elif kind in ("flip", "float", "list", "alias"):
        operands = graph.ops[mutation[1]][2]
        key = mutation[2]
        if kind == "flip":
            operands[key] = not operands[key]
        elif kind == "float":
            operands[key] = mutation[3]
        elif kind == "alias":
            operands[key] = NamedValue(mutation[3])
        else:
            values, change = list(operands[key]), mutation[3]
            if change == "wider":
                values = [1] + values
            elif change == "narrower":
                values = values[1:]
            else:
                values[change[1]] = 0 if change[0] == "zero" else values[change[1]] + 1
            operands[key] = values
    elif kind == "output":
        if mutation[1] not in graph.outputs:
            graph.outputs.append(mutation[1])
    elif kind == "use":
        generator._inner_uses_of(graph, mutation[1])


def _unary_operand(dialect: str, value: str) -> dict:
    return {"x": NamedValue(value)} if dialect == "mil" else {"input": NamedValue(value)}


def _constant_vars(rule: ast.Rule) -> set[str]:
    """Variables the conditions read a constant from: is_const(%v), const(%v), %v[i]."""
    found: set[str] = set()

    def visit(expr):
        if isinstance(expr, ast.Call) and expr.function in ("is_const", "const", "uniform"):
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
        program = backend.build_example(instance.inputs, instance.ops, instance.outputs,
                                        nested_by="flag" if instance.nested else None, opset=instance.opset)
        validate = getattr(backend, "validate_example", None)
        if validate is not None:
            validate(program)  # what the IR's own checker rejects is no instance either
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
    for binding, edges in _ROUNDS:
        feeds = _feeds(rng, instance, binding, edges)
        try:
            expected = backend.evaluate_example(original, feeds)
        except Exception:
            continue  # these sizes do not broadcast in the original either
        compared += 1
        try:
            got = backend.evaluate_example(program, feeds)
        except Exception as error:
            if any(0 in array.shape for array in feeds.values()):
                # The reference evaluators' kernels are not all written for
                # empty tensors (coremltools' l2_norm reshapes to (0, -1)):
                # a failure there is the evaluator's, not the rule's.
                continue
            return True, f"the rewritten graph fails where the original runs ({binding}): {error}"
        for name, value in expected.items():
            problem = _compare(name, value, got.get(name))
            if problem:
                return True, f"{problem} at {binding}" + (" with edge values in the inputs" if edges else "")
    return compared > 0, None


def _compare(name: str, expected: np.ndarray, got) -> str | None:
    """What differs between an output before and after, if anything.

    Shapes and dtypes exactly; ints and bools exactly; floats within the
    dtype's own precision. Where the original computes NaN (an overflowed
    or invalid decomposition, such as exp(x)/sum(exp(x)) at x = 100), the
    rewritten graph may compute anything: fusing into the stable op is
    the point of such rules. Every number, and every infinity, must stay.
    """
    if got is None or got.shape != expected.shape:
        return f"output '{name}' has shape {None if got is None else got.shape} instead of {expected.shape}"
    if got.dtype != expected.dtype:
        return f"output '{name}' has dtype {got.dtype} instead of {expected.dtype}"
    if expected.dtype.kind != "f":
        return None if np.array_equal(expected, got) else f"output '{name}' changed value"
    tolerance = 1e-3 if expected.dtype == np.float16 else 1e-5
    defined = ~np.isnan(expected)
    close = np.isclose(expected, got, rtol=tolerance, atol=tolerance, equal_nan=True)
    return None if np.all(close | ~defined) else f"output '{name}' changed value"


def _runs_somewhere(backend, program, instance: Instance) -> bool:
    """Whether `program` evaluates at any of the bindings tried."""
    rng = np.random.default_rng(0)
    for binding, edges in _ROUNDS:
        try:
            backend.evaluate_example(program, _feeds(rng, instance, binding, edges))
        except Exception:
            continue
        return True
    return False


# Each binding with random normal inputs, and the first two again with float
# inputs salted with edge values: signed zeros and subnormals. The largest
# finite values, the infinities and NaN go into the constants, where rules
# decide on them (fills, shifts, scales): as inputs they overflow an
# intermediate of a decomposition (exp(x)/sum(exp(x)) at x = 100, a dot
# product at 1e38), where the fused op does not, and no fusion can promise
# equal results past an overflow its decomposition makes.
_ROUNDS = tuple((binding, False) for binding in BINDINGS) + tuple((binding, True) for binding in BINDINGS[:2])
_FEED_EDGES = {np.dtype(np.float32): np.array([0.0, -0.0, 1e-45, -1e-45, 1e-40], dtype=np.float32),
               np.dtype(np.float16): np.array([0.0, -0.0, 6e-8, -6e-8, 3e-5], dtype=np.float16)}


def _feeds(rng, instance: Instance, binding: dict, edges: bool = False) -> dict:
    """Random inputs for `instance` with its symbolic dims bound by `binding`."""
    feeds = {}
    for name, dtype, dims in instance.inputs:
        shape = tuple(binding[d] if isinstance(d, str) else d for d in dims)
        array = _random_array(rng, dtype, shape)
        if edges and array.dtype in _FEED_EDGES and name != "flag":
            values = _FEED_EDGES[array.dtype]
            salted = rng.random(shape) < 0.3
            array = np.where(salted, values[rng.integers(0, len(values), size=shape)], array).astype(array.dtype)
        feeds[name] = array
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
    if instance.nested:  # a flat graph is what an example can say
        candidate = instance.copy()
        candidate.nested = False
        candidate.inputs = [i for i in candidate.inputs if i[0] != "flag"]
        yield candidate
    if instance.opset is not None:
        candidate = instance.copy()
        candidate.opset = None
        yield candidate
    for output in instance.outputs:
        if len(instance.outputs) > 1:
            candidate = instance.copy()
            candidate.outputs.remove(output)
            candidate.ops = [op for op in candidate.ops if op[0] != output or op[0] == "anchor"]
            # The flag of a nested instance is read by the conditional, not by an op.
            kept = used(candidate)
            candidate.inputs = [i for i in candidate.inputs if i[0] in kept or (i[0] == "flag" and instance.nested)]
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
    """Try `trials` instances of `rule`; stop at the first counterexample.

    The first three fifths of the budget enumerate the small cases best-first
    (the plainest instance, then every single change to it, then pairs); the
    rest are sampled with `seed`. Instances are shaped by `shaped_by`
    (default: the rule itself), so that a rule with a condition dropped is
    tried on the graphs the full rule expects.
    """
    instances, nested, counterexample = 0, 0, None
    generator = _Generator(shaped_by or rule)
    rng = random.Random(seed)
    enumerated = trials * 3 // 5

    def candidates():
        # Each source (the generator, each example) enumerated on its own,
        # in turn, so that no source's many single changes starve another's;
        # the generator, whose instances vary most, has every other turn.
        # The examples the rule rewrites have as many turns together as those
        # it leaves (listed again, since a rule may have dozens of the latter).
        sources = [_plans(generator.instance, enumerated, root=((0, i),)) for i in range(generator.sources)]
        rewritten = sources[1:1 + generator.rewritten_examples]
        left = sources[1 + generator.rewritten_examples:]
        repeat = max(1, len(left) // max(1, len(rewritten)))
        others = [source for _ in range(repeat) for source in rewritten] + left
        yield from itertools.islice(_round_robin(sources[0], others), enumerated)
        for _ in range(trials - enumerated):
            yield generator.instance(Choices(rng=rng))

    seen: set[str] = set()
    quiet = _QuietBackends()
    for instance in quiet(candidates()):
        if instance is None:
            continue
        key = "\n".join(instance.body()) + f"\n{instance.nested}"
        if key in seen:
            continue
        seen.add(key)
        fired, problem = _check(rule, instance)
        instances += fired
        nested += fired and instance.nested
        if problem:
            small, problem = _shrink(rule, instance, problem)
            counterexample = Counterexample(small.as_example(f"counterexample: {problem}"), problem)
            break
    results = []
    if necessity and counterexample is None:
        for index, condition in enumerate(rule.conditions):
            weaker = replace(rule, conditions=rule.conditions[:index] + rule.conditions[index + 1:])
            verdict = verify_rule(weaker, trials, seed, necessity=False, shaped_by=rule)
            results.append(Necessity(condition.text, str(condition.span), verdict.counterexample is not None,
                                     max(verdict.instances - instances, 0)))
    return Verdict(rule.name, trials, instances, counterexample, tuple(results), nested)


class _QuietBackends:
    """Backend warnings about the constants of generated graphs (`Saving value
    type of float64 ...`) are noise here: hold them while instances run."""

    NAMES = ("coremltools",)

    def __call__(self, items):
        loggers = [logging.getLogger(name) for name in self.NAMES]
        levels = [logger.level for logger in loggers]
        for logger in loggers:
            logger.setLevel(logging.ERROR)
        try:
            yield from items
        finally:
            for logger, level in zip(loggers, levels):
                logger.setLevel(level)


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
