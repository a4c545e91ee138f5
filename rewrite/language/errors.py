"""Diagnostics for rules files: `file:line:col`, the line, and a caret."""

from __future__ import annotations

from dataclasses import dataclass

from rewrite.language.ast import Span

# A longer source line is shown as this many characters around the caret, so
# that a rule written on one enormous line does not flood the terminal.
_SHOWN_WIDTH = 100


@dataclass(frozen=True)
class Diagnostic:
    """One finding about a rules file. `severity` is "error", "warning" or "note".

    A note with `more` stands for that many errors of its file not shown
    (a file with more syntax errors than are worth reading at once).
    """

    span: Span
    message: str
    severity: str = "error"
    source_line: str = ""
    more: int = 0

    def render(self) -> str:
        head = f"{self.span}: {self.severity}: {self.message}"
        if not self.source_line:
            return head
        # Tabs and other control characters would throw the caret off; show
        # each as a single space.
        line = "".join(" " if not c.isprintable() else c for c in self.source_line)
        offset = max(self.span.column - 1, 0)
        if len(line) > _SHOWN_WIDTH:
            start = max(0, min(offset - _SHOWN_WIDTH // 2, len(line) - _SHOWN_WIDTH))
            end = start + _SHOWN_WIDTH
            before = "..." if start > 0 else ""
            after = "..." if end < len(line) else ""
            line = before + line[start:end] + after
            offset += len(before) - start
        caret = " " * offset + "^"
        return f"{head}\n  {line}\n  {caret}"


class RuleError(Exception):
    """A rules file could not be loaded. Carries every error found, in order."""

    def __init__(self, diagnostics: list[Diagnostic]):
        self.diagnostics = tuple(diagnostics)
        super().__init__(self.render())

    @property
    def first(self) -> Diagnostic:
        return self.diagnostics[0]

    @property
    def error_count(self) -> int:
        """How many errors were found, those not shown included."""
        return sum((d.severity == "error") + d.more for d in self.diagnostics)

    def render(self) -> str:
        return "\n".join(d.render() for d in self.diagnostics)


class SourceText:
    """The text of one rules file, to quote lines back in diagnostics."""

    def __init__(self, path: str, text: str):
        self.path = path
        self.text = text
        # Lines as lark counts them: split at "\n" only (str.splitlines would
        # also split at form feeds and the like that comments may contain).
        self.lines = text.split("\n")
        if self.lines and self.lines[-1] == "":
            self.lines.pop()
        self.lines = [line.removesuffix("\r") for line in self.lines]

    def line(self, number: int) -> str:
        if 1 <= number <= len(self.lines):
            return self.lines[number - 1]
        return ""

    def diagnostic(self, span: Span, message: str, severity: str = "error") -> Diagnostic:
        return Diagnostic(span, message, severity, self.line(span.line))

    def span_at(self, line: int, column: int) -> Span:
        """A span at (line, column), clamped to a place that exists in the text."""
        if not self.lines:
            return Span(self.path, 1, 1)
        line = min(max(line, 1), len(self.lines))
        column = min(max(column, 1), len(self.line(line)) + 1)
        return Span(self.path, line, column)
