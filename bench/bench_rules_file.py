"""Benchmark: `rewrite check` on one big generated rules file (default 8,000 rules, about 5 MB).

The file is the shipped library of one dialect, copied over and over: its
op classes once, then every rule again and again with a numbered name
(`fuse_transposes_17`), without examples unless `--examples` (an example is
a program to build, and `rewrite check` builds each one, so with examples
the time is the backend's building, not the loader's). About 640 bytes a
rule, as the library's rules are.

For each size: `rewrite check FILE` as a process (wall clock and peak RSS:
start-up, imports, parsing, checking, lint), against `python -c "import
rewrite"` as the floor, and `rewrite.load_rules(FILE)` timed in this process
(parse, check and lint, imports excluded; each size is a new text, so no
cache of an earlier parse helps). Time per rule must stay flat as the file
grows: loading is linear in its size.

Usage:
    python bench/bench_rules_file.py [--rules 1000,8000] [--dialect mil|onnx] [--examples]
                                     [--repeat N] [--keep DIR] [--profile N]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import re
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _measure import best_of, locate_cli  # noqa: E402

REPO = Path(__file__).resolve().parent.parent


def _items(text: str) -> list[str]:
    """The top-level items of a rules file: each starts at column 0 and runs to the next."""
    items, current = [], []
    for line in text.splitlines():
        starts = line[:1] not in ("", " ", "\t", "#")
        if starts and current:
            items.append("\n".join(current))
            current = []
        if starts or current:
            current.append(line)
    if current:
        items.append("\n".join(current))
    return items


def library(dialect: str, examples: bool) -> tuple[list[str], list[tuple[str, str]]]:
    """The shipped classes of `dialect` and its rules as (name, text without the name)."""
    classes, rules, seen = [], [], set()
    for path in sorted((REPO / "rules" / dialect).glob("*.rules")):
        for item in _items(path.read_text(encoding="utf-8")):
            if item.startswith("class "):
                name = item.split()[1]
                if name not in seen:  # a class files share through imports is declared once here
                    seen.add(name)
                    classes.append(item.rstrip())
            elif item.startswith("rule "):
                if not examples:
                    item = re.split(r"(?m)^  example ", item)[0]
                name, rest = re.match(r"rule (\w+)(.*)", item, re.S).groups()
                rules.append((name, rest.rstrip()))
    return classes, rules


def generate(count: int, dialect: str = "mil", examples: bool = False) -> str:
    classes, rules = library(dialect, examples)
    parts = [f"dialect {dialect}", *classes]
    for index in range(count):
        name, rest = rules[index % len(rules)]
        parts.append(f"rule {name}_{index}{rest}")
    return "\n\n".join(parts) + "\n"


def load_in_process(path: Path) -> float:
    import rewrite

    start = time.perf_counter()
    rewrite.load_rules(path)
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rules", default="1000,8000", help="rule counts, comma separated")
    parser.add_argument("--dialect", default="mil", choices=("mil", "onnx"))
    parser.add_argument("--examples", action="store_true", help="keep the rules' examples (built by check)")
    parser.add_argument("--repeat", type=int, default=1, help="runs per size (best is kept)")
    parser.add_argument("--keep", metavar="DIR", help="keep the generated files in DIR")
    parser.add_argument("--profile", type=int, default=0, metavar="N", help="cProfile load_rules on N rules")
    args = parser.parse_args(argv)
    counts = [int(c) for c in args.rules.split(",") if c.strip()]

    folder = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="bench_rules_"))
    folder.mkdir(parents=True, exist_ok=True)
    cli = locate_cli()
    floor = best_of([sys.executable, "-c", "import rewrite"], 3)
    print(f"`python -c 'import rewrite'`: {floor.seconds:.2f} s, peak RSS {floor.peak_mb:.0f} MB")
    print(f"{'rules':>6} {'MB':>6} | {'check s':>8} {'check MB':>9} {'ms/rule':>8} | "
          f"{'load_rules s':>12} {'ms/rule':>8} {'MB/rules MB':>11}")
    rows = []
    for count in counts:
        path = folder / f"generated_{args.dialect}_{count}.rules"
        path.write_text(generate(count, args.dialect, args.examples), encoding="utf-8")
        size = path.stat().st_size / 1e6
        run = best_of([*cli, "check", str(path)], args.repeat, timeout=3600)
        if not run.ok:
            print(f"{count:>6} {size:>6.1f} | check failed: {(run.stderr or run.stdout).strip()[-300:]}")
            return 1
        inside = min(load_in_process(path) for _ in range(args.repeat)) if count <= 20000 else float("nan")
        rows.append((count, run.seconds, inside))
        print(f"{count:>6} {size:>6.1f} | {run.seconds:>8.2f} {run.peak_mb:>9.0f} "
              f"{(run.seconds - floor.seconds) * 1e3 / count:>8.3f} | {inside:>12.2f} {inside * 1e3 / count:>8.3f} "
              f"{(run.peak_mb - floor.peak_mb) / size:>11.1f}", flush=True)
    if len(rows) >= 2:
        per_rule = [inside / count for count, _, inside in rows]
        print(f"in-process time per rule, largest over smallest: {max(per_rule) / min(per_rule):.2f} "
              "(1.0 is linear)")
    print("check s: the `rewrite check FILE` process; ms/rule: net of the `import rewrite` floor.")
    print("load_rules s: rewrite.load_rules(FILE) in this process; MB/rules MB: the process's peak RSS over")
    print("  the floor's, per MB of rules text.")
    if args.profile:
        path = folder / f"profile_{args.dialect}_{args.profile}.rules"
        path.write_text(generate(args.profile, args.dialect, args.examples), encoding="utf-8")
        profiler = cProfile.Profile()
        profiler.enable()
        load_in_process(path)
        profiler.disable()
        out = io.StringIO()
        pstats.Stats(profiler, stream=out).sort_stats("cumulative").print_stats(30)
        print(out.getvalue())
    if not args.keep:
        for path in folder.iterdir():
            path.unlink()
        folder.rmdir()
    return 0


if __name__ == "__main__":
    sys.exit(main())
