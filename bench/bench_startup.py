"""Benchmark: what a short `rewrite` process costs before it does any work.

Each line is a fresh process (best of --repeat), wall clock and peak RSS:

* `python -c "import onnx"`: the floor for any ONNX tool in Python;
* `python -c "import ml_dtypes"`, which onnx imports: ml_dtypes 0.7.0 takes
  about 0.5 s of that floor here (its ufunc loops registered one by one with
  numpy 2.3, a scan of the loops so far each), 0.6.0 about 5 ms;
* `python -c "import rewrite"`;
* `rewrite.load_rules()` with no argument (the whole shipped library, both
  dialects): it must not import coremltools (and torch) nor onnx;
* the same, then rewriting a 10-node ONNX model in memory;
* `rewrite apply tiny.onnx -o out.onnx` (start-up, rules, load, rewrite, save);
* onnxscript's `rewrite` on the same file as a process, for comparison.

Usage:
    python bench/bench_startup.py [--repeat N]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _measure import best_of, locate_cli  # noqa: E402

LOAD_ALL = (
    "import sys, rewrite; rewrite.load_rules(); "
    "assert 'coremltools' not in sys.modules and 'onnx' not in sys.modules, sorted(sys.modules)"
)
LOAD_AND_APPLY = (
    "import sys, onnx, rewrite; rules = rewrite.load_rules(); model = onnx.load(sys.argv[1]); "
    "rules.apply(model); assert 'coremltools' not in sys.modules"
)
ONNXSCRIPT = (
    "import sys, onnx\n"
    "from onnxscript.rewriter import rewrite\n"
    "from onnxscript.rewriter.rules.common import expand_before_binary_op_rules\n"
    "onnx.save(rewrite(onnx.load(sys.argv[1]), pattern_rewrite_rules=expand_before_binary_op_rules), sys.argv[2])\n"
)


def tiny_model() -> onnx.ModelProto:
    """Ten nodes: two of the shipped rule's Expands among them."""
    nodes = [
        helper.make_node("ReduceMean", ["x", "axes"], ["m"], keepdims=1),
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Expand", ["m", "s"], ["e"]),
        helper.make_node("Mul", ["x", "e"], ["a"]),
        helper.make_node("Tanh", ["a"], ["b"]),
        helper.make_node("ReduceMax", ["b", "axes"], ["n"], keepdims=1),
        helper.make_node("Expand", ["n", "s"], ["f"]),
        helper.make_node("Sub", ["b", "f"], ["c"]),
        helper.make_node("Relu", ["c"], ["d"]),
        helper.make_node("Identity", ["d"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes, "tiny", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 16])],
        [numpy_helper.from_array(np.array([-1], np.int64), "axes")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def _version(distribution: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(distribution)
    except PackageNotFoundError:
        return "not installed"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench_startup_") as folder:
        source = Path(folder) / "tiny.onnx"
        onnx.save(tiny_model(), str(source))
        output = str(Path(folder) / "out.onnx")
        python = sys.executable
        rows = [
            ('python -c "import onnx"', [python, "-c", "import onnx"]),
            (f'python -c "import ml_dtypes" ({_version("ml_dtypes")})', [python, "-c", "import ml_dtypes"]),
            ('python -c "import rewrite"', [python, "-c", "import rewrite"]),
            ("rewrite.load_rules() (both dialects)", [python, "-c", LOAD_ALL]),
            ("load_rules() + apply to a 10-node ONNX model", [python, "-c", LOAD_AND_APPLY, str(source)]),
            ("rewrite apply tiny.onnx -o out.onnx", [*locate_cli(), "apply", str(source), "-o", output]),
            ("onnxscript rewrite, as a process", [python, "-c", ONNXSCRIPT, str(source), output]),
        ]
        floor = None
        print(f"{'process':<48} {'s':>7} {'vs import onnx':>15} {'peak MB':>8}")
        for label, argv_ in rows:
            run = best_of(argv_, args.repeat, timeout=600)
            if not run.ok:
                print(f"{label:<48} failed: {(run.stderr or run.stdout).strip().splitlines()[-1:]}")
                continue
            floor = floor or run.seconds
            print(f"{label:<48} {run.seconds:>7.3f} {run.seconds / floor:>14.2f}x {run.peak_mb:>8.0f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
