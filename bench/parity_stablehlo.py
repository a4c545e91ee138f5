"""Parity: stablehlo_coreml's MIL pass pipeline vs rewrite's, on real JAX converter output.

For every model in tests/rules/jax_programs.py (FUNCTIONS) and each shape mode
(symbolic dims, then static), the function is converted to a raw MIL Program
by `stablehlo_coreml.convert`, and two deep copies of it are optimized:

* theirs: `stablehlo_coreml.build_pass_pipeline()` (= stablehlo_coreml.passes.utils),
* ours:   `rewrite.mil.build_pass_pipeline()`,

both without `common::add_fp16_cast` / `common::add_int16_cast`, as
`ct.convert(..., compute_precision=ct.precision.FLOAT32)` runs them. The
pipelines are applied to the Program directly (no macOS needed; see
tests/rules/parity.py). For each result the script reports the op count, the
histogram of non-const ops, the number of `const` ops (counted apart: they are
weights and folded values, not work), and whether the values agree with JAX
(reference evaluator, rtol 1e-4 / atol 1e-5; symbolic programs at batch 2 and 5,
static ones at batch 4 with two seeds).

The helpers live in tests/rules/parity.py so that pytest tests can use them;
this script puts tests/rules on sys.path the way pytest does for the tests.
The output is deterministic (no timings).

Usage:
    python bench/parity_stablehlo.py [--models NAME,NAME] [--no-histograms]
"""

from __future__ import annotations

import argparse
import difflib
import logging
import os
import sys
import warnings
from pathlib import Path

os.environ.setdefault("TQDM_DISABLE", "1")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests" / "rules"))
sys.path.insert(0, str(REPO))

# A failing pass is reported in the output; coremltools' own "ERROR - ... graph pass" log is not needed.
logging.getLogger("coremltools").setLevel(logging.CRITICAL)
warnings.filterwarnings("ignore", category=RuntimeWarning)  # gelu_erf: overflow in discarded branches

from jax_programs import FUNCTIONS, STATIC_ONLY, converted, modes  # noqa: E402
from parity import (  # noqa: E402
    FP16_PASSES,
    PassFailed,
    agrees_with_jax,
    format_histogram,
    fp32,
    histogram,
    optimized,
    our_pipeline,
    their_pipeline,
)

from rewrite.backends.mil import ct  # noqa: E402


def mode_name(symbolic: bool) -> str:
    return "symbolic" if symbolic else "static"


def run_side(raw, pipeline, name, symbolic):
    """(histogram, consts, agreement) or a failure message."""
    try:
        program = optimized(raw, pipeline)
    except PassFailed as failure:
        return None, str(failure)
    counts, consts = histogram(program)
    return (counts, consts, agrees_with_jax(name, program, symbolic)), None


def print_table(header, rows):
    widths = [max(len(str(row[i])) for row in [header, *rows]) for i in range(len(header))]
    line = "  ".join(f"{{:{'<' if i < 2 else '>'}{w}}}" for i, w in enumerate(widths))
    print(line.format(*header))
    print("  ".join("-" * w for w in widths))
    for row in rows:
        print(line.format(*row))


def describe_pipelines(theirs, ours):
    """What each pipeline inserts into coremltools' default one, and where."""
    default = fp32(ct.PassPipeline.DEFAULT).passes
    fp16 = ", ".join(sorted(FP16_PASSES))
    print(f"Both pipelines: coremltools' default ({len(default)} passes) without {fp16}, plus")
    for label, pipeline in (("theirs", theirs), ("ours", ours)):
        print(f"  {label} ({len(pipeline.passes)} passes):")
        matcher = difflib.SequenceMatcher(a=default, b=pipeline.passes, autojunk=False)
        for tag, i1, i2, j1, j2 in matcher.get_opcodes():
            if tag == "equal":
                continue
            after = default[i1 - 1].replace("common::", "") if i1 > 0 else "the start"
            before = default[i2].replace("common::", "") if i2 < len(default) else "the end"
            where = f"between {after} and {before}"
            inserted = ", ".join(p.replace("common::", "") for p in pipeline.passes[j1:j2])
            removed = ", ".join(default[i1:i2])
            print(f"    {tag} {where}: {inserted}" + (f" (replacing {removed})" if removed else ""))
    print()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", help="comma-separated FUNCTIONS names (default: all)")
    parser.add_argument("--no-histograms", action="store_true")
    args = parser.parse_args(argv)
    names = args.models.split(",") if args.models else list(FUNCTIONS)

    theirs, ours = their_pipeline(), our_pipeline()
    describe_pipelines(theirs, ours)

    header = ["model", "mode", "raw", "theirs", "ours", "consts t/o", "values theirs", "values ours", "raw values"]
    rows, details, problems, skipped = [], [], [], []
    for name in names:
        for symbolic in (True, False):
            mode = mode_name(symbolic)
            if symbolic not in modes(name):
                rows.append([name, mode, "-", "-", "-", "-", "-", "-", "skipped (*)"])
                skipped.append(f"(*) {name} {mode}: static only -- {STATIC_ONLY[name]}")
                continue
            raw = converted(name, symbolic)
            raw_counts, raw_consts = histogram(raw)
            raw_agreement = agrees_with_jax(name, raw, symbolic)
            results = {}
            for side, pipeline in (("theirs", theirs), ("ours", ours)):
                result, failure = run_side(raw, pipeline, name, symbolic)
                results[side] = result
                if failure:
                    problems.append(f"{name} {mode} {side}: {failure}")
            cells = []
            for side in ("theirs", "ours"):
                result = results[side]
                cells.append("FAILED" if result is None else str(sum(result[0].values())))
            consts = "/".join("-" if results[s] is None else str(results[s][1]) for s in ("theirs", "ours"))
            values = ["-" if results[s] is None else str(results[s][2]) for s in ("theirs", "ours")]
            rows.append([name, mode, str(sum(raw_counts.values())), *cells, consts, *values, str(raw_agreement)])
            details.append((name, mode, raw_counts, raw_consts, results))

    print("Op counts exclude `const` ops (counted in 'consts t/o' = theirs/ours).")
    print_table(header, rows)
    for line in skipped:
        print(line)

    if not args.no_histograms:
        print()
        print("Histograms (non-const ops; raw = converter output before any pass)")
        for name, mode, raw_counts, raw_consts, results in details:
            print(f"\n{name} [{mode}]")
            print(f"  raw    ({raw_consts} consts): {format_histogram(raw_counts)}")
            for side in ("theirs", "ours"):
                result = results[side]
                if result is None:
                    print(f"  {side:6} FAILED")
                else:
                    print(f"  {side:6} ({result[1]} consts): {format_histogram(result[0])}")
            if results["theirs"] is not None and results["ours"] is not None:
                only_theirs = results["theirs"][0] - results["ours"][0]
                only_ours = results["ours"][0] - results["theirs"][0]
                if only_theirs or only_ours:
                    print(f"  theirs - ours: {format_histogram(only_theirs) or '-'}")
                    print(f"  ours - theirs: {format_histogram(only_ours) or '-'}")
                else:
                    print("  same histogram")

    print()
    if problems:
        print("Pipeline failures:")
        for problem in problems:
            print(f"  {problem}")
    else:
        print("Pipeline failures: none")
    return 0


if __name__ == "__main__":
    sys.exit(main())
