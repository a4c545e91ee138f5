"""The abstract syntax of `.rules` files.

Every node is a small frozen dataclass that carries its `Span`, so that any
later stage (checker, engine, explain) can point back at the text the user
wrote. Nothing here knows about an IR.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Union


@dataclass(frozen=True)
class Span:
    """A region of a rules file: 1-based line and column of its first character."""

    file: str
    line: int
    column: int
    end_line: int = 0
    end_column: int = 0

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.column}"


NO_SPAN = Span("<builtin>", 0, 0)


# ------------------------------------------------------------------ patterns


@dataclass(frozen=True)
class Wildcard:
    """`_`: matches any operand, binds nothing."""

    span: Span = field(compare=False)


@dataclass(frozen=True)
class Bind:
    """`%v`, or `%v = op(...)`: binds (or, if already bound, must equal) a value."""

    var: str
    producer: OpPattern | None
    span: Span = field(compare=False)


ValuePattern = Union["Wildcard", "Bind", "OpPattern"]


@dataclass(frozen=True)
class Operand:
    """One operand of an op pattern.

    `name` is the schema name for `name=pattern`, None for a positional
    operand. `rest` marks `%v...`, which binds the tuple of operands no other
    positional pattern took.
    """

    name: str | None
    pattern: ValuePattern
    rest: bool
    span: Span = field(compare=False)
    optional: bool = False  # `name=%v?`: the operand may be absent; %v is then `absent`


@dataclass(frozen=True)
class OpPattern:
    """`op(operands)`, where `op` names an op type or an op class.

    `types` is filled in by the checker: the op types `op` stands for.
    """

    op: str
    operands: tuple[Operand, ...]
    any_order: bool
    span: Span = field(compare=False)
    types: frozenset[str] = frozenset()


# --------------------------------------------------------------- expressions


@dataclass(frozen=True)
class Literal:
    """An int, float, string or bool written in the rule."""

    value: int | float | str | bool
    span: Span = field(compare=False)


@dataclass(frozen=True)
class ValueRef:
    """`%v`: a value bound by a pattern or a quantifier."""

    var: str
    span: Span = field(compare=False)


@dataclass(frozen=True)
class NameRef:
    """A bare name: a quantifier variable or a named constant such as `fp16`."""

    name: str
    span: Span = field(compare=False)


@dataclass(frozen=True)
class ListExpr:
    items: tuple[Expr, ...]
    span: Span = field(compare=False)


@dataclass(frozen=True)
class TupleExpr:
    """`(a, b, ...)`: the values of a variadic operand, as an op is built.

    Not an expression of conditions: it stands only as a whole argument,
    `concat(values=(%a, %b), ...)`, so it is no member of `Expr`.
    """

    items: tuple[Expr, ...]
    span: Span = field(compare=False)


@dataclass(frozen=True)
class TupleComprehension:
    """`(item for variable in domain if keep)`: a variadic operand's values, an
    item (a value or a constant) for each element of the domain that is kept.
    Like `TupleExpr`, it stands only as a whole argument of an op being built."""

    comprehension: Comprehension
    span: Span = field(compare=False)


@dataclass(frozen=True)
class Conditional:
    """`then if condition else otherwise`: `then` only when the condition is proved."""

    condition: Expr
    then: Expr
    otherwise: Expr
    span: Span = field(compare=False)


@dataclass(frozen=True)
class Comprehension:
    """`[item for variable in domain if keep]`; an element stays only when `keep` is proved."""

    item: Expr
    variable: str
    domain: Expr
    keep: Expr | None
    span: Span = field(compare=False)


@dataclass(frozen=True)
class Index:
    """`base[index]`: an element of a list, or of a value's constant."""

    base: Expr
    index: Expr
    span: Span = field(compare=False)


@dataclass(frozen=True)
class Arithmetic:
    """`left op right` with op one of + - * /; `-x` is `0 - x`."""

    operator: str
    left: Expr
    right: Expr
    span: Span = field(compare=False)


@dataclass(frozen=True)
class Compare:
    operator: str
    left: Expr
    right: Expr
    span: Span = field(compare=False)


@dataclass(frozen=True)
class And:
    left: Expr
    right: Expr
    span: Span = field(compare=False)


@dataclass(frozen=True)
class Or:
    left: Expr
    right: Expr
    span: Span = field(compare=False)


@dataclass(frozen=True)
class Not:
    operand: Expr
    span: Span = field(compare=False)


@dataclass(frozen=True)
class SameValue:
    """`a is %b` / `a is not %b`: identity of graph values."""

    left: Expr
    var: str
    negated: bool
    span: Span = field(compare=False)


@dataclass(frozen=True)
class Matches:
    """`%v is op(...)`: the producer of `%v` matches the pattern.

    Unnegated, the pattern's new bindings are visible to the right of it in
    the same conjunction; the match is existential over operand orders.
    """

    subject: Expr
    pattern: OpPattern
    negated: bool
    span: Span = field(compare=False)


@dataclass(frozen=True)
class Call:
    """A built-in function or an embedder-registered predicate."""

    function: str
    arguments: tuple[Expr, ...]
    keywords: tuple[tuple[str, Expr], ...]
    span: Span = field(compare=False)


@dataclass(frozen=True)
class Quantifier:
    """`forall x in domain [where filter]: body`, or `exists ...`."""

    kind: str  # "forall" | "exists"
    variable: str
    domain: Expr
    filter: Expr | None
    body: Expr
    span: Span = field(compare=False)


@dataclass(frozen=True)
class EveryUse:
    """`every use %u of %v: body`: body holds for each op that consumes `%v`.

    `%u` is bound to the consuming op's (first) output. Block outputs are
    not ops and are not ranged over; `block_output(%v)` speaks of them.
    """

    variable: str
    of: str
    body: Expr
    span: Span = field(compare=False)


Expr = (
    Literal | ValueRef | NameRef | ListExpr | Index | Arithmetic | Compare | And | Or | Not
    | SameValue | Matches | Call | Quantifier | EveryUse | Conditional | Comprehension
)


# ----------------------------------------------------------------- rewrites


@dataclass(frozen=True)
class Argument:
    """`name=value` of an op being built; a tuple only for a variadic operand."""

    name: str
    value: Expr | TupleExpr | TupleComprehension
    span: Span = field(compare=False)


@dataclass(frozen=True)
class OpBuild:
    """`op(name=expr, ...)`: a new op, inserted before the anchor."""

    op: str
    arguments: tuple[Argument, ...]
    span: Span = field(compare=False)


@dataclass(frozen=True)
class Rebuild:
    """`%v with name=expr, ...`: `%v`'s op again, with some operands changed."""

    var: str
    arguments: tuple[Argument, ...]
    span: Span = field(compare=False)


@dataclass(frozen=True)
class BuildAction:
    """`%v = op(...)`."""

    var: str
    build: OpBuild
    span: Span = field(compare=False)


@dataclass(frozen=True)
class ReplaceAction:
    """`%old -> replacement`: every use of `%old` is redirected to the replacement
    (a value, `%items[i]` one of a tuple a rest or variadic operand bound, or a new op)."""

    target: str
    replacement: ValueRef | Index | OpBuild | Rebuild
    span: Span = field(compare=False)
    within: str | None = None  # `%old -> %new in %op`: only %op's operands change


Action = BuildAction | ReplaceAction


# -------------------------------------------------------------------- rules


# The name an unnamed anchor (`match op(...)`, `match _ = op(...)`) is bound
# under. A rule cannot write it (a VAR needs a letter or `_` after the `%`),
# so nothing can refer to it, yet the engine still holds the anchor's output
# like any binding: `internal()` counts the anchor among the matched ops.
UNNAMED_ANCHOR = "%"


@dataclass(frozen=True)
class MatchClause:
    """`match %v = op(...)`; for the anchor, `var` may be `UNNAMED_ANCHOR`."""

    var: str
    pattern: OpPattern
    span: Span = field(compare=False)

    @property
    def named(self) -> bool:
        return self.var != UNNAMED_ANCHOR


@dataclass(frozen=True)
class Condition:
    """One `where` clause, with its source text kept for explanations."""

    expr: Expr
    text: str
    span: Span = field(compare=False)


@dataclass(frozen=True)
class ExampleInput:
    """`input %x: fp32[B, 8]`: a graph input; a named dim is symbolic."""

    var: str
    dtype: str
    dims: tuple[int | str, ...]
    span: Span = field(compare=False)


@dataclass(frozen=True)
class ExampleOp:
    """`%t = tile(x=%y, reps=[1, 8])`."""

    var: str
    build: OpBuild
    span: Span = field(compare=False)


@dataclass(frozen=True)
class ExampleOutput:
    vars: tuple[str, ...]
    span: Span = field(compare=False)


@dataclass(frozen=True)
class ExampleOpset:
    """`opset 7` (ONNX) or `opset iOS16` (Core ML's deployment target): the
    example's graph is built for it instead of the backend's default."""

    opset: int | str
    span: Span = field(compare=False)


ExampleStatement = ExampleInput | ExampleOp | ExampleOutput | ExampleOpset


@dataclass(frozen=True)
class Example:
    """A graph the rule must rewrite into `expected` (None: leave it unchanged)."""

    description: str
    statements: tuple[ExampleStatement, ...]
    expected: tuple[ExampleStatement, ...] | None
    span: Span = field(compare=False)

    @property
    def inputs(self) -> tuple[ExampleInput, ...]:
        return tuple(s for s in self.statements if isinstance(s, ExampleInput))

    @property
    def outputs(self) -> tuple[str, ...]:
        return tuple(v for s in self.statements if isinstance(s, ExampleOutput) for v in s.vars)

    @property
    def opset(self) -> int | str | None:
        """The opset (or deployment target) the example states; None for the backend's default."""
        return next((s.opset for s in self.statements if isinstance(s, ExampleOpset)), None)


@dataclass(frozen=True)
class Group:
    """`group cleanup, fusion`: pass groups the rule runs in, which the dialect's backend
    names and places in its pipeline. `name_spans` are where each name is written."""

    names: tuple[str, ...]
    span: Span = field(compare=False)
    name_spans: tuple[Span, ...] = field(default=(), compare=False)


@dataclass(frozen=True)
class Assume:
    """`assume no_nans`: what the rule relies on beyond IEEE-exact values
    (`rewrite.language.assumptions`); it runs only where the user grants each."""

    names: tuple[str, ...]
    span: Span = field(compare=False)
    name_spans: tuple[Span, ...] = field(default=(), compare=False)


@dataclass(frozen=True)
class Rule:
    name: str
    description: str
    dialect: str
    matches: tuple[MatchClause, ...]
    conditions: tuple[Condition, ...]
    actions: tuple[Action, ...]
    benefit: int
    span: Span = field(compare=False)
    examples: tuple[Example, ...] = field(default=(), compare=False)
    groups: tuple[Group, ...] = ()
    assumptions: tuple[Assume, ...] = ()

    @property
    def anchor(self) -> MatchClause:
        return self.matches[0]

    @property
    def group_names(self) -> tuple[str, ...]:
        """The groups every `group` clause names, in the order written."""
        return tuple(name for group in self.groups for name in group.names)

    @property
    def assumption_names(self) -> frozenset[str]:
        """What every `assume` clause names: the grants the rule needs to run."""
        return frozenset(name for clause in self.assumptions for name in clause.names)


@dataclass(frozen=True)
class OpClass:
    name: str
    members: tuple[str, ...]
    span: Span = field(compare=False)


@dataclass(frozen=True)
class Import:
    path: str
    names: tuple[str, ...] | None  # None: every class of the file
    span: Span = field(compare=False)


@dataclass(frozen=True)
class RuleFile:
    """One parsed `.rules` file, before imports and names are resolved."""

    path: str
    dialect: str | None
    dialect_span: Span | None
    imports: tuple[Import, ...]
    classes: tuple[OpClass, ...]
    rules: tuple[Rule, ...]


def walk(expr):
    """`expr` and every expression inside it, depth first (op patterns are not entered)."""
    if isinstance(expr, tuple):
        for item in expr:
            yield from walk(item)
    elif hasattr(expr, "__dataclass_fields__") and not isinstance(expr, (Span, OpPattern)):
        yield expr
        for name in expr.__dataclass_fields__:
            yield from walk(getattr(expr, name))


def conjuncts(expr) -> list:
    """The operands of a chain of `and`s, left to right (`[expr]` for anything else)."""
    if isinstance(expr, And):
        return conjuncts(expr.left) + conjuncts(expr.right)
    return [expr]
