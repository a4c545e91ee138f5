"""Name resolution and type checking of parsed rules.

The checker turns a `RuleFile` plus the op classes it imports into rules the
engine can run: class names in patterns are resolved to op types, op types
and operand names are checked against the dialect's op schema, every `%var`
is bound before it is used, and every condition is type checked. Each
finding is a `Diagnostic` pointing at the text.

One module, though long: name resolution and type checking walk the same rule
in one pass with one scope, and the diagnostics they give share the "did you
mean" machinery.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, replace

from rewrite.language import ast
from rewrite.language.assumptions import ASSUMPTIONS
from rewrite.language.errors import Diagnostic, SourceText
from rewrite.language.schema import OpSchema, OpSignature
from rewrite.language.types import BUILTINS, GRAPH_FREE_BUILTINS, NAMED_CONSTANTS, Signature, Type


@dataclass
class _Scope:
    """Names visible at a point: graph values (`%v`) and quantifier variables."""

    values: frozenset[str]
    names: frozenset[str]

    def with_values(self, *names: str) -> _Scope:
        return _Scope(self.values | frozenset(names), self.names)

    def with_name(self, name: str) -> _Scope:
        return _Scope(self.values, self.names | {name})


class Checker:
    """Checks the rules of one file. Findings accumulate in `diagnostics`."""

    def __init__(
        self,
        source: SourceText,
        classes: dict[str, ast.OpClass],
        schema: OpSchema | None,
        predicates: dict[str, Signature],
    ):
        self.source = source
        self.classes = classes
        self.schema = schema
        self.predicates = predicates
        self.diagnostics: list[Diagnostic] = []
        self._unnamed_anchor: str | None = None  # the op of the rule's anchor, when it has no name
        self._tuple_items = 0  # > 0 while a tuple's items are checked (a value or a constant each)

    def error(self, span: ast.Span, message: str) -> None:
        self.diagnostics.append(self.source.diagnostic(span, message))

    def _unbound(self, span: ast.Span, var: str) -> None:
        message = f"'{var}' is not bound here"
        anchor = self._unnamed_anchor
        if anchor is not None:
            # The likeliest reason, in a rule whose anchor has no name.
            message += f" (the anchor has no name; if '{var}' means it, write 'match {var} = {anchor}(...)')"
        self.error(span, message)

    def warning(self, span: ast.Span, message: str) -> None:
        self.diagnostics.append(self.source.diagnostic(span, message, "warning"))

    # ------------------------------------------------------------ op names

    def _suggest(self, name: str, candidates) -> str:
        close = difflib.get_close_matches(name, list(candidates), n=1)
        return f"; did you mean '{close[0]}'?" if close else ""

    def check_class(self, op_class: ast.OpClass) -> None:
        if self.schema is None:
            return
        for member in op_class.members:
            if self.schema.signature(member) is None:
                self.error(
                    op_class.span,
                    f"class '{op_class.name}': unknown {self.schema.dialect} op '{member}'"
                    + self._suggest(member, self.schema.op_types()),
                )

    def _op_types(self, name: str, span: ast.Span) -> frozenset[str] | None:
        if name in self.classes:
            return frozenset(self.classes[name].members)
        if self.schema is None or self.schema.signature(name) is not None:
            return frozenset([name])
        candidates = list(self.classes) + list(self.schema.op_types())
        self.error(
            span,
            f"unknown {self.schema.dialect} op or class '{name}'" + self._suggest(name, candidates),
        )
        return None

    def _signatures(self, types: frozenset[str]) -> list[OpSignature]:
        if self.schema is None:
            return []
        return [s for s in (self.schema.signature(t) for t in sorted(types)) if s is not None]

    # ------------------------------------------------------------ patterns

    def check_pattern(self, pattern: ast.OpPattern, bound: set[str]) -> ast.OpPattern:
        """Resolve and check an op pattern; add the variables it binds to `bound`."""
        types = self._op_types(pattern.op, pattern.span) or frozenset()
        signatures = self._signatures(types)
        named = [(o.name, o) for o in pattern.operands if o.name is not None]
        positional = [o for o in pattern.operands if o.name is None]
        if named and positional:
            self.error(pattern.span, "an op pattern takes named or positional operands, not both")
        if pattern.any_order and len(pattern.operands) < 2:
            self.error(pattern.span, "'in any order' needs two operands or more")
        rests = [o for o in positional if o.rest]
        if len(rests) > 1 or (rests and positional[-1] is not rests[0]):
            self.error(rests[0].span, "a rest operand '%v...' comes last, once")
        seen_names: set[str] = set()
        for name, operand in named:
            if name in seen_names:
                self.error(operand.span, f"operand '{name}' given twice")
            seen_names.add(name)
            for signature in signatures:
                if signature.input(name) is None:
                    names = [i.name for i in signature.inputs]
                    self.error(
                        operand.span,
                        f"op '{signature.op_type}' has no operand '{name}' "
                        f"(it has {', '.join(names) or 'none'})" + self._suggest(name, names),
                    )
        fixed = len([o for o in positional if not o.rest])
        for signature in signatures:
            if positional and not any(i.variadic for i in signature.inputs):
                if fixed > len(signature.inputs):
                    self.error(
                        pattern.span,
                        f"op '{signature.op_type}' takes at most {len(signature.inputs)} "
                        f"operands; the pattern lists {fixed}",
                    )
        operands = []
        for operand in pattern.operands:
            checked = self._check_value_pattern(operand.pattern, bound)
            # Copied only if its pattern changed (a wildcard or a plain %v does not).
            operands.append(operand if checked is operand.pattern else replace(operand, pattern=checked))
        return replace(pattern, operands=tuple(operands), types=types)

    def _check_value_pattern(self, pattern, bound: set[str]):
        if isinstance(pattern, ast.Wildcard):
            return pattern
        if isinstance(pattern, ast.OpPattern):
            return self.check_pattern(pattern, bound)
        bound.add(pattern.var)
        if pattern.producer is not None:
            producer = self.check_pattern(pattern.producer, bound)
            self._var_types[pattern.var] = producer.types
            return replace(pattern, producer=producer)
        return pattern

    # ------------------------------------------------------------ expressions

    def check_expr(self, expr, scope: _Scope) -> tuple[Type, _Scope]:
        """The type of `expr`, and the scope after it (patterns in conjunctions bind)."""
        method = getattr(self, "_expr_" + type(expr).__name__)
        return method(expr, scope)

    def _expect(self, expr, scope: _Scope, expected: Type, what: str) -> Type:
        actual, _ = self.check_expr(expr, scope)
        if not expected.accepts(actual):
            self.error(expr.span, f"{what} must be {expected}, not {actual}")
        return actual

    def _expr_Literal(self, expr: ast.Literal, scope):
        value = expr.value
        if isinstance(value, bool):
            return Type.BOOL, scope
        if isinstance(value, str):
            return Type.STRING, scope
        return Type.NUMBER, scope

    def _expr_ValueRef(self, expr: ast.ValueRef, scope):
        if expr.var not in scope.values:
            self._unbound(expr.span, expr.var)
        return Type.VALUE, scope

    def _expr_NameRef(self, expr: ast.NameRef, scope):
        if expr.name in scope.names:
            return Type.ANY, scope
        if expr.name in NAMED_CONSTANTS:
            return NAMED_CONSTANTS[expr.name][0], scope
        self.error(
            expr.span,
            f"unknown name '{expr.name}'"
            + self._suggest(expr.name, list(scope.names) + list(NAMED_CONSTANTS)),
        )
        return Type.ANY, scope

    def _expr_TupleExpr(self, expr: ast.TupleExpr, scope):
        # Only `with` reaches here: an op build checks a tuple's items itself.
        for item in expr.items:
            self.check_expr(item, scope)
        return Type.ANY, scope

    def _expr_TupleComprehension(self, expr: ast.TupleComprehension, scope):
        self._tuple_items += 1
        try:
            self.check_expr(expr.comprehension, scope)
        finally:
            self._tuple_items -= 1
        return Type.ANY, scope

    def _expr_ListExpr(self, expr: ast.ListExpr, scope):
        for item in expr.items:
            self.check_expr(item, scope)
        return Type.LIST, scope

    def _expr_Conditional(self, expr: ast.Conditional, scope):
        self._condition(expr.condition, scope, "'if'")
        then, _ = self.check_expr(expr.then, scope)
        otherwise, _ = self.check_expr(expr.otherwise, scope)
        if then is otherwise or otherwise is Type.ANY:
            return then, scope
        if then is Type.ANY:
            return otherwise, scope
        if self._tuple_items and Type.VALUE in (then, otherwise):
            return Type.ANY, scope  # a tuple's item: a value here, a constant there
        self.error(expr.span, f"the branches of 'if ... else' differ: {then} and {otherwise}")
        return Type.ANY, scope

    def _expr_Comprehension(self, expr: ast.Comprehension, scope):
        domain, _ = self.check_expr(expr.domain, scope)
        if domain not in (Type.LIST, Type.VALUE, Type.ANY):
            self.error(expr.domain.span, f"the domain of 'for' must be list, not {domain}")
        inner = scope.with_name(expr.variable)
        if expr.keep is not None:
            self._condition(expr.keep, inner, "'for ... if'")
        self.check_expr(expr.item, inner)
        return Type.LIST, scope

    def _expr_Index(self, expr: ast.Index, scope):
        base, _ = self.check_expr(expr.base, scope)
        self._expect(expr.index, scope, Type.NUMBER, "an index")
        if base is Type.VALUE:
            return Type.ANY, scope  # an element of the value's constant: a number, a bool, a string
        if not Type.LIST.accepts(base):
            self.error(expr.base.span, f"only a list or a constant value can be indexed, not {base}")
        return Type.ANY, scope

    def _expr_Arithmetic(self, expr: ast.Arithmetic, scope):
        self._expect(expr.left, scope, Type.NUMBER, f"an operand of '{expr.operator}'")
        self._expect(expr.right, scope, Type.NUMBER, f"an operand of '{expr.operator}'")
        return Type.NUMBER, scope

    def _expr_Compare(self, expr: ast.Compare, scope):
        left, _ = self.check_expr(expr.left, scope)
        right, _ = self.check_expr(expr.right, scope)
        for side, actual in ((expr.left, left), (expr.right, right)):
            if actual is Type.VALUE:
                self.error(
                    side.span,
                    "a graph value cannot be compared with "
                    f"'{expr.operator}'; use 'is' for identity, or dim()/const() for its contents",
                )
        if expr.operator in ("<", "<=", ">", ">="):
            for side, actual in ((expr.left, left), (expr.right, right)):
                if not Type.NUMBER.accepts(actual):
                    self.error(side.span, f"'{expr.operator}' compares numbers, not {actual}")
        elif not left.accepts(right) and Type.VALUE not in (left, right):
            self.error(expr.span, f"'{expr.operator}' compares {left} with {right}")
        return Type.BOOL, scope

    def _expr_And(self, expr: ast.And, scope):
        _, scope = self._condition(expr.left, scope, "'and'")
        _, scope = self._condition(expr.right, scope, "'and'")
        return Type.BOOL, scope

    def _expr_Or(self, expr: ast.Or, scope):
        # What both sides bind is bound after the `or`, whichever side held.
        _, left = self._condition(expr.left, scope, "'or'")
        _, right = self._condition(expr.right, scope, "'or'")
        return Type.BOOL, scope.with_values(*(left.values & right.values))

    def _expr_Not(self, expr: ast.Not, scope):
        self._condition(expr.operand, scope, "'not'")
        return Type.BOOL, scope

    def _condition(self, expr, scope, where: str):
        actual, after = self.check_expr(expr, scope)
        if not Type.BOOL.accepts(actual):
            self.error(expr.span, f"an operand of {where} must be bool, not {actual}")
        return actual, after

    def _expr_SameValue(self, expr: ast.SameValue, scope):
        self._expect(expr.left, scope, Type.VALUE, "the left of 'is'")
        if expr.var not in scope.values:
            if expr.negated:
                self._unbound(expr.span, expr.var)
            else:
                # `expr is %new` names the value for what follows, as a pattern would.
                return Type.BOOL, scope.with_values(expr.var)
        return Type.BOOL, scope

    def _expr_Matches(self, expr: ast.Matches, scope):
        self._expect(expr.subject, scope, Type.VALUE, "the left of 'is'")
        bound = set(scope.values)
        pattern = self.check_pattern(expr.pattern, bound)
        self._resolved[id(expr)] = pattern
        if expr.negated:
            # A pattern that did not match binds nothing.
            return Type.BOOL, scope
        return Type.BOOL, scope.with_values(*bound)

    def _expr_Call(self, expr: ast.Call, scope):
        signature = BUILTINS.get(expr.function) or self.predicates.get(expr.function)
        if signature is None:
            if NAMED_CONSTANTS.get(expr.function, (None,))[0] is Type.STRING:  # `fp16(3.0)`
                hint = f"; a constant of a dtype is written as_dtype(x, {expr.function})"
            else:
                hint = self._suggest(expr.function, list(BUILTINS) + list(self.predicates))
            self.error(expr.span, f"unknown function '{expr.function}'" + hint)
            for argument in expr.arguments:
                self.check_expr(argument, scope)
            return Type.ANY, scope
        positional = signature.positional
        if len(expr.arguments) != len(positional):
            self.error(
                expr.span,
                f"'{expr.function}' takes {len(positional)} positional argument"
                f"{'s' if len(positional) != 1 else ''}, not {len(expr.arguments)}",
            )
        for parameter, argument in zip(positional, expr.arguments):
            self._expect(argument, scope, parameter.type, f"argument '{parameter.name}' of '{expr.function}'")
        keywords = signature.keywords
        given = {name for name, _ in expr.keywords}
        for name, argument in expr.keywords:
            if name not in keywords:
                self.error(argument.span, f"'{expr.function}' has no keyword argument '{name}'")
                continue
            self._expect(argument, scope, keywords[name].type, f"argument '{name}' of '{expr.function}'")
        for name, parameter in keywords.items():
            if name not in given and not parameter.optional:
                self.error(expr.span, f"'{expr.function}' needs the keyword argument '{name}='")
        return signature.result, scope

    def _warn_runaway_body(self, expr: ast.Quantifier) -> None:
        # A body reaches as far right as it can: `forall x in s: p(x) and q`
        # quantifies q too, which over an empty domain makes it vacuously
        # true. A conjunct that never mentions x was likely meant outside.
        parts = ast.conjuncts(expr.body)
        for part in parts[1:]:
            if not _mentions(part, expr.variable):
                self.warning(
                    part.span,
                    f"this is inside '{expr.kind} {expr.variable}' but does not use '{expr.variable}'; "
                    f"a quantifier's body extends as far right as it can: parenthesize "
                    f"'({expr.kind} {expr.variable} in ...: ...)' if it should end before this",
                )
                return

    def _expr_Quantifier(self, expr: ast.Quantifier, scope):
        self._warn_runaway_body(expr)
        domain, _ = self.check_expr(expr.domain, scope)
        if domain not in (Type.LIST, Type.VALUE, Type.ANY):  # a value here: a rest operand's tuple
            self.error(expr.domain.span, f"the domain of '{expr.kind}' must be list, not {domain}")
        inner = scope.with_name(expr.variable)
        if expr.filter is not None:
            _, inner = self._condition(expr.filter, inner, f"'{expr.kind} ... where'")
        self._condition(expr.body, inner, f"'{expr.kind}'")
        return Type.BOOL, scope

    def _expr_EveryUse(self, expr: ast.EveryUse, scope):
        if expr.of not in scope.values:
            self._unbound(expr.span, expr.of)
        if expr.variable in scope.values:
            self.error(expr.span, f"'{expr.variable}' is already bound")
        self._condition(expr.body, scope.with_values(expr.variable), "'every use'")
        return Type.BOOL, scope

    # ------------------------------------------------------------ rules

    def check_rule(self, rule: ast.Rule) -> ast.Rule:
        self._resolved: dict[int, ast.OpPattern] = {}
        self._var_types: dict[str, frozenset[str]] = {}  # %v -> op types a pattern matched it to
        bound: set[str] = set()
        matches = []
        if not rule.matches:
            self.error(rule.span, f"rule '{rule.name}' has no 'match' clause")
        self._unnamed_anchor = None
        for index, clause in enumerate(rule.matches):
            if not clause.named:
                if index == 0:
                    self._unnamed_anchor = clause.pattern.op
                else:
                    self.error(
                        clause.span,
                        "only the first 'match' (the anchor) may go without a name; a later 'match' "
                        "walks from a value bound before it: 'match %v = op(...)'",
                    )
            elif index == 0:
                bound.add(clause.var)
            elif clause.var not in bound:
                self.error(
                    clause.span,
                    f"'{clause.var}' is not bound; a later 'match' walks from a value bound before it",
                )
            pattern = self.check_pattern(clause.pattern, bound)
            self._var_types[clause.var] = pattern.types
            matches.append(replace(clause, pattern=pattern))
        scope = _Scope(frozenset(bound), frozenset())
        for condition in rule.conditions:
            _, scope = self._condition(condition.expr, scope, "'where'")
        conditions = tuple(
            replace(c, expr=_substitute_patterns(c.expr, self._resolved)) for c in rule.conditions
        )
        actions = []
        for action in rule.actions:
            actions.append(self._check_action(action, scope))
            if isinstance(action, ast.BuildAction):
                scope = scope.with_values(action.var)
        if not rule.actions:
            self.error(rule.span, f"rule '{rule.name}' has no 'rewrite' clause")
        for example in rule.examples:
            self._check_example(example)
        self._check_groups(rule)
        self._check_assumptions(rule)
        return replace(rule, matches=tuple(matches), conditions=conditions, actions=tuple(actions))

    def _check_groups(self, rule: ast.Rule) -> None:
        if self.schema is None or not rule.groups:
            return
        known = tuple(self.schema.groups)
        for name, span, again in _names_once(rule.groups):
            if again:
                self.error(span, f"rule '{rule.name}' is in group '{name}' already")
            elif not known:
                self.error(
                    span,
                    f"unknown {self.schema.dialect} group '{name}': {self.schema.dialect} rules have no "
                    f"groups (the backend has no pass pipeline to place them in); remove the 'group' clause",
                )
            elif name not in known:
                self.error(
                    span,
                    f"unknown {self.schema.dialect} group '{name}' (the groups are {', '.join(known)})"
                    + self._suggest(name, known),
                )

    def _check_assumptions(self, rule: ast.Rule) -> None:
        known = tuple(ASSUMPTIONS)
        for name, span, again in _names_once(rule.assumptions):
            if again:
                self.error(span, f"rule '{rule.name}' assumes '{name}' already")
            elif name not in known:
                self.error(span, f"unknown assumption '{name}' (the assumptions are {', '.join(known)})"
                           + self._suggest(name, known))

    def _check_example(self, example: ast.Example) -> None:
        defined = self._check_example_statements(example.statements, set())
        opsets = [s for s in example.statements if isinstance(s, ast.ExampleOpset)]
        for extra in opsets[1:]:
            self.error(extra.span, "an example states one 'opset'")
        outputs = example.outputs
        if not outputs:
            self.error(example.span, "an example needs an 'output' line")
        for var in outputs:
            if var not in defined:
                self.error(example.span, f"example output '{var}' is never defined")
        if example.expected is not None:
            inputs = {s.var for s in example.inputs}
            for statement in example.expected:
                if not isinstance(statement, ast.ExampleOp):
                    self.error(statement.span, "after 'becomes' come only ops; inputs and outputs stay the same")
            expected = self._check_example_statements(example.expected, inputs)
            for var in outputs:
                if var not in expected:
                    self.error(example.span, f"the 'becomes' graph does not define output '{var}'")

    def _check_example_statements(self, statements, defined: set[str]) -> set[str]:
        defined = set(defined)
        for statement in statements:
            if isinstance(statement, ast.ExampleInput):
                if NAMED_CONSTANTS.get(statement.dtype, (None,))[0] is not Type.STRING:
                    self.error(statement.span, f"unknown dtype '{statement.dtype}' (fp32, fp16, int32, bool, ...)")
                defined.add(statement.var)
            elif isinstance(statement, ast.ExampleOp):
                self._check_build(statement.build, _Scope(frozenset(defined), frozenset()), complete=True,
                                  example=True)
                defined.add(statement.var)
        return defined

    def _check_action(self, action: ast.Action, scope: _Scope) -> ast.Action:
        if isinstance(action, ast.BuildAction):
            self._check_build(action.build, scope, complete=True)
            if action.var in scope.values:
                self.error(action.span, f"'{action.var}' is already bound")
            return action
        if action.target not in scope.values:
            self._unbound(action.span, action.target)
        if action.within is not None and action.within not in scope.values:
            self._unbound(action.span, action.within)
        replacement = action.replacement
        if isinstance(replacement, (ast.ValueRef, ast.Index)):
            self.check_expr(replacement, scope)
        elif isinstance(replacement, ast.OpBuild):
            self._check_build(replacement, scope, complete=True)
        else:
            if replacement.var not in scope.values:
                self._unbound(replacement.span, replacement.var)
            elif replacement.var not in self._var_types:
                self.error(replacement.span, f"'{replacement.var}' was not matched by an op pattern; "
                           "'with' rebuilds a matched op")
            for argument in replacement.arguments:
                self.check_expr(argument.value, scope)
                for signature in self._signatures(self._var_types.get(replacement.var, frozenset())):
                    if signature.input(argument.name) is None and argument.name not in signature.attributes:
                        names = [i.name for i in signature.inputs]
                        self.error(argument.span, f"op '{signature.op_type}' has no operand '{argument.name}'"
                                   + self._suggest(argument.name, names))
                    elif isinstance(argument.value, (ast.TupleExpr, ast.TupleComprehension)):
                        self._check_tuple(signature.op_type, argument.name, argument.value, signature)
        return action

    def _check_build(self, build: ast.OpBuild, scope: _Scope, complete: bool, example: bool = False) -> None:
        """Check an op a rewrite (or, with `example`, an example) builds.

        An example's operands are evaluated before there is any graph to
        read, so besides values they may only be constants (see `_constant_operand`).
        """
        signature = None
        if self.schema is not None:
            signature = self.schema.signature(build.op)
            if signature is None:
                self.error(
                    build.span,
                    f"unknown {self.schema.dialect} op '{build.op}'"
                    + self._suggest(build.op, self.schema.op_types()),
                )
        given = set()
        for argument in build.arguments:
            if argument.name in given:
                self.error(argument.span, f"operand '{argument.name}' given twice")
            given.add(argument.name)
            value = argument.value
            items: tuple[ast.Expr, ...]
            if isinstance(value, ast.TupleComprehension):
                self.check_expr(value, scope)
                if example:
                    self.error(value.span, "an example lists a tuple's items: (%a, %b)")
                items = ()
            else:
                items = value.items if isinstance(value, ast.TupleExpr) else (value,)
            self._tuple_items += isinstance(value, ast.TupleExpr)
            try:
                for item in items:
                    self.check_expr(item, scope)
                    if example and not isinstance(item, ast.ValueRef):
                        self._constant_operand(item)
            finally:
                self._tuple_items -= isinstance(value, ast.TupleExpr)
            if isinstance(value, (ast.TupleExpr, ast.TupleComprehension)):
                self._check_tuple(build.op, argument.name, value, signature)
            if (
                signature is not None
                and signature.input(argument.name) is None
                and argument.name not in signature.attributes
            ):
                names = [i.name for i in signature.inputs] + list(signature.attributes)
                self.error(
                    argument.span,
                    f"op '{build.op}' has no operand '{argument.name}'" + self._suggest(argument.name, names),
                )
        if signature is not None and complete:
            missing = [i.name for i in signature.inputs if not i.optional and i.name not in given]
            if missing:
                self.error(build.span, f"op '{build.op}' needs operand(s) {', '.join(missing)}")

    def _check_tuple(self, op: str, name: str, value, signature) -> None:
        spec = signature.input(name) if signature is not None else None
        if spec is not None and not spec.variadic:
            self.error(value.span, f"operand '{name}' of '{op}' takes one value, not a tuple")

    def _constant_operand(self, expr) -> None:
        """An example operand that is not a value must be computed from the rule
        text alone: literals, lists, named constants and the functions of them."""
        for node in ast.walk(expr):
            if isinstance(node, ast.ValueRef):
                if isinstance(expr, ast.ListExpr) and node in expr.items:
                    self.error(expr.span, "a list holds constants, not values; a variadic operand takes "
                               "a tuple: (%a, %b)")
                else:
                    self.error(node.span, f"'{node.var}' inside a constant: {_EXAMPLE_OPERAND}")
                return
            if isinstance(node, ast.Call) and node.function not in GRAPH_FREE_BUILTINS:
                if node.function not in BUILTINS and node.function not in self.predicates:
                    return  # an unknown function, already reported
                what = "reads the graph" if node.function in BUILTINS else "is a registered predicate"
                self.error(node.span, f"'{node.function}' {what}, which an example cannot: {_EXAMPLE_OPERAND}")
                return


_EXAMPLE_OPERAND = (
    "an example operand is a value, a tuple of values such as (%a, %b), or a constant "
    "such as 2, [1, 8], -inf or as_dtype(3.0, fp16)"
)


def _mentions(expr, name: str) -> bool:
    """Whether `expr` refers to the quantifier variable `name` anywhere."""
    if isinstance(expr, ast.NameRef):
        return expr.name == name
    if isinstance(expr, tuple):
        return any(_mentions(item, name) for item in expr)
    if not hasattr(expr, "__dataclass_fields__") or isinstance(expr, ast.Span):
        return False
    return any(_mentions(getattr(expr, field), name) for field in expr.__dataclass_fields__)


def _substitute_patterns(expr, resolved: dict[int, ast.OpPattern]):
    """Copy `expr` with each `Matches` pattern replaced by its resolved form.

    Only the nodes on the way to a `Matches` are copied; the rest is shared.
    (A tuple field rebuilt item by item is a new tuple even when every item
    stayed: copying on that alone copied every node of every condition, a
    quarter of the time it takes to load a large rules file.)
    """
    if not resolved or type(expr) in _LEAVES:
        return expr
    if isinstance(expr, ast.Matches):
        return replace(expr, subject=_substitute_patterns(expr.subject, resolved),
                       pattern=resolved.get(id(expr), expr.pattern))
    fields = _CHILD_FIELDS.get(type(expr))
    if fields is None:
        if not hasattr(expr, "__dataclass_fields__"):
            return expr
        fields = _CHILD_FIELDS[type(expr)] = tuple(name for name in expr.__dataclass_fields__ if name != "span")
    changes = {}
    for name in fields:
        child = getattr(expr, name)
        if isinstance(child, tuple):
            new = tuple(_substitute_patterns(c, resolved) for c in child)
            if all(item is old for item, old in zip(new, child)):
                continue
        elif hasattr(child, "__dataclass_fields__"):
            new = _substitute_patterns(child, resolved)
        else:
            continue
        if new is not child:
            changes[name] = new
    return replace(expr, **changes) if changes else expr


# Expressions with no expression inside, and the fields of the others that
# may hold one (a span never does).
_LEAVES = frozenset({ast.Literal, ast.ValueRef, ast.NameRef, ast.Wildcard, ast.Span})
_CHILD_FIELDS: dict[type, tuple[str, ...]] = {}


def _names_once(clauses):
    """(name, span, named before) for each name of `group` or `assume` clauses, in order."""
    seen: set[str] = set()
    for clause in clauses:
        for name, span in zip(clause.names, clause.name_spans or (clause.span,) * len(clause.names)):
            yield name, span, name in seen
            seen.add(name)
