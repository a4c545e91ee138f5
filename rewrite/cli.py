"""The `rewrite` command line.

    rewrite apply [--rules FILE_OR_DIR ...] INPUT -o OUTPUT
    rewrite check RULES...

User mistakes (a bad rules file, a missing or corrupt model) end with exit
code 2 and our own message, never a traceback. Outputs are written to a
temporary path beside the destination and moved into place only when
complete, so a failure leaves nothing half-written.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import sys
import tempfile
import warnings
from pathlib import Path

EXIT_OK = 0
EXIT_FINDINGS = 1
EXIT_USAGE = 2


class UserError(Exception):
    """A mistake in what the user gave us; printed as one line, exit 2."""


def _quiet_third_party() -> None:
    # coremltools logs import-time warnings on Linux; they are not ours to
    # show. (Its pass-pipeline progress bars are silenced where the MIL
    # backend saves, so that our own progress bar still works.)
    logging.getLogger("coremltools").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rewrite",
        description="Rule-based graph rewriting for Core ML (MIL) and ONNX models.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    apply = commands.add_parser("apply", help="rewrite a model with rules")
    apply.add_argument("input", metavar="INPUT", help="an .mlpackage or an .onnx file")
    apply.add_argument("-o", "--output", metavar="OUTPUT", help="where to write the rewritten model")
    apply.add_argument(
        "--rules", action="append", metavar="FILE_OR_DIR",
        help="a .rules file or a folder of them (repeatable; default: the shipped library)",
    )
    apply.add_argument("--rule", action="append", metavar="NAME", help="apply only this rule (repeatable)")
    apply.add_argument("--in-place", action="store_true", help="overwrite INPUT with the result")
    apply.add_argument("--max-sweeps", type=int, default=None, metavar="N",
                       help="give up when rules still fire after N sweeps")
    apply.add_argument("--check-types", action="store_true",
                       help="re-derive types after each rewrite and stop at a rule that changes one")
    apply.add_argument("--stats", action="store_true", help="also print attempts and time per rule")
    apply.add_argument("--json", action="store_true", help="print the statistics as JSON")

    explain = commands.add_parser("explain", help="say why each rule fires or not on each anchor")
    explain.add_argument("rules", metavar="RULES", help="a .rules file or a folder of them")
    explain.add_argument("model", metavar="MODEL", help="an .mlpackage or an .onnx file (not changed)")
    explain.add_argument("--rule", metavar="NAME", help="only this rule")
    explain.add_argument("--op", metavar="NAME", help="only the anchor op (or node) with this name")
    explain.add_argument("--json", action="store_true", help="print the explanations as JSON")

    test = commands.add_parser("test", help="run the examples the rules carry")
    test.add_argument("rules", nargs="+", metavar="RULES", help=".rules files or folders")
    test.add_argument("--rule", metavar="NAME", help="only this rule's examples")

    verify = commands.add_parser("verify", help="try random instances of each rule, before against after")
    verify.add_argument("rules", nargs="+", metavar="RULES", help=".rules files or folders")
    verify.add_argument("--rule", metavar="NAME", help="only this rule")
    verify.add_argument("--trials", type=int, default=50, metavar="N", help="instances to try per rule")
    verify.add_argument("--seed", type=int, default=0, metavar="S", help="random seed")

    check = commands.add_parser("check", help="parse and check rules files")
    check.add_argument("rules", nargs="+", metavar="RULES", help=".rules files or folders")
    check.add_argument("--backend", choices=["mil", "onnx"], help="check only the rules of this dialect")
    return parser


def main(argv: list[str] | None = None) -> int:
    _quiet_third_party()
    arguments = _parser().parse_args(argv)
    try:
        if arguments.command == "apply":
            return _apply(arguments)
        if arguments.command == "explain":
            return _explain(arguments)
        if arguments.command == "test":
            return _test(arguments)
        if arguments.command == "verify":
            return _verify(arguments)
        return _check(arguments)
    except UserError as error:
        print(f"rewrite: error: {error}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("rewrite: interrupted", file=sys.stderr)
        return 130


def _load_rules(paths, dialect: str | None):
    import rewrite

    try:
        return rewrite.load_rules(*paths, dialects=None if dialect is None else [dialect])
    except rewrite.RuleError as error:
        print(error.render(), file=sys.stderr)
        raise UserError(f"{len(error.diagnostics)} error(s) in rules") from None


def _check(arguments) -> int:
    for path in arguments.rules:
        if not Path(path).exists():
            raise UserError(f"{path}: no such file or directory")
    import rewrite

    dialects = [arguments.backend] if arguments.backend else None
    try:
        rule_set = rewrite.load_rules(*arguments.rules, dialects=dialects)
    except rewrite.RuleError as error:
        print(error.render(), file=sys.stderr)
        return EXIT_FINDINGS
    for warning in rule_set.warnings:
        print(warning.render(), file=sys.stderr)
    warnings = f", {len(rule_set.warnings)} warning(s)" if rule_set.warnings else ""
    print(f"{len(rule_set.rules)} rule(s) in {len(rule_set.files)} file(s): no errors{warnings}")
    return EXIT_OK


class _Model:
    """A model file of one format: how to read it, count its ops and write it back."""

    def __init__(self, path: Path):
        suffix = path.suffix.lower()
        if suffix in (".mlpackage", ".mlmodel"):
            self.format = "mil"
        elif suffix == ".onnx":
            self.format = "onnx"
        else:
            raise UserError(f"{path}: unknown model format (expected an .mlpackage or an .onnx file)")
        self.path = path

    def load(self) -> None:
        if self.format == "mil":
            from rewrite.backends import mil

            try:
                self.program, self._saved_with = mil.load_mlpackage(self.path)
            except mil.MilError as error:
                raise UserError(str(error)) from None
        else:
            from rewrite.backends import onnx as onnx_backend

            try:
                self.program, self._saved_with = onnx_backend.load_onnx(self.path)
            except onnx_backend.OnnxError as error:
                raise UserError(str(error)) from None

    def count_ops(self) -> int:
        if self.format == "mil":
            from rewrite.backends.mil import count_ops

            return count_ops(self.program)
        from rewrite.backends.onnx import count_nodes

        return count_nodes(self.program)

    def save(self, path: Path) -> None:
        if self.format == "mil":
            from rewrite.backends.mil import save_mlpackage

            save_mlpackage(self.program, path, self._saved_with)
        else:
            from rewrite.backends.onnx import save_onnx

            save_onnx(self.program, path, external_data=self._saved_with)


def _test(arguments) -> int:
    for path in arguments.rules:
        if not Path(path).exists():
            raise UserError(f"{path}: no such file or directory")
    rule_set = _load_rules(arguments.rules, None)
    from rewrite.examples import run_examples

    results = run_examples(rule_set, arguments.rule)
    for result in results:
        verdict = "PASS" if result.passed else "FAIL"
        print(f"{verdict}  {result.rule}: {result.description}  ({result.location})")
        if not result.passed:
            print("      " + result.message.replace("\n", "\n      "))
    failed = sum(not r.passed for r in results)
    print(f"{len(results) - failed} passed, {failed} failed")
    return EXIT_FINDINGS if failed else EXIT_OK


def _verify(arguments) -> int:
    for path in arguments.rules:
        if not Path(path).exists():
            raise UserError(f"{path}: no such file or directory")
    rule_set = _load_rules(arguments.rules, None)
    if arguments.rule:
        try:
            rule_set = rule_set.only(arguments.rule)
        except KeyError as error:
            raise UserError(error.args[0]) from None
    import numpy

    from rewrite.verify import format_verdict, verify_rule

    failed = 0
    with numpy.errstate(all="ignore"):
        for rule in rule_set.rules:
            verdict = verify_rule(rule, trials=arguments.trials, seed=arguments.seed)
            failed += not verdict.passed
            print(format_verdict(verdict))
    return EXIT_FINDINGS if failed else EXIT_OK


def _explain(arguments) -> int:
    model = _Model(Path(arguments.model))
    if not model.path.exists():
        raise UserError(f"{model.path}: no such file or directory")
    if not Path(arguments.rules).exists():
        raise UserError(f"{arguments.rules}: no such file or directory")
    rule_set = _load_rules([arguments.rules], model.format)
    if arguments.rule and arguments.rule not in {r.name for r in rule_set.rules}:
        raise UserError(f"no rule named '{arguments.rule}' for {model.format} in {arguments.rules}")
    model.load()

    from rewrite import backends
    from rewrite.engine.explain import explain, format_text
    from rewrite.predicates import registered_predicates

    adapter = backends.adapter_for(model.program)
    explanations = explain(
        rule_set.rules, adapter, registered_predicates(), rule_name=arguments.rule, op_name=arguments.op
    )
    if arguments.json:
        print(json.dumps([e.as_dict() for e in explanations], indent=2))
    elif explanations:
        print(format_text(explanations))
    else:
        print("no candidate anchors")
    return EXIT_OK


def _apply(arguments) -> int:
    source = Path(arguments.input)
    if not source.exists():
        raise UserError(f"{source}: no such file or directory")
    if arguments.in_place:
        if arguments.output and Path(arguments.output).resolve() != source.resolve():
            raise UserError("--in-place writes to INPUT; do not also give -o")
        destination = source
    else:
        if not arguments.output:
            raise UserError("no output given: use -o OUTPUT (or --in-place to overwrite INPUT)")
        destination = Path(arguments.output)
        if destination.resolve() == source.resolve():
            raise UserError(f"{destination}: refusing to overwrite the input; use --in-place")
    model = _Model(source)
    if _Model(destination).format != model.format:
        raise UserError(f"{destination}: the output must have the same format as the input")
    if not destination.parent.exists():
        raise UserError(f"{destination.parent}: no such directory")

    import rewrite
    from rewrite.api import paused_garbage_collection

    # The job only adds long-lived objects: a collector pass would rescan
    # them all (0.4 s of 2.5 s at 100k ONNX nodes). The process ends right
    # after, and an embedder's next collection frees what a run left.
    with paused_garbage_collection():
        rule_set = _load_rules(arguments.rules or [], model.format)
        if arguments.rule:
            try:
                rule_set = rule_set.only(*arguments.rule)
            except KeyError as error:
                raise UserError(error.args[0]) from None
        model.load()
        options = {"check_types": arguments.check_types, "count_ops": True}
        if arguments.max_sweeps is not None:
            options["max_sweeps"] = arguments.max_sweeps
        # The run counts ops from its own index; walking the model for them
        # (0.02 s a walk at 100k ONNX nodes) is only worth it for a bar that
        # a person watches.
        bar = _progress_bar(model.count_ops()) if sys.stderr.isatty() else None
        try:
            statistics = rule_set.apply(model.program, progress=bar, **options)
        except (rewrite.RewriteLimitError, rewrite.UnsoundRewriteError) as error:
            raise UserError(str(error)) from None
        finally:
            if bar is not None:
                bar.close()
        ops_before, ops_after = statistics.ops_before, statistics.ops_after  # both adapters count
        _write_atomically(destination, model.save)
        _report(arguments, statistics, source, destination, ops_before, ops_after)
    return EXIT_OK


PROGRESS_THRESHOLD = 10_000


class _ProgressBar:
    """A tqdm bar per sweep, on stderr."""

    def __init__(self, total: int):
        from tqdm import tqdm

        self._tqdm = tqdm
        self.total = total
        self.bar = None

    def sweep(self, number: int) -> None:
        self.close()
        columns, rows = _terminal_size()
        self.bar = self._tqdm(
            total=self.total, desc=f"sweep {number}", unit="op", file=sys.stderr, leave=False,
            disable=False, mininterval=0.2, ncols=columns, nrows=rows,
        )

    def advance(self, ops: int) -> None:
        if self.bar is not None:
            self.bar.update(ops)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


def _terminal_size() -> tuple[int, int]:
    # A terminal that reports no size (a bare pty) would get a bar of zero
    # columns on a screen of zero rows, which tqdm does not draw.
    try:
        size = os.get_terminal_size(sys.stderr.fileno())
        columns, rows = size.columns, size.lines
    except OSError:
        columns, rows = 0, 0
    return columns or 80, rows or 24


def _progress_bar(ops: int) -> _ProgressBar | None:
    # Only for big models (and the caller asks only for a terminal).
    if ops <= PROGRESS_THRESHOLD:
        return None
    return _ProgressBar(ops)


def _report(arguments, statistics, source, destination, ops_before, ops_after) -> None:
    if arguments.json:
        document = {
            "input": str(source),
            "output": str(destination),
            "ops_before": ops_before,
            "ops_after": ops_after,
            **statistics.as_dict(),
        }
        print(json.dumps(document, indent=2))
        return
    width = max((len(name) for name in statistics.rules), default=0)
    for name, rule in statistics.rules.items():
        line = f"{name:<{width}}  fired {rule.fires}"
        if arguments.stats:
            line += f"  tried {rule.attempts}  {rule.seconds * 1000:.2f} ms"
        print(line)
    print(f"wrote {destination} ({ops_before} -> {ops_after} ops)")


def _write_atomically(destination: Path, write) -> None:
    """Write through `write(temporary_path)`, then move the result into place.

    Everything `write` leaves in the staging folder moves beside the
    destination (an ONNX model's external data file first, the model last).
    """
    parent = destination.parent.resolve()
    staging = Path(tempfile.mkdtemp(prefix=f".{destination.name}.", dir=parent))
    temporary = staging / destination.name
    try:
        try:
            write(temporary)
        except UserError:
            raise
        except Exception as error:  # the libraries raise many kinds; all mean "could not save"
            raise UserError(f"{destination}: could not write the model ({error})") from None
        companions = [p for p in staging.iterdir() if p.name != destination.name]
        for companion in companions:
            os.replace(companion, parent / companion.name)
        if destination.exists():
            os.replace(destination, staging / (destination.name + ".old"))
        os.replace(temporary, destination)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
