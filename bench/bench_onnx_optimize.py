"""Benchmark: `rewrite.onnx.optimize` against onnxscript's optimizer (and onnxsim, if installed) on the
committed torch exports (tests/backends/onnx_models), in this process.

For each export: nodes before; nodes after ours and after each peer (Constant
nodes counted as nodes: each tool leaves its constants as initializers); the
time of each, the best of --repeat runs; and whether onnxruntime gives the
same outputs as the original at the manifest's two test shapes.

Usage:
    python bench/bench_onnx_optimize.py [--repeat 3]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import onnx

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests" / "rules"))

from test_onnx_exported_models import MANIFEST, MODELS, _feeds  # noqa: E402

from rewrite.onnx import optimize  # noqa: E402


def _run(model, feeds):
    import onnxruntime

    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def _peers():
    peers = {}
    try:
        import onnxscript.optimizer

        peers["onnxscript"] = onnxscript.optimizer.optimize
    except ImportError:
        pass
    try:
        import onnxsim

        peers["onnxsim"] = lambda model: onnxsim.simplify(model)[0]
    except ImportError:
        pass
    return peers


def _timed(function, path, repeat):
    best, result = None, None
    for _ in range(repeat):
        model = onnx.load(str(path))
        start = time.perf_counter()
        result = function(model)
        elapsed = time.perf_counter() - start
        best = elapsed if best is None else min(best, elapsed)
        result = result if isinstance(result, onnx.ModelProto) else model
    return result, best


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=3)
    arguments = parser.parse_args(argv)
    peers = _peers()
    header = ["model", "before", "ours", *peers, "ours s", *(f"{p} s" for p in peers), "values"]
    print("  ".join(header))
    for entry in MANIFEST["files"]:
        path = MODELS / entry["file"]
        original = onnx.load(str(path))
        feeds = [_feeds(entry, shape, seed) for seed, shape in enumerate(entry["test_shapes"])]
        expected = [_run(original, f) for f in feeds]
        ours, ours_time = _timed(optimize, path, arguments.repeat)
        counts, times = [len(ours.graph.node)], [ours_time]
        for peer in peers.values():
            theirs, their_time = _timed(peer, path, arguments.repeat)
            counts.append(len(theirs.graph.node))
            times.append(their_time)
        same = all(
            np.allclose(a, b, rtol=1e-5, atol=1e-5) and a.shape == b.shape
            for f, e in zip(feeds, expected) for a, b in zip(e, _run(ours, f))
        )
        row = [entry["file"], str(len(original.graph.node)), *map(str, counts), *(f"{t:.3f}" for t in times),
               "same" if same else "DIFFER"]
        print("  ".join(row))
    return 0


if __name__ == "__main__":
    sys.exit(main())
