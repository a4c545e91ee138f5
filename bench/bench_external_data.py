"""Benchmark: `rewrite apply` on a model whose weights (default 2 GB) are external data.

The model: --layers layers of x = Mul(MatMul(x, W_i), Expand(ReduceMean(..), Shape(..))),
each W_i a float32 weight stored in one data file beside the model, with the
small tensors (axes) external too. Every Expand goes.

Measured as processes, each the best of --repeat, data file in the page cache:

* a plain copy of the data file (`cp`, no reflink): the time to beat within 2x;
* `python -c "onnx.load(path, load_external_data=False)"`: the graph alone, its peak RSS;
* `rewrite apply IN -o OUT`: time and peak RSS (target: below 300 MB + the graph);
* onnxscript: onnx.load (weights in) + rewrite + onnx.save with external data,
  as a process (--no-theirs to skip).

The output is checked: every weight's bytes equal the input's, and the Expands are gone.

Usage:
    python bench/bench_external_data.py [--gigabytes 2] [--layers 16] [--repeat 1] [--keep DIR] [--no-theirs]
"""

from __future__ import annotations

import argparse
import hashlib
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _measure import best_of, locate_cli  # noqa: E402

GRAPH_ONLY = "import sys, onnx; onnx.load(sys.argv[1], load_external_data=False)"
THEIRS = (
    "import sys, onnx\n"
    "from onnxscript.rewriter import rewrite\n"
    "from onnxscript.rewriter.rules.common import expand_before_binary_op_rules\n"
    "model = rewrite(onnx.load(sys.argv[1]), pattern_rewrite_rules=expand_before_binary_op_rules)\n"
    "onnx.save(model, sys.argv[2], save_as_external_data=True, location=sys.argv[3])\n"
)


def _external(name: str, data_type: int, dims: list[int], location: str, offset: int, length: int):
    tensor = TensorProto(name=name, data_type=data_type, dims=dims, data_location=TensorProto.EXTERNAL)
    for key, value in (("location", location), ("offset", str(offset)), ("length", str(length))):
        tensor.external_data.add(key=key, value=value)
    return tensor


def build(folder: Path, gigabytes: float, layers: int) -> Path:
    """The model file and its data file, written a weight at a time (never all in memory)."""
    width = int((gigabytes * 2**30 / layers / 4) ** 0.5)
    data_name = "weights.bin"
    nodes, initializers, x = [], [], "x"
    with open(folder / data_name, "wb") as data:
        axes = np.array([-1], np.int64).tobytes()
        for i in range(layers):
            weight = np.random.default_rng(i).standard_normal((width, width), dtype=np.float32)
            tensor = _external(f"w{i}", TensorProto.FLOAT, [width, width], data_name, data.tell(), weight.nbytes)
            data.write(weight.tobytes())
            del weight
            initializers.append(tensor)
            nodes += [
                helper.make_node("MatMul", [x, f"w{i}"], [f"h{i}"]),
                helper.make_node("ReduceMean", [f"h{i}", "axes"], [f"m{i}"], keepdims=1),
                helper.make_node("Shape", [f"h{i}"], [f"s{i}"]),
                helper.make_node("Expand", [f"m{i}", f"s{i}"], [f"e{i}"]),
                helper.make_node("Mul", [f"h{i}", f"e{i}"], [f"x{i}"]),
            ]
            x = f"x{i}"
        tensor = _external("axes", TensorProto.INT64, [1], data_name, data.tell(), len(axes))
        data.write(axes)
        initializers.append(tensor)
    graph = helper.make_graph(
        nodes, "external", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", width])],
        [helper.make_tensor_value_info(x, TensorProto.FLOAT, ["b", width])], initializers,
    )
    path = folder / "model.onnx"
    onnx.save_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), str(path))
    return path


def weights_digest(path: Path) -> dict[str, str]:
    """Each weight's bytes, hashed, read from its data file a tensor at a time."""
    model = onnx.load(str(path), load_external_data=False)
    found = {}
    for tensor in model.graph.initializer:
        info = onnx.external_data_helper.ExternalDataInfo(tensor)
        with open(path.parent / info.location, "rb") as data:
            data.seek(info.offset or 0)
            found[tensor.name] = hashlib.sha256(data.read(info.length)).hexdigest()
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gigabytes", type=float, default=2.0)
    parser.add_argument("--layers", type=int, default=16)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--keep", metavar="DIR")
    parser.add_argument("--no-theirs", action="store_true")
    args = parser.parse_args(argv)
    folder = Path(args.keep or tempfile.mkdtemp(prefix="bench_external_"))
    folder.mkdir(parents=True, exist_ok=True)
    try:
        source = build(folder, args.gigabytes, args.layers)
        data = folder / "weights.bin"
        print(f"model: {args.layers} layers, data file {data.stat().st_size / 2**30:.2f} GiB, "
              f"model file {source.stat().st_size / 1024:.0f} KiB")
        cp = shutil.which("cp")
        copy = best_of([cp, "--reflink=never", str(data), str(folder / "copy.bin")], args.repeat, timeout=3600)
        (folder / "copy.bin").unlink()
        graph = best_of([sys.executable, "-c", GRAPH_ONLY, str(source)], args.repeat, timeout=3600)
        out = folder / "out.onnx"
        ours = None
        for _ in range(max(1, args.repeat)):
            for stale in (out, folder / "out.onnx.data"):
                stale.unlink(missing_ok=True)
            run = best_of([*locate_cli(), "apply", str(source), "-o", str(out)], 1, timeout=3600)
            if ours is None or run.seconds < ours.seconds:
                ours = run
        rows = [("plain cp of the data file", copy), ("onnx.load without external data", graph),
                ("rewrite apply", ours)]
        if not args.no_theirs:
            theirs_out = folder / "theirs.onnx"
            theirs = best_of([sys.executable, "-c", THEIRS, str(source), str(theirs_out), "theirs.data"], 1,
                             timeout=3600)
            rows.append(("onnxscript (load, rewrite, save)", theirs))
        print(f"{'process':<36} {'s':>8} {'vs cp':>7} {'peak MB':>8}")
        for label, run in rows:
            if not run.ok:
                print(f"{label:<36} failed: {(run.stderr or run.stdout).strip().splitlines()[-1:]}")
                continue
            print(f"{label:<36} {run.seconds:>8.2f} {run.seconds / copy.seconds:>6.2f}x {run.peak_mb:>8.0f}")
        written = onnx.load(str(out), load_external_data=False)
        expands = sum(node.op_type == "Expand" for node in written.graph.node)
        same = weights_digest(source) == weights_digest(out)
        print(f"output: {expands} Expand left, weights {'identical' if same else 'DIFFERENT'}; "
              f"input data file untouched: {data.stat().st_size == (folder / 'weights.bin').stat().st_size}")
        budget = 300 + graph.peak_mb
        print(f"targets: peak RSS {ours.peak_mb:.0f} MB < 300 MB + graph ({budget:.0f} MB): "
              f"{'met' if ours.peak_mb < budget else 'MISSED'}; time {ours.seconds / copy.seconds:.2f}x cp "
              f"(<= 2x: {'met' if ours.seconds <= 2 * copy.seconds else 'MISSED'})")
    finally:
        if not args.keep:
            shutil.rmtree(folder, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
