"""Reading rules files from disk: imports, op classes, and checking.

`load_rule_files` is the one entry from paths to checked rules. It parses
every file (and every file they import, once), resolves op classes, and
checks each rule against the op schema of its dialect. All errors of all
files are collected before it raises, so one run shows every mistake.
"""

from __future__ import annotations

import itertools
import os
import re
import stat
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from rewrite.language import ast
from rewrite.language.checker import Checker
from rewrite.language.cycles import lint_cycles
from rewrite.language.errors import Diagnostic, RuleError, SourceText
from rewrite.language.lint import lint_rule, lint_shadowing
from rewrite.language.parser import parse_rules
from rewrite.language.schema import OpSchema
from rewrite.language.types import Signature

SchemaLookup = Callable[[str], "OpSchema | None"]


@dataclass(frozen=True)
class LoadedRules:
    """Checked rules, in load order, with the warnings found on the way."""

    rules: tuple[ast.Rule, ...]
    classes: dict[str, ast.OpClass]
    warnings: tuple[Diagnostic, ...]
    files: tuple[str, ...]
    # (path, dialect) of each file passed over because it declares a known
    # dialect other than those asked for, in load order.
    skipped_files: tuple[tuple[str, str], ...] = ()


# A rules file larger than this is refused unread. The shipped library is
# about 100 KB and a generated file of 8,000 rules about 5 MB; 64 MiB of
# rules is a mistake, and reading on without a bound (say from /dev/zero)
# would take all memory.
MAX_RULES_FILE_BYTES = 64 * 1024 * 1024

_BOM = b"\xef\xbb\xbf"


class UnreadableRules(Exception):
    """A rules file that cannot be read as text.

    `reason` never quotes the file's content. `line`, `column` and
    `source_line` locate an undecodable byte (line 0: no position).
    """

    def __init__(self, reason: str, line: int = 0, column: int = 0, source_line: str = ""):
        super().__init__(reason)
        self.reason = reason
        self.line = line
        self.column = column
        self.source_line = source_line


def _special_kind(mode: int) -> str | None:
    """What a file that is not a regular file is, for a message; None if it is one."""
    if stat.S_ISREG(mode):
        return None
    for test, kind in (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISFIFO, "a FIFO (named pipe)"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return kind
    return "not a regular file"


def _open_regular(path: Path) -> BinaryIO:
    """Open `path` for reading if it is a regular file of bounded size.

    Checked with stat before opening: opening a FIFO blocks until a writer
    comes, and a device can be read forever. stat follows symlinks, so a
    link to /dev/zero is refused too. Raises `UnreadableRules`.
    """
    try:
        info = os.stat(path)
        kind = _special_kind(info.st_mode)
        if kind is not None:
            raise UnreadableRules(f"it is {kind}, not a regular file")
        if info.st_size > MAX_RULES_FILE_BYTES:
            raise UnreadableRules(_too_large(info.st_size))
        # O_NONBLOCK: should the path have become a FIFO since the stat,
        # opening still returns at once, and the fstat below refuses it.
        descriptor = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError as error:
        raise UnreadableRules(error.strerror or str(error)) from None
    except ValueError as error:  # a NUL in the path
        raise UnreadableRules(str(error)) from None
    try:
        kind = _special_kind(os.fstat(descriptor).st_mode)
        if kind is not None:
            raise UnreadableRules(f"it is {kind}, not a regular file")
        return os.fdopen(descriptor, "rb")
    except BaseException:
        os.close(descriptor)
        raise


def _too_large(size: int | None = None) -> str:
    limit = MAX_RULES_FILE_BYTES // (1024 * 1024)
    if size is None:
        return f"file too large (more than {limit} MiB)"
    return f"file too large ({size:,} bytes; the limit is {limit} MiB)"


def read_rules_text(path: str | Path) -> str:
    """The text of a rules file, as the loader reads it.

    Refuses anything but a regular file of at most `MAX_RULES_FILE_BYTES`,
    drops a UTF-8 byte order mark, and keeps "\r" as written, so that lines
    and columns number as the parser counts them. Raises `UnreadableRules`,
    which for text that is not UTF-8 gives the line and column of the first
    undecodable byte.
    """
    try:
        with _open_regular(Path(path)) as handle:
            data = handle.read(MAX_RULES_FILE_BYTES + 1)
    except OSError as error:
        raise UnreadableRules(error.strerror or str(error)) from None
    if len(data) > MAX_RULES_FILE_BYTES:  # it grew since the stat
        raise UnreadableRules(_too_large())
    if data.startswith(_BOM):
        data = data[len(_BOM) :]
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise _not_utf8(data, error.start) from None


def _not_utf8(data: bytes, at: int) -> UnreadableRules:
    line_start = data.rfind(b"\n", 0, at) + 1
    line_end = data.find(b"\n", at)
    if line_end < 0:
        line_end = len(data)
    line = data.count(b"\n", 0, line_start) + 1
    # Everything before the first bad byte decodes; columns count characters, as lark's do.
    column = len(data[line_start:at].decode("utf-8")) + 1
    source_line = data[line_start:line_end].decode("utf-8", errors="replace").removesuffix("\r")
    return UnreadableRules(
        f"not UTF-8: byte 0x{data[at]:02x} at line {line}, column {column}",
        line, column, source_line,
    )


def rules_files(path: str | Path) -> list[Path]:
    """`path` itself if it is a file, else every `.rules` file below it, sorted."""
    path = Path(path)
    if path.is_dir():
        return sorted(p for p in path.rglob("*.rules") if p.is_file())
    return [path]


class _Loader:
    def __init__(self, schema_for: SchemaLookup, predicates: dict[str, Signature]):
        self.schema_for = schema_for
        self.predicates = predicates
        self.parsed: dict[Path, tuple[ast.RuleFile, SourceText]] = {}
        self.diagnostics: list[Diagnostic] = []

    def parse(self, path: Path, cited_at: tuple[SourceText, ast.Span] | None) -> ast.RuleFile | None:
        given = path
        try:
            path = _resolve(path)
            if path in self.parsed:
                return self.parsed[path][0]
            text = read_rules_text(path)
        except UnreadableRules as error:
            if error.line:
                # Where in the file it went wrong is what helps, imported or not.
                span = ast.Span(_display_path(path), error.line, error.column)
                self.diagnostics.append(Diagnostic(span, error.reason, source_line=error.source_line))
            elif cited_at is None:  # named as the user named it, not where a link leads
                self.diagnostics.append(
                    Diagnostic(ast.Span(str(given), 1, 1), f"cannot read rules file: {error.reason}")
                )
            else:
                source, span = cited_at
                self.diagnostics.append(source.diagnostic(span, f"cannot import '{path}': {error.reason}"))
            return None
        display = _display_path(path)
        source = SourceText(display, text)
        try:
            rule_file = parse_rules(text, display)
        except RuleError as error:
            self.diagnostics.extend(error.diagnostics)
            return None
        self.parsed[path] = (rule_file, source)
        return rule_file

    def classes_visible(self, path: Path, rule_file: ast.RuleFile, source: SourceText, stack=()):
        """The classes a file can use: its own, and those it imports."""
        visible: dict[str, ast.OpClass] = {}
        for imported in rule_file.imports:
            if "\x00" in imported.path:
                self.diagnostics.append(source.diagnostic(imported.span, "a path cannot contain a NUL character"))
                continue
            # Only rules files, and refused before reading: a syntax error
            # would quote the first line of whatever was named (/etc/shadow).
            if not imported.path.endswith(".rules"):
                self.diagnostics.append(source.diagnostic(
                    imported.span, f"cannot import '{imported.path}': only a .rules file can be imported"
                ))
                continue
            try:
                target = _resolve(path.parent / imported.path)
            except UnreadableRules as error:
                self.diagnostics.append(source.diagnostic(
                    imported.span, f"cannot import '{imported.path}': {error.reason}"
                ))
                continue
            if not target.name.endswith(".rules"):  # a link named .rules to some other file
                self.diagnostics.append(source.diagnostic(
                    imported.span, f"cannot import '{imported.path}': it links to '{target}', not a .rules file"
                ))
                continue
            if target in stack:
                self.diagnostics.append(source.diagnostic(imported.span, f"import cycle through '{imported.path}'"))
                continue
            other = self.parse(target, (source, imported.span))
            if other is None:
                continue
            other_source = self.parsed[target][1]
            if other.dialect != rule_file.dialect:
                self.diagnostics.append(source.diagnostic(
                    imported.span,
                    f"'{imported.path}' is dialect '{other.dialect}', this file is '{rule_file.dialect}'",
                ))
                continue
            available = self.classes_visible(target, other, other_source, stack + (path.resolve(),))
            names = imported.names if imported.names is not None else tuple(available)
            for name in names:
                if name not in available:
                    self.diagnostics.append(source.diagnostic(
                        imported.span, f"'{imported.path}' has no class '{name}'"
                    ))
                else:
                    visible[name] = available[name]
        for op_class in rule_file.classes:
            if op_class.name in visible:
                self.diagnostics.append(source.diagnostic(op_class.span, f"class '{op_class.name}' is defined twice"))
            visible[op_class.name] = op_class
        return visible


def _links_to_rules(path: Path, diagnostics: list[Diagnostic]) -> bool:
    """Whether a file found in a folder is, after symlinks, a .rules file.

    As for imports: a link named x.rules to another file is not read, lest
    a syntax error quote that file's first line.
    """
    try:
        target = _resolve(path)
    except UnreadableRules as error:
        diagnostics.append(Diagnostic(ast.Span(str(path), 1, 1), f"cannot read rules file: {error.reason}"))
        return False
    if target.name.endswith(".rules"):
        return True
    diagnostics.append(Diagnostic(
        ast.Span(str(path), 1, 1), f"cannot read rules file: it links to '{target}', not a .rules file"
    ))
    return False


def _resolve(path: Path) -> Path:
    """`path.resolve()`, with a symlink loop an `UnreadableRules`, not a RuntimeError."""
    try:
        return path.resolve()
    except (OSError, RuntimeError) as error:
        raise UnreadableRules(f"cannot resolve the path ({error})") from None


def _display_path(path: Path) -> str:
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def load_rule_files(
    paths: Sequence[str | Path],
    schema_for: SchemaLookup,
    predicates: dict[str, Signature] | None = None,
    dialects: Collection[str] | None = None,
    known_dialects: Collection[str] = (),
) -> LoadedRules:
    """Parse and check every rules file named by `paths` (files or folders).

    With `dialects`, files of other dialects (among `known_dialects`) are
    parsed but neither checked nor loaded: checking needs the dialect's op
    schema, and importing a backend's IR library is not free.
    Raises `RuleError` with every error found; warnings are returned.
    """
    loader = _Loader(schema_for, predicates or {})
    files: list[Path] = []
    for path in paths:
        found = rules_files(path)
        if not found:
            loader.diagnostics.append(Diagnostic(ast.Span(str(path), 1, 1), "no .rules files here"))
        if Path(path).is_dir():
            found = [file for file in found if _links_to_rules(file, loader.diagnostics)]
        files.extend(found)

    rules: list[ast.Rule] = []
    all_classes: dict[str, ast.OpClass] = {}
    seen_rules: dict[str, ast.Rule] = {}
    warnings: list[Diagnostic] = []
    skipped: list[tuple[str, str]] = []
    other_dialects = set(known_dialects) - set(dialects or ())
    for path in files:
        if dialects is not None:
            declared = _declared_dialect(path)
            if declared in other_dialects:
                skipped.append((str(path), declared))
                continue  # not even parsed: a large library of another dialect costs nothing
        rule_file = loader.parse(path, None)
        if rule_file is None:
            continue
        source = loader.parsed[_resolve(path)][1]
        if rule_file.dialect is None:
            loader.diagnostics.append(source.diagnostic(
                source.span_at(1, 1), "missing 'dialect' declaration (e.g. 'dialect mil')"
            ))
            continue
        if dialects is not None and rule_file.dialect in other_dialects:
            skipped.append((str(path), rule_file.dialect))
            continue
        schema = loader.schema_for(rule_file.dialect)
        if schema is None:
            assert rule_file.dialect_span is not None  # the parser sets it with the dialect
            loader.diagnostics.append(source.diagnostic(
                rule_file.dialect_span, f"unknown dialect '{rule_file.dialect}'"
            ))
            continue
        classes = loader.classes_visible(path, rule_file, source)
        checker = Checker(source, classes, schema, loader.predicates)
        for op_class in rule_file.classes:
            checker.check_class(op_class)
            all_classes.setdefault(op_class.name, op_class)
        # Whether the file has an error so far: lint only runs until one. Each
        # diagnostic is looked at once (rescanning them all per rule made a
        # file with thousands of warnings quadratic to load).
        looked_at, erred = 0, False
        for rule in rule_file.rules:
            if rule.name in seen_rules:
                checker.error(rule.span, f"rule '{rule.name}' is already defined at {seen_rules[rule.name].span}")
                continue
            seen_rules[rule.name] = rule
            checked = checker.check_rule(rule)
            rules.append(checked)
            diagnostics = checker.diagnostics
            if not erred:
                erred = any(d.severity == "error" for d in diagnostics[looked_at:])
            if not erred:
                diagnostics.extend(lint_rule(checked, source))
            looked_at = len(diagnostics)
        for diagnostic in checker.diagnostics:
            (warnings if diagnostic.severity == "warning" else loader.diagnostics).append(diagnostic)

    if loader.diagnostics:
        raise RuleError(loader.diagnostics)
    sources = {source.path: source for _, source in loader.parsed.values()}
    warnings.extend(_shadowing(rules, sources))
    warnings.extend(lint_cycles(rules, sources, loader.schema_for))
    return LoadedRules(
        tuple(rules), all_classes, tuple(warnings), tuple(str(f) for f in files), tuple(skipped)
    )


def _shadowing(rules: list[ast.Rule], sources: dict[str, SourceText]) -> list[Diagnostic]:
    """What `lint_shadowing(rules, sources)` warns, found without comparing every pair of rules.

    `lint_shadowing` tries each rule against every rule tried before it: 32
    million pairs in a file of 8,000 rules, each a deep comparison. It warns
    about a rule when an earlier one has the same dialect and match clauses
    and no condition the later one lacks; the first such earlier rule is the
    one it names. Here, rules with the same dialect and matches are grouped,
    each group keeps the first rule (in the order rules are tried) with each
    set of conditions, and a rule with k conditions looks up the 2^k subsets
    of its own (scanning the group's sets instead when k is large). The
    warning itself comes from `lint_shadowing` on the pair found, so its
    words and its verdict stay lint's.
    """
    ordered = sorted(enumerate(rules), key=lambda item: (-item[1].benefit, item[0]))
    groups: dict[tuple, dict[frozenset, tuple[int, ast.Rule]]] = {}
    # Each distinct condition as a number: an AST node's hash walks all of
    # it each time, and the subsets are hashed many times over.
    numbers: dict[object, int] = {}
    warnings: list[Diagnostic] = []
    for position, (_, later) in enumerate(ordered):
        seen = groups.setdefault((later.dialect, later.matches), {})
        conditions = frozenset(numbers.setdefault(condition.expr, len(numbers)) for condition in later.conditions)
        if seen:
            earlier = _first_subset(seen, conditions)
            if earlier is not None:
                warnings.extend(lint_shadowing([earlier, later], sources))
        seen.setdefault(conditions, (position, later))
    return warnings


# Beyond this many conditions a rule's subsets are more than its group's sets, likely.
_SUBSET_LOOKUP_LIMIT = 10


def _first_subset(seen: dict[frozenset, tuple[int, ast.Rule]], conditions: frozenset) -> ast.Rule | None:
    """Of the rules in `seen` (by condition set, with their place in order), the first whose set is in `conditions`."""
    best: tuple[int, ast.Rule] | None = None
    if len(conditions) <= _SUBSET_LOOKUP_LIMIT:
        items = list(conditions)
        for size in range(len(items) + 1):
            for subset in itertools.combinations(items, size):
                found = seen.get(frozenset(subset))
                if found is not None and (best is None or found[0] < best[0]):
                    best = found
    else:
        for condition_set, found in seen.items():
            if condition_set <= conditions and (best is None or found[0] < best[0]):
                best = found
    return None if best is None else best[1]


_DIALECT_LINE = re.compile(r"\s*dialect\s+([A-Za-z_][A-Za-z0-9_]*)")

# How much of a file is searched for its dialect declaration; a longer
# preamble of comments only means the file is parsed to find it.
_DIALECT_SEARCH_BYTES = 64 * 1024


def _declared_dialect(path: Path) -> str | None:
    """The dialect a file declares on its first line of code, read without
    parsing; None if that line is something else (the parser will say what),
    or if the file is not one the loader would read (it will say why)."""
    try:
        with _open_regular(path) as handle:
            head = handle.read(_DIALECT_SEARCH_BYTES + 1)
    except (UnreadableRules, OSError):
        return None
    if head.startswith(_BOM):
        head = head[len(_BOM) :]
    lines = head.split(b"\n")
    if len(head) > _DIALECT_SEARCH_BYTES:
        lines.pop()  # cut off: not a whole line
    for line in lines:
        code = line.decode("utf-8", errors="replace").split("#", 1)[0].strip()
        if code:
            match = _DIALECT_LINE.fullmatch(code)
            return match.group(1) if match else None
    return None
