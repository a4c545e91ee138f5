"""A recursive-descent parser for well-formed rules files, for speed.

lark's LALR parser (`parser.py`) costs about 50 µs a token in this grammar
with positions propagated: a generated file of 8,000 rules (5 MB, 1.2M
tokens) took over a minute to parse. This parser reads the same language
straight into the same AST, spans included, at a few µs a token. It is only
the fast path: on anything it does not take (a syntax error, a nesting
deeper than `MAX_NESTING`, a construct the lark path refuses with its own
message) it raises `Unhandled`, and `parser.py` parses the text with lark,
which decides and words the error. So it must never take a text lark
refuses, nor build a different AST: tests/language/test_fast_parser*.py
compare the two on every shipped and test rules text, spans included.

How it mirrors lark:

* Tokens are grammar.lark's terminals. lark lexes contextually: a word is a
  keyword only where the grammar accepts that keyword, else a NAME where a
  NAME is accepted (`Expand(input=%x)` has an operand named `input`). Here
  every word lexes as a NAME and each parse function tells keywords by
  value, accepting as keywords exactly those its position accepts.
* A node's span runs from its first token to its last, and a parenthesized
  child counts with its parentheses (lark's "containers"), though its own
  span does not include them. So every parse function returns, beside the
  node, the start and end of the text it covers.
* Nesting is counted as `parser._too_deep` counts it: each parse function
  returns the height of its node in nesting levels.

One error it words itself, as lark's path words it at the same place: a
rule with more than `MAX_CONDITIONS` conditions (`too_many_conditions`),
refused as soon as the clause that holds the first one too many is done,
where the text up to there parsed here (and so parses in lark's path too).

One module, though long: a recursive-descent parser is one set of mutually
recursive methods over one token stream, mirroring grammar.lark rule for rule;
a split would cut that mirror in two.
"""

from __future__ import annotations

import dataclasses
import re

from rewrite.language import ast
from rewrite.language.errors import Diagnostic, RuleError

MAX_NESTING = 32  # parser.MAX_NESTING; beyond it lark's path reports where
MAX_MATCHES = 64
MAX_CONDITIONS = 64

# Words that may follow a complete `where` clause: the next clause, the next
# item, or nothing. lark reduces the clause on seeing one of them (and only
# then), which is where its path checks the count of conditions.
_AFTER_CLAUSE = frozenset({
    "match", "where", "benefit", "rewrite", "example", "group", "assume", "rule", "dialect", "import", "class",
})


def too_many_conditions(span: ast.Span, source_line: str) -> RuleError:
    """The error for a rule's condition past `MAX_CONDITIONS`, at that condition.

    Raised while parsing, by both parsers, as soon as the `where` clause
    that holds it is complete: a rule of 20,000 conditions is refused after
    65 of them, not after all of its text is read.
    """
    message = (f"more than {MAX_CONDITIONS} conditions in one rule (counting each 'where' clause, and each part "
               f"of one that 'and' joins); expected at most {MAX_CONDITIONS}: split the rule")
    return RuleError([Diagnostic(span, message, "error", source_line)])


def nth_conjunct(expr, index: int):
    """Part `index` (from 0) of `a and b and c`, in reading order, without recursing; None past the last."""
    stack = [expr]
    while stack:
        item = stack.pop()
        if isinstance(item, ast.And):
            stack += (item.right, item.left)
        elif index == 0:
            return item
        else:
            index -= 1
    return None


class Unhandled(Exception):
    """The text is not one this parser takes; lark's parser decides what it is."""


class Declined(Unhandled):
    """`FastParser.items_from` stopped at something it does not take; `line` is
    where the item holding it starts, from where lark's parser reads on."""

    def __init__(self, line: int):
        super().__init__(f"declined in the item from line {line}")
        self.line = line


# Each match is the blanks before a token and the token (or a comment, or
# one character no terminal starts with), on one line: tokens never span
# lines, so the line a token is on is the line scanned.
_TOKEN = re.compile(
    r"([ \t\f\r]*)"
    r"(#[^\n]*"
    r"|%[A-Za-z_][A-Za-z0-9_]*"
    r"|[0-9]+\.[0-9]*(?:[eE][-+]?[0-9]+)?|[0-9]+[eE][-+]?[0-9]+|[0-9]+"
    r"|[A-Za-z_][A-Za-z0-9_]*"
    r'|"[^"\n]*"'
    r"|\.\.\.|->|==|!=|<=|>=|[<>=()\[\],:|+\-*/?]"
    r"|.)"
)
# A token's kind by its first character; punctuation is its own kind.
_FIRST = {
    **dict.fromkeys("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ_", "NAME"),
    **dict.fromkeys("0123456789", "number"),
    "%": "VAR", '"': "STRING", "#": "comment",
}
_PUNCTUATION = frozenset(["...", "->", "==", "!=", "<=", ">=", *"<>=()[],:|+-*/?"])

_COMPARE = frozenset({"==", "!=", "<=", ">=", "<", ">"})
# Words that are keywords where an expression may start (and a NAME too).
_EXPRESSION_KEYWORDS = frozenset({"not", "forall", "exists", "every", "true", "false"})
_CLAUSES = frozenset({"match", "where", "benefit", "rewrite", "example", "group", "assume"})
_STATEMENTS = frozenset({"input", "output", "opset"})

_END = ("$END", "", (0, 0), (0, 0))
# The kind of a token no terminal of the grammar starts with.
BAD = "BAD"


def tokenize(lines: list[str], first_line: int = 1, words: dict | None = None) -> list[tuple]:
    """(kind, text, (line, column), (line, end column)) for each token of `lines`, then an end marker.

    kind is VAR, FLOAT, INT, NAME, STRING, the punctuation itself, or `BAD`
    for a character no terminal starts with. Each
    distinct text is one string (through `words`): names and keywords recur
    all over a large file, and the AST keeps them.
    """
    tokens: list[tuple] = []
    append = tokens.append
    findall = _TOKEN.findall
    first_kind = _FIRST.get
    if words is None:
        words = {}
    shared = words.setdefault
    for number, line in enumerate(lines, first_line):
        column = 1
        # Blanks that end a line precede no token (a "\r" before "\n" is one).
        for blank, value in findall(line.rstrip(" \t\f\r")):
            column += len(blank)
            end = column + len(value)
            kind = first_kind(value[0])
            if kind is None:
                # A character no token starts with is a token no parse
                # function takes: the parse stops there, at the item it is
                # in, and not before the items ahead of it are read.
                kind = value if value in _PUNCTUATION else BAD
            elif kind == "number":
                kind = "FLOAT" if "." in value or "e" in value or "E" in value else "INT"
            elif kind == "comment":
                column = end
                continue
            elif len(value) == 1 and kind != "NAME":  # `%` or `"` alone: no VAR, no STRING
                kind = BAD
            value = shared(value, value)
            append((kind, value, (number, column), (number, end)))
            column = end
    append(_END)
    return tokens


# Items start where a line starts with one of these words (`rule r ...`).
_ITEM_LINE = re.compile(r"(?:rule|class|import|dialect)(?:[ \t\f\r]|$)")
# About this many lines are tokenized at a time (see `chunks`).
CHUNK_LINES = 2000


def chunks(lines: list[str], size: int = CHUNK_LINES, start: int = 0):
    """`lines[start:]` in pieces of about `size` lines, each cut where a line starts an item:
    (first line, lines), the first line counted from 1 for `lines[0]`.

    Tokens are held a piece at a time: all of a 5 MB file's would take some
    hundreds of MB. Parsing piece after piece builds what parsing the whole
    builds, as long as every piece parses: a line that starts with `rule`
    starts an item wherever a complete item could end before it (there no
    NAME may come, so the word is the keyword), and the grammar is a
    sequence of items. A cut elsewhere leaves a piece that does not parse,
    and then lark parses from the item the piece ends in.
    """
    while start < len(lines):
        end = min(start + size, len(lines))
        while end < len(lines) and not _ITEM_LINE.match(lines[end]):
            end += 1
        yield start + 1, lines[start:end]
        start = end


def _maker(cls):
    """A constructor for the frozen dataclass `cls` that fills its `__dict__` at once.

    A frozen dataclass's `__init__` stores each field through
    `object.__setattr__`, about 1 µs a node; a file of 8,000 rules has a
    million nodes and spans. Equality, hashing, `repr` and `replace` read
    and build through the dataclass as usual, so the objects are the same.
    """
    names = [f.name for f in dataclasses.fields(cls)]
    defaults = {
        f.name: f.default for f in dataclasses.fields(cls) if f.default is not dataclasses.MISSING
    }
    parameters = ", ".join(f"{name}=_d_{name}" if name in defaults else name for name in names)
    body = ", ".join(f"{name!r}: {name}" for name in names)
    namespace = {"_new": object.__new__, "_set": object.__setattr__, "_cls": cls}
    namespace.update({f"_d_{name}": value for name, value in defaults.items()})
    code = f"def make({parameters}):\n    o = _new(_cls)\n    _set(o, '__dict__', {{{body}}})\n    return o\n"
    exec(code, namespace)  # noqa: S102 - code built from the dataclass's own field names
    return namespace["make"]


_Span = _maker(ast.Span)
_Wildcard, _Bind, _Operand, _OpPattern = map(_maker, (ast.Wildcard, ast.Bind, ast.Operand, ast.OpPattern))
_Literal, _ValueRef, _NameRef, _ListExpr = map(_maker, (ast.Literal, ast.ValueRef, ast.NameRef, ast.ListExpr))
_TupleExpr, _Conditional, _Comprehension = map(_maker, (ast.TupleExpr, ast.Conditional, ast.Comprehension))
_TupleComprehension = _maker(ast.TupleComprehension)
_Index, _Arithmetic, _Compare, _And, _Or = map(_maker, (ast.Index, ast.Arithmetic, ast.Compare, ast.And, ast.Or))
_Not, _SameValue, _Matches, _Call = map(_maker, (ast.Not, ast.SameValue, ast.Matches, ast.Call))
_Quantifier, _EveryUse, _Argument = map(_maker, (ast.Quantifier, ast.EveryUse, ast.Argument))
_OpBuild, _Rebuild, _BuildAction, _ReplaceAction = map(
    _maker, (ast.OpBuild, ast.Rebuild, ast.BuildAction, ast.ReplaceAction)
)
_MatchClause, _Condition, _Example, _Group, _Assume = map(
    _maker, (ast.MatchClause, ast.Condition, ast.Example, ast.Group, ast.Assume))
_ExampleInput, _ExampleOp, _ExampleOutput, _ExampleOpset = map(
    _maker, (ast.ExampleInput, ast.ExampleOp, ast.ExampleOutput, ast.ExampleOpset)
)
_Rule, _OpClass, _Import, _RuleFile = map(_maker, (ast.Rule, ast.OpClass, ast.Import, ast.RuleFile))

# Binding powers of the infix operators (`?or_expr` ... `?product` in
# grammar.lark); a prefix `not` binds its operand at COMPARISON, and `-` at
# UNARY.
OR, AND, COMPARISON, SUM, PRODUCT, UNARY = 1, 2, 3, 4, 5, 6
_INFIX = {"+": SUM, "-": SUM, "*": PRODUCT, "/": PRODUCT, "==": COMPARISON, "!=": COMPARISON,
          "<=": COMPARISON, ">=": COMPARISON, "<": COMPARISON, ">": COMPARISON}
_WORD_INFIX = {"or": OR, "and": AND, "is": COMPARISON}


class FastParser:
    def __init__(self, text: str, path: str, source_lines: list[str]):
        self.path = path
        self.text = text
        self.lines = source_lines
        # Lines as the tokenizer reads them, with any "\r" (which it skips as a blank).
        self.raw_lines = text.split("\n")
        self.words: dict[str, str] = {}
        self.tokens: list[tuple] = [_END]
        self.position = 0

    # ---- tokens

    def take(self) -> tuple:
        token = self.tokens[self.position]
        self.position += 1
        return token

    def expect(self, kind: str) -> tuple:
        token = self.tokens[self.position]
        if token[0] != kind:
            raise Unhandled(kind)
        self.position += 1
        return token

    def keyword(self, word: str) -> tuple:
        token = self.tokens[self.position]
        if token[1] != word or token[0] != "NAME":
            raise Unhandled(word)
        self.position += 1
        return token

    def at_keyword(self, word: str) -> bool:
        token = self.tokens[self.position]
        return token[1] == word and token[0] == "NAME"

    def span(self, start: tuple, end: tuple) -> ast.Span:
        return _Span(self.path, start[0], start[1], end[0], end[1])

    def token_span(self, token: tuple) -> ast.Span:
        start, end = token[2], token[3]
        return _Span(self.path, start[0], start[1], end[0], end[1])

    def integer(self, token: tuple) -> int:
        if len(token[1]) > 30:
            raise Unhandled("integer literal too large")  # lark's path says so
        return int(token[1])

    # ---- top level

    def parse(self) -> ast.RuleFile:
        """The whole text's AST; `Unhandled` (a `Declined`) for anything it does not take."""
        items: list = []
        self.items_from(1, items)
        return build_file(self.path, items)

    def items_from(self, first_line: int, items: list) -> None:
        """Append the items of the text from line `first_line` on to `items` (see `build_file`).

        Raises `Declined` at the first thing this parser does not take, with
        the line where the item holding it starts (the last line at or before
        it that starts with an item word and that no item spans), and with
        `items` cut back to what came before that line; or the `RuleError`
        of too many conditions. parser.py recovers from either there.
        """
        lines = self.raw_lines
        self.tokens, self.position = [_END], 0
        pieces = chunks(lines, CHUNK_LINES, start=first_line - 1)  # the size read now: tests make it small
        words = self.words
        region, mark = first_line, len(items)
        append = items.append
        try:
            while True:
                token = self.tokens[self.position]
                kind, value = token[0], token[1]
                if kind == "$END":
                    piece = next(pieces, None)
                    if piece is None:
                        return
                    self.tokens, self.position = tokenize(piece[1], piece[0], words), 0
                    continue
                tokens = self.tokens
                if kind != "NAME":
                    raise Unhandled("an item")
                line, column = token[2]
                if column == 1 and _ITEM_LINE.match(lines[line - 1]):
                    region, mark = line, len(items)
                if value == "rule":
                    append(self.rule())
                elif value == "dialect":
                    self.position += 1
                    name = self.expect("NAME")
                    append(("dialect", name[1], self.token_span(name)))
                elif value == "import":
                    append(self.import_decl())
                elif value == "class":
                    self.position += 1
                    name = self.expect("NAME")
                    self.expect("=")
                    members = [self.expect("NAME")[1]]
                    while tokens[self.position][0] == "|":
                        self.position += 1
                        members.append(self.expect("NAME")[1])
                    append(_OpClass(name[1], tuple(members), self.token_span(name)))
                else:
                    raise Unhandled("an item")
        except (Unhandled, RecursionError, IndexError):
            # IndexError: the end marker stops every loop first; RecursionError:
            # nesting too deep for this parser, which lark's path measures.
            del items[mark:]
            raise Declined(region) from None

    def import_decl(self) -> ast.Import:
        start = self.take()[2]
        if self.tokens[self.position][0] == "STRING":
            path = self.take()
            return _Import(path[1][1:-1], None, self.span(start, path[3]))
        names = [self.expect("NAME")[1]]
        while self.tokens[self.position][0] == ",":
            self.position += 1
            names.append(self.expect("NAME")[1])
        self.keyword("from")
        path = self.expect("STRING")
        return _Import(path[1][1:-1], tuple(names), self.span(start, path[3]))

    def rule(self) -> dict:
        self.position += 1
        name = self.expect("NAME")
        description = self.expect("STRING")
        matches, conditions, actions, examples, groups, assumptions = [], [], [], [], [], []
        benefit = 0
        counted = 0  # conditions so far, each part of a `where` that `and` joins one
        tokens = self.tokens
        while True:
            token = tokens[self.position]
            word = token[1]
            if token[0] != "NAME" or word not in _CLAUSES:
                break
            if word == "where":
                condition, height = self.where_clause()
                conditions.append(condition)
                parts = _count_conjuncts(condition.expr)
                if counted + parts > MAX_CONDITIONS:
                    following = tokens[self.position]
                    if following[0] != "$END" and (following[0] != "NAME" or following[1] not in _AFTER_CLAUSE):
                        raise Unhandled("too many conditions, then not a clause")  # lark words what comes first
                    span = nth_conjunct(condition.expr, MAX_CONDITIONS - counted).span
                    raise too_many_conditions(span, self.lines[span.line - 1])
                _check(height)
                counted += parts
            elif word == "match":
                matches.append(self.match_clause())
            elif word == "rewrite":
                self.position += 1
                actions.append(self.action())
                while tokens[self.position][0] == "VAR":
                    actions.append(self.action())
            elif word == "benefit":
                self.position += 1
                benefit = self.integer(self.expect("INT"))
            elif word == "group":
                groups.append(self.group_clause(_Group))
            elif word == "assume":
                assumptions.append(self.group_clause(_Assume))
            else:
                examples.append(self.example())
        if len(matches) > MAX_MATCHES:
            raise Unhandled("too many match clauses")
        return {
            "name": name[1], "description": description[1][1:-1], "matches": tuple(matches),
            "conditions": tuple(conditions), "actions": tuple(actions), "benefit": benefit,
            "span": self.token_span(name), "examples": tuple(examples), "groups": tuple(groups),
            "assumptions": tuple(assumptions),
        }

    def group_clause(self, make):
        """`group a, b` or `assume a, b`: a keyword, then names joined by commas."""
        start = self.take()[2]
        names = [self.expect("NAME")]
        while self.tokens[self.position][0] == ",":
            self.position += 1
            names.append(self.expect("NAME"))
        return make(
            tuple(name[1] for name in names), self.span(start, names[-1][3]),
            tuple(self.token_span(name) for name in names),
        )

    def match_clause(self) -> ast.MatchClause:
        self.position += 1
        token = self.tokens[self.position]
        if token[0] == "VAR":
            self.position += 1
            self.expect("=")
            pattern, height, _ = self.op_pattern(self.expect("NAME"))
            _check(height)
            return _MatchClause(token[1], pattern, self.token_span(token))
        if token[0] == "NAME" and token[1] == "_":
            self.position += 1
            self.expect("=")
        pattern, height, _ = self.op_pattern(self.expect("NAME"))
        _check(height)
        return _MatchClause(ast.UNNAMED_ANCHOR, pattern, pattern.span)

    def where_clause(self) -> tuple[ast.Condition, int]:
        """The clause and its height: checked against `MAX_NESTING` after its
        conditions are counted, as lark's path counts them during its parse
        and measures nesting after it."""
        start = self.take()[2]
        expr, height, _, end = self.expr()
        return _Condition(expr, self.text_between(start, end)[len("where"):].strip(), self.span(start, end)), height

    def text_between(self, start: tuple, end: tuple) -> str:
        """What `_ToAst._text` gives for a node from `start` to `end` (lines joined by spaces)."""
        if start[0] == end[0]:
            return self.lines[start[0] - 1][start[1] - 1 : end[1] - 1]
        lines = self.lines[start[0] - 1 : end[0]]
        lines[0] = lines[0][start[1] - 1 :]
        lines[-1] = lines[-1][: end[1] - 1]
        return " ".join(line.strip() for line in lines)

    # ---- patterns

    def op_pattern(self, name: tuple) -> tuple:
        """`name(operands) [in any order]`, its name already taken: (pattern, height, end)."""
        self.expect("(")
        tokens = self.tokens
        operands = []
        height = 0
        if tokens[self.position][0] != ")":
            while True:
                operand, operand_height = self.operand()
                operands.append(operand)
                if operand_height > height:
                    height = operand_height
                if tokens[self.position][0] != ",":
                    break
                self.position += 1
        end = self.expect(")")[3]
        any_order = False
        if self.at_keyword("in"):
            self.position += 1
            self.keyword("any")
            end = self.keyword("order")[3]
            any_order = True
        return _OpPattern(name[1], tuple(operands), any_order, self.token_span(name), frozenset()), height + 1, end

    def operand(self) -> tuple:
        tokens = self.tokens
        token = tokens[self.position]
        kind = token[0]
        following = tokens[self.position + 1][0]
        if kind == "NAME" and following == "=" and token[1] != "_":
            self.position += 2
            value = tokens[self.position]
            if value[0] == "VAR" and tokens[self.position + 1][0] == "?":
                self.position += 2
                bind = _Bind(value[1], None, self.token_span(value))
                return _Operand(token[1], bind, False, self.token_span(token), True), 0
            if value[0] == "(":
                raise Unhandled("a tuple pattern")  # lark's path words the refusal
            pattern, height, _, _ = self.value_pattern()
            return _Operand(token[1], pattern, False, self.token_span(token), False), height
        if kind == "VAR" and following == "...":
            self.position += 2
            span = self.token_span(token)
            return _Operand(None, _Bind(token[1], None, span), True, span, False), 0
        pattern, height, start, end = self.value_pattern()
        return _Operand(None, pattern, False, self.span(start, end), False), height

    def value_pattern(self) -> tuple:
        token = self.take()
        kind = token[0]
        if kind == "VAR":
            if self.tokens[self.position][0] == "=":
                self.position += 1
                pattern, height, end = self.op_pattern(self.expect("NAME"))
                return _Bind(token[1], pattern, self.token_span(token)), height, token[2], end
            return _Bind(token[1], None, self.token_span(token)), 0, token[2], token[3]
        if kind == "NAME":
            if token[1] == "_":
                return _Wildcard(self.token_span(token)), 0, token[2], token[3]
            pattern, height, end = self.op_pattern(token)
            return pattern, height, token[2], end
        raise Unhandled("a value pattern")

    # ---- expressions: each returns (node, height, start, end), where start
    # and end take in the parentheses around the node, if any

    def expr(self) -> tuple:
        then = self.binary(OR)
        token = self.tokens[self.position]
        if token[1] != "if" or token[0] != "NAME":
            return then
        self.position += 1
        condition = self.binary(OR)
        self.keyword("else")
        otherwise = self.expr()
        node = _Conditional(condition[0], then[0], otherwise[0], self.span(then[2], otherwise[3]))
        return node, 1 + max(then[1], condition[1], otherwise[1]), then[2], otherwise[3]

    def binary(self, floor: int) -> tuple:
        """An expression of operators binding at `floor` or tighter (precedence climbing)."""
        left = self.prefix(floor)
        tokens = self.tokens
        compared = False
        while True:
            token = tokens[self.position]
            kind = token[0]
            if kind == "NAME":
                power = _WORD_INFIX.get(token[1])
            else:
                power = _INFIX.get(kind)
            if power is None or power < floor:
                return left
            if power == COMPARISON:
                if compared:
                    raise Unhandled("a chained comparison")  # the grammar has none
                compared = True
                left = self.comparison(left, token)
                continue
            self.position += 1
            right = self.binary(power + 1)
            start, end = left[2], right[3]
            span = _Span(self.path, start[0], start[1], end[0], end[1])
            if kind == "NAME":
                node = (_Or if power == OR else _And)(left[0], right[0], span)
            else:
                node = _Arithmetic(kind, left[0], right[0], span)
            height = left[1] if left[1] > right[1] else right[1]
            left = node, height + 1, start, end

    def comparison(self, left: tuple, token: tuple) -> tuple:
        self.position += 1
        if token[0] != "NAME":
            right = self.binary(SUM)
            node = _Compare(token[1], left[0], right[0], self.span(left[2], right[3]))
            return node, 1 + max(left[1], right[1]), left[2], right[3]
        negated = False
        if self.at_keyword("not"):
            self.position += 1
            negated = True
        target = self.take()
        if target[0] == "VAR":
            node = _SameValue(left[0], target[1], negated, self.span(left[2], target[3]))
            return node, 1 + left[1], left[2], target[3]
        if target[0] != "NAME":
            raise Unhandled("a value or an op pattern after 'is'")
        pattern, height, end = self.op_pattern(target)
        node = _Matches(left[0], pattern, negated, self.span(left[2], end))
        return node, 1 + max(left[1], height), left[2], end

    def prefix(self, floor: int) -> tuple:
        """What an operand starts with: `not`, a quantifier, `-`, or an atom with its indexes."""
        tokens = self.tokens
        token = tokens[self.position]
        kind = token[0]
        if kind == "NAME" and token[1] in _EXPRESSION_KEYWORDS:
            word = token[1]
            if word == "true" or word == "false":
                self.position += 1
                return self.postfix((_Literal(word == "true", self.token_span(token)), 0, token[2], token[3]))
            if floor > COMPARISON:
                # lark takes the word for a NAME here; let it decide.
                raise Unhandled("a keyword where an atom must be")
            self.position += 1
            if word == "not":
                operand = self.binary(COMPARISON)
                return _Not(operand[0], self.span(token[2], operand[3])), 1 + operand[1], token[2], operand[3]
            if word == "every":
                self.keyword("use")
                variable = self.expect("VAR")
                self.keyword("of")
                of = self.expect("VAR")
                self.expect(":")
                body = self.expr()
                node = _EveryUse(variable[1], of[1], body[0], self.span(token[2], body[3]))
                return node, 1 + body[1], token[2], body[3]
            return self.quantifier(word, token[2])
        if kind == "-":
            self.position += 1
            operand = self.binary(UNARY)
            span = self.span(token[2], operand[3])
            number = operand[0].value if type(operand[0]) is ast.Literal else None
            if isinstance(number, (int, float)) and type(number) is not bool:
                return _Literal(-number, span), operand[1], token[2], operand[3]  # parser.negate
            return _Arithmetic("-", _Literal(0, span), operand[0], span), 1 + operand[1], token[2], operand[3]
        return self.postfix(self.atom())

    def quantifier(self, kind: str, start: tuple) -> tuple:
        variable = self.expect("NAME")
        self.keyword("in")
        domain = self.binary(OR)
        height = domain[1]
        condition_filter = None
        if self.at_keyword("where"):
            self.position += 1
            filtered = self.binary(OR)
            condition_filter = filtered[0]
            height = max(height, filtered[1])
        self.expect(":")
        body = self.expr()
        node = _Quantifier(kind, variable[1], domain[0], condition_filter, body[0], self.span(start, body[3]))
        return node, 1 + max(height, body[1]), start, body[3]

    def postfix(self, base: tuple) -> tuple:
        tokens = self.tokens
        while tokens[self.position][0] == "[":
            self.position += 1
            position = self.expr()
            end = self.expect("]")[3]
            node = _Index(base[0], position[0], self.span(base[2], end))
            base = node, 1 + max(base[1], position[1]), base[2], end
        return base

    def atom(self) -> tuple:
        tokens = self.tokens
        token = tokens[self.position]
        self.position += 1
        kind = token[0]
        if kind == "VAR":
            return _ValueRef(token[1], self.token_span(token)), 0, token[2], token[3]
        if kind == "NAME":
            if tokens[self.position][0] == "(":
                return self.call(token)
            return _NameRef(token[1], self.token_span(token)), 0, token[2], token[3]
        if kind == "INT":
            return _Literal(self.integer(token), self.token_span(token)), 0, token[2], token[3]
        if kind == "FLOAT":
            return _Literal(float(token[1]), self.token_span(token)), 0, token[2], token[3]
        if kind == "STRING":
            return _Literal(token[1][1:-1], self.token_span(token)), 0, token[2], token[3]
        if kind == "(":
            inner = self.expr()
            end = self.expect(")")[3]
            return inner[0], inner[1], token[2], end  # spans its parentheses for its parent
        if kind == "[":
            return self.list_or_comprehension(token)
        raise Unhandled("an atom")

    def call(self, name: tuple) -> tuple:
        self.position += 1
        tokens = self.tokens
        positional, keywords = [], []
        height = 0
        if tokens[self.position][0] != ")":
            while True:
                token = tokens[self.position]
                if (token[0] == "NAME" and tokens[self.position + 1][0] == "="
                        and token[1] not in _EXPRESSION_KEYWORDS):
                    self.position += 2
                    value = self.expr()
                    keywords.append((token[1], value[0]))
                else:
                    value = self.expr()
                    positional.append(value[0])
                if value[1] > height:
                    height = value[1]
                if tokens[self.position][0] != ",":
                    break
                self.position += 1
        end = self.expect(")")[3]
        node = _Call(name[1], tuple(positional), tuple(keywords), self.span(name[2], end))
        return node, height + 1, name[2], end

    def list_or_comprehension(self, bracket: tuple) -> tuple:
        tokens = self.tokens
        if tokens[self.position][0] == "]":
            end = self.take()[3]
            return _ListExpr((), self.span(bracket[2], end)), 1, bracket[2], end
        first = self.expr()
        if self.at_keyword("for"):
            variable, domain, keep, height = self.comprehension_tail(first)
            end = self.expect("]")[3]
            node = _Comprehension(first[0], variable, domain, keep, self.span(bracket[2], end))
            return node, height + 1, bracket[2], end
        items = [first[0]]
        height = first[1]
        while tokens[self.position][0] == ",":
            self.position += 1
            item = self.expr()
            items.append(item[0])
            if item[1] > height:
                height = item[1]
        end = self.expect("]")[3]
        return _ListExpr(tuple(items), self.span(bracket[2], end)), height + 1, bracket[2], end

    # ---- rewrites

    def action(self) -> ast.BuildAction | ast.ReplaceAction:
        target = self.expect("VAR")
        kind = self.take()[0]
        if kind == "=":
            build, height = self.op_build(self.expect("NAME"))
            _check(height)
            return _BuildAction(target[1], build, self.token_span(target))
        if kind != "->":
            raise Unhandled("an action")
        token = self.take()
        if token[0] == "NAME":
            build, height = self.op_build(token)
            _check(height)
            return _ReplaceAction(target[1], build, self.token_span(target), None)
        if token[0] != "VAR":
            raise Unhandled("an action")
        if self.at_keyword("with"):
            self.position += 1
            arguments, height = self.build_arguments()
            _check(height)
            rebuild = _Rebuild(token[1], tuple(arguments), self.token_span(token))
            return _ReplaceAction(target[1], rebuild, self.token_span(target), None)
        source = _ValueRef(token[1], self.token_span(token))
        if self.tokens[self.position][0] == "[":  # `%old -> %items[i]`
            self.position += 1
            position = self.expr()
            end = self.expect("]")[3]
            _check(1 + position[1])
            element = _Index(source, position[0], self.span(token[2], end))
            return _ReplaceAction(target[1], element, self.token_span(target), None)
        within = None
        if self.at_keyword("in"):
            self.position += 1
            within = self.expect("VAR")[1]
        return _ReplaceAction(target[1], source, self.token_span(target), within)

    def op_build(self, name: tuple) -> tuple:
        self.expect("(")
        arguments, height = [], 0
        if self.tokens[self.position][0] != ")":
            arguments, height = self.build_arguments()
        self.expect(")")
        return _OpBuild(name[1], tuple(arguments), self.token_span(name)), height + 1

    def build_arguments(self) -> tuple:
        tokens = self.tokens
        arguments, height = [], 0
        while True:
            name = self.expect("NAME")
            self.expect("=")
            if tokens[self.position][0] == "(":
                value, value_height = self.parenthesized_or_tuple()
            else:
                value, value_height = self.expr()[:2]
            arguments.append(_Argument(name[1], value, self.token_span(name)))
            if value_height > height:
                height = value_height
            if tokens[self.position][0] != ",":
                return arguments, height
            self.position += 1

    def parenthesized_or_tuple(self) -> tuple:
        """After `name=`: `(expr)` as an expression (with what may follow it), or a tuple `(a, b)`."""
        tokens = self.tokens
        opening = tokens[self.position]
        saved = self.position
        self.position += 1
        first = self.expr()
        if self.at_keyword("for"):
            return self.tuple_comprehension(opening, first)
        if tokens[self.position][0] != ",":
            # Only a parenthesized expression: parse it again as one, so that
            # `(a) + b` goes on past the parenthesis as lark's grammar does.
            self.position = saved
            return self.expr()[:2]
        items = [first[0]]
        height = first[1]
        self.position += 1
        while tokens[self.position][0] != ")":
            item = self.expr()
            items.append(item[0])
            height = max(height, item[1])
            if tokens[self.position][0] != ",":
                break
            self.position += 1
        self.expect(")")
        span = _Span(self.path, opening[2][0], opening[2][1], 0, 0)  # where `(` is, as lark's path gives it
        return _TupleExpr(tuple(items), span), height

    def comprehension_tail(self, first: tuple) -> tuple:
        """`for name in domain [if keep]` after a comprehension's item: (name, domain, keep, height)."""
        self.position += 1
        variable = self.expect("NAME")
        self.keyword("in")
        domain = self.binary(OR)
        height = max(first[1], domain[1])
        keep = None
        if self.at_keyword("if"):
            self.position += 1
            kept = self.binary(OR)
            keep = kept[0]
            height = max(height, kept[1])
        return variable[1], domain[0], keep, height

    def tuple_comprehension(self, opening: tuple, first: tuple) -> tuple:
        """`(item for name in domain [if keep])` after `name=`, the item already read."""
        variable, domain, keep, height = self.comprehension_tail(first)
        self.expect(")")
        span = _Span(self.path, opening[2][0], opening[2][1], 0, 0)  # where `(` is, as lark's path gives it
        comprehension = _Comprehension(first[0], variable, domain, keep, span)
        return _TupleComprehension(comprehension, span), height + 1

    # ---- examples

    def example(self) -> ast.Example:
        start = self.take()[2]
        description = self.expect("STRING")
        statements = [self.statement()[0]]
        while self.at_statement():
            statements.append(self.statement()[0])
        token = self.take()
        if token[0] != "NAME":
            raise Unhandled("an example's outcome")
        expected: tuple | None
        if token[1] == "unchanged":
            expected, end = None, token[3]
        elif token[1] == "becomes":
            statement, end = self.statement()
            outcome = [statement]
            while self.at_statement():
                statement, end = self.statement()
                outcome.append(statement)
            expected = tuple(outcome)
        else:
            raise Unhandled("an example's outcome")
        return _Example(description[1][1:-1], tuple(statements), expected, self.span(start, end))

    def at_statement(self) -> bool:
        token = self.tokens[self.position]
        return token[0] == "VAR" or (token[0] == "NAME" and token[1] in _STATEMENTS)

    def statement(self) -> tuple:
        """One example statement and where it ends."""
        token = self.take()
        if token[0] == "VAR":
            self.expect("=")
            name = self.expect("NAME")
            build, height = self.op_build(name)
            _check(height)
            return _ExampleOp(token[1], build, self.token_span(token)), self.tokens[self.position - 1][3]
        word = token[1] if token[0] == "NAME" else ""
        if word == "input":
            var = self.expect("VAR")
            self.expect(":")
            dtype = self.expect("NAME")
            self.expect("[")
            dims = []
            if self.tokens[self.position][0] != "]":
                while True:
                    dim = self.take()
                    if dim[0] == "INT":
                        dims.append(self.integer(dim))
                    elif dim[0] == "NAME":
                        dims.append(dim[1])
                    else:
                        raise Unhandled("a dim")
                    if self.tokens[self.position][0] != ",":
                        break
                    self.position += 1
            end = self.expect("]")[3]
            return _ExampleInput(var[1], dtype[1], tuple(dims), self.token_span(var)), end
        if word == "output":
            names = [self.expect("VAR")]
            while self.tokens[self.position][0] == ",":
                self.position += 1
                names.append(self.expect("VAR"))
            end = names[-1][3]
            return _ExampleOutput(tuple(n[1] for n in names), self.span(token[2], end)), end
        if word == "opset":
            value = self.take()
            if value[0] == "INT":
                opset = self.integer(value)
            elif value[0] == "NAME":
                opset = value[1]
            else:
                raise Unhandled("an opset")
            return _ExampleOpset(opset, self.span(token[2], value[3])), value[3]
        raise Unhandled("an example statement")


def _check(height: int) -> None:
    if height > MAX_NESTING:
        raise Unhandled("nesting too deep")  # lark's path points at where


def _count_conjuncts(expr) -> int:
    count, stack = 0, [expr]
    while stack:
        item = stack.pop()
        if isinstance(item, ast.And):
            stack.append(item.left)
            stack.append(item.right)
        else:
            count += 1
    return count


def parse_fast(text: str, path: str, lines: list[str]) -> ast.RuleFile:
    """The AST of `text`, as `parser._parse` builds it; raises `Unhandled` for lark's parser to decide."""
    return FastParser(text, path, lines).parse()


def build_file(path: str, items: list) -> ast.RuleFile:
    """The `RuleFile` of `items` in text order, as both parsers read them: a
    ("dialect", name, span) tuple, an `Import`, an `OpClass`, or a rule (the
    fields of one, or a `Rule`), which gets the file's dialect: the last
    one declared, as lark's grammar has it."""
    dialect = dialect_span = None
    imports, classes, rules = [], [], []
    for item in items:
        kind = type(item)
        if kind is dict or kind is ast.Rule:
            rules.append(item)
        elif kind is tuple:
            dialect, dialect_span = item[1], item[2]
        elif kind is ast.Import:
            imports.append(item)
        else:
            classes.append(item)
    name = dialect or ""
    built = tuple(
        _Rule(dialect=name, **rule) if type(rule) is dict else dataclasses.replace(rule, dialect=name)
        for rule in rules
    )
    return _RuleFile(path, dialect, dialect_span, tuple(imports), tuple(classes), built)


def is_item_line(line: str) -> bool:
    """Whether a line starts with an item word, `rule r ...`: where parsing recovers after an error."""
    return _ITEM_LINE.match(line) is not None


def next_item_line(lines: list[str], after: int) -> int | None:
    """The number (from 1) of the first of `lines` after line `after` that starts an item; None if none."""
    match = _ITEM_LINE.match
    for index in range(after, len(lines)):
        if match(lines[index]):
            return index + 1
    return None
