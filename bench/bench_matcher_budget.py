"""Benchmark: `in any order` over wide variadic ops, with the match budget.

What users found: 300 variadic ops of 32 inputs each (about 10,000 nodes)
and a rule of three positional sub-patterns in any order did not finish in
300 s, because every anchor tried all 32·31·30 = 29,760 orders. Now the
sub-patterns are assigned one at a time with backtracking, and an anchor
gets at most `MATCH_BUDGET` structural attempts per rule; past them the
rule is skipped there, and counted.

The ops are `Max`es (each of 32 distinct `Neg`s of one input) so that the
rules are sound: dropping a duplicate operand is exact for Max, and not for
Sum, whose result depends on the order of its additions. Rules:

* dedupe: `Max(%a, %b, %c, %rest...) in any order where %a is %b`: three
  plain sub-patterns, every order matches structurally and the condition
  never holds: each anchor spends its whole budget (the worst case);
* pruned: `Max(%a = Exp(...), %b, %c, %rest...) in any order`: the first
  sub-pattern matches no operand, so each anchor costs 32 tries;
* dedupe, width 64 and 2 sub-patterns (the 14.5 s case: 64·63 orders).

Each case runs in this process (the model built and indexed outside the
clock) and prints its seconds, the anchors skipped and the fires. The
target: the 10k-node, 32-wide, 3-sub-pattern case under 5 s.

Usage: python bench/bench_matcher_budget.py [--ops 300] [--width 32] [--repeat 3]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import onnx
from onnx import TensorProto, helper

import rewrite
from rewrite.backends.onnx import OnnxAdapter
from rewrite.engine.matcher import MATCH_BUDGET

RULES = {
    "dedupe": """
rule dedupe
  "A Max that reads one value twice reads it once."
  match %m = Max(%a, %b, %c, %rest...) in any order
  where %a is %b
  rewrite %m -> %m with data_0=(%a if i == 0 else (%c if i == 1 else %rest[i - 2]) for i in range(len(%rest) + 2))
""",
    "pruned": """
rule pruned
  "A Max of an Exp and two others (no Exp here: the first sub-pattern ends the search)."
  match %m = Max(%e = Exp(input=%x), %b, %c, %rest...) in any order
  where %b is %c
  rewrite %m -> %m with data_0=(%e if i == 0 else (%c if i == 1 else %rest[i - 2]) for i in range(len(%rest) + 2))
""",
    "dedupe2": """
rule dedupe2
  "A Max that reads one value twice reads it once (two sub-patterns)."
  match %m = Max(%a, %b, %rest...) in any order
  where %a is %b
  rewrite %m -> %m with data_0=(%a if i == 0 else %rest[i - 1] for i in range(len(%rest) + 1))
""",
}


def model(ops: int, width: int) -> onnx.ModelProto:
    """`ops` Maxes, each of `width` distinct Negs of the input x: ops * (width + 1) nodes."""
    nodes, outputs = [], []
    for op in range(ops):
        names = []
        for position in range(width):
            name = f"n{op}_{position}"
            nodes.append(helper.make_node("Neg", ["x"], [name]))
            names.append(name)
        nodes.append(helper.make_node("Max", names, [f"m{op}"]))
        outputs.append(helper.make_tensor_value_info(f"m{op}", TensorProto.FLOAT, ["batch", 4]))
    graph = helper.make_graph(nodes, "wide", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
                              outputs)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def run_case(rule: str, ops: int, width: int, repeat: int, folder: Path) -> tuple[float, int, int, int]:
    path = folder / f"{rule}.rules"
    path.write_text("dialect onnx\n" + RULES[rule])
    rules = rewrite.load_rules(path)
    best = None
    for _ in range(repeat):
        adapter = OnnxAdapter(model(ops, width))
        start = time.perf_counter()
        statistics = rules.apply_with(adapter)
        seconds = time.perf_counter() - start
        if best is None or seconds < best[0]:
            found = statistics.rules[rule]
            best = (seconds, len(adapter.model.graph.node), found.exhausted, found.fires)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=300)
    parser.add_argument("--width", type=int, default=32)
    parser.add_argument("--repeat", type=int, default=3)
    arguments = parser.parse_args()
    cases = [("dedupe", arguments.ops, arguments.width), ("pruned", arguments.ops, arguments.width),
             ("dedupe2", arguments.ops, 2 * arguments.width)]
    print(f"match budget: {MATCH_BUDGET} attempts per anchor per rule")
    print(f"{'rule':<8} {'ops':>5} {'width':>5} {'nodes':>6} {'seconds':>8} {'skipped':>8} {'fires':>6}  µs/anchor")
    with tempfile.TemporaryDirectory() as folder:
        for rule, ops, width in cases:
            seconds, nodes, skipped, fires = run_case(rule, ops, width, arguments.repeat, Path(folder))
            print(f"{rule:<8} {ops:>5} {width:>5} {nodes:>6} {seconds:>8.3f} {skipped:>8} {fires:>6}  "
                  f"{seconds / ops * 1e6:.0f}")


if __name__ == "__main__":
    main()
