"""The embedding API: load rules, apply them to a program."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rewrite import backends, resources
from rewrite.engine.driver import DEFAULT_MAX_SWEEPS, Driver, Progress, Statistics
from rewrite.engine.interfaces import Capability, optional
from rewrite.engine.steps import Steps
from rewrite.language import assumptions, ast
from rewrite.language.errors import Diagnostic
from rewrite.language.loader import load_rule_files
from rewrite.predicates import registered_predicates


@dataclass(frozen=True)
class RuleSet:
    """Checked rules, ready to apply. Build one with `load_rules`."""

    rules: tuple[ast.Rule, ...]
    warnings: tuple[Diagnostic, ...] = ()
    files: tuple[str, ...] = ()
    skipped_files: tuple[tuple[str, str], ...] = ()  # (path, dialect) of files of another dialect

    def for_dialect(self, dialect: str) -> tuple[ast.Rule, ...]:
        return tuple(rule for rule in self.rules if rule.dialect == dialect)

    def only(self, *names: str) -> RuleSet:
        """The subset of rules with these names (raises KeyError for an unknown one)."""
        known = {rule.name for rule in self.rules}
        for name in names:
            if name not in known:
                raise KeyError(f"no rule named '{name}'")
        return RuleSet(tuple(r for r in self.rules if r.name in names), self.warnings, self.files, self.skipped_files)

    def group(self, name: str) -> RuleSet:
        """The subset of rules whose `group` clauses name `name`, in load order."""
        return RuleSet(tuple(r for r in self.rules if name in r.group_names), self.warnings, self.files,
                       self.skipped_files)

    def apply(
        self,
        program: Any,
        *,
        max_sweeps: int = DEFAULT_MAX_SWEEPS,
        check_types: bool = False,
        progress: Progress | None = None,
        count_ops: bool = False,
        steps: Steps | None = None,
        source: Any = None,
        assume: Iterable[str] = (),
    ) -> Statistics:
        """Rewrite `program` in place with the rules of its dialect; return statistics.

        `program` is a coremltools MIL `Program` or an `onnx.ModelProto`.
        Raises `RewriteLimitError` if rules are still firing after
        `max_sweeps` sweeps. With `check_types`, every rewrite re-derives its
        consumers' types and a change raises `UnsoundRewriteError` naming the
        rule (slower; for developing and testing rules). With `count_ops`,
        the statistics carry `ops_before` and `ops_after` (nested blocks
        included). `steps` records each rewrite by its rule's name, and
        stops the run at its limit (see `rewrite.engine.steps`). For an ONNX
        model read by `rewrite.backends.onnx.files.read_onnx` with its
        external data left on disk, `source` (what it returned) says where.
        A rule with an `assume` clause fires only if `assume` grants all it
        assumes (`rewrite.language.assumptions`: `"no_nans"`,
        `"no_signed_zeros"`); elsewhere the statistics count it as `kept`.
        """
        with paused_garbage_collection():
            adapter = backends.adapter_for(program, check_types=check_types, source=source)
            try:
                return self.apply_with(
                    adapter, max_sweeps=max_sweeps, progress=progress, count_ops=count_ops, check_types=check_types,
                    steps=steps, assume=assume,
                )
            finally:
                release = optional(adapter, Capability.RELEASE)  # an index of its own, now done with
                if release is not None:
                    release()

    def apply_with(
        self,
        adapter,
        *,
        max_sweeps: int = DEFAULT_MAX_SWEEPS,
        progress: Progress | None = None,
        count_ops: bool = False,
        check_types: bool = False,
        steps: Steps | None = None,
        assume: Iterable[str] = (),
    ) -> Statistics:
        """Like `apply`, over an adapter you built (for a backend of your own).

        `steps` records each rewrite by its rule's name, and stops the run at
        its limit (`Steps`).
        """
        rules = self.for_dialect(adapter.dialect)
        driver = Driver(
            rules, adapter, registered_predicates(), max_sweeps=max_sweeps, progress=progress, count_ops=count_ops,
            check_types=check_types, steps=steps, assume=assumptions.granted(assume),
        )
        return driver.run()


@contextlib.contextmanager
def paused_garbage_collection():
    """Pause CPython's cyclic garbage collector for a bulk graph job.

    Indexing and rewriting a large graph allocates hundreds of thousands of
    long-lived objects, and every generation-2 pass would rescan them all
    (30% of the time at 100k ONNX nodes). What a run leaves unreachable is
    collected once, when it ends.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def load_rules(*paths: str | Path, dialects: Sequence[str] | None = None) -> RuleSet:
    """Load `.rules` files or folders of them (all `.rules` files below a folder).

    With no path, loads the shipped rule library. With `dialects` (e.g.
    `["onnx"]`), only rules of those dialects are checked and loaded. Raises
    `RuleError` listing every error, each with `file:line:col`.
    """
    if not paths:
        paths = (resources.rules_path(),)
    predicates = {name: p.signature for name, p in registered_predicates().items()}
    # Rules are trees of frozen dataclasses, without a cycle among them: the
    # cyclic collector only rescans them as they pile up (half the time of
    # loading a file of 8,000 rules).
    with paused_garbage_collection():
        loaded = load_rule_files(
            paths, backends.schema_for, predicates, dialects=dialects, known_dialects=backends.dialects()
        )
    return RuleSet(loaded.rules, loaded.warnings, loaded.files, loaded.skipped_files)


def shipped_rules_path() -> Path:
    """The folder of the rule library that ships with this package."""
    return resources.rules_path()


__all__ = ["RuleSet", "load_rules", "shipped_rules_path"]
