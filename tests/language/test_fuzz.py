"""Fuzzing the loader: any text gives checked rules or a `RuleError`, never a crash.

Three sources of text:

* a token soup of the language's keywords, punctuation, names, values,
  numbers and strings, optionally after a well-formed prefix so that the
  soup reaches the checker and not only the parser;
* rules that are syntactically valid by construction (random patterns,
  conditions and actions), which exercise the checker;
* the shipped rules files with characters dropped, swapped, duplicated or
  inserted.

Every text is written to a file and given to `rewrite.load_rules`. It must
either load or raise `rewrite.RuleError`, and every diagnostic must point at
a `file:line:col` that exists in the file it names, and be quoted in the
error's text.

Crashes this file once found are pinned as regression tests at the end.
"""

from __future__ import annotations

import itertools
import random
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import rewrite
from rewrite.language.types import BUILTINS

RULES_DIR = Path(__file__).resolve().parents[2] / "rules" / "mil"
SHIPPED = {path.name: path.read_text(encoding="utf-8") for path in sorted(RULES_DIR.glob("*.rules"))}


def fuzz_settings(max_examples: int):
    # Deterministic (derandomize) so CI sees the same examples every run; the
    # counts keep the whole file near 30 seconds on 2 cores.
    return settings(
        max_examples=max_examples,
        derandomize=True,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


# ------------------------------------------------------------------ harness


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    """A folder holding a copy of every shipped rules file, for imports to find."""
    folder = tmp_path_factory.mktemp("fuzz")
    for name in SHIPPED:
        shutil.copy(RULES_DIR / name, folder / name)
    return folder


_serial = itertools.count()


def _lines(text: str) -> list[str]:
    # Lines as lark counts them, split at "\n" alone (a trailing "\r" is not
    # part of the line); an empty file has one empty line.
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    return [line.removesuffix("\r") for line in lines] or [""]


def check_loads_or_reports(folder: Path, text: str) -> None:
    """Load `text` from a file in `folder`: it loads, or raises RuleError with sound spans."""
    path = folder / f"fuzzed_{next(_serial)}.rules"
    path.write_text(text, encoding="utf-8")
    # A byte order mark is dropped on reading; positions count from after it.
    texts = {path.resolve(): text.removeprefix("\ufeff")}
    for name, shipped in SHIPPED.items():  # what an import may have pulled in
        texts[(folder / name).resolve()] = shipped
    try:
        rewrite.load_rules(path)
    except rewrite.RuleError as error:
        assert error.diagnostics, "a RuleError without diagnostics"
        rendered = str(error)
        for diagnostic in error.diagnostics:
            span = diagnostic.span
            where = Path(span.file).resolve()
            assert where in texts, f"diagnostic in an unexpected file: {span.file}"
            lines = _lines(texts[where])
            assert 1 <= span.line <= len(lines), f"{span}: no line {span.line} ({len(lines)} lines)"
            line = lines[span.line - 1]
            assert 1 <= span.column <= len(line) + 1, f"{span}: no column {span.column} in {line!r}"
            assert f"{span.file}:{span.line}:{span.column}" in rendered
            if diagnostic.severity == "note":  # errors past the cap, counted at the first of them
                assert diagnostic.more > 0
                continue
            assert diagnostic.source_line == line, f"{span}: quotes {diagnostic.source_line!r}"
            # lark numbers lines by "\n" alone; the quoted line must be the one it meant.
            meant = texts[where].split("\n")[span.line - 1].removesuffix("\r")
            assert line == meant, f"{span}: quotes {line!r}, the error is in {meant!r}"
            assert diagnostic.severity == "error"
    finally:
        path.unlink()


# ------------------------------------------------------------- token soup

KEYWORDS = [
    "dialect", "import", "from", "class", "rule", "match", "where", "benefit", "group", "rewrite",
    "in", "any", "order", "forall", "exists", "every", "use", "of", "is", "not", "and", "or",
    "true", "false", "with",
]
PUNCTUATION = [
    "(", ")", "[", "]", ",", "=", "|", ":", "->", "...", "+", "-", "*", "/",
    "==", "!=", "<=", ">=", "<", ">", "_", "#", "%", '"', ".",
]
NAMES = [
    "mil", "onnx", "tile", "add", "mul", "sub", "relu", "cast", "concat", "reshape", "broadcasting",
    "x", "y", "reps", "values", "axis", "dtype", "i", "rank", "dim", "shape", "axes", "aligned_dim",
    "is_const", "const", "is_symbolic", "is_known", "use_count", "one_use", "block_output",
    "same_block", "op_type", "len", "range", "abs", "mod", "fp16", "fp32", "inf", "nan",
    "nosuchop", "r", "r2", "cleanup", "fusion", "nosuchgroup",
]
VARS = ["%t", "%x", "%y", "%u", "%reps", "%other", "%rest", "%new", "%_"]
LITERALS = [
    "0", "1", "2", "-1", "10", "1.5", "2.", "1e3", "3E-2", '"d"', '""', '"fp16"',
    '"elementwise.rules"', '"remove_broadcast_tiles.rules"', '"missing.rules"', '"."',
]
SEPARATORS = [" ", " ", " ", "\n", "\t", "\n  ", "# a comment\n", "\r\n"]

token_soup = st.lists(
    st.one_of(
        st.sampled_from(KEYWORDS),
        st.sampled_from(PUNCTUATION),
        st.sampled_from(NAMES),
        st.sampled_from(VARS),
        st.sampled_from(LITERALS),
    ),
    max_size=60,
).flatmap(
    lambda tokens: st.lists(
        st.sampled_from(SEPARATORS), min_size=len(tokens), max_size=len(tokens)
    ).map(lambda separators: "".join(t + s for t, s in zip(tokens, separators)))
)

# Well-formed beginnings, so that the soup gets past the parser more often.
PREFIXES = [
    "",
    "dialect mil\n",
    'dialect mil\nimport broadcasting from "elementwise.rules"\n',
    'dialect mil\nrule r "d"\n',
    'dialect mil\nrule r "d"\n  match %t = tile(x=%x, reps=%reps)\n',
    'dialect mil\nrule r "d"\n  match %t = tile(x=%x, reps=%reps)\n  where ',
    'dialect mil\nrule r "d"\n  match %t = mul(%x, %y) in any order\n  rewrite ',
]


@fuzz_settings(800)
@given(prefix=st.sampled_from(PREFIXES), soup=token_soup)
def test_token_soup(workdir, prefix, soup):
    check_loads_or_reports(workdir, prefix + soup)


# --------------------------------------------------- well-formed rule texts

OPS = {"tile": ["x", "reps"], "mul": ["x", "y"], "add": ["x", "y"], "relu": ["x"],
       "concat": ["values", "axis", "interleave"], "broadcasting": ["x", "y"], "nosuchop": ["x"]}
op_names = st.sampled_from(sorted(OPS))
var_names = st.sampled_from(VARS)
plain_names = st.sampled_from(["axis", "i", "fp16", "inf", "nosuchname", "x", "rank"])


def value_patterns(depth: int):
    leaves = st.one_of(var_names, st.just("_"))
    if depth == 0:
        return leaves
    return st.one_of(
        leaves,
        op_patterns(depth - 1),
        st.tuples(var_names, op_patterns(depth - 1)).map(lambda p: f"{p[0]} = {p[1]}"),
    )


def op_patterns(depth: int = 1):
    def build(op, style, operands, rest, any_order):
        names = OPS[op] + ["bogus"]
        if style == "named":
            parts = [f"{names[i % len(names)]}={o}" for i, o in enumerate(operands)]
        else:
            parts = list(operands)
        if rest:
            parts.append(rest + "...")
        return f"{op}({', '.join(parts)})" + (" in any order" if any_order else "")

    return st.builds(
        build,
        op_names,
        st.sampled_from(["named", "positional"]),
        st.lists(value_patterns(depth), max_size=3),
        st.one_of(st.just(""), var_names),
        st.booleans(),
    )


def expressions():
    atoms = st.one_of(
        st.sampled_from(["0", "1", "-2", "1.5", '"fp16"', "true", "false", "[]", "[1, 2]"]),
        var_names,
        plain_names,
    )

    def extend(inner):
        return st.one_of(
            st.tuples(inner, st.sampled_from(["+", "-", "*", "/", "==", "!=", "<", ">=", "and", "or"]),
                      inner).map(lambda t: f"({t[0]} {t[1]} {t[2]})"),
            inner.map(lambda e: f"(not {e})"),
            inner.map(lambda e: f"(-{e})"),
            st.tuples(inner, inner).map(lambda t: f"({t[0]})[{t[1]}]"),
            st.lists(inner, max_size=3).map(lambda items: f"[{', '.join(items)}]"),
            st.tuples(st.sampled_from(sorted(BUILTINS) + ["nosuchfn"]),
                      st.lists(inner, max_size=3), st.booleans(), inner).map(
                lambda t: f"{t[0]}({', '.join(t[1] + ([f'of={t[3]}'] if t[2] else []))})"),
            st.tuples(inner, st.sampled_from([" is ", " is not "]), var_names).map(
                lambda t: f"({''.join(t)})"
            ),
            st.tuples(inner, st.sampled_from([" is ", " is not "]), op_patterns(1)).map(
                lambda t: f"({''.join(t)})"
            ),
            st.tuples(st.sampled_from(["forall", "exists"]), plain_names, inner,
                      st.one_of(st.just(""), inner.map(lambda f: f" where {f}")), inner).map(
                lambda t: f"({t[0]} {t[1]} in {t[2]}{t[3]}: {t[4]})"),
            st.tuples(var_names, var_names, inner).map(lambda t: f"(every use {t[0]} of {t[1]}: {t[2]})"),
        )

    return st.recursive(atoms, extend, max_leaves=12)


def actions():
    arguments = st.lists(
        st.tuples(st.sampled_from(["x", "y", "reps", "bogus"]), expressions()).map(
            lambda a: f"{a[0]}={a[1]}"
        ),
        max_size=3,
    ).map(", ".join)
    return st.one_of(
        st.tuples(var_names, op_names, arguments).map(lambda a: f"{a[0]} = {a[1]}({a[2]})"),
        st.tuples(var_names, var_names).map(lambda a: f"{a[0]} -> {a[1]}"),
        st.tuples(var_names, op_names, arguments).map(lambda a: f"{a[0]} -> {a[1]}({a[2]})"),
        st.tuples(var_names, var_names, arguments.filter(bool)).map(
            lambda a: f"{a[0]} -> {a[1]} with {a[2]}"),
    )


def rules():
    return st.builds(
        lambda name, matches, conditions, benefit, groups, acts: "\n".join(
            [f'rule {name} "a fuzzed rule"']
            + [f"  match {v} = {p}" for v, p in matches]
            + [f"  where {c}" for c in conditions]
            + ([f"  benefit {benefit}"] if benefit is not None else [])
            + ([f"  group {', '.join(groups)}"] if groups else [])
            + ([f"  rewrite {' '.join(acts)}"] if acts else [])
        ),
        st.sampled_from(["r", "r2", "remove_broadcast_tiles"]),
        st.lists(st.tuples(var_names, op_patterns(2)), max_size=3),
        st.lists(expressions(), max_size=3),
        st.one_of(st.none(), st.integers(0, 100)),
        st.lists(st.sampled_from(["cleanup", "fusion", "nosuchgroup"]), max_size=2),
        st.lists(actions(), max_size=3),
    )


rule_files = st.builds(
    lambda header, classes, body: header + "".join(classes) + "\n\n".join(body) + "\n",
    st.sampled_from(PREFIXES[1:3] + ['dialect mil\nimport "elementwise.rules"\n', "dialect onnx\n", ""]),
    st.lists(st.sampled_from(["class c = add | mul\n", "class broadcasting = add\n",
                              "class bad = add | nosuchop\n"]), max_size=2),
    st.lists(rules(), min_size=1, max_size=3),
)


@fuzz_settings(300)
@given(text=rule_files)
def test_well_formed_rules(workdir, text):
    check_loads_or_reports(workdir, text)


# ---------------------------------------------------------- mutated files

inserted_characters = st.one_of(
    st.sampled_from(list("()[]{},=|:%_.#\"'-+*/<>!\n\t 0123456789az")),
    st.characters(exclude_categories=["Cs"]),
)


@st.composite
def mutated_shipped_file(draw):
    name = draw(st.sampled_from(sorted(SHIPPED)))
    text = SHIPPED[name]
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["drop", "swap", "duplicate", "insert"]))
        if not text and kind != "insert":
            kind = "insert"
        if kind == "insert":
            at = draw(st.integers(0, len(text)))
            text = text[:at] + draw(inserted_characters) + text[at:]
            continue
        at = draw(st.integers(0, len(text) - 1))
        if kind == "drop":
            text = text[:at] + text[at + 1 :]
        elif kind == "duplicate":
            text = text[:at] + text[at] + text[at:]
        elif at + 1 < len(text):
            text = text[:at] + text[at + 1] + text[at] + text[at + 2 :]
    return text


@fuzz_settings(1000)
@given(text=mutated_shipped_file())
def test_mutated_shipped_files(workdir, text):
    check_loads_or_reports(workdir, text)


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_shipped_files_load_unchanged(workdir, name):
    # The harness itself: an unmutated copy, next to its imports, loads cleanly.
    check_loads_or_reports(workdir, SHIPPED[name])


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_every_truncation_of_shipped_files(workdir, name):
    # Cutting a file anywhere is the commonest "mutation" of all. A fixed
    # sample of line ends and of cuts inside lines: each load costs as much as
    # the prefix is long, so every line end of a 1,400-line file took minutes.
    text = SHIPPED[name]
    sample = random.Random(name)
    line_ends = [i for i, c in enumerate(text) if c == "\n"]
    line_ends = sample.sample(line_ends, min(len(line_ends), 100))
    inside = sample.sample(range(len(text) + 1), min(len(text) + 1, 40))
    for end in sorted({0, len(text), *line_ends, *inside}):
        check_loads_or_reports(workdir, text[:end])


# ---------------------------------------------------------- regressions

_CLEAN = 'dialect mil\nrule r "d"\n  match %t = tile(x=%x, reps=%reps)\n  where %q == 1\n  rewrite %t -> %x\n'


def test_nul_in_import_path(workdir):
    check_loads_or_reports(workdir, 'dialect mil\nimport "a\x00b.rules"\n')


def test_huge_integer(workdir):
    check_loads_or_reports(workdir, 'dialect mil\nrule r "d" benefit ' + "1" * 5000 + "\n")


@pytest.mark.parametrize("line_break", ["\r", "\x0b", "\x0c", "\x1c", "\x85", "\u2028"])
def test_other_line_breaks_in_comments(workdir, line_break):
    # A comment may hold any character but "\n"; after such a line break the
    # diagnostic quotes the wrong line and its column lies past that line's end.
    check_loads_or_reports(workdir, f"# a{line_break}b\n" + _CLEAN)


def test_byte_order_mark(workdir):
    # Once refused as an unexpected character at 1:1.
    check_loads_or_reports(workdir, "\ufeff" + _CLEAN)
    check_loads_or_reports(workdir, "\ufeffdialect 3\n")


@pytest.mark.parametrize(
    "nested",
    ["not " * 600 + "true", " + ".join(["1"] * 10_000) + " == 1", "[" * 10_000 + "]" * 10_000 + " == []"],
    ids=["600 nots", "10,000 terms", "10,000 nested lists"],
)
def test_deep_nesting(workdir, nested):
    # Once a RecursionError, with 3,000 lines of traceback.
    check_loads_or_reports(workdir, _CLEAN.replace("%q == 1", nested))
