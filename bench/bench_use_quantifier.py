"""Benchmark: a quantifier over the uses of one value that every anchor asks about.

What a user found: a rule anchored on each `Reshape`, with
`where every use %u of %s: op_type(%u) == "Reshape"` over the one `Shape`
output that feeds all of them, ran for more than 10 minutes on a 50,000-node
fan-out: each of the n anchors walked the same n uses. A body that reads
only the use is now decided once per value and kept until the value's uses
change (`Adapter.uses_version`).

The model: x [batch, 4]; s = Shape(x); per layer, y = Reshape(Neg(Neg(prev)), s)
(3 nodes a layer, s read by every layer). Two rules, each over every use of s:

* negs: drops the double Neg under a Reshape of s where every use of s is a
  Reshape; its rewrite leaves s's uses as they are (the kept verdict is read);
* reshapes: drops a Reshape of y to Shape(x) where y has x's shape, every
  use of s a Reshape: each fire removes a use of s (the kept tally is told
  of each removal, and never listed again).

For each rule and size (nodes): the seconds of `RuleSet.apply_with` (best of
--repeat, the model built and indexed outside the clock), µs per node,
fires; then the ratio of the largest size's µs/node to the smallest's
(linear: near 1). --check runs onnxruntime on the smallest model before and
after each rule.

Usage: python bench/bench_use_quantifier.py [--sizes 20000,50000,200000] [--repeat 3] [--rules negs,reshapes] [--check]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

import rewrite
from rewrite.backends.onnx import OnnxAdapter

RULES = {
    "negs": """dialect onnx
rule negs
  "A Reshape to a shape every use of which is a Reshape reads -(-y) as y."
  match %r = Reshape(data=%n, shape=%s)
  where %n is Neg(X=%m) and %m is Neg(X=%y)
  where every use %u of %s: op_type(%u) == "Reshape"
  rewrite %n -> %y
""",
    "reshapes": """dialect onnx
rule reshapes
  "A Reshape of y to Shape(x), y of x's shape, every use of which is a Reshape, is y."
  match %r = Reshape(data=%n, shape=%s)
  where %s is Shape(data=%x)
  where every use %u of %s: op_type(%u) == "Reshape"
  where shape(%n) == shape(%x)
  rewrite %r -> %n
""",
}


def model(nodes: int) -> onnx.ModelProto:
    layers = (nodes - 1) // 3
    built = [helper.make_node("Shape", ["x"], ["s"])]
    previous = "x"
    for layer in range(layers):
        built += [
            helper.make_node("Neg", [previous], [f"a{layer}"]),
            helper.make_node("Neg", [f"a{layer}"], [f"b{layer}"]),
            helper.make_node("Reshape", [f"b{layer}", "s"], [f"r{layer}"]),
        ]
        previous = f"r{layer}"
    value = helper.make_tensor_value_info
    graph = helper.make_graph(built, "fan_out", [value("x", TensorProto.FLOAT, ["batch", 4])],
                              [value(previous, TensorProto.FLOAT, ["batch", 4])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="20000,50000,200000")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--rules", default="negs,reshapes")
    parser.add_argument("--check", action="store_true")
    arguments = parser.parse_args()
    sizes = [int(size) for size in arguments.sizes.split(",")]
    for name in arguments.rules.split(","):
        with tempfile.TemporaryDirectory() as folder:
            path = Path(folder) / f"{name}.rules"
            path.write_text(RULES[name])
            rules = rewrite.load_rules(path)
        rows = []
        print(f"{'rule':<9} {'nodes':>8} {'seconds':>8} {'µs/node':>8} {'fires':>7}")
        for size in sizes:
            best = None
            for _ in range(arguments.repeat):
                adapter = OnnxAdapter(model(size))
                start = time.perf_counter()
                statistics = rules.apply_with(adapter)
                seconds = time.perf_counter() - start
                best = seconds if best is None else min(best, seconds)
            rows.append(best / size * 1e6)
            print(f"{name:<9} {size:>8} {best:>8.3f} {rows[-1]:>8.2f} {statistics.fires:>7}")
        print(f"{name}: µs/node ratio, {sizes[-1]} / {sizes[0]}: {rows[-1] / rows[0]:.2f}")
        if arguments.check:
            import onnxruntime

            built = model(sizes[0])
            feeds = {"x": np.random.default_rng(0).normal(size=(3, 4)).astype(np.float32)}
            before = onnxruntime.InferenceSession(built.SerializeToString()).run(None, feeds)
            rules.apply(built)
            after = onnxruntime.InferenceSession(built.SerializeToString()).run(None, feeds)
            np.testing.assert_array_equal(before[0], after[0])
            kinds = [n.op_type for n in built.graph.node]
            print(f"{name}: onnxruntime gives the same outputs; {kinds.count('Neg')} Negs, "
                  f"{kinds.count('Reshape')} Reshapes left")


if __name__ == "__main__":
    main()
