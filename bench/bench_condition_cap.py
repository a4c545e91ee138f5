"""Benchmark: how long a rule of far too many conditions takes to refuse.

Both parsers count a rule's conditions while they parse and stop at the
clause that holds the first one past `MAX_CONDITIONS` (64), so the time to
refuse does not grow with what comes after it. Three texts of --count
conditions (default 20,000): one `where` of and-ed conditions, one `where`
a condition, and `where`s of two and-ed conditions each. Prints the seconds
to refuse each (best of --repeat), at --count and at a tenth of it. The
parse stops at the cap; what still grows with the text is reading it: the
fast parser tokenizes a rule's piece of lines whole before parsing it (about
8 µs a line), and the text is split into lines once.

Usage: python bench/bench_condition_cap.py [--count 20000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import time

from rewrite.language import parser
from rewrite.language.errors import RuleError

HEAD = 'dialect onnx\nrule r "d"\n  match %y = Relu(X=%x)\n'


def texts(count: int) -> dict[str, str]:
    return {
        "one where": HEAD + "  where " + " and ".join(["rank(%x) == 2"] * count) + "\n  rewrite %y -> %x\n",
        "a where each": HEAD + "".join("  where rank(%x) == 2\n" for _ in range(count)) + "  rewrite %y -> %x\n",
        "wheres of two": HEAD + "".join("  where rank(%x) == 2 and rank(%x) == 2\n" for _ in range(count // 2))
        + "  rewrite %y -> %x\n",
    }


def refuse(text: str, repeat: int) -> tuple[float, str]:
    best, message = None, ""
    for _ in range(repeat):
        parser._PARSED.clear()
        start = time.perf_counter()
        try:
            parser.parse_rules(text, "bench.rules")
        except RuleError as error:
            message = error.render().splitlines()[0]
        seconds = time.perf_counter() - start
        best = seconds if best is None else min(best, seconds)
    return best, message


def main() -> None:
    arguments = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    arguments.add_argument("--count", type=int, default=20_000)
    arguments.add_argument("--repeat", type=int, default=3)
    options = arguments.parse_args()
    small, large = texts(options.count // 10), texts(options.count)
    print(f"{'text':<14} {options.count // 10:>8} {options.count:>8}  ratio  error")
    for name in large:
        little, _ = refuse(small[name], options.repeat)
        seconds, message = refuse(large[name], options.repeat)
        print(f"{name:<14} {little:>7.3f}s {seconds:>7.3f}s  {seconds / little:5.2f}  {message[:90]}")


if __name__ == "__main__":
    main()
