"""Reading rules files from disk: imports, op classes, and checking.

`load_rule_files` is the one entry from paths to checked rules. It parses
every file (and every file they import, once), resolves op classes, and
checks each rule against the op schema of its dialect. All errors of all
files are collected before it raises, so one run shows every mistake.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from pathlib import Path

from rewrite.engine.interfaces import OpSchema
from rewrite.language import ast
from rewrite.language.checker import Checker
from rewrite.language.errors import Diagnostic, RuleError, SourceText
from rewrite.language.lint import lint_rule, lint_shadowing
from rewrite.language.parser import parse_rules
from rewrite.language.types import Signature

SchemaLookup = Callable[[str], "OpSchema | None"]


@dataclass(frozen=True)
class LoadedRules:
    """Checked rules, in load order, with the warnings found on the way."""

    rules: tuple[ast.Rule, ...]
    classes: dict[str, ast.OpClass]
    warnings: tuple[Diagnostic, ...]
    files: tuple[str, ...]


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
        path = path.resolve()
        if path in self.parsed:
            return self.parsed[path][0]
        try:
            # newline="": keep "\r" as written, so lines number as lark counts them.
            with open(path, encoding="utf-8", newline="") as handle:
                text = handle.read()
        except (OSError, UnicodeDecodeError, ValueError) as error:  # ValueError: a NUL in the path
            reason = error.strerror if isinstance(error, OSError) and error.strerror else str(error)
            if cited_at is None:
                self.diagnostics.append(Diagnostic(ast.Span(str(path), 1, 1), f"cannot read rules file: {reason}"))
            else:
                source, span = cited_at
                self.diagnostics.append(source.diagnostic(span, f"cannot import '{path}': {reason}"))
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
            target = (path.parent / imported.path).resolve()
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
        files.extend(found)

    rules: list[ast.Rule] = []
    all_classes: dict[str, ast.OpClass] = {}
    seen_rules: dict[str, ast.Rule] = {}
    warnings: list[Diagnostic] = []
    for path in files:
        if dialects is not None and _declared_dialect(path) in set(known_dialects) - set(dialects):
            continue  # not even parsed: a large library of another dialect costs nothing
        rule_file = loader.parse(path, None)
        if rule_file is None:
            continue
        source = loader.parsed[path.resolve()][1]
        if rule_file.dialect is None:
            loader.diagnostics.append(source.diagnostic(
                source.span_at(1, 1), "missing 'dialect' declaration (e.g. 'dialect mil')"
            ))
            continue
        if dialects is not None and rule_file.dialect not in dialects and rule_file.dialect in known_dialects:
            continue
        schema = loader.schema_for(rule_file.dialect)
        if schema is None:
            loader.diagnostics.append(source.diagnostic(
                rule_file.dialect_span, f"unknown dialect '{rule_file.dialect}'"
            ))
            continue
        classes = loader.classes_visible(path, rule_file, source)
        checker = Checker(source, classes, schema, loader.predicates)
        for op_class in rule_file.classes:
            checker.check_class(op_class)
            all_classes.setdefault(op_class.name, op_class)
        for rule in rule_file.rules:
            if rule.name in seen_rules:
                checker.error(rule.span, f"rule '{rule.name}' is already defined at {seen_rules[rule.name].span}")
                continue
            seen_rules[rule.name] = rule
            checked = checker.check_rule(rule)
            rules.append(checked)
            if not any(d.severity == "error" for d in checker.diagnostics):
                checker.diagnostics.extend(lint_rule(checked, source))
        for diagnostic in checker.diagnostics:
            (warnings if diagnostic.severity == "warning" else loader.diagnostics).append(diagnostic)

    if loader.diagnostics:
        raise RuleError(loader.diagnostics)
    sources = {source.path: source for _, source in loader.parsed.values()}
    warnings.extend(lint_shadowing(rules, sources))
    return LoadedRules(tuple(rules), all_classes, tuple(warnings), tuple(str(f) for f in files))


_DIALECT_LINE = re.compile(r"\s*dialect\s+([A-Za-z_][A-Za-z0-9_]*)")


def _declared_dialect(path: Path) -> str | None:
    """The dialect a file declares on its first line of code, read without
    parsing; None if that line is something else (the parser will say what)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            for line in handle:
                code = line.split("#", 1)[0].strip()
                if code:
                    match = _DIALECT_LINE.fullmatch(code)
                    return match.group(1) if match else None
    except OSError:
        return None
    return None
