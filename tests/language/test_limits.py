"""Hostile or unusual input: deep nesting, special and huge files, imports of
non-rules files, byte order marks and bytes that are not UTF-8.

Each ends in a `RuleError` whose diagnostics say `file:line:col` what was
wrong; never a traceback, a hang, or a read without bound. Where a
regression would hang (a FIFO) or read until memory runs out (/dev/zero),
the test runs the CLI in a subprocess with a timeout.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import rewrite
from rewrite import backends, cli
from rewrite.engine.explain import explain, format_text
from rewrite.engine.interfaces import NamedValue
from rewrite.language import loader
from rewrite.language.errors import RuleError
from rewrite.language.loader import load_rule_files
from rewrite.language.parser import MAX_CONDITIONS, MAX_MATCHES, MAX_NESTING
from rewrite.predicates import registered_predicates

REPO = Path(__file__).resolve().parents[2]


def _rule(where: str = "true", match: str = "Relu(X=%x)", clauses: str = "") -> str:
    return f'dialect onnx\nrule r "d"\n  match %y = {match}\n{clauses}  where {where}\n  rewrite %y -> %x\n'


def _error(path: Path) -> RuleError:
    with pytest.raises(RuleError) as raised:
        rewrite.load_rules(path)
    return raised.value


def _run_cli(*arguments: str, cwd: Path) -> subprocess.CompletedProcess:
    # A subprocess with a timeout: a regression hangs on a FIFO or reads
    # /dev/zero until memory runs out, and must take neither the suite with it.
    return subprocess.run(
        [sys.executable, "-m", "rewrite.cli", *arguments],
        cwd=cwd, capture_output=True, text=True, timeout=30,
    )


# ------------------------------------------------------------------ nesting

# Each builds a rule whose deepest part is n levels deep, as the error counts them.
NESTED = {
    "op patterns": lambda n: _rule(match="Relu(X=" * (n - 1) + "Relu(X=%x)" + ")" * (n - 1)),
    "bound op patterns": lambda n: _rule(
        match="".join(f"Relu(X=%b{i} = " for i in range(n - 1)) + "Relu(X=%x)" + ")" * (n - 1)
    ),
    "not": lambda n: _rule(where="not " * n + "true"),
    "a chain of +": lambda n: _rule(where=" + ".join(["1"] * n) + f" == {n}"),
    "a chain of and": lambda n: _rule(where=" and ".join(["true"] * (n + 1))),
    "lists": lambda n: _rule(where="[" * (n - 1) + "]" * (n - 1) + " == " + "[" * (n - 1) + "]" * (n - 1)),
    "calls": lambda n: _rule(where="abs(" * (n - 2) + "rank(%x)" + ")" * (n - 2) + " == 2"),
    "quantifiers": lambda n: _rule(where="".join(f"forall i{k} in [1]: " for k in range(n - 1)) + "true"),
    "if else": lambda n: _rule(where="(" + "1 if false else " * (n - 1) + "2) == 2"),
}


@pytest.mark.parametrize("kind", sorted(NESTED))
def test_nesting_up_to_the_limit_loads_and_one_more_level_is_an_error(write_rules, kind):
    rewrite.load_rules(write_rules(NESTED[kind](MAX_NESTING)))
    error = _error(write_rules(NESTED[kind](MAX_NESTING + 1)))
    (diagnostic,) = error.diagnostics
    assert f"nesting deeper than {MAX_NESTING} levels" in diagnostic.message


def test_a_rule_nested_20_deep_loads(write_rules):
    nested = "Relu(X=" * 19 + "Relu(X=%x)" + ")" * 19
    text = _rule(match=nested, where=f"not not %y is {nested} and " + " + ".join(["1"] * 20) + " == 20")
    (rule,) = rewrite.load_rules(write_rules(text)).rules
    assert rule.anchor.pattern.op == "Relu"


# What users reported, each with the place of the first level too many: the
# 33rd relu (each `relu(x=` is 7 characters from column 14), the 33rd `not`,
# the chain of `+` where it starts, the 32nd `[` (the comparison is a level).
REPORTED = [
    ("op patterns 200 deep", _rule(match="relu(x=" * 200 + "%x" + ")" * 200).replace("onnx", "mil"),
     3, 14 + 7 * MAX_NESTING, f"nesting deeper than {MAX_NESTING} levels"),
    ("600 nots", _rule(where="not " * 600 + "true"), 4, 9 + 4 * MAX_NESTING,
     f"nesting deeper than {MAX_NESTING} levels"),
    ("10,000 terms", _rule(where=" + ".join(["1"] * 10_000) + " == 1"), 4, 9,
     "expression too long: nesting deeper than"),
    ("10,000 nested lists", _rule(where="[" * 10_000 + "]" * 10_000 + " == []"), 4, 9 + MAX_NESTING - 1,
     f"nesting deeper than {MAX_NESTING} levels"),
]


@pytest.mark.parametrize("what, text, line, column, message", REPORTED, ids=[r[0] for r in REPORTED])
def test_deep_nesting_is_one_error_at_the_first_level_too_many(write_rules, what, text, line, column, message):
    path = write_rules(text)
    error = _error(path)
    (diagnostic,) = error.diagnostics
    assert (diagnostic.span.line, diagnostic.span.column) == (line, column)
    assert message in diagnostic.message
    rendered = error.render().splitlines()
    assert rendered[0].startswith(f"{path.resolve()}:{line}:{column}: error: ")
    # A line of 50,000 characters is shown as a window around the caret.
    assert len(rendered) == 3 and all(len(part) < 400 for part in rendered)
    assert rendered[1][rendered[2].index("^")] == text.splitlines()[line - 1][column - 1]


def _match_chain(count: int) -> str:
    """`count` match clauses after an anchor `Relu(X=%v0)`, walking up a chain of Relus to %x."""
    names = [f"%v{i}" for i in range(count)] + ["%x"]
    return "".join(f"  match {names[i]} = Relu(X={names[i + 1]})\n" for i in range(count))


def test_too_many_conditions_or_match_clauses(write_rules):
    conditions = "".join("  where %x is %x\n" for _ in range(MAX_CONDITIONS - 1))
    rewrite.load_rules(write_rules(_rule(clauses=conditions)))
    error = _error(write_rules(_rule(clauses=conditions + "  where true and %x is %x\n")))
    (diagnostic,) = error.diagnostics
    # The 65th condition is the second part of the last `where` but one.
    assert (diagnostic.span.line, diagnostic.span.column) == (3 + MAX_CONDITIONS, 18)
    assert f"more than {MAX_CONDITIONS} conditions in one rule" in diagnostic.message

    rewrite.load_rules(write_rules(_rule(match="Relu(X=%v0)", clauses=_match_chain(MAX_MATCHES - 1))))
    error = _error(write_rules(_rule(match="Relu(X=%v0)", clauses=_match_chain(MAX_MATCHES))))
    (diagnostic,) = error.diagnostics
    assert (diagnostic.span.line, diagnostic.span.column) == (3 + MAX_MATCHES, 9)
    assert f"more than {MAX_MATCHES} 'match' clauses in one rule" in diagnostic.message


# The limit is there so that no pass over the AST comes near Python's
# recursion limit. Run each on rules at the limits with only this many
# frames left: they must not need more.
FRAMES_LEFT = 450


def _with_frames_left(frames: int, function):
    depth, frame = 0, sys._getframe()
    while frame is not None:
        depth, frame = depth + 1, frame.f_back

    def descend(levels):
        return function() if levels <= 0 else descend(levels - 1)

    return descend(sys.getrecursionlimit() - frames - depth)


def _relu_chain(length: int):
    onnx = backends.backend_module("onnx")
    ops = [(f"v{length}", "Relu", {"X": NamedValue("x")})]
    ops += [(f"v{i}", "Relu", {"X": NamedValue(f"v{i + 1}")}) for i in range(length - 1, -1, -1)]
    return onnx.build_example([("x", "fp32", (2, 3))], ops, ["v0"])


def test_every_pass_over_rules_at_the_limits_leaves_the_stack_far_from_full(write_rules):
    texts = [NESTED[kind](MAX_NESTING) for kind in sorted(NESTED)]
    # The most of everything at once: match clauses, conditions, and a deep last one.
    clauses = _match_chain(MAX_MATCHES - 1)
    clauses += "".join("  where %x is %x\n" for _ in range(MAX_CONDITIONS - 2))
    texts.append(_rule(match="Relu(X=%v0)", clauses=clauses, where="not " * MAX_NESTING + "true"))
    paths = [write_rules(text.replace("rule r ", f"rule r{i} "), f"r{i}.rules") for i, text in enumerate(texts)]

    def every_pass():
        rule_set = rewrite.load_rules(*paths)  # parser, checker, lint
        for rule in rule_set.rules:
            repr(rule), hash(rule)
        explained = explain(rule_set.rules, backends.adapter_for(_relu_chain(70)), registered_predicates())
        format_text(explained)  # the interpreter
        # The compiled conditions; one rule at a time, lest one rewrite away what the next would match.
        fired = {rule.name for rule in rule_set.rules if rule_set.only(rule.name).apply(_relu_chain(70)).fires}
        return explained, fired

    explained, fired = _with_frames_left(FRAMES_LEFT, every_pass)
    # Every rule fires: every condition was evaluated to the end, yes.
    names = {f"r{i}" for i in range(len(texts))}
    assert fired == names
    assert {e.rule for e in explained if e.fired} == names


# ------------------------------------------------------- special files


@pytest.mark.skipif(not os.path.exists("/dev/zero"), reason="needs /dev/zero")
def test_check_dev_zero_is_refused_unread(tmp_path):
    result = _run_cli("check", "/dev/zero", cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        "/dev/zero:1:1: error: cannot read rules file: it is a character device, not a regular file",
        "rewrite: error: 1 error in rules: they do not load",
    ]


@pytest.mark.skipif(not hasattr(os, "mkfifo") or not os.path.exists("/dev/zero"), reason="needs POSIX")
def test_fifos_devices_and_links_to_them_are_refused_without_opening(tmp_path):
    os.mkfifo(tmp_path / "fifo.rules")
    (tmp_path / "zero.rules").symlink_to("/dev/zero")
    (tmp_path / "imports.rules").write_text('dialect onnx\nimport "fifo.rules"\nimport "zero.rules"\n')
    # --backend: the dialect of each file is peeked at first, which must not hang either.
    result = _run_cli("check", "--backend", "onnx", "fifo.rules", "zero.rules", "imports.rules", cwd=tmp_path)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    lines = result.stderr.splitlines()
    assert lines[0] == "fifo.rules:1:1: error: cannot read rules file: it is a FIFO (named pipe), not a regular file"
    assert lines[1] == "zero.rules:1:1: error: cannot read rules file: it is a character device, not a regular file"
    assert lines[2] == (f"imports.rules:2:1: error: cannot import '{(tmp_path / 'fifo.rules').resolve()}': "
                        "it is a FIFO (named pipe), not a regular file")
    assert lines[5] == ("imports.rules:3:1: error: cannot import 'zero.rules': "
                        "it links to '/dev/zero', not a .rules file")
    assert lines[8:] == ["rewrite: error: 4 errors in rules: they do not load"]


def test_a_file_over_the_size_limit_is_refused_unread(tmp_path):
    path = tmp_path / "huge.rules"
    with open(path, "wb") as handle:
        handle.truncate(loader.MAX_RULES_FILE_BYTES + 1)  # sparse: no disk, and never read
    error = _error(path)
    (diagnostic,) = error.diagnostics
    assert diagnostic.message == (
        f"cannot read rules file: file too large ({loader.MAX_RULES_FILE_BYTES + 1:,} bytes; the limit is 64 MiB)"
    )


def test_a_5_mb_rules_file_loads(tmp_path):
    path = tmp_path / "big.rules"
    comment = "# " + "a long comment that makes the file big " * 2 + "\n"
    rule = 'rule r{} "d"\n  match %y = Relu(X=%x)\n  where rank(%x) == {}\n  rewrite %y -> %x\n'
    text = "dialect onnx\n" + comment * 62_000 + "".join(rule.format(i, i) for i in range(200))
    path.write_text(text)
    assert path.stat().st_size > 5_000_000
    assert len(rewrite.load_rules(path).rules) == 200


def test_a_directory_named_as_an_import_is_refused(write_rules, tmp_path):
    (tmp_path / "folder.rules").mkdir()
    error = _error(write_rules('dialect onnx\nimport "folder.rules"\n'))
    (diagnostic,) = error.diagnostics
    assert diagnostic.message.endswith("it is a directory, not a regular file")
    assert (diagnostic.span.line, diagnostic.span.column) == (2, 1)


# ------------------------------------------------------ importing non-rules


SECRET = "root:$6$TOPSECRET:19000:0:99999:7:::\n"


def test_only_rules_files_can_be_imported_and_nothing_else_is_quoted(write_rules, tmp_path):
    (tmp_path / "secret.txt").write_text(SECRET)
    (tmp_path / "innocent.rules").symlink_to(tmp_path / "secret.txt")
    path = write_rules(
        'dialect onnx\nimport "/etc/shadow"\n  import "secret.txt"\nimport "innocent.rules"\n'
    )
    error = _error(path)
    path = str(path.resolve())
    assert [(d.span.file, d.span.line, d.span.column, d.message) for d in error.diagnostics] == [
        (path, 2, 1, "cannot import '/etc/shadow': only a .rules file can be imported"),
        (path, 3, 3, "cannot import 'secret.txt': only a .rules file can be imported"),
        (path, 4, 1,
         f"cannot import 'innocent.rules': it links to '{(tmp_path / 'secret.txt').resolve()}', not a .rules file"),
    ]
    assert "TOPSECRET" not in error.render()


def test_a_link_to_a_non_rules_file_in_a_folder_is_not_read(tmp_path):
    (tmp_path / "secret.txt").write_text(SECRET)
    (tmp_path / "rules").mkdir()
    (tmp_path / "rules" / "innocent.rules").symlink_to(tmp_path / "secret.txt")
    error = _error(tmp_path / "rules")
    (diagnostic,) = error.diagnostics
    assert "not a .rules file" in diagnostic.message
    assert "TOPSECRET" not in error.render()


# ------------------------------------------------------------ encodings


def test_a_byte_order_mark_is_dropped_and_columns_stay_right(tmp_path):
    path = tmp_path / "bom.rules"
    path.write_bytes(b"\xef\xbb\xbf" + _rule().encode())
    (rule,) = rewrite.load_rules(path).rules
    assert rule.name == "r"
    path.write_bytes(b"\xef\xbb\xbfdialect 3\n")
    (diagnostic,) = _error(path).diagnostics
    assert (diagnostic.span.line, diagnostic.span.column) == (1, 9)
    assert diagnostic.source_line == "dialect 3"


def test_text_that_is_not_utf8_is_reported_at_its_byte(tmp_path):
    path = tmp_path / "latin1.rules"
    # Line 3; "é" before the bad byte is one character, so the byte is column 12.
    path.write_bytes(b'dialect onnx\n# fine\nrule r "d\xc3\xa9 \xff" match\n')
    error = _error(path)
    (diagnostic,) = error.diagnostics
    assert (diagnostic.span.line, diagnostic.span.column) == (3, 12)
    assert diagnostic.message == "not UTF-8: byte 0xff at line 3, column 12"
    assert diagnostic.source_line == 'rule r "d\xe9 \ufffd" match'
    rendered = error.render().splitlines()
    assert rendered[2].index("^") == rendered[1].index("\ufffd")


def test_text_that_is_not_utf8_in_an_imported_file_is_reported_there(write_rules, tmp_path):
    (tmp_path / "lib.rules").write_bytes(b"\xef\xbb\xbfdialect onnx\n\xfe\n")
    error = _error(write_rules('dialect onnx\nimport "lib.rules"\n'))
    (diagnostic,) = error.diagnostics
    assert Path(diagnostic.span.file).resolve() == (tmp_path / "lib.rules").resolve()
    assert (diagnostic.span.line, diagnostic.span.column) == (2, 1)
    assert diagnostic.message == "not UTF-8: byte 0xfe at line 2, column 1"


# ------------------------------------------------------ skipped dialects


def test_files_of_another_dialect_are_listed_as_skipped(tmp_path):
    (tmp_path / "a_mil.rules").write_text('dialect mil\nrule m "d" match %y = relu(x=%x) rewrite %y -> %x\n')
    (tmp_path / "b_onnx.rules").write_text(_rule())
    # Too long a preamble to peek at: found out by parsing, and skipped all the same.
    (tmp_path / "c_mil.rules").write_text("# x\n" * 20_000 + "dialect mil\n")
    loaded = load_rule_files([tmp_path], backends.schema_for, dialects=["onnx"], known_dialects=["mil", "onnx"])
    assert [rule.name for rule in loaded.rules] == ["r"]
    assert loaded.skipped_files == (
        (str(tmp_path / "a_mil.rules"), "mil"),
        (str(tmp_path / "c_mil.rules"), "mil"),
    )
    alone = load_rule_files([tmp_path / "b_onnx.rules"], backends.schema_for, dialects=["onnx"],
                            known_dialects=["mil", "onnx"])
    assert alone.skipped_files == ()


# ------------------------------------------------------------------ CLI


def test_cli_check_of_deep_nesting_is_a_short_error(write_rules, capsys):
    path = write_rules(_rule(where="not " * 600 + "true"))
    assert cli.main(["check", str(path)]) == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert "Traceback" not in err and "RecursionError" not in err
    column = 9 + 4 * MAX_NESTING
    assert err.splitlines()[0] == f"{path.resolve()}:4:{column}: error: nesting deeper than {MAX_NESTING} levels"
    assert err.splitlines()[3:] == ["rewrite: error: 1 error in rules: they do not load"]


def test_cli_check_in_a_subprocess_has_no_traceback(tmp_path):
    (tmp_path / "deep.rules").write_text(_rule(match="Relu(X=" * 200 + "%x" + ")" * 200))
    (tmp_path / "shadow.rules").write_text('dialect onnx\nimport "/etc/shadow"\n')
    result = _run_cli("check", "deep.rules", "shadow.rules", cwd=tmp_path)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 7 and lines[6] == "rewrite: error: 2 errors in rules: they do not load"
    assert lines[0] == f"deep.rules:3:{14 + 7 * MAX_NESTING}: error: nesting deeper than {MAX_NESTING} levels"
    assert lines[3] == "shadow.rules:2:1: error: cannot import '/etc/shadow': only a .rules file can be imported"
