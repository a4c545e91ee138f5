"""grammar.lark -> lark tree -> AST.

Parsing is lark's LALR(1); the `Transformer` below turns its tree into the
frozen dataclasses of `rewrite.language.ast`. Text that parses goes through
`fast_parser` instead, which builds the same AST many times faster; lark
parses only the items that one does not take. Syntax errors become a
`RuleError` with `file:line:col`, the line, a caret and what was expected:
every error of the file (up to `MAX_REPORTED_ERRORS`), since the parse
recovers at the next item after each (`_parse_recovering`).

One module, though long: the lark `Transformer` has one method per grammar
rule, and keeping them in the grammar's order beside the error recovery is what
makes a change to grammar.lark a change in one place.
"""

from __future__ import annotations

import functools
import re
import threading
from typing import cast

import lark
from lark import Token, Transformer_NonRecursive, Tree, v_args

from rewrite import resources
from rewrite.language import ast
from rewrite.language.errors import Diagnostic, RuleError, SourceText
from rewrite.language.fast_parser import (
    MAX_CONDITIONS,
    Declined,
    FastParser,
    build_file,
    is_item_line,
    next_item_line,
    too_many_conditions,
)
from rewrite.language.types import BUILTINS


class _TooManyConditions(Exception):
    """Raised from inside lark's parse at the `where` clause that holds condition MAX_CONDITIONS + 1."""

    def __init__(self, conjunct):
        self.conjunct = conjunct  # its lark tree (or token)


class _ConditionCounter(lark.Transformer):
    """Counts a rule's conditions as lark reduces its clauses, during the parse.

    LALR reduces a rule's `where` clauses in order and the rule itself before
    the next rule's first clause, so a count kept per thread and reset at
    each rule (and each parse) is the count of the rule being read. Trees
    pass through unchanged; `_ToAst` builds the AST after the parse.
    """

    def __init__(self):
        super().__init__()
        self.local = threading.local()

    def reset(self) -> None:
        self.local.count = 0

    def where_clause(self, children):
        (expr,) = children
        parts = _tree_conjuncts(expr)
        counted = getattr(self.local, "count", 0)
        if counted + len(parts) > MAX_CONDITIONS:
            raise _TooManyConditions(parts[MAX_CONDITIONS - counted])
        self.local.count = counted + len(parts)
        return Tree("where_clause", children)

    def rule(self, children):
        self.local.count = 0
        return Tree("rule", children)


class _Lark(lark.Lark):
    """lark's parser with the condition counter reset at the start of each parse."""

    counter: _ConditionCounter

    def parse(self, text, start=None, on_error=None):
        self.counter.reset()
        return super().parse(text, start=start, on_error=on_error)


@functools.lru_cache(maxsize=1)
def grammar_parser() -> lark.Lark:
    """The lark parser for grammar.lark, built once per process.

    lark caches the LALR tables on disk, keyed by a hash of the grammar and
    options, so a short CLI run does not rebuild them. A rule's conditions
    are counted while it parses (`_ConditionCounter`), so that one of too
    many is refused without reading the rest of the text.
    """
    counter = _ConditionCounter()
    parser = _Lark(
        resources.grammar_text(),
        parser="lalr",
        propagate_positions=True,
        maybe_placeholders=True,
        cache=True,
        transformer=counter,
    )
    parser.counter = counter
    return parser


def _tree_conjuncts(expr) -> list:
    """The parts of a lark tree `a and b and c`, in reading order, without recursing."""
    found, stack = [], [expr]
    while stack:
        item = stack.pop()
        if isinstance(item, Tree) and item.data == "and_":
            stack += reversed(item.children)
        else:
            found.append(item)
    return found


def parse_rules(text: str, path: str) -> ast.RuleFile:
    """Parse the text of one rules file. Raises `RuleError` on a syntax error.

    The AST is immutable, so a text parsed once in this process is not parsed
    again: an embedder that loads the same rules for every model pays once.
    """
    key = (path, text)
    parsed = _PARSED.get(key)
    if parsed is None:
        parsed = _parse(text, path)
        if len(_PARSED) >= _PARSED_LIMIT:
            _PARSED.clear()
        _PARSED[key] = parsed
    return parsed


_PARSED: dict[tuple[str, str], ast.RuleFile] = {}
_PARSED_LIMIT = 256


def _parse(text: str, path: str) -> ast.RuleFile:
    source = SourceText(path, text)
    # The fast parser takes well-formed text, by far the common case, at a
    # tenth of lark's cost or less; lark decides the rest and words the error.
    return _parse_recovering(source, fast=True)


def parse_with_lark(source: SourceText) -> ast.RuleFile:
    """lark's path alone, which decides and words what the fast parser leaves
    to it. Raises `RuleError`; tests compare it with `fast_parser`."""
    return _parse_recovering(source, fast=False)


# At most this many errors of one file are reported; a note says how many more.
MAX_REPORTED_ERRORS = 20


def _parse_recovering(source: SourceText, fast: bool) -> ast.RuleFile:
    """Parse the whole text, reporting every error, not only the first.

    After an error the parse recovers at the next line that starts with an
    item word (`rule`, `dialect`, `import`, `class` at column 1) and reads on
    from there, so that each broken item is one error and the items after it
    are still read. (When the error is that very word, cutting the item
    before it short, the parse goes on at that line.)

    lark reads the text a stretch at a time (`_lark_stretch`): from such a
    line to the next, longer only where an item runs on past it. With
    `fast`, the fast parser reads first and lark only the stretch from the
    item it did not take; both ways read the same stretches, so they report
    the same errors (tests/language/test_fast_parser.py compares them).
    """
    raw = source.text.split("\n")  # as lark counts lines, "\r" kept
    items: list = []
    errors: list[Diagnostic] = []
    fast_parser = FastParser(source.text, source.path, source.lines) if fast else None
    start: int | None = 1
    while start is not None:
        if fast_parser is not None:
            try:
                fast_parser.items_from(start, items)
                break
            except Declined as declined:
                start = declined.line
            except RuleError as error:  # too many conditions, which lark's path words alike
                errors.extend(error.diagnostics)
                start = next_item_line(raw, error.first.span.line)
                continue
        start = _lark_stretch(source, raw, start, items, errors)
    if errors:
        raise RuleError(_capped(errors))
    return build_file(source.path, items)


def _capped(errors: list[Diagnostic]) -> list[Diagnostic]:
    if len(errors) <= MAX_REPORTED_ERRORS:
        return errors
    more = len(errors) - MAX_REPORTED_ERRORS
    note = Diagnostic(errors[MAX_REPORTED_ERRORS].span,
                      f"{more} more error{'s' if more > 1 else ''} in this file not shown", "note", more=more)
    return [*errors[:MAX_REPORTED_ERRORS], note]


def _lark_stretch(source: SourceText, raw: list[str], start: int, items: list, errors: list) -> int | None:
    """Parse with lark from line `start` to the next line that starts an item
    (or on, while an item runs past it); append its items, or its errors, and
    return the line to read on from (None: the end of the text).

    A stretch that is complete items is what those items are in the whole
    text: the item word at its end starts a new item wherever a complete one
    may end before it (`fast_parser.chunks` says why). One that ends inside
    an item (lark meets the end of the stretch) is made longer.
    """
    end = next_item_line(raw, start)
    while True:
        # The lines before the stretch as empty ones: lark's lines and columns are the file's.
        text = "\n" * (start - 1) + "\n".join(raw[start - 1 : None if end is None else end - 1])
        try:
            tree = grammar_parser().parse(text)
            break
        except lark.exceptions.UnexpectedInput as error:
            if end is not None and _at_end(error):
                end = next_item_line(raw, end)
                continue
            diagnostic = _syntax_diagnostic(error, source)
            errors.append(diagnostic)
            if isinstance(error, lark.exceptions.UnexpectedEOF) or (
                    isinstance(error, lark.exceptions.UnexpectedToken) and error.token.type == "$END"):
                return None
            line = diagnostic.span.line
            if line > start and diagnostic.span.column == 1 and is_item_line(raw[line - 1]):
                return line  # the item word itself was unexpected: the item before it stops short
            return next_item_line(raw, line)
        except _TooManyConditions as error:
            diagnostic = _too_many_diagnostic(error, source)
            errors.append(diagnostic)
            return next_item_line(raw, diagnostic.span.line)
    # `start: _item*`, and every item is a rule of its own: a tree, never a bare token.
    for item in cast("list[Tree]", tree.children):
        too_deep = _too_deep(item, source)
        if too_deep is not None:
            errors.append(too_deep)
            continue
        try:
            items.append(_ToAst(source).transform(item))
        except lark.exceptions.VisitError as error:
            if not isinstance(error.orig_exc, RuleError):
                raise
            errors.extend(error.orig_exc.diagnostics)
    return end


def _at_end(error: lark.exceptions.UnexpectedInput) -> bool:
    """Whether lark stopped at the end of the text it was given."""
    if isinstance(error, lark.exceptions.UnexpectedEOF):
        return True
    return isinstance(error, lark.exceptions.UnexpectedToken) and error.token.type == "$END"


def _too_many_diagnostic(error: _TooManyConditions, source: SourceText) -> Diagnostic:
    meta = error.conjunct.meta if isinstance(error.conjunct, Tree) else error.conjunct
    span = ast.Span(source.path, meta.line, meta.column, meta.end_line, meta.end_column)
    return too_many_conditions(span, source.line(span.line)).first


# ------------------------------------------------------------ nesting

# How deeply patterns and expressions may nest. lark's LALR parser keeps its
# own stack, but every later pass over the AST recurses once or more per
# level: the checker, lint, the condition compiler and the closures it
# builds, the interpreter, explain, a dataclass repr (up to ten frames per
# level of `op(x=%v = op(...))`). The engine runs them from deep in its own
# stack, under pytest deeper still, and Python stops at 1000 frames. At 32
# levels the costliest pass stays near 350 frames; shipped rules nest 8.
MAX_NESTING = 32

# The engine also recurses once per `match` clause and once or twice per
# condition (the `where` clauses, each split at its top-level `and`s).
MAX_MATCHES = 64  # and MAX_CONDITIONS, from fast_parser: both parsers count conditions while parsing

# The lark nodes that are a level of nesting to the user: an op pattern or
# op build, an operator, a list, a call, an index, a quantifier. The nodes
# between them (operands, arguments, clauses) add no level of their own.
_NESTING_NODES = frozenset({
    "op_pattern", "op_build", "list", "comprehension", "tuple_comprehension_argument", "call", "index",
    "replace_with_element",
    "choose", "forall", "exists", "every_use", "or_", "and_", "not_",
    "compare", "same_value", "different_value", "is_op", "is_not_op",
    "add", "subtract", "multiply", "divide", "negate",
})

# lark nests a chain `a + b + c` to the left: each operator is one level.
_CHAIN_NODES = frozenset({"or_", "and_", "add", "subtract", "multiply", "divide"})


def _too_deep(tree: Tree, source: SourceText):
    """A diagnostic at the first node nested deeper than `MAX_NESTING`, or None.

    Walks the tree with an explicit stack: recursing here would fail at the
    very depth it is meant to refuse.
    """
    stack: list[tuple[Tree, int, Tree | None]] = [(tree, 0, None)]
    while stack:
        node, depth, parent = stack.pop()
        if node.data in _NESTING_NODES:
            depth += 1
            if depth > MAX_NESTING:
                return _nesting_diagnostic(node, parent, source)
        children = [child for child in node.children if isinstance(child, Tree)]
        # Reversed onto the stack, so the first node in reading order is reported.
        stack.extend((child, depth, node) for child in reversed(children))
    return None


def _nesting_diagnostic(node: Tree, parent: Tree | None, source: SourceText):
    meta = node.meta
    if getattr(meta, "empty", True):  # pragma: no cover - every nesting node holds a token
        span = source.span_at(1, 1)
    else:
        span = source.span_at(meta.line, meta.column)
    message = f"nesting deeper than {MAX_NESTING} levels"
    if node.data in _CHAIN_NODES and parent is not None and parent.data in _CHAIN_NODES:
        message = (
            f"expression too long: nesting deeper than {MAX_NESTING} levels, where each operator "
            "of a chain like 'a + b + c' is one level; split it up (e.g. into several 'where' clauses)"
        )
    return source.diagnostic(span, message)


# ------------------------------------------------------------ syntax errors

# What a user should read for a terminal lark expected.
_TERMINAL_WORDS = {
    "VAR": "a value such as %x",
    "NAME": "a name",
    "INT": "an integer",
    "FLOAT": "a number",
    "STRING": 'a string in double quotes',
    "COMPARE": "a comparison",
    "$END": "the end of the file",
}


@functools.lru_cache(maxsize=1)
def _terminal_words() -> dict[str, str]:
    words = dict(_TERMINAL_WORDS)
    for terminal in grammar_parser().terminals:
        if terminal.name not in words and isinstance(terminal.pattern, lark.lexer.PatternStr):
            words[terminal.name] = f"'{terminal.pattern.value}'"
    return words


def _describe_expected(expected: set[str]) -> str:
    words = _terminal_words()
    names = sorted({words.get(name, name) for name in expected})
    if not names:
        return "something else"
    if len(names) > 12:
        names = names[:12] + ["..."]
    return ", ".join(names)


def _syntax_diagnostic(error: lark.exceptions.UnexpectedInput, source: SourceText):
    line = getattr(error, "line", None) or 0
    column = getattr(error, "column", None) or 0
    if isinstance(error, lark.exceptions.UnexpectedToken):
        token = error.token
        if token.type == "$END":
            span = _end_of_text(source)
            found = "end of file"
        else:
            span = source.span_at(line, column)
            found = repr(str(token))
        message = f"unexpected {found}; expected {_describe_expected(set(error.expected))}"
        if token.type != "$END":
            message += _replacement_hint(source, span, str(token))
    elif isinstance(error, lark.exceptions.UnexpectedCharacters):
        span = source.span_at(line, column)
        character = source.line(span.line)[span.column - 1 : span.column] or "?"
        allowed = set(error.allowed or ())
        message = f"unexpected character {character!r}"
        if allowed:
            message += f"; expected {_describe_expected(allowed)}"
    elif isinstance(error, lark.exceptions.UnexpectedEOF):
        span = _end_of_text(source)
        message = f"unexpected end of file; expected {_describe_expected(set(error.expected))}"
    else:  # pragma: no cover - lark has no other UnexpectedInput kinds today
        span = source.span_at(line, column)
        message = str(error).splitlines()[0]
    return source.diagnostic(span, message)


# `%t ->` at the end of the text before an error, and what a replacement is: a
# literal, or the start of a call of a builtin (not an op) still open there.
_REPLACED = re.compile(r"(%[A-Za-z_][A-Za-z0-9_]*)\s*->\s*$")
_REPLACED_BY_CALL = re.compile(r"(%[A-Za-z_][A-Za-z0-9_]*)\s*->\s*([A-Za-z_][A-Za-z0-9_]*)\s*\([^()]*$")
_LITERAL = re.compile(r'[0-9]|"|-|\[')
# The literal as written from where it starts: a number (negated or not), a string, a flat list.
_LITERAL_TEXT = re.compile(r'-?\s*[0-9][0-9.]*(?:[eE][-+]?[0-9]+)?|"[^"\n]*"|\[[^\[\]\n]*\]')
_DIALECT = re.compile(r"\s*dialect\s+([A-Za-z_][A-Za-z0-9_]*)")


def _replacement_hint(source: SourceText, span: ast.Span, found: str) -> str:
    """For a constant written as a replacement (`%t -> 0.0`, `%t -> zero_of(fp32)`),
    the way to say it in the file's dialect; "" for any other error.

    A replacement is a graph value or an op the rule builds, and a constant
    is an op of the backend: the message names it, so that the user need
    not find it in the docs.
    """
    # The text before the error, from up to three lines above (an action may be split over lines).
    first = max(1, span.line - 3)
    before = " ".join([source.line(n) for n in range(first, span.line)] + [source.line(span.line)[: span.column - 1]])
    literal = _REPLACED.search(before)
    if literal is not None and _LITERAL.match(found):
        written = _LITERAL_TEXT.match(source.line(span.line), span.column - 1)
        target, value = literal.group(1), written.group() if written is not None else "..."
    else:
        call = _REPLACED_BY_CALL.search(before)
        if call is None or call.group(2) not in BUILTINS:
            return ""
        target, value = call.group(1), "0.0"
    dialect = next((m.group(1) for line in source.lines if (m := _DIALECT.match(line))), None)
    typed = f"as_dtype({value}, dtype({target}))"
    ways = {
        "mil": (f"'{target} -> const(val={typed})', or, shaped like a value %v whose shape is known only at "
                f"run time, '{target} -> fill_like(ref_tensor=%v, value={typed})'"),
        "onnx": (f"'{target} -> Constant(value={typed})', or, shaped like a value %v whose shape is known only "
                 f"at run time, '%s = Shape(data=%v)' then "
                 f"'{target} -> ConstantOfShape(input=%s, value=as_dtype([{value}], dtype({target})))'"),
    }
    if dialect in ways:
        way = f"as in {ways[dialect]}"
    else:
        way = f"in MIL as in {ways['mil']}; in ONNX as in {ways['onnx']}"
    return (f". A replacement is a value or an op, not a constant: build the constant, {way} "
            f"(docs/language.md, \"Replacing a value by a constant\")")


def _end_of_text(source: SourceText) -> ast.Span:
    if not source.lines:
        return ast.Span(source.path, 1, 1)
    return source.span_at(len(source.lines), len(source.lines[-1]) + 1)


# ------------------------------------------------------------ tree -> AST


def _unquote(token: Token) -> str:
    return str(token)[1:-1]


def _position(token: Token) -> tuple[int, int, int, int]:
    """The line, column, end line and end column of a token the parser read.

    lark types them Optional, for a token made by hand; the parser gives
    every token it reads all four.
    """
    return cast("tuple[int, int, int, int]", (token.line, token.column, token.end_line, token.end_column))


@v_args(meta=True)
class _ToAst(Transformer_NonRecursive):
    """Builds AST nodes bottom-up; each method is one grammar alternative.

    Non-recursive, so that the only limit on nesting is `MAX_NESTING`.
    """

    def __init__(self, source: SourceText):
        super().__init__()
        self.source = source

    def _span(self, meta) -> ast.Span:
        if getattr(meta, "empty", True):
            return ast.Span(self.source.path, 1, 1)
        return ast.Span(self.source.path, meta.line, meta.column, meta.end_line, meta.end_column)

    def _token_span(self, token: Token) -> ast.Span:
        return ast.Span(self.source.path, *_position(token))

    def _text(self, meta) -> str:
        lines = self.source.lines[meta.line - 1 : meta.end_line]
        if not lines:
            return ""
        if len(lines) == 1:
            return lines[0][meta.column - 1 : meta.end_column - 1]
        lines[0] = lines[0][meta.column - 1 :]
        lines[-1] = lines[-1][: meta.end_column - 1]
        return " ".join(line.strip() for line in lines)

    # ---- top level (each item is transformed on its own; `fast_parser.build_file` makes the file)

    def dialect_decl(self, meta, children):
        (name,) = children
        return ("dialect", str(name), self._token_span(name))

    def import_all(self, meta, children):
        (path,) = children
        return ast.Import(_unquote(path), None, self._span(meta))

    def import_names(self, meta, children):
        names, path = children
        return ast.Import(_unquote(path), names, self._span(meta))

    def name_list(self, meta, children):
        return tuple(str(child) for child in children)

    def class_decl(self, meta, children):
        name, *members = children
        return ast.OpClass(str(name), tuple(str(m) for m in members), self._token_span(name))

    def rule(self, meta, children):
        name, description, *clauses = children
        matches, conditions, actions, examples, groups, assumptions = [], [], [], [], [], []
        benefit = 0
        for kind, value in clauses:
            if kind == "example":
                examples.append(value)
            elif kind == "group":
                groups.append(value)
            elif kind == "assume":
                assumptions.append(value)
            elif kind == "match":
                matches.append(value)
            elif kind == "where":
                conditions.append(value)
            elif kind == "benefit":
                benefit = value
            else:
                actions.extend(value)
        if len(matches) > MAX_MATCHES:
            self._too_many(matches[MAX_MATCHES].span, f"more than {MAX_MATCHES} 'match' clauses in one rule")
        # Too many conditions were refused while parsing (`_ConditionCounter`).
        return ast.Rule(
            name=str(name),
            description=_unquote(description),
            dialect="",
            matches=tuple(matches),
            conditions=tuple(conditions),
            actions=tuple(actions),
            benefit=benefit,
            span=self._token_span(name),
            examples=tuple(examples),
            groups=tuple(groups),
            assumptions=tuple(assumptions),
        )

    def _too_many(self, span: ast.Span, message: str):
        raise RuleError([self.source.diagnostic(span, message)])

    def match_clause(self, meta, children):
        var, pattern = children
        return ("match", ast.MatchClause(str(var), pattern, self._token_span(var)))

    def unnamed_match(self, meta, children):
        (pattern,) = children
        return ("match", ast.MatchClause(ast.UNNAMED_ANCHOR, pattern, pattern.span))

    def where_clause(self, meta, children):
        (expr,) = children
        text = self._text(meta)[len("where") :].strip()
        return ("where", ast.Condition(expr, text, self._span(meta)))

    def benefit_clause(self, meta, children):
        (value,) = children
        return ("benefit", self._int(value))

    def group_clause(self, meta, children):
        names = tuple(str(name) for name in children)
        return ("group", ast.Group(names, self._span(meta), tuple(self._token_span(name) for name in children)))

    def assume_clause(self, meta, children):
        names = tuple(str(name) for name in children)
        return ("assume", ast.Assume(names, self._span(meta), tuple(self._token_span(name) for name in children)))

    def rewrite_clause(self, meta, children):
        return ("rewrite", tuple(children))

    # ---- examples

    def example_clause(self, meta, children):
        description, *statements, outcome = children
        return ("example", ast.Example(_unquote(description), tuple(statements), outcome, self._span(meta)))

    def becomes(self, meta, children):
        return tuple(children)

    def unchanged(self, meta, children):
        return None

    def example_input(self, meta, children):
        var, dtype, *dims = children
        dims = tuple(d for d in dims if d is not None)
        return ast.ExampleInput(str(var), str(dtype), dims, self._token_span(var))

    def example_dim(self, meta, children):
        (token,) = children
        return self._int(token) if token.type == "INT" else str(token)

    def example_op(self, meta, children):
        var, build = children
        return ast.ExampleOp(str(var), build, self._token_span(var))

    def example_output(self, meta, children):
        return ast.ExampleOutput(tuple(str(v) for v in children), self._span(meta))

    def example_opset(self, meta, children):
        (token,) = children
        return ast.ExampleOpset(self._int(token) if token.type == "INT" else str(token), self._span(meta))

    # ---- patterns

    def op_pattern(self, meta, children):
        name, *operands, any_order = children
        operands = tuple(o for o in operands if o is not None)
        return ast.OpPattern(str(name), operands, any_order is not None, self._token_span(name))

    def any_order(self, meta, children):
        return True

    def named_operand(self, meta, children):
        name, pattern = children
        return ast.Operand(str(name), pattern, False, self._token_span(name))

    def optional_operand(self, meta, children):
        name, var = children
        span = self._token_span(var)
        return ast.Operand(str(name), ast.Bind(str(var), None, span), False, self._token_span(name), True)

    def positional_operand(self, meta, children):
        (pattern,) = children
        return ast.Operand(None, pattern, False, self._span(meta))

    def tuple_operand(self, meta, children):
        name = children[0]
        # Matching a tuple item by item would be a second way of saying what
        # positional operands already say; point there instead.
        raise RuleError([self.source.diagnostic(
            self._paren_span(name),
            f"a tuple is not a pattern: match a variadic operand's values positionally, "
            f"as in op(%a, %b, ...) (every operand, in schema order), or bind them all with {name}=%{name}",
        )])

    def rest_operand(self, meta, children):
        (var,) = children
        span = self._token_span(var)
        return ast.Operand(None, ast.Bind(str(var), None, span), True, span)

    def bind(self, meta, children):
        (var,) = children
        return ast.Bind(str(var), None, self._token_span(var))

    def bind_op(self, meta, children):
        var, pattern = children
        return ast.Bind(str(var), pattern, self._token_span(var))

    def anonymous_op(self, meta, children):
        (pattern,) = children
        return pattern

    def wildcard(self, meta, children):
        return ast.Wildcard(self._span(meta))

    # ---- conditions

    def _quantifier(self, kind, meta, children):
        variable, domain, condition_filter, body = children
        return ast.Quantifier(kind, str(variable), domain, condition_filter, body, self._span(meta))

    def forall(self, meta, children):
        return self._quantifier("forall", meta, children)

    def exists(self, meta, children):
        return self._quantifier("exists", meta, children)

    def every_use(self, meta, children):
        variable, of, body = children
        return ast.EveryUse(str(variable), str(of), body, self._span(meta))

    def or_(self, meta, children):
        left, right = children
        return ast.Or(left, right, self._span(meta))

    def and_(self, meta, children):
        left, right = children
        return ast.And(left, right, self._span(meta))

    def not_(self, meta, children):
        (operand,) = children
        return ast.Not(operand, self._span(meta))

    def compare(self, meta, children):
        left, operator, right = children
        return ast.Compare(str(operator), left, right, self._span(meta))

    def same_value(self, meta, children):
        left, var = children
        return ast.SameValue(left, str(var), False, self._span(meta))

    def different_value(self, meta, children):
        left, var = children
        return ast.SameValue(left, str(var), True, self._span(meta))

    def is_op(self, meta, children):
        subject, pattern = children
        return ast.Matches(subject, pattern, False, self._span(meta))

    def is_not_op(self, meta, children):
        subject, pattern = children
        return ast.Matches(subject, pattern, True, self._span(meta))

    def _arithmetic(self, operator, meta, children):
        left, right = children
        return ast.Arithmetic(operator, left, right, self._span(meta))

    def add(self, meta, children):
        return self._arithmetic("+", meta, children)

    def subtract(self, meta, children):
        return self._arithmetic("-", meta, children)

    def multiply(self, meta, children):
        return self._arithmetic("*", meta, children)

    def divide(self, meta, children):
        return self._arithmetic("/", meta, children)

    def negate(self, meta, children):
        (operand,) = children
        span = self._span(meta)
        if type(operand) is ast.Literal and isinstance(number := operand.value, (int, float)) \
                and type(number) is not bool:
            # A negative number is a literal: `-0.0` is negative zero, which `0 - 0.0` is not.
            return ast.Literal(-number, span)
        return ast.Arithmetic("-", ast.Literal(0, span), operand, span)

    def index(self, meta, children):
        base, position = children
        return ast.Index(base, position, self._span(meta))

    def _int(self, token: Token) -> int:
        # Python refuses to convert very long digit strings; no rule needs one.
        if len(token) > 30:
            raise RuleError([self.source.diagnostic(self._token_span(token), "integer literal too large")])
        return int(token)

    def integer(self, meta, children):
        return ast.Literal(self._int(children[0]), self._span(meta))

    def real(self, meta, children):
        return ast.Literal(float(children[0]), self._span(meta))

    def string(self, meta, children):
        return ast.Literal(_unquote(children[0]), self._span(meta))

    def true(self, meta, children):
        return ast.Literal(True, self._span(meta))

    def false(self, meta, children):
        return ast.Literal(False, self._span(meta))

    def value_ref(self, meta, children):
        return ast.ValueRef(str(children[0]), self._span(meta))

    def name_ref(self, meta, children):
        return ast.NameRef(str(children[0]), self._span(meta))

    def call(self, meta, children):
        name, *arguments = children
        positional, keywords = [], []
        for argument in arguments:
            if argument is None:
                continue
            if argument[0] is None:
                positional.append(argument[1])
            else:
                keywords.append(argument)
        return ast.Call(str(name), tuple(positional), tuple(keywords), self._span(meta))

    def positional_argument(self, meta, children):
        return (None, children[0])

    def keyword_argument(self, meta, children):
        name, value = children
        return (str(name), value)

    def choose(self, meta, children):
        then, condition, otherwise = children
        return ast.Conditional(condition, then, otherwise, self._span(meta))

    def comprehension(self, meta, children):
        item, variable, domain, keep = children
        return ast.Comprehension(item, str(variable), domain, keep, self._span(meta))

    def list(self, meta, children):
        return ast.ListExpr(tuple(c for c in children if c is not None), self._span(meta))

    # ---- rewrites

    def build(self, meta, children):
        var, op_build = children
        return ast.BuildAction(str(var), op_build, self._token_span(var))

    def replace_with_value(self, meta, children):
        target, source = children
        return ast.ReplaceAction(
            str(target), ast.ValueRef(str(source), self._token_span(source)), self._token_span(target)
        )

    def replace_with_element(self, meta, children):
        target, source, position = children
        element = ast.Index(
            ast.ValueRef(str(source), self._token_span(source)), position,
            ast.Span(self.source.path, source.line, source.column, meta.end_line, meta.end_column),
        )
        return ast.ReplaceAction(str(target), element, self._token_span(target))

    def replace_with_op(self, meta, children):
        target, op_build = children
        return ast.ReplaceAction(str(target), op_build, self._token_span(target))

    def replace_operand(self, meta, children):
        target, source, within = children
        return ast.ReplaceAction(
            str(target), ast.ValueRef(str(source), self._token_span(source)), self._token_span(target), str(within)
        )

    def rebuild(self, meta, children):
        target, var, *arguments = children
        rebuild = ast.Rebuild(str(var), tuple(arguments), self._token_span(var))
        return ast.ReplaceAction(str(target), rebuild, self._token_span(target))

    def op_build(self, meta, children):
        name, *arguments = children
        arguments = tuple(a for a in arguments if a is not None)
        return ast.OpBuild(str(name), arguments, self._token_span(name))

    def build_argument(self, meta, children):
        name, value = children
        return ast.Argument(str(name), value, self._token_span(name))

    def tuple_argument(self, meta, children):
        name, *items = children
        items = tuple(item for item in items if item is not None)
        return ast.Argument(str(name), ast.TupleExpr(items, self._paren_span(name)), self._token_span(name))

    def tuple_comprehension_argument(self, meta, children):
        name, item, variable, domain, keep = children
        span = self._paren_span(name)
        comprehension = ast.Comprehension(item, str(variable), domain, keep, span)
        return ast.Argument(str(name), ast.TupleComprehension(comprehension, span), self._token_span(name))

    def _paren_span(self, name: Token) -> ast.Span:
        """Where the `(` after `name=` is: the tuple has no token of its own to point at."""
        # Found from the token's line and column: lark parsed a stretch of the
        # text, so its character offsets are not the file's.
        lines = self.source.lines
        _, _, line, column = _position(name)
        while True:
            text = lines[line - 1]
            index = column - 1
            while index < len(text) and text[index] not in "(#":  # past blanks and the `=`
                index += 1
            if index < len(text) and text[index] == "(":
                return ast.Span(self.source.path, line, index + 1)
            line, column = line + 1, 1  # a comment, or the end of the line
