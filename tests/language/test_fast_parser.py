"""The fast parser builds exactly lark's AST, spans included, or leaves the text to lark.

`fast_parser` is only a fast path: wherever it takes a text, the AST must be
the one lark's parser and `_ToAst` build (spans compare too, though AST
equality ignores them), and it must never take a text lark refuses.
"""

from __future__ import annotations

import ast as python_ast
import dataclasses
import random
import re
import textwrap
from pathlib import Path

import pytest

from rewrite.language import ast, fast_parser, parser
from rewrite.language.errors import RuleError, SourceText
from rewrite.language.fast_parser import Unhandled, parse_fast

REPO = Path(__file__).resolve().parents[2]


def lark_parse(text: str, path: str = "t.rules") -> ast.RuleFile:
    return parser.parse_with_lark(SourceText(path, text))


def difference(a, b, where="file") -> str | None:
    """Where two ASTs differ, spans included; None if nowhere."""
    if type(a) is not type(b):
        return f"{where}: {type(a).__name__} != {type(b).__name__}"
    if dataclasses.is_dataclass(a):
        for field in dataclasses.fields(a):
            found = difference(getattr(a, field.name), getattr(b, field.name), f"{where}.{field.name}")
            if found:
                return found
        return None
    if isinstance(a, tuple):
        if len(a) != len(b):
            return f"{where}: {len(a)} items != {len(b)}"
        for index, (x, y) in enumerate(zip(a, b)):
            found = difference(x, y, f"{where}[{index}]")
            if found:
                return found
        return None
    return None if a == b else f"{where}: {a!r} != {b!r}"


def outcome(text: str, path: str = "t.rules") -> str:
    """'same', 'left to lark' (fast declined, lark took it), 'both refuse', or what went wrong.

    Where the fast parser declines or refuses, the fast-first parse that
    loading uses (`parser._parse`: the fast parser, and lark from the item it
    stopped at) must end as lark's path alone does: the same AST, or the
    same errors, every one of them, in the same words and places.
    """
    try:
        want = lark_parse(text, path)
    except Exception as error:  # noqa: BLE001 - any refusal of lark's
        want = error
    try:
        got = parse_fast(text, path, SourceText(path, text).lines)
    except (Unhandled, RuleError) as error:
        worded = isinstance(error, RuleError)  # the one error it words itself
        try:
            combined = parser._parse(text, path)
        except RuleError as refusal:
            if isinstance(want, RuleError) and want.render() == refusal.render():
                return "both refuse"
            return f"the fast-first parse refused otherwise than lark's path: {refusal.render()!r} vs {want!r}"
        if worded:
            return "fast refused what lark's path takes"
        if isinstance(want, Exception):
            return f"the fast-first parse took what lark refuses: {want}"
        found = difference(want, combined)
        return f"the fast-first parse differs: {found}" if found else "left to lark"
    if isinstance(want, Exception):
        return f"fast took what lark refuses: {want}"
    return difference(want, got) or "same"


def shipped_texts() -> list[tuple[str, str]]:
    return [(str(p), p.read_text(encoding="utf-8")) for p in sorted((REPO / "rules").rglob("*.rules"))]


def test_texts() -> list[str]:
    """Every string constant in the tests that looks like rules text."""
    found = []
    for path in sorted((REPO / "tests").rglob("*.py")):
        if path.name == Path(__file__).name:
            continue  # its own cases include texts left to lark on purpose
        try:
            tree = python_ast.parse(path.read_text(encoding="utf-8"))
        except SyntaxError:
            continue
        for node in python_ast.walk(tree):
            if isinstance(node, python_ast.Constant) and isinstance(node.value, str) and "rule " in node.value:
                found.append(textwrap.dedent(node.value).lstrip("\n"))
    return found


test_texts.__test__ = False  # a helper, not a test


@pytest.mark.parametrize(("path", "text"), shipped_texts(), ids=lambda v: Path(v).name if "/" in str(v) else "")
def test_shipped_rules_parse_the_same(path, text):
    assert outcome(text, path) == "same"


def test_rules_texts_of_the_tests():
    results = [outcome(text) for text in test_texts()]
    assert results and set(results) <= {"same", "both refuse"}, [r for r in results if r not in ("same", "both refuse")]


EDGE_CASES = [
    # keywords where lark takes them for names
    'dialect onnx\nrule r "d"\n  match %e = Expand(input=%x, shape=_)\n  rewrite %e -> %x\n',
    'dialect mil\nrule in "d"\n  match %a = if(x=%x, in=%y)\n'
    '  where in == 1 and f(for=1, match=2) > -3\n  rewrite %a -> %x\n',
    # parentheses: a parent spans them, the child does not
    'dialect mil\nrule r "d"\n  match %a = op(x=%x)\n  where ((rank(%x)) + 1) * 2 == (3)\n'
    '  rewrite %a -> op(x=(%x), y=(1 + 2) * 3)\n',
    # a where clause over lines, with a comment inside it (kept in its text, as lark's path keeps it)
    'dialect mil\nrule r "d"\n  match %a = op(x=%x)\n  where rank(%x) == 1 # one\n'
    '     and forall i in axes(%x) where i > 0: dim(%x, i) == 1 if true else false\n'
    '  rewrite %a -> %x\n',
    # tuples, conditionals, comprehensions, quantifiers, every use, is / is not
    'dialect mil\nrule r "d"\n  match %a = op(x=%x, y=%y?) in any order\n'
    '  where every use %u of %a: %u is add(%a, %o) in any order and %o is not %a and not (%x is not mul(_, %z))\n'
    '  where [i * 2 for i in axes(%x) if i != 0][0] == -1 and [1, 2.5, "s", [true]] != []\n'
    '  rewrite %a -> %x with y=[d if is_known(d) else -1 for d in shape(%x)]\n'
    '  example "e"\n    input %x: fp32[B, 3]\n    opset 18\n    %a = op(x=%x, values=(%x, %x,))\n    output %a\n'
    '  becomes\n    %a = op(x=%x)\n',
    # CRLF line ends and tabs
    'dialect mil\r\nrule r "d"\r\n\tmatch %a = op(x=%x)\r\n\twhere 1 == 1\r\n\trewrite %a -> %x\r\n',
    # refused by both: chained comparison, trailing comma, tuple pattern, bad character
    'dialect mil\nrule r "d"\n  match %a = op(x=%x)\n  where 1 < 2 < 3\n  rewrite %a -> %x\n',
    'dialect mil\nrule r "d"\n  match %a = op(x=%x,)\n  rewrite %a -> %x\n',
    'dialect mil\nrule r "d"\n  match %a = op(x=(%x, %y))\n  rewrite %a -> %x\n',
    'dialect mil\nrule r "d"\n  match %a = op(x=%x)\n  where 1 == 1 ;\n  rewrite %a -> %x\n',
    # taken by lark only (its lexer splits `is_const` after a complete expression)
    'dialect mil\nrule r "d"\n  match %a = op(x=%x)\n  where is_const(%x) is_const(%x)\n  rewrite %a -> %x\n',
    "",
    "# only a comment\n",
]


@pytest.mark.parametrize("text", EDGE_CASES)
def test_edge_cases(text):
    assert outcome(text) in ("same", "both refuse", "left to lark")


def test_edge_cases_that_must_take_the_fast_path():
    for text in EDGE_CASES[:6]:
        assert outcome(text) == "same", text


def test_a_long_file_parses_piece_by_piece(monkeypatch):
    """Tokens are read a piece of lines at a time; pieces change nothing."""
    text = "\n\n".join(text for _, text in shipped_texts() if "dialect mil" in text)
    text = "dialect mil\n" + re.sub(r"(?m)^dialect mil\n", "", text)
    text = re.sub(r"(?m)^import .*\n", "", text)
    monkeypatch.setattr(fast_parser, "CHUNK_LINES", 7)
    assert list(fast_parser.chunks(text.split("\n"), 7))[1][0] > 1
    whole = parse_fast(text, "t.rules", SourceText("t.rules", text).lines)
    monkeypatch.setattr(fast_parser, "CHUNK_LINES", 10**9)
    assert difference(whole, parse_fast(text, "t.rules", SourceText("t.rules", text).lines)) is None
    assert difference(lark_parse(text), whole) is None


def test_a_line_starting_with_an_item_word_inside_an_item_is_left_to_lark(monkeypatch):
    monkeypatch.setattr(fast_parser, "CHUNK_LINES", 2)
    text = 'dialect mil\nrule r "d"\n  match %a = op(x=%x)\n  where f(1,\nrule) == 1\n  rewrite %a -> %x\n'
    assert outcome(text) in ("same", "left to lark")
    assert parser._parse(text, "t.rules").rules[0].conditions[0].text == "f(1, rule) == 1"


WORDS = ["not", "forall", "exists", "every", "true", "false", "in", "if", "else", "for", "is", "and", "or",
         "use", "of", "where", "match", "rewrite", "example", "becomes", "unchanged", "input", "output", "opset",
         "with", "any", "order", "_", "(", ")", "[", "]", ",", ":", "=", "->", "...", "?", "-", "+", "*", "/",
         "==", "<", "%z", "x", "1", "1.5", '"s"', "\n", "|", "1e3", "rule", "class"]
_TOKEN = re.compile(r'%\w+|[0-9]+\.[0-9]*|[0-9]+|\w+|"[^"\n]*"|\.\.\.|->|==|!=|<=|>=|[<>=()\[\],:|+\-*/?]|\s+|#[^\n]*')


@pytest.mark.parametrize("seed", range(3))
def test_mutated_rules_never_parse_differently(seed):
    """Rules with a few tokens deleted, inserted, swapped or replaced: never a different AST."""
    rng = random.Random(seed)
    seeds = []
    for _, text in shipped_texts():
        head, *rules = re.split(r"(?m)^(?=rule )", text)
        seeds += [head + rule for rule in rules]
    for _ in range(150):
        tokens = _TOKEN.findall(rng.choice(seeds))
        kind = rng.randrange(4)
        for _ in range(rng.randint(1, 3)):
            index = rng.randrange(len(tokens))
            if kind == 0:
                del tokens[index]
            elif kind == 1:
                tokens.insert(index, rng.choice(WORDS) + " ")
            elif kind == 2 and index + 2 < len(tokens):
                tokens[index], tokens[index + 2] = tokens[index + 2], tokens[index]
            else:
                tokens[index] = rng.choice(WORDS)
        text = "".join(tokens)
        assert outcome(text) in ("same", "both refuse", "left to lark"), text


def test_loading_the_shipped_library_never_needs_lark(monkeypatch):
    import rewrite

    monkeypatch.setattr(parser, "_PARSED", {})

    def refuse():
        raise AssertionError("lark was asked to parse a well-formed file")

    monkeypatch.setattr(parser, "grammar_parser", refuse)
    assert rewrite.load_rules().rules


# ------------------------------------------------------------ the cap on conditions, while parsing

_WHERES = 'dialect onnx\nrule r "d"\n  match %y = Relu(X=%x)\n'
_CAP = fast_parser.MAX_CONDITIONS


def _wheres(count: int, after: str = "  rewrite %y -> %x\n") -> str:
    return _WHERES + "".join(f"  where rank(%x) == {i}\n" for i in range(count)) + after


CAPPED = {
    "then a clause": _wheres(_CAP + 1),
    "then the end": _wheres(_CAP + 1, after=""),
    "then another rule": _wheres(_CAP + 1, after='rule s "d" match %y = Relu(X=%x) rewrite %y -> %x\n'),
    "then a syntax error in a clause": _wheres(_CAP + 1, after="  rewrite rewrite ) )\n"),
    "within one where": _WHERES + "  where " + " and ".join(f"({i} == {i})" for i in range(2 * _CAP)) + "\n",
    "parenthesized and": _WHERES + "  where " + " and ".join("(true and true)" for _ in range(_CAP)) + "\n",
    "after a clause too deep": _WHERES + "  where " + "not " * 40 + "true\n" + _wheres(_CAP)[len(_WHERES):],
}
# The clause past the cap is followed by what lark does not reduce it before: its syntax error comes first.
NOT_CAPPED_FIRST = {
    "then a stray parenthesis": _wheres(_CAP + 1)[:-len("  rewrite %y -> %x\n")] + "  ) rewrite %y -> %x\n",
    "then a bad character": _wheres(_CAP + 1, after="  @\n"),
}


def _refused_alike(text: str) -> RuleError:
    """The errors of `text`, which both ways of parsing report alike."""
    assert outcome(text) == "both refuse"
    with pytest.raises(RuleError) as raised:
        parser._parse(text, "t.rules")
    return raised.value


@pytest.mark.parametrize("case", sorted(CAPPED))
def test_too_many_conditions_are_refused_alike_by_both_parsers(case):
    refusal = _refused_alike(CAPPED[case])
    (diagnostic,) = refusal.diagnostics
    assert diagnostic.message.startswith(f"more than {_CAP} conditions in one rule")
    assert f"expected at most {_CAP}" in diagnostic.message
    assert refusal.render().splitlines()[0].startswith(f"t.rules:{diagnostic.span.line}:{diagnostic.span.column}:")


@pytest.mark.parametrize("case", sorted(NOT_CAPPED_FIRST))
def test_a_syntax_error_right_after_the_clause_past_the_cap_is_reported_instead(case):
    assert "unexpected" in _refused_alike(NOT_CAPPED_FIRST[case]).diagnostics[0].message


def test_the_cap_is_found_while_parsing_not_after(monkeypatch):
    """20,000 conditions: refused at the 65th, by the fast parser alone, and the text
    after it is never parsed (a syntax error there is not what is reported)."""
    monkeypatch.setattr(parser, "_PARSED", {})

    def refuse():
        raise AssertionError("lark was asked")

    many = _wheres(20_000, after="  rewrite rewrite ) )\n")
    one = _WHERES + "  where " + " and ".join(f"rank(%x) == {i}" for i in range(20_000)) + "\n  rewrite rewrite ) )\n"
    monkeypatch.setattr(parser, "grammar_parser", refuse)
    for text, (line, column) in ((many, (4 + _CAP, 9)), (one, (4, 9 + sum(len(f"rank(%x) == {i} and ")
                                                                               for i in range(_CAP))))):
        with pytest.raises(RuleError) as raised:
            parser._parse(text, "t.rules")
        (diagnostic,) = raised.value.diagnostics
        assert (diagnostic.span.line, diagnostic.span.column) == (line, column)
        assert diagnostic.message.startswith(f"more than {_CAP} conditions")
    # lark's path stops there too: what comes after the clause is never read.
    monkeypatch.undo()
    with pytest.raises(RuleError) as raised:
        lark_parse(_wheres(_CAP + 1, after="  rewrite rewrite ) )\n" + "@" * 10))
    assert raised.value.diagnostics[0].span.line == 4 + _CAP


# ------------------------------------------------------------ every error: both ways read the same stretches

# Texts with several errors, each a case of how the parse recovers: an item
# cut short by the next item word, an error on an item line, items on one
# line, a line that starts with `rule` inside an item, an error in the
# first item and in the last, a bad character, nesting too deep and a tuple
# pattern (worded by lark's path after its parse), too many conditions (worded
# by the fast parser itself), and an error before the first item.
MULTIPLE_ERRORS = {
    "cut short, then more": 'dialect mil\nrule a "d"\n  match %t = tile(x=%x\nrule b "d"\n  match %t tile(x=%x)\n'
                            'rule c "d"\n  match %t = tile(x=%x)\n  rewrite %t -> 1\n',
    "two items on a line": 'dialect mil\nrule a "d" match %t = tile(x=%x) rewrite %t -> %x rule b "d" match ) )\n'
                           'rule c "d"\n  match %t = tile(x=%x,)\n  rewrite %t -> %x\n',
    "a rule line inside an item": 'dialect mil\nrule a "d"\n  match %t = tile(x=%x)\n  where f(1,\nrule) == 1 ==\n'
                                  'rule b "d"\n  match = tile(x=%x)\n',
    "junk first, junk last": '@@\ndialect mil\nrule a "d"\n  match %t = tile(x=%x)\n  rewrite %t -> %x\n'
                             'rule b "d"\n  match %t = tile(x=%x)\n  rewrite %t ->',
    "bad characters": 'dialect mil\nrule a "d"\n  where ; 1\nrule b "d"\n  match %t = tile(x=%x) `\n'
                      'rule c "d"\n  match %t = tile(x=%x)\n  rewrite %t -> %x\n',
    "too deep, a tuple pattern": 'dialect mil\nrule a "d"\n  match %t = tile(x=%x)\n  where ' + "not " * 40
                                 + 'true\n  rewrite %t -> %x\nrule b "d"\n  match %t = tile(x=(%x, %y))\n'
                                 '  rewrite %t -> %x\nrule c "d"\n  match %t = tile(x=%x\n',
    "too many conditions, twice": _WHERES + "".join(f"  where rank(%x) == {i}\n" for i in range(_CAP + 1))
                                  + 'rule b "d"\n  match %y = Relu(X=%x)\n  rewrite %y %x\n'
                                  + _WHERES + "".join(f"  where rank(%x) == {i}\n" for i in range(_CAP + 1)),
    "an item keyword out of place": 'dialect mil\nclass = a | b\nimport "x.rules" from\n'
                                    'rule a "d"\n  match %t = tile(x=%x)\n  rewrite %t -> %x\ndialect\n',
}


@pytest.mark.parametrize("case", sorted(MULTIPLE_ERRORS))
def test_several_errors_are_reported_alike_by_both_parsers(case):
    refusal = _refused_alike(MULTIPLE_ERRORS[case])
    assert len(refusal.diagnostics) >= 2, refusal.render()
    lines = [d.span.line for d in refusal.diagnostics]
    assert lines == sorted(lines)  # in the order of the text


def _stretches_read_by_lark(monkeypatch) -> list[list[str]]:
    """From now on, the lines (blank ones left out) of every stretch lark is asked to parse."""
    read = []
    real = parser.grammar_parser()

    class Recording:
        def parse(self, stretch):
            read.append([line for line in stretch.split("\n") if line])
            return real.parse(stretch)

        def __getattr__(self, name):  # the rest of lark's parser (its terminals, to word errors)
            return getattr(real, name)

    monkeypatch.setattr(parser, "grammar_parser", lambda: Recording())
    return read


def _rules_file(count: int, rule: str, odd_one: int, odd: str) -> str:
    rules = [rule.format(i) for i in range(count)]
    rules[odd_one] = odd
    return "dialect mil\n" + "".join(rules)


def test_the_fast_parser_gives_lark_only_the_stretch_it_stopped_in(monkeypatch):
    """200 rules with one broken in the middle: lark reads that rule's lines, not the file."""
    text = _rules_file(200, 'rule r{} "d"\n  match %t = tile(x=%x, reps=%r)\n  rewrite %t -> %x\n', 100,
                       'rule broken "d"\n  match %t = tile(x=%x reps=%r)\n  rewrite %t -> %x\n')
    read = _stretches_read_by_lark(monkeypatch)
    with pytest.raises(RuleError) as raised:
        parser._parse(text, "t.rules")
    (diagnostic,) = raised.value.diagnostics
    assert diagnostic.span.line == 2 + 3 * 100 + 1
    assert [len(lines) for lines in read] == [3]  # the broken rule's three lines, up to the next rule


def test_a_file_left_to_lark_in_one_place_is_read_fast_around_it(monkeypatch):
    """A construct only lark takes (its lexer splits `is_const`) in one rule of 50:
    lark parses that rule alone, and the AST is lark's whole-file one."""
    text = _rules_file(50, 'rule r{} "d"\n  match %a = op(x=%x)\n  rewrite %a -> %x\n', 20,
                       'rule odd "d"\n  match %a = op(x=%x)\n  where is_const(%x) is_const(%x)\n  rewrite %a -> %x\n')
    assert outcome(text) == "left to lark"
    read = _stretches_read_by_lark(monkeypatch)
    parsed = parser._parse(text, "t.rules")
    assert len(read) == 1 and read[0][0] == 'rule odd "d"'
    monkeypatch.undo()
    assert difference(lark_parse(text), parsed) is None and len(parsed.rules) == 50


@pytest.mark.parametrize("seed", range(3))
def test_files_of_several_mutated_rules_report_the_same_errors_both_ways(seed):
    """Files of a few shipped rules, some of them mutated: the same AST or the same errors, every one."""
    rng = random.Random(100 + seed)
    bodies = []
    for _, text in shipped_texts():
        head, *rules = re.split(r"(?m)^(?=rule )", text)
        bodies += [(head, rule) for rule in rules]
    refused = 0
    for _ in range(40):
        chosen = rng.sample(bodies, 4)
        parts = [chosen[0][0]]
        for _, rule in chosen:
            tokens = _TOKEN.findall(rule)
            if rng.random() < 0.5:
                for _ in range(rng.randint(1, 2)):
                    index = rng.randrange(len(tokens))
                    tokens[index] = rng.choice(WORDS)
            parts.append("".join(tokens))
        text = "".join(parts)
        result = outcome(text)
        assert result in ("same", "both refuse", "left to lark"), text
        refused += result == "both refuse"
    assert refused  # the mutations do reach the error paths


@pytest.mark.parametrize("case", sorted(MULTIPLE_ERRORS))
def test_the_errors_are_the_same_whatever_the_pieces_the_text_is_read_in(case, monkeypatch):
    text = MULTIPLE_ERRORS[case]
    whole = _refused_alike(text).render()
    monkeypatch.setattr(fast_parser, "CHUNK_LINES", 2)
    assert _refused_alike(text).render() == whole
