"""Mutation score of the shipped rule library: is every condition needed, or known harmless to drop?

    python bench/mutation_score.py [--trials 200] [--rule NAME ...] [--markdown]

Each mutant is the shipped library with one condition of one rule deleted,
as an author would delete it in the text:

- each `where` clause, whole;
- each top-level conjunct of a clause that has several (`a and b and c`).

A mutant that loads is *caught* when one of the rule's own examples fails,
or when `verify` finds a counterexample (on instances shaped by the full
rule, so the generator aims where the deleted condition mattered). A
mutant that is not caught must have an entry in `ARGUMENTS`: a one-line
reason the rule is sound without that condition. The script exits 1 if
any uncaught mutant lacks one, so the table in a closing note is complete.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np

import rewrite
from rewrite.examples import run_examples
from rewrite.language import ast
from rewrite.verify import verify_rule

# (rule, deleted condition text with whitespace collapsed) -> why the rule stays sound without it.
ARGUMENTS: dict[tuple[str, str], str] = {}


@dataclass(frozen=True)
class Mutant:
    rule: str
    deleted: str  # the condition text taken out
    location: str
    files: dict  # file name -> mutated text


@dataclass(frozen=True)
class Outcome:
    mutant: Mutant
    verdict: str  # "does not load", "caught by examples", "caught by verify", "not caught"
    detail: str = ""


def _squash(text: str) -> str:
    return " ".join(text.split())


def _offset(lines: list[str], line: int, column: int) -> int:
    return sum(len(text) for text in lines[: line - 1]) + column - 1


def _cut(text: str, span: ast.Span) -> tuple[int, int]:
    lines = text.splitlines(keepends=True)
    return _offset(lines, span.line, span.column), _offset(lines, span.end_line, span.end_column)


def mutants(folder: Path, only: set[str] | None = None):
    sources = {path.name: path.read_text() for path in sorted(folder.glob("*.rules"))}
    for rule in rewrite.load_rules(folder).rules:
        if only and rule.name not in only:
            continue
        name = Path(rule.span.file).name
        text = sources[name]
        for condition in rule.conditions:
            lines = text.splitlines(keepends=True)
            # The whole clause: from `where` to the end of its last line.
            start = _offset(lines, condition.span.line, 1)
            end = _offset(lines, condition.span.end_line + 1, 1) if condition.span.end_line < len(lines) else len(text)
            yield Mutant(rule.name, _squash(condition.text), str(condition.span),
                         {**sources, name: text[:start] + text[end:]})
            parts = ast.conjuncts(condition.expr)
            if len(parts) < 2:
                continue
            begin, finish = _cut(text, condition.expr.span)
            for index, part in enumerate(parts):
                kept = [text[slice(*_cut(text, p.span))] for i, p in enumerate(parts) if i != index]
                rewritten = " and ".join(f"({k})" for k in kept)
                deleted = text[slice(*_cut(text, part.span))]
                yield Mutant(rule.name, _squash(deleted), str(part.span),
                             {**sources, name: text[:begin] + rewritten + text[finish:]})


def judge(mutant: Mutant, original: ast.Rule, trials: int) -> Outcome:
    with tempfile.TemporaryDirectory() as scratch:
        for name, text in mutant.files.items():
            (Path(scratch) / name).write_text(text)
        try:
            rule_set = rewrite.load_rules(scratch).only(mutant.rule)
            (rule,) = rule_set.rules
        except Exception as error:  # the deletion left the rule ill-formed: no mutant
            return Outcome(mutant, "does not load", str(error).splitlines()[0])
        failed = [r for r in run_examples(rule_set) if not r.passed]
        if failed:
            return Outcome(mutant, "caught by examples", failed[0].description)
        verdict = verify_rule(rule, trials=trials, seed=0, necessity=False, shaped_by=original)
        if verdict.counterexample is not None:
            return Outcome(mutant, "caught by verify", verdict.counterexample.problem)
    return Outcome(mutant, "not caught", ARGUMENTS.get((mutant.rule, mutant.deleted), ""))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=200)
    parser.add_argument("--rule", action="append", help="only these rules")
    parser.add_argument("--markdown", action="store_true", help="print the uncaught mutants as a table")
    args = parser.parse_args(argv)
    warnings.simplefilter("ignore")
    np.seterr(all="ignore")
    started = time.perf_counter()
    shipped = rewrite.shipped_rules_path()
    originals = {rule.name: rule for rule in rewrite.load_rules().rules}
    outcomes = []
    for dialect_folder in sorted(p for p in shipped.iterdir() if p.is_dir()):
        for mutant in mutants(dialect_folder, set(args.rule) if args.rule else None):
            outcome = judge(mutant, originals[mutant.rule], args.trials)
            outcomes.append(outcome)
            print(f"{outcome.verdict:20} {mutant.rule}: {mutant.deleted[:70]}", file=sys.stderr)
    loaded = [o for o in outcomes if o.verdict != "does not load"]
    caught = [o for o in loaded if o.verdict.startswith("caught")]
    uncaught = [o for o in loaded if o.verdict == "not caught"]
    unargued = [o for o in uncaught if not o.detail]
    print(f"\n{len(outcomes)} mutants, {len(loaded)} load; caught {len(caught)} "
          f"({sum(o.verdict == 'caught by examples' for o in caught)} by examples, "
          f"{sum(o.verdict == 'caught by verify' for o in caught)} by verify); "
          f"{len(uncaught)} not caught, {len(uncaught) - len(unargued)} of them argued sound; "
          f"{time.perf_counter() - started:.0f} s")
    if args.markdown:
        print("\n| rule | deleted condition | why the rule is sound without it |\n|---|---|---|")
        for o in uncaught:
            print(f"| {o.mutant.rule} | `{o.mutant.deleted}` | {o.detail or '**no argument**'} |")
    for o in unargued:
        print(f"NO ARGUMENT  {o.mutant.rule} ({o.mutant.location}): {o.mutant.deleted}")
    return 1 if unargued else 0


if __name__ == "__main__":
    sys.exit(main())
