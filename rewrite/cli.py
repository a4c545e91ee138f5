"""The `rewrite` command line.

    rewrite apply [--rules FILE_OR_DIR ...] INPUT -o OUTPUT
    rewrite check RULES...

Exit codes, the same for every command (`EXIT_CODES`, shown by `--help`):
0 done, nothing wrong; 1 the command did its work and found something wrong
with the rules or the model; 2 it could not do its work, because something
the user gave could not be read (a rules file that does not load, a missing
or corrupt model, a bad option). Each ends with our own message, never a
traceback. Outputs are written to a temporary path beside the destination
and moved into place only when complete, so a failure leaves nothing
half-written.

One module, though long: one function per command and their shared option
parsing, error and exit-code handling; the work itself lives in the library, so
the module is only wiring.
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import os
import sys
import warnings
from pathlib import Path

from rewrite.language.assumptions import ASSUMPTIONS, flag, granted

EXIT_OK = 0
EXIT_FINDINGS = 1
EXIT_USAGE = 2

EXIT_CODES = """\
exit codes, the same for every command:
  0  done: nothing wrong found
  1  a finding about the rules or the model: an error 'check' finds beyond
     loading (an example the backend cannot build), a failing example or a
     file without any ('test'), a counterexample ('verify'), a rewrite that
     would make the model invalid, change a type ('apply --check-types') or
     not settle within --max-sweeps ('apply')
  2  something given could not be read, so nothing was checked, tested,
     verified, explained or applied: a rules file that does not parse or
     type-check (for 'check' too), a missing or corrupt model, an output
     path that cannot be written, a bad option
"""


class UserError(Exception):
    """A mistake in what the user gave us; printed as one line, exit 2."""


class Finding(Exception):
    """Something wrong with the rules or the model that a command found; printed as one line, exit 1."""


def _quiet_third_party() -> None:
    # coremltools logs import-time warnings on Linux; they are not ours to
    # show. (Its pass-pipeline progress bars are silenced where the MIL
    # backend saves, so that our own progress bar still works.)
    logging.getLogger("coremltools").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")


def _parser() -> argparse.ArgumentParser:
    from rewrite.engine.driver import DEFAULT_MAX_SWEEPS

    parser = argparse.ArgumentParser(
        prog="rewrite",
        description="Rule-based graph rewriting for Core ML (MIL) and ONNX models.",
        epilog=EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    # Each command's --help states the exit codes too: they are one convention.
    described = {"epilog": EXIT_CODES, "formatter_class": argparse.RawDescriptionHelpFormatter}

    apply = commands.add_parser("apply", help="rewrite a model with rules", **described)
    apply.add_argument("input", metavar="INPUT", help="an .mlpackage or an .onnx file")
    apply.add_argument("-o", "--output", metavar="OUTPUT", help="where to write the rewritten model")
    apply.add_argument(
        "--rules", action="append", metavar="FILE_OR_DIR",
        help="a .rules file or a folder of them (repeatable; default: the shipped library)",
    )
    apply.add_argument("--rule", action="append", metavar="NAME", help="apply only this rule (repeatable)")
    apply.add_argument("--rules-only", action="store_true",
                       help="ONNX: only the rules, without constant folding and pruning (the default with --rules)")
    apply.add_argument("--in-place", action="store_true", help="overwrite INPUT with the result")
    apply.add_argument("--opset", type=_positive, default=None, metavar="N",
                       help="ONNX: convert the model to opset N first (onnx.version_converter), so that fusions to "
                            "newer standard ops can fire")
    apply.add_argument("--overridable-initializers", action="store_true",
                       help="ONNX: take initializers the graph lists as inputs as inputs a user may override, "
                            "not as constants, even below IR version 4 (where onnxruntime takes them as constants)")
    apply.add_argument("--max-sweeps", type=_positive, default=None, metavar="N",
                       help=f"give up (exit 1) when rules still fire after N sweeps (default: {DEFAULT_MAX_SWEEPS})")
    apply.add_argument("--check-types", action="store_true",
                       help="re-derive types after each rewrite and stop at a rule that changes one")
    apply.add_argument("--assume", action="append", metavar="NAME", type=_assumption, default=[],
                       help="grant an assumption that rules may state beyond IEEE-exact values (repeatable): "
                            + "; ".join(f"{flag(name)}: {meaning}" for name, meaning in ASSUMPTIONS.items()))
    apply.add_argument("--stats", action="store_true", help="also print attempts and time per rule")
    apply.add_argument("--json", action="store_true", help="print the statistics as JSON")

    explain = commands.add_parser("explain", help="say why each rule fires or not on each anchor", **described)
    explain.add_argument("rules", metavar="RULES", help="a .rules file or a folder of them")
    explain.add_argument("model", metavar="MODEL", help="an .mlpackage or an .onnx file (not changed)")
    explain.add_argument("--rule", metavar="NAME", help="only this rule")
    explain.add_argument("--op", metavar="NAME", help="only the anchor op (or node) with this name")
    explain.add_argument("--assume", action="append", metavar="NAME", type=_assumption, default=[],
                         help="explain as 'apply --assume NAME' would decide (repeatable)")
    explain.add_argument("--json", action="store_true", help="print the explanations as JSON")

    test = commands.add_parser("test", help="run the examples the rules carry", **described)
    test.add_argument("rules", nargs="+", metavar="RULES", help=".rules files or folders")
    test.add_argument("--rule", metavar="NAME", help="only this rule's examples")

    verify = commands.add_parser("verify", help="try random instances of each rule, before against after", **described)
    verify.add_argument("rules", nargs="+", metavar="RULES", help=".rules files or folders")
    verify.add_argument("--rule", metavar="NAME", help="only this rule")
    verify.add_argument("--trials", type=_positive, default=50, metavar="N",
                        help="instances to try per rule (default: %(default)s)")
    verify.add_argument("--seed", type=int, default=0, metavar="S", help="random seed (default: %(default)s)")
    verify.add_argument("--jobs", type=_positive, default=None, metavar="N",
                        help="rules verified at once, each in a process of its own (default: the CPUs this "
                             "process may use); the verdicts print in load order either way")
    verify.add_argument("--allow-unexercised", action="store_true",
                        help="exit 0 although no instance fired some rule (NONE: nothing was checked)")

    check = commands.add_parser("check", help="parse and check rules files", **described)
    check.add_argument("rules", nargs="+", metavar="RULES", help=".rules files or folders")
    check.add_argument("--backend", choices=["mil", "onnx"], help="check only the rules of this dialect")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the `rewrite` command with `argv` (default: `sys.argv[1:]`); return its exit code."""
    _quiet_third_party()
    arguments = _parser().parse_args(argv)
    from rewrite.output import Terminated, terminating_signals_unwind

    try:
        with terminating_signals_unwind():
            return _COMMANDS[arguments.command](arguments)
    except UserError as error:
        print(f"rewrite: error: {error}", file=sys.stderr)
        return EXIT_USAGE
    except Finding as error:
        print(f"rewrite: error: {error}", file=sys.stderr)
        return EXIT_FINDINGS
    except KeyboardInterrupt:
        print("rewrite: interrupted", file=sys.stderr)
        return 130
    except Terminated as signal_received:
        print("rewrite: terminated", file=sys.stderr)
        return 128 + signal_received.signal_number


def _version() -> str:
    from importlib import metadata

    try:
        return metadata.version("rewrite")
    except metadata.PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown"


def _assumption(text: str) -> str:
    try:
        (name,) = granted([text])
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return name


def _positive(text: str) -> int:
    try:
        number = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a whole number") from None
    if number < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {number}")
    return number


def _load_rules(paths, dialect: str | None, explicit: bool = True):
    import rewrite

    try:
        rule_set = rewrite.load_rules(*paths, dialects=None if dialect is None else [dialect])
    except rewrite.RuleError as error:
        raise _unloadable(error) from None
    skipped = rule_set.skipped_files
    if skipped and dialect is not None and (explicit or not rule_set.rules):
        # Rules the user named that cannot apply are a likely mistake: say so.
        others = sorted({other for _, other in skipped})
        names = ", ".join(path for path, _ in skipped[:3]) + (", ..." if len(skipped) > 3 else "")
        message = (f"{_plural(len(skipped), 'rules file')} of dialect {'/'.join(others)} "
                   f"do not apply to this {dialect} model ({names})")
        if not rule_set.rules:
            raise UserError(f"no {dialect} rules given: {message}")
        print(f"rewrite: note: {message}", file=sys.stderr)
    return rule_set


def _unloadable(error) -> UserError:
    """Rules that do not load: every error printed, then the one-line summary, exit 2.

    For every command alike, `check` included: what does not load was not
    read, so nothing in it was checked (see `EXIT_CODES`).
    """
    print(error.render(), file=sys.stderr)
    return UserError(f"{_plural(error.error_count, 'error')} in rules: they do not load")


def _check(arguments) -> int:
    for path in arguments.rules:
        if not Path(path).exists():
            raise UserError(f"{path}: no such file or directory")
    import rewrite

    dialects = [arguments.backend] if arguments.backend else None
    try:
        rule_set = rewrite.load_rules(*arguments.rules, dialects=dialects)
    except rewrite.RuleError as error:
        raise _unloadable(error) from None
    from rewrite.examples import example_errors

    # An example the backend cannot build is as much a mistake as a syntax error.
    unbuildable = example_errors(rule_set.rules)
    for diagnostic in [*unbuildable, *rule_set.warnings]:
        print(diagnostic.render(), file=sys.stderr)
    if unbuildable:
        raise Finding(f"{_plural(len(unbuildable), 'example')} the backend cannot build")
    warnings = f", {len(rule_set.warnings)} warning(s)" if rule_set.warnings else ""
    # Files of another dialect were not checked, so they are not counted.
    checked = len(rule_set.files) - len(rule_set.skipped_files)
    print(f"{len(rule_set.rules)} rule(s) in {checked} file(s): no errors{warnings}")
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
        self.package = suffix == ".mlpackage"

    def load(self) -> None:
        """Read the model, strictly read-only: no file of the input is touched."""
        from rewrite.engine.interfaces import ModelError

        try:
            if self.format == "mil":
                from rewrite.backends.mil import load_mlpackage

                self.program, self.source = load_mlpackage(self.path)
            else:
                from rewrite.backends.onnx.files import read_onnx

                self.program, self.source = read_onnx(self.path)
        except ModelError as error:
            raise UserError(str(error)) from None

    def reload_program(self):
        """The MIL program as the package holds it, loaded again."""
        from rewrite.backends.mil import load_mlpackage

        return load_mlpackage(self.path)[0]

    def reread(self):
        """The ONNX model as its file holds it, and the folder of its external data (left there)."""
        from rewrite.backends.onnx.files import read_onnx

        model, source = read_onnx(self.path)
        return model, source.base_dir

    def files(self) -> list[Path]:
        """Every file the input consists of (a package's whole tree), the input's own path first."""
        return [self.path, *self.source.files]

    def count_ops(self) -> int:
        if self.format == "mil":
            from rewrite.backends.mil import count_ops

            return count_ops(self.program)
        from rewrite.backends.onnx import count_nodes

        return count_nodes(self.program)

    def publish(self, target, in_place: bool) -> None:
        """Write the model to `target` atomically (see `rewrite.output`)."""
        from rewrite import output

        if self.format == "mil":
            from rewrite.backends.mil import save_mlpackage

            output.publish(target, lambda path: save_mlpackage(self.program, path, self.source))
            return
        from rewrite.backends.onnx.files import data_files_of, write_onnx

        data_name = None
        if self.source.external_data:
            data_name = output.free_companion_name(target, ".data", avoid=self.source.data_files)
        # The replaced model's data files are garbage once the new model is in
        # place; the input's are kept unless the input is what is replaced.
        replaced = self.source.data_files if in_place else (data_files_of(target.path) if target.replaces else ())
        keep = {Path(os.path.realpath(p)) for p in (() if in_place else self.source.files)}
        obsolete = [
            p for p in replaced
            if Path(os.path.realpath(p)) not in keep and p.name != data_name
            and Path(os.path.realpath(p)).parent == target.path.parent
        ]
        output.publish(target, lambda path: write_onnx(self.program, path, data_name, self.source),
                       obsolete=obsolete)


def _test(arguments) -> int:
    for path in arguments.rules:
        if not Path(path).exists():
            raise UserError(f"{path}: no such file or directory")
    rule_set = _load_rules(arguments.rules, None)
    if arguments.rule and arguments.rule not in {rule.name for rule in rule_set.rules}:
        raise UserError(f"no rule named '{arguments.rule}'")
    from rewrite.examples import run_examples

    results = run_examples(rule_set, arguments.rule)
    if not results:
        # Nothing was tested: a file without examples passes no test, and CI must not think it did.
        which = f"rule '{arguments.rule}'" if arguments.rule else ", ".join(arguments.rules)
        raise Finding(f"no examples in {which}: nothing was tested (a rule carries them as 'example \"...\"')")
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
    failed = 0
    jobs = min(arguments.jobs or _cpu_count(), len(rule_set.rules)) or 1
    task = functools.partial(_verify_one, trials=arguments.trials, seed=arguments.seed)
    if jobs == 1:
        verdicts = map(task, rule_set.rules)
    else:
        # Rules are independent: one process each at a time, printed in load order.
        from concurrent.futures import ProcessPoolExecutor

        pool = ProcessPoolExecutor(jobs)
        verdicts = pool.map(task, rule_set.rules)
    try:
        for text, found, conclusive in verdicts:
            # NONE checked nothing: a finding, like FAIL, unless the user says it may be.
            failed += found or (not conclusive and not arguments.allow_unexercised)
            print(text, flush=True)
    finally:
        if jobs > 1:
            pool.shutdown(cancel_futures=True)
    return EXIT_FINDINGS if failed else EXIT_OK


def _verify_one(rule, trials: int, seed: int) -> tuple[str, bool, bool]:
    """One rule's verdict as printed, whether it found a counterexample, and whether it checked anything."""
    import numpy

    from rewrite.verify import format_verdict, verify_rule

    with numpy.errstate(all="ignore"):
        verdict = verify_rule(rule, trials=trials, seed=seed)
    return format_verdict(verdict), verdict.counterexample is not None, verdict.conclusive


def _cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def _explain(arguments) -> int:
    model = _Model(Path(arguments.model))
    if not os.path.lexists(model.path):
        raise UserError(f"{model.path}: no such file or directory")
    if not Path(arguments.rules).exists():
        raise UserError(f"{arguments.rules}: no such file or directory")
    # A folder of both dialects is the usual thing to explain with: no note.
    rule_set = _load_rules([arguments.rules], model.format, explicit=False)
    if arguments.rule and arguments.rule not in {r.name for r in rule_set.rules}:
        raise UserError(f"no rule named '{arguments.rule}' for {model.format} in {arguments.rules}")
    model.load()

    import rewrite
    from rewrite import backends
    from rewrite.engine.explain import explain, format_text
    from rewrite.engine.interfaces import ModelError
    from rewrite.predicates import registered_predicates

    try:
        adapter = backends.adapter_for(model.program, source=model.source if model.format == "onnx" else None)
        explanations = explain(
            rule_set.rules, adapter, registered_predicates(), rule_name=arguments.rule, op_name=arguments.op,
            assume=frozenset(arguments.assume),
        )
    except ModelError as error:
        raise UserError(str(error)) from None
    except rewrite.RuleError as error:  # explain rereads the rules files, which may have changed since
        raise _unloadable(error) from None
    if not explanations and arguments.op is not None and not _has_op(adapter, arguments.op):
        raise UserError(f"{model.path} has no op named '{arguments.op}'")  # most likely a typo in --op
    if arguments.json:
        print(json.dumps([e.as_dict() for e in explanations], indent=2))
    elif explanations:
        print(format_text(explanations))
    else:
        print("no candidate anchors")
    return EXIT_OK


def _has_op(adapter, name: str) -> bool:
    """Whether an op (in any block, nested ones too) of the program is named `name`."""
    blocks = list(adapter.top_blocks())
    while blocks:
        for op in adapter.operations(blocks.pop()):
            if adapter.op_name(op) == name:
                return True
            blocks.extend(adapter.nested_blocks(op))
    return False


def _apply(arguments) -> int:
    from rewrite import output

    source = Path(arguments.input)
    if not os.path.lexists(source):
        raise UserError(f"{source}: no such file or directory")
    model = _Model(source)
    if arguments.opset is not None and model.format != "onnx":
        raise UserError("--opset is for ONNX models; a Core ML program keeps its deployment target")
    if arguments.overridable_initializers and model.format != "onnx":
        raise UserError("--overridable-initializers is for ONNX models")
    if arguments.in_place:
        if arguments.output and Path(os.path.realpath(arguments.output)) != Path(os.path.realpath(source)):
            raise UserError("--in-place writes to INPUT; do not also give -o")
        requested = source
    else:
        if not arguments.output:
            raise UserError("no output given: use -o OUTPUT (or --in-place to overwrite INPUT)")
        requested = Path(arguments.output)
        if _Model(requested).format != model.format:
            raise UserError(f"{requested}: the output must have the same format as the input")
    try:
        # Checked before any work, and again once the input's own files are known.
        output.resolve_target(requested, package=model.package, input_path=source, input_files=[source],
                              in_place=arguments.in_place)
    except output.OutputError as error:
        raise UserError(str(error)) from None

    import rewrite
    from rewrite.api import paused_garbage_collection
    from rewrite.engine.interfaces import ModelError

    # The job only adds long-lived objects: a collector pass would rescan
    # them all (0.4 s of 2.5 s at 100k ONNX nodes). The process ends right
    # after, and an embedder's next collection frees what a run left.
    with paused_garbage_collection():
        rule_set = _load_rules(arguments.rules or [], model.format, explicit=bool(arguments.rules))
        if arguments.rule:
            try:
                rule_set = rule_set.only(*arguments.rule)
            except KeyError as error:
                raise UserError(error.args[0]) from None
        model.load()
        try:
            target = output.resolve_target(requested, package=model.package, input_path=source,
                                           input_files=model.files(), in_place=arguments.in_place)
        except output.OutputError as error:
            raise UserError(str(error)) from None
        options = {"check_types": arguments.check_types, "count_ops": True, "assume": frozenset(arguments.assume)}
        details: dict = {}  # what the JSON report says beside the statistics
        if arguments.max_sweeps is not None:
            options["max_sweeps"] = arguments.max_sweeps
        # The run counts ops from its own index; walking the model for them
        # (0.02 s a walk at 100k ONNX nodes) is only worth it for a bar that
        # a person watches.
        bar = _progress_bar(model.count_ops()) if sys.stderr.isatty() else None
        try:
            if model.format == "onnx":
                from rewrite.onnx import optimize

                # The whole ONNX library folds constants and prunes dead values
                # around the rules; rules of the user's own run alone.
                library = not arguments.rules and not arguments.rule and not arguments.rules_only
                only_rules = {} if library else {
                    "fold": False, "prune_dead": False, "constants_as_initializers": False, "max_rounds": 1}
                result = optimize(model.program, arguments.opset, rules=rule_set, progress=bar,
                                  check_types=arguments.check_types, original=model.reread, source=model.source,
                                  assume=frozenset(arguments.assume),
                                  overridable_initializers=True if arguments.overridable_initializers else None,
                                  **({"max_sweeps": arguments.max_sweeps} if arguments.max_sweeps else {}),
                                  **only_rules)
                statistics = result.statistics
                if result.listed_initializers:
                    details["listed_initializers"] = result.listed_initializers
                    details["initializers_overridable"] = result.overridable_initializers
                    if not arguments.json:
                        _note_initializers(result)
            else:
                from rewrite.mil import apply as apply_mil

                statistics = apply_mil(model.program, rule_set, original=model.reload_program, progress=bar,
                                       **options)
        except (rewrite.RewriteLimitError, rewrite.UnsoundRewriteError) as error:
            raise Finding(f"{error}; nothing was written") from None
        except ModelError as error:
            from rewrite.backends.mil.validation import InvalidProgramError
            from rewrite.backends.onnx.validation import InvalidOutputError

            if isinstance(error, (InvalidOutputError, InvalidProgramError)):
                raise Finding(f"{error}; nothing was written") from None
            raise UserError(str(error)) from None
        finally:
            if bar is not None:
                bar.close()
        try:
            model.publish(target, arguments.in_place)
        except output.OutputError as error:
            raise UserError(str(error)) from None
        assumed = {rule.name: rule.assumption_names for rule in rule_set.rules if rule.assumptions}
        _report(arguments, statistics, source, target.path if arguments.in_place else requested, details, assumed)
    return EXIT_OK


def _note_initializers(result) -> None:
    """Say how initializers listed as graph inputs were taken, where the model has any: it decides what folds."""
    listed = result.listed_initializers
    if not listed:
        return
    if result.overridable_initializers:
        print(f"rewrite: note: {_plural(listed, 'initializer')} the graph lists as inputs kept as inputs a user "
              "may override (not folded)", file=sys.stderr)
    else:
        print(f"rewrite: note: IR version below 4: {_plural(listed, 'initializer')} the graph lists as inputs "
              "taken as constants, as onnxruntime takes them (--overridable-initializers keeps them inputs)",
              file=sys.stderr)


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


def _report(arguments, statistics, source, destination, details: dict, assumed: dict) -> None:
    ops_before, ops_after = statistics.ops_before, statistics.ops_after
    # On stderr in every mode: a rule skipped for its match budget did not
    # fire where it might have, and the user should know which one.
    for name, rule in statistics.rules.items():
        if rule.exhausted:
            print(f"note: rule '{name}' was skipped at {_plural(rule.exhausted, 'anchor')}: matching it there "
                  "took more than its budget of structural attempts (see 'rewrite explain')", file=sys.stderr)
    # On stderr in every mode too: what a granted assumption would change.
    for name, rule in statistics.rules.items():
        if rule.kept:
            missing = sorted(assumed.get(name, frozenset()) - set(arguments.assume))
            print(f"note: {_plural(rule.kept, 'place')} kept where rule '{name}' holds but assumes "
                  f"{' and '.join(missing)}; {' '.join(f'--assume {flag(m)}' for m in missing)} rewrites "
                  f"{'them' if rule.kept > 1 else 'it'}", file=sys.stderr)
    if arguments.json:
        document = {
            "input": str(source),
            "output": str(destination),
            "ops_before": ops_before,
            "ops_after": ops_after,
            **details,
            **statistics.as_dict(),
        }
        print(json.dumps(document, indent=2))
        return
    # The full table is for --stats; by default only what happened.
    shown = {name: rule for name, rule in statistics.rules.items() if arguments.stats or rule.fires}
    width = max((len(name) for name in shown), default=0)
    for name, rule in shown.items():
        line = f"{name:<{width}}  fired {rule.fires}"
        if arguments.stats:
            line += f"  tried {rule.attempts}"
            # Where the conditions held but nothing was rewritten, and why: what `explain` would say.
            if rule.refused:
                line += f"  refused {rule.refused} (shape guard)"
            if rule.unevaluable:
                line += f"  not built {rule.unevaluable} (no value to build with, or an op the target lacks)"
            if rule.exhausted:
                line += f"  skipped {rule.exhausted} (match budget)"
            line += f"  {rule.seconds * 1000:.2f} ms"
        print(line)
    fires = sum(rule.fires for rule in statistics.rules.values())
    fired_rules = sum(rule.fires > 0 for rule in statistics.rules.values())
    if fires:
        what = f"{_plural(fires, 'rewrite')} by {_plural(fired_rules, 'rule')}"
    else:
        what = f"no rule fired ({_plural(len(statistics.rules), 'rule')} tried)"
    print(f"wrote {destination}: {what}, {ops_before} -> {ops_after} ops")


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}" + ("" if count == 1 else "s")


_COMMANDS = {"apply": _apply, "explain": _explain, "test": _test, "verify": _verify, "check": _check}

if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
