"""Benchmark: `rewrite.onnx.optimize` against onnxscript's optimizer (and onnxsim, if installed) on the
committed torch exports (tests/backends/onnx_models), in this process.

For each export: nodes before; nodes after ours and after each peer (Constant
nodes counted as nodes: each tool leaves its constants as initializers); the
time of each, the best of --repeat runs; the ratios ours / peer of both, from
this one run; and whether onnxruntime gives the same outputs as the original
at the manifest's two test shapes, for ours and for each peer. The last row
sums the node counts and times over the models shown.

With --processes, each tool is also timed as a fresh process, as a user runs it on
a file: `rewrite apply model.onnx -o out.onnx` against `python -c` scripts that
load the model, run the peer and save it (the best of --repeat runs each, start-up
included); a second table gives those times and their ratios.

With --ops, each model is followed by the op types whose counts differ
between ours and a peer (ours - peer per op type), to see what a peer removes
that we keep.

Neither peer is a dependency: a peer that is not installed is left out.

Usage:
    python bench/bench_onnx_optimize.py [--repeat 3] [--models bert t5] [--ops] [--peers onnxscript] [--processes]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
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


def _onnxsim(model):
    import onnxsim

    simplified, ok = onnxsim.simplify(model)
    if not ok:
        raise RuntimeError("onnxsim: its own check of the simplified model failed")
    return simplified


def _peers(wanted=None):
    peers = {}
    try:
        import onnxscript.optimizer

        peers["onnxscript"] = onnxscript.optimizer.optimize
    except ImportError:
        pass
    try:
        import onnxsim  # noqa: F401

        peers["onnxsim"] = _onnxsim
    except ImportError:
        pass
    return {name: peer for name, peer in peers.items() if wanted is None or name in wanted}


# What a user of each peer runs on a file: load, optimize, save.
_PEER_SCRIPTS = {
    "onnxscript": "import sys, onnx, onnxscript.optimizer as o; m = onnx.load(sys.argv[1]); "
                  "onnx.save(o.optimize(m), sys.argv[2])",
    "onnxsim": "import sys, onnx, onnxsim; m, ok = onnxsim.simplify(onnx.load(sys.argv[1])); "
               "assert ok; onnx.save(m, sys.argv[2])",
}


def _process_seconds(argv: list[str], repeat: int) -> float | None:
    """The best wall time of `repeat` runs of argv as a process; None if one fails."""
    from _measure import run_measured

    best = None
    for _ in range(repeat):
        run = run_measured(argv, timeout=600)
        if not run.ok:
            return None
        best = run.seconds if best is None else min(best, run.seconds)
    return best


def _processes(entries, peers, repeat) -> list[list[str]]:
    import tempfile

    rows = [["model", "ours s", *(f"{p} s" for p in peers), *(f"time/{p}" for p in peers)]]
    totals = {name: 0.0 for name in ("ours", *peers)}
    with tempfile.TemporaryDirectory() as folder:
        out = str(Path(folder) / "out.onnx")
        for entry in entries:
            path = str(MODELS / entry["file"])
            seconds = {"ours": _process_seconds([sys.executable, "-m", "rewrite.cli", "apply", path, "-o", out],
                                                repeat)}
            for name in peers:
                seconds[name] = _process_seconds([sys.executable, "-c", _PEER_SCRIPTS[name], path, out], repeat)
            for name, value in seconds.items():
                totals[name] += value or 0.0
            rows.append([entry["file"], *(_seconds(seconds[n]) for n in ("ours", *peers)),
                         *(_ratio(seconds["ours"], seconds[p]) if seconds["ours"] and seconds[p] else "-"
                           for p in peers)])
    rows.append(["total", *(f"{totals[n]:.3f}" for n in ("ours", *peers)),
                 *(_ratio(totals["ours"], totals[p]) for p in peers)])
    return rows


def _seconds(value: float | None) -> str:
    return "failed" if value is None else f"{value:.3f}"


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


def _same(model, feeds, expected) -> bool:
    try:
        return all(
            a.shape == b.shape and np.allclose(a, b, rtol=1e-5, atol=1e-5)
            for f, e in zip(feeds, expected)
            for a, b in zip(e, _run(model, f))
        )
    except Exception:  # a model onnxruntime refuses is not the same model
        return False


def _ops(model) -> Counter:
    return Counter(node.op_type for node in model.graph.node)


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}" if b else "-"


def _table(rows: list[list[str]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(row, widths)))
        for row in rows
    )


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--models", nargs="+", help="only the exports whose file name starts with one of these")
    parser.add_argument("--peers", nargs="+", help="only these peers (default: every one installed)")
    parser.add_argument("--ops", action="store_true", help="print the op types whose counts differ from a peer's")
    parser.add_argument("--processes", action="store_true", help="also time each tool as a process on the file")
    arguments = parser.parse_args(argv)
    peers = _peers(arguments.peers)
    entries = [
        e for e in MANIFEST["files"]
        if arguments.models is None or any(e["file"].startswith(m) for m in arguments.models)
    ]
    header = ["model", "before", "ours", *peers, "ours s", *(f"{p} s" for p in peers)]
    header += [f"nodes/{p}" for p in peers] + [f"time/{p}" for p in peers] + ["values", *(f"{p} values" for p in peers)]
    rows = [header]
    totals = {"before": 0, "ours": 0, "ours s": 0.0, **{p: 0 for p in peers}, **{f"{p} s": 0.0 for p in peers}}
    differences = []
    for entry in entries:
        path = MODELS / entry["file"]
        original = onnx.load(str(path))
        feeds = [_feeds(entry, shape, seed) for seed, shape in enumerate(entry["test_shapes"])]
        expected = [_run(original, f) for f in feeds]
        ours, ours_time = _timed(optimize, path, arguments.repeat)
        counts, times, same = [len(ours.graph.node)], [ours_time], [_same(ours, feeds, expected)]
        for name, peer in peers.items():
            theirs, their_time = _timed(peer, path, arguments.repeat)
            counts.append(len(theirs.graph.node))
            times.append(their_time)
            same.append(_same(theirs, feeds, expected))
            if arguments.ops:
                delta = _ops(ours)
                delta.subtract(_ops(theirs))
                differences.append((entry["file"], name, {op: n for op, n in sorted(delta.items()) if n}))
        totals["before"] += len(original.graph.node)
        totals["ours"] += counts[0]
        totals["ours s"] += times[0]
        for i, name in enumerate(peers, start=1):
            totals[name] += counts[i]
            totals[f"{name} s"] += times[i]
        rows.append([
            entry["file"], str(len(original.graph.node)), *map(str, counts), *(f"{t:.3f}" for t in times),
            *(_ratio(counts[0], c) for c in counts[1:]), *(_ratio(times[0], t) for t in times[1:]),
            *("same" if s else "DIFFER" for s in same),
        ])
    rows.append([
        "total", str(totals["before"]), str(totals["ours"]), *(str(totals[p]) for p in peers),
        f"{totals['ours s']:.3f}", *(f"{totals[f'{p} s']:.3f}" for p in peers),
        *(_ratio(totals["ours"], totals[p]) for p in peers),
        *(_ratio(totals["ours s"], totals[f"{p} s"]) for p in peers),
        "", *("" for _ in peers),
    ])
    print(_table(rows))
    if arguments.processes:
        print("\nas processes (load, optimize, save; start-up included):")
        print(_table(_processes(entries, peers, arguments.repeat)))
    if differences:
        print("\nop counts, ours - peer (only the op types that differ):")
        for file, name, delta in differences:
            print(f"  {file} vs {name}: {delta or 'none'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
