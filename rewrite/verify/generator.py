"""Random instances of a rule's whole pattern, each built from one `Choices`.

An instance holds every op the rule names: its `match` lines, the ops and
values its conditions say a variable is (`where %v is op(...)`,
`unscaled(%v) is ...`, one branch of each disjunction), a scaling by a
constant wherever the rule looks through one, and consumers of the kinds its
`every use` clauses expect. A variable named twice is one value. Constants
the conditions read are drawn from three pools: the values the conditions
compare against, exactly; values beside those (an ulp off, 10% off, the
sign flipped); and the edge values (zeros, infinities, NaN, the largest
finite). So a condition deleted or changed shows as an instance that fires
and changes values.

Half the instances are instead the rule's own examples, changed in one
place (mutation testing): they cross the conditions' edges where the
generated ones are plain.

One module, though long: one generator, whose pattern building, constant pools
and example mutations share one `Choices` stream (enumeration depends on their
order), so they stay together.
"""

from __future__ import annotations

import itertools
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from rewrite import backends
from rewrite.engine.interfaces import NamedValue
from rewrite.examples import example_ops
from rewrite.language import ast
from rewrite.verify.choices import Choices
from rewrite.verify.structure import (
    Structure,
    attribute_targets,
    constant_variables,
    keeps_its_shape,
    nearby,
    scale_equations,
    scaled_variables,
    shape_targets,
    structures,
    targets,
    uses_targets,
)

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


def distinct(values) -> list:
    """`values` without repeats, in order, -0.0 apart from 0.0 (which `==` and a dict merge)."""
    return list({(type(v), repr(v)): v for v in values}.values())


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




class Generator:
    """Instances of one rule's pattern.

    Every value in the pattern gets its own rank (0 to 4) and dims (0, 1, 2,
    3 or a symbol); constants come in every length, wider than the anchor
    too, with zeros; float constants take the target, nearby and edge
    values; inner pattern values get extra uses, aliases and block outputs;
    and the opset runs from the oldest the backend supports to the newest.
    `unbuilt` counts, per clause, the instances that could not be built for it.
    """

    def __init__(self, rule: ast.Rule):
        self.rule = rule
        self.dialect = rule.dialect
        self.schema = backends.schema_for(rule.dialect)
        self.facts = backends.backend_module(rule.dialect).EXAMPLE_FACTS
        self.constants = constant_variables(rule)
        self.targets = targets(rule)
        self.consumer_patterns = _consumer_patterns(rule)
        self.contracting = any(t in self.facts.contractions for p in self.consumer_patterns for t in p.types)
        self.sources = 1 + len(rule.examples)  # the first decision: generated, or which example
        self.rewritten_examples = sum(example.expected is not None for example in rule.examples)
        self.unbuilt: Counter[str] = Counter()
        self.newest_first = uses_targets(rule)
        self.scaled = scaled_variables(rule)
        self.attributes = attribute_targets(rule)
        self.ranks, self.axis_sizes = shape_targets(rule)
        self.same_shapes = False
        self.elementwise = keeps_its_shape(rule)

    def instance(self, choices: Choices) -> Instance | None:
        self.c = choices
        # Half the instances are the rule's own examples, changed in one
        # place: those the rule rewrites first, whose changes cross the
        # conditions' edges. Those it rewrites count as much together as
        # those it leaves (a rule may have dozens of the latter, one per condition).
        examples = sorted(self.rule.examples, key=lambda example: example.expected is None)
        rewritten = sum(example.expected is not None for example in examples)
        weight = max(1, (len(examples) - rewritten) // max(1, rewritten))
        weights = [weight if example.expected is not None else 1 for example in examples]
        source = choices.choice(["generated", *range(len(examples))], [sum(weights) or 1] + weights)
        opsets = self.facts.opsets
        if self.newest_first:  # the op a rule fuses into may exist only in the newest opsets
            opsets = (opsets[-1], *opsets[:-1])
        self.opset = choices.choice(opsets, [2 * len(opsets)] + [1] * (len(opsets) - 1))
        graph = self._generated() if source == "generated" else self._mutated_example(examples[source])
        if graph is None:
            return None
        if self.opset is not None:
            graph.opset = self.opset
        if choices.flag(0.2):
            graph.nested = True
            graph.inputs.append(self.facts.flag_input)
        return graph

    def _unary(self, value: str) -> dict:
        return {self.facts.unary_operand: NamedValue(value)}

    # ---- constants

    def _typed(self, value):
        """A float constant in the instance's float dtype (a plain literal is fp32)."""
        if self.dtype == "fp16" and isinstance(value, float):
            return np.float16(value)
        if self.dtype == "fp16" and isinstance(value, list):
            return np.asarray(value, dtype=np.float16)
        return value

    def _float_constant(self, value=None):
        """A data operand made constant: boundary values matter most, at any rank."""
        c = self.c
        if value is None:
            value = c.choice(FLOAT_EDGES, FLOAT_EDGE_WEIGHTS)
        shape = c.choice(("scalar", "ones", "ones wider", "full"), (6, 2, 1, 1))
        if shape == "scalar":
            return self._typed(float(value))
        dims = {"ones": [1] * self.rank, "ones wider": [1] * (self.rank + 1),
                "full": [d if isinstance(d, int) else 1 for d in self.full]}[shape]
        return self._typed(np.full(dims, value, dtype=np.float32).tolist())

    def _constant(self, operand: str, var: str | None = None):
        """A constant operand, shaped by what the operand means, from the rule's targets where it has some."""
        c = self.c
        wanted = self.targets.get(var, []) if var is not None else []
        if wanted and self.dtype in ("fp32", "fp16") and operand not in self.facts.constant_operands:
            wanted = [w if isinstance(w, bool) else float(w) for w in wanted]  # `== 1` of a float is 1.0
        if wanted:
            # The values the conditions compare against, exactly, first; then
            # those beside the first; then whatever the operand usually takes.
            pool = distinct([*wanted, *nearby(wanted[0]), "other"])
            value = c.choice(pool, [8] * len(wanted) + [1] * (len(pool) - len(wanted) - 1) + [6])
            if value != "other":
                if isinstance(value, bool) or operand in self.facts.constant_operands:
                    return value
                if self.dtype in ("fp32", "fp16"):
                    return self._float_constant(float(value))
                return int(value) if float(value).is_integer() else value
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
        if operand == "axis":
            return c.choice([-1, *range(self.rank)]) if self.rank else 0
        if operand == "axes":
            # The last axis first: what normalizations and softmaxes reduce over.
            return [c.choice([-1, *range(self.rank)])] if self.rank else [0]
        if operand == "shape" and all(isinstance(d, int) for d in self.data_dims):
            form = c.choice(("per axis", "-1", "reversed"), (4, 1, 1))
            if form == "-1":
                return [-1]
            if form == "reversed":
                return list(reversed(self.data_dims))
        if operand not in self.facts.constant_operands and self.dtype in ("fp32", "fp16"):
            return self._float_constant()
        return self._int_list(self.hint)

    # ---- graphs

    def _generated(self) -> Instance | None:
        c = self.c
        graph = Instance()
        # Every dtype the ops might take: graphs an op refuses are not instances.
        self.dtype = c.choice(self.facts.dtypes, (4, 1, 1, 1))
        self.rank = c.choice((2, 3, 4)) if self.contracting else c.choice(RANKS, RANK_WEIGHTS)
        # Half the time, the rank and the sizes the conditions name (`rank(%x) >= 3`,
        # `dim(%x, -2) == 1`), or just beside them: where a deleted clause would matter.
        targeted = bool(self.ranks or self.axis_sizes) and c.flag(0.5)
        if targeted and self.ranks:
            self.rank = min(MAX_RANK, max(1, c.choice([*self.ranks, self.ranks[0] + 1, self.ranks[0] - 1],
                                                      [4] * len(self.ranks) + [1, 1])))
        # A constant int list as long as the data's rank (tile's reps, Expand's
        # shape) is read as a per-axis size: the data is mostly 1 where it
        # widens, and the full size is what other operands mostly carry.
        # (The plainest instance widens every axis by 2: what such rules are for.)
        self.hint = [c.choice((2, 1, 3, 0), (3, 6, 3, 1)) for _ in range(self.rank)]
        if self.contracting and c.flag(0.6):
            self.hint[-2:] = [1, 1]  # products broadcast only batch axes: widen those
        dims = self.dims(self.rank)
        if targeted:
            for axis, sizes in sorted(self.axis_sizes.items()):
                if -self.rank <= axis < self.rank:
                    dims[axis] = c.choice([*sizes, sizes[0] + 1], [3] * len(sizes) + [1])
                    self.hint[axis] = 1
        # Now and then every fresh value has one shape, the data's own, of no
        # axis widened; first and mostly for the elementwise rules (those that
        # ask shape(anchor) == shape(%x)), which fire only where nothing
        # broadcasts, and whose reductions a data of 1s would hide.
        self.same_shapes = c.flag(0.7 if self.elementwise else 0.3)
        if self.same_shapes:
            self.hint = [1] * self.rank
        self.data_dims = [1 if size != 1 and c.flag(0.75) else d for size, d in zip(self.hint, dims)]
        self.full = [size if dim == 1 else dim for size, dim in zip(self.hint, self.data_dims)]
        # What a tile by the hint makes of the data, where it is not the full size.
        self.tiled = [size * dim if isinstance(dim, int) else dim for size, dim in zip(self.hint, self.data_dims)]
        # The pattern's variables: their structure (one branch of each
        # disjunction), the values built for them, the factors of those scaled.
        dropped: list = []
        self.structures = structures(self.rule, c.choice, dropped)
        self.equations = scale_equations(self.rule, dropped)
        self.planned = self._plan_scales()
        self.values: dict[str, object] = {}
        self.scales: dict[str, float] = {}
        anchor = self.rule.anchor
        if anchor.var in self.structures:
            # Its match line names no operand: the anchor is what a condition
            # says it is, built as any variable and then named "anchor".
            self.building = set()
            value = self._variable(graph, ast.Bind(anchor.var, None, anchor.span), "x", 0, {}, False)
            if not isinstance(value, NamedValue) or all(op[0] != value.name for op in graph.ops):
                return None
            _rename(graph, value.name, "anchor")
        else:
            self.building = {anchor.var}
            if self._op(graph, anchor.pattern, "anchor", f"match {anchor.var}", anchor.var) is None:
                return None
        self.values[anchor.var] = NamedValue("anchor")
        for index in range(c.choice((1, 2, 3), (3, 1, 1))):
            self._consumer(graph, index)
        if c.flag(0.15):
            graph.ops.append(("extra", self.facts.extra_consumer, self._unary("anchor")))
            graph.outputs.append("extra")
        if c.flag(0.15):
            graph.outputs.append("anchor")
        return graph if graph.outputs else None

    def _op(self, graph: Instance, pattern: ast.OpPattern, name: str, clause: str, var: str | None = None
            ) -> str | None:
        """Add an op matching `pattern` (and the ops its operands are) to `graph`; its name, or None."""
        c = self.c
        op_type = c.choice(sorted(pattern.types))
        signature = self.schema.signature(op_type)
        if signature is None:
            self.unbuilt[f"{clause}: the schema has no op {op_type}"] += 1
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
        operands: dict[str, object] = {}
        for position, spec in enumerate(signature.inputs):
            if spec.optional and spec.name not in named:
                continue
            if spec.name in optional and c.flag(0.4):
                continue  # `name=%v?`: try it absent too (present first: the conditions read it)
            operand = named.get(spec.name)
            if isinstance(operand, ast.Bind):
                value = self._variable(graph, operand, spec.name, position, operands, spec.name in optional)
            elif isinstance(operand, ast.OpPattern):
                made = self._op(graph, operand, f"{name}_{spec.name}", clause)
                value = None if made is None else NamedValue(made)
                if made is not None:
                    self._inner_uses(graph, made)
            elif position > 0 and (spec.name in self.facts.constant_operands or spec.name in optional
                                   or var in self.scaled):
                # An operand left open beside a value the rule looks through
                # scalings of is its constant factor.
                value = self._constant(spec.name)
            else:
                value = self._data_operand(graph, spec.name, operands)
            if value is None:
                return None
            operands[spec.name] = value
        for attribute, values in self.facts.attribute_values:
            if attribute in signature.attributes and attribute not in operands and c.flag(0.2):
                operands[attribute] = c.choice(values)
        for (owner, attribute), wanted in self.attributes.items():
            if owner == var and attribute not in operands:
                # The values the conditions compare the attribute against, then
                # those beside the first, then the schema's default (absent).
                pool = distinct([*wanted, *nearby(wanted[0]), "absent"])
                value = c.choice(pool, [6] * len(wanted) + [1] * (len(pool) - len(wanted) - 1) + [3])
                if value != "absent":
                    operands[attribute] = value
        graph.ops.append((name, op_type, operands))
        return name

    def _variable(self, graph: Instance, bind: ast.Bind, operand: str, position: int, so_far: dict,
                  optional: bool):
        """The value of a pattern variable: built once, whatever the number of places that name it."""
        var = bind.var
        if var in self.values:
            return self.values[var]
        if var in self.building:  # a pattern that reaches itself: no op can be built for that
            return self._data_operand(graph, operand, so_far)
        structure = self.structures.get(var)
        if structure is None and bind.producer is not None:
            structure = Structure(bind.producer, None, False, f"{var} = {bind.producer.op}(...)")
        self.building.add(var)
        try:
            if structure is not None and structure.pattern is not None:
                made = self._op(graph, structure.pattern, "v_" + var.lstrip("%"), structure.clause, var)
                if made is None:
                    return None
                value = NamedValue(made)
                self._inner_uses(graph, made)
            elif structure is not None and structure.alias is not None:
                value = self._variable(graph, ast.Bind(structure.alias, None, bind.span), operand, position,
                                       so_far, optional)
                if value is None:
                    return None
            elif var in self.constants or position > 0 and (operand in self.facts.constant_operands or optional):
                # What the conditions read a constant from is one, wherever it stands.
                value = self._constant(operand, var)
            else:
                value = self._data_operand(graph, operand, so_far)
            # A value the conditions read a scale of is a scaling of another,
            # with a structure saying of what or not (then of a fresh value).
            if (structure.scaled if structure is not None else var in self.scaled) \
                    and isinstance(value, NamedValue):
                value = self._scaled(graph, var, value)
        finally:
            self.building.discard(var)
        self.values[var] = value
        return value

    def _plan_scales(self) -> dict[str, float]:
        """Factors for the scaled variables that meet every `scale_of` equation at once.

        A variable with no scaled structure has factor 1. Each round solves
        the equations with one free variable left; where every equation has
        several, the variable in most equations is set to 1 (no scaling).
        """
        free = {var for var, structure in self.structures.items() if structure.scaled}
        free |= {var for var in self.scaled if var not in self.structures}
        planned: dict[str, float] = {}
        pending = [e for e in self.equations if any(v in free for v in e.variables)]
        while pending:
            progress = False
            for equation in list(pending):
                unknown = [v for v in dict.fromkeys(equation.variables) if v in free and v not in planned]
                if len(unknown) > 1:
                    continue
                pending.remove(equation)
                if not unknown:
                    continue
                known = equation.factor
                for other in equation.variables:
                    if other != unknown[0]:
                        known *= planned.get(other, 1.0)
                value = equation.value / known if known else float("nan")
                if np.isfinite(value) and value != 0:
                    planned[unknown[0]] = value
                progress = True
            if not progress:
                counts = Counter(v for e in pending for v in e.variables if v in free and v not in planned)
                planned[counts.most_common(1)[0][0]] = 1.0
        return planned

    def _scaled(self, graph: Instance, var: str, value: NamedValue) -> NamedValue:
        """`value`, or `value` times a constant: the factor that solves the rule's
        `scale_of` equations given the factors chosen so far, first; then none;
        then factors beside the solved one."""
        c = self.c
        solved = [self.planned[var]] if var in self.planned else []
        # With nothing to solve, a scaling first: the rule looks through one.
        plain = [1.0] if solved else [2.0, 1.0]
        options = list(dict.fromkeys([*solved, *plain, *(nearby(solved[0]) if solved else ()), 2.0, -1.0, 0.5]))
        first = len(dict.fromkeys([*solved, *plain]))
        factor = c.choice(options, [8] * first + [1] * (len(options) - first))
        self.scales[var] = factor
        if factor == 1.0:
            return value
        spellings = [s for s in self.facts.scalings if not (s.divides and factor == 0)]
        spelling = c.choice(spellings)
        constant = 1.0 / factor if spelling.divides else factor
        name = f"{value.name}_scaled"
        while any(op[0] == name for op in graph.ops):
            name += "_"
        graph.ops.append((name, spelling.op_type,
                          {spelling.value_operand: value, spelling.factor_operand: self._typed(float(constant))}))
        return NamedValue(name)



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
        if first or operand == "update" or self.same_shapes:  # an update covers what it writes
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
            graph.ops.append((name, self.facts.extra_consumer, self._unary(value)))
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
            # An internal value first (what most rules are written for), then a block output.
            if index == 0 and c.flag(0.6):
                graph.ops.append((f"use{index}", self.facts.extra_consumer, self._unary("anchor")))
                graph.outputs.append(f"use{index}")
            else:
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
            if op_type in self.facts.contractions and len(self.full) >= 2:
                dims = self._contracted_dims(anchor_is_left=anchor_at < position)
            else:
                dims = self._other_dims()
            graph.inputs.append((name, "bool" if position in conditions else self.dtype, dims))
            values.append(NamedValue(name))
        if variadic:
            operands = {signature.inputs[0].name: tuple(values)}
        else:
            operands = {spec.name: value for spec, value in zip(required, values)}
        old = self.facts.old_broadcast_below
        if old is not None and self.opset is not None and self.opset < old and c.flag(0.8):
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
        mutation = self.c.choice(_mutations(graph, self.facts.dtypes))
        _mutate(graph, mutation, self)
        return graph


def _rename(graph: Instance, old: str, new: str) -> None:
    """Call the op `old` (and every reference to it) `new`."""
    def renamed(value):
        if isinstance(value, NamedValue) and value.name == old:
            return NamedValue(new)
        if isinstance(value, tuple):
            return tuple(renamed(item) for item in value)
        return value

    graph.ops = [(new if name == old else name, op_type, {k: renamed(v) for k, v in operands.items()})
                 for name, op_type, operands in graph.ops]
    graph.outputs = [new if output == old else output for output in graph.outputs]


def _mutations(graph: Instance, dtypes: tuple[str, ...]) -> list[tuple]:
    """Every single change to `graph`: kinds interleaved, so that a prefix tries each kind."""
    kinds: list[list[tuple]] = [[] for _ in range(9)]
    for i, (_, dtype, dims) in enumerate(graph.inputs):
        for axis, dim in enumerate(dims):
            kinds[0] += [("dim", i, axis, d) for d in DIMS if d != dim]
        kinds[1] += [("rank", i, "wider"), ("rank", i, "narrower")]
        kinds[2] += [("dtype", i, d) for d in dtypes if d != dtype]
    values = [n for n, _, _ in graph.inputs]
    for position, (name, _, operands) in enumerate(graph.ops):
        for key, value in operands.items():
            if isinstance(value, bool):
                kinds[3].append(("flip", position, key))
            elif isinstance(value, float):
                nearby = (value * 1.01, -value, value * (1 + 1e-7), *FLOAT_EDGES)
                kinds[4] += [("float", position, key, v) for v in distinct(nearby) if repr(v) != repr(value)]
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


def _mutate(graph: Instance, mutation: tuple, generator: Generator) -> None:
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


