"""Benchmark family, ONNX: `rewrite` against onnxscript's expand rules on five shapes of graph.

Every model is opset 18, float32, x: ["batch", 16], built of layers around an
Expand of a per-row statistic m = ReduceMean(x) [batch, 1] to Shape(x) that
the consumer broadcasts anyway (so the shipped `remove_broadcast_expand`
removes it):

* chain: today's benchmark (bench_onnx_expand.py): ReduceMean, Shape, Expand,
  Mul, Add, Tanh per layer, each on the previous layer's output.
* fan-out: one m and one Shape(x) feed every layer: x = Tanh(Mul(x, Expand(m, s))).
  The shared values have as many uses as there are layers.
* wide: blocks of one variadic node with --width inputs (default 1,000):
  `concat` blocks take Mul(x, Expand(m, s)) inputs (Expands removed, the
  Concat is wide), `sum` blocks take the Expands themselves (removed; each
  Expand's check asks about the Sum's other operands, answered from the
  Sum's summary of them in time that does not grow with the width),
  `concat-kept` blocks take the Expands (kept: Concat does not broadcast).
* nested: If nodes whose branches hold fan-out layers reading the outer m
  and s, and a Loop in each then-branch whose body holds more.
* mixed: fan-out layers where every other Expand feeds a Concat (kept) and
  the others a Mul (removed), all from the same m and s.

For each shape and size (nodes, subgraphs included), in this process (imports
excluded; load, rewrite and save for both): ours = `onnx_files.read_onnx`,
`RuleSet.apply`, `onnx_files.write_onnx`; theirs = onnx.load,
`onnxscript.rewriter.rewrite(model, pattern_rewrite_rules=expand_before_binary_op_rules)`,
onnx.save. Then `rewrite apply` as a process for its peak RSS, against a
plain `onnx.load` process; with --processes, onnxscript as a process too.
Outputs are checked with onnxruntime against the original (up to
--check-limit nodes) and their Expands counted.

onnxscript's rules read the shapes that onnx's shape inference wrote into
the model, and rewrite an Expand only where its shape is a constant and
the shapes are static. On these models (a symbolic batch, the shape read
by Shape) they remove no Expand, so by default the comparison is our
rewrites against their scan. With --static the models have a fixed batch
(4) and constant Expand shapes, and onnxscript is given
`onnx.shape_inference.infer_shapes` first (counted in its time), so both
remove the same Expands: the like-for-like comparison. "th. left" counts
the Expands onnxscript left. Its rules take binary ops only, so even with
--static they leave every Expand a Sum reads (wide-sum).

Targets (issue 13): time per node flat within 25% from the smallest size to
the largest; at least 10x onnxscript in-process at 10k and 100k nodes (and as
processes at 100k); peak RSS at most 3x a plain onnx.load.

Usage:
    python bench/bench_family_onnx.py [--shapes chain,fan-out,wide,nested,mixed] [--sizes 1000,10000,100000]
        [--big] [--width 1000] [--wide-kinds concat,sum,concat-kept] [--repeat 1] [--processes]
        [--theirs-limit 150000] [--sum-limit 1000000] [--check-limit 150000] [--keep DIR] [--library] [--static]
--big adds 1,000,000 nodes.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _measure import best_of, locate_cli  # noqa: E402

HIDDEN = 16
OPSET = 18
BATCHES = (3, 5)
PLAIN_LOAD = "import sys, onnx; onnx.load(sys.argv[1])"
THEIRS_PROCESS = (
    "import sys, onnx\n"
    "from onnxscript.rewriter import rewrite\n"
    "from onnxscript.rewriter.rules.common import expand_before_binary_op_rules\n"
    "model = onnx.load(sys.argv[1])\n"
    "if sys.argv[3] == 'infer':\n"
    "    model = onnx.shape_inference.infer_shapes(model)\n"
    "onnx.save(rewrite(model, pattern_rewrite_rules=expand_before_binary_op_rules), sys.argv[2])\n"
)
STATIC_BATCH = 4
# Sizes up to SMALL nodes take milliseconds a run: at least SMALL_REPEAT runs each.
SMALL, SMALL_REPEAT = 20_000, 5

make = helper.make_node


def _model(nodes, output: str, name: str, initializers=()) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes, name, [helper.make_tensor_value_info("x0", TensorProto.FLOAT, ["batch", HIDDEN])],
        [helper.make_tensor_value_info(output, TensorProto.FLOAT, None)],
        [numpy_helper.from_array(np.array([-1], np.int64), "axes"), *initializers],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=10)


def chain(size: int, _width: int) -> onnx.ModelProto:
    """bench_onnx_expand.py's chain: 5.5 nodes a layer."""
    nodes, x = [], "x0"
    shape_const = numpy_helper.from_array(np.array([1, HIDDEN], np.int64), "shape_1x16")
    for i in range(max(1, round(size / 5.5))):
        nodes.append(make("ReduceMean", [x, "axes"], [f"m{i}"], keepdims=1))
        shape = "shape_1x16"
        if i % 2 == 0:
            shape = f"s{i}"
            nodes.append(make("Shape", [x], [shape]))
        nodes += [make("Expand", [f"m{i}", shape], [f"e{i}"]), make("Mul", [x, f"e{i}"], [f"z{i}"]),
                  make("Add", [f"z{i}", x], [f"a{i}"]), make("Tanh", [f"a{i}"], [f"x{i + 1}"])]
        x = f"x{i + 1}"
    return _model(nodes, x, "chain", [shape_const])


def _statistic(x: str = "x0") -> list:
    return [make("ReduceMean", [x, "axes"], ["m"], keepdims=1), make("Shape", [x], ["s"])]


def fan_out(size: int, _width: int) -> onnx.ModelProto:
    """3 nodes a layer, every Expand of the one m to the one s."""
    nodes, x = _statistic(), "x0"
    for i in range(max(1, (size - 2) // 3)):
        nodes += [make("Expand", ["m", "s"], [f"e{i}"]), make("Mul", [x, f"e{i}"], [f"p{i}"]),
                  make("Tanh", [f"p{i}"], [f"x{i + 1}"])]
        x = f"x{i + 1}"
    return _model(nodes, x, "fan_out")


def wide(kind: str):
    def build(size: int, width: int) -> onnx.ModelProto:
        nodes, x = _statistic(), "x0"
        per_input = 3 if kind == "concat" else 1
        blocks = max(1, (size - 2) // (width * per_input + 2))
        for b in range(blocks):
            inputs = [x] if kind == "sum" else []
            for i in range(width):
                e = f"e{b}_{i}"
                nodes.append(make("Expand", ["m", "s"], [e]))
                if kind == "concat":
                    nodes.append(make("Mul", [x, e], [f"p{b}_{i}"]))
                    nodes.append(make("Identity", [f"p{b}_{i}"], [f"q{b}_{i}"]))
                    inputs.append(f"q{b}_{i}")
                else:
                    inputs.append(e)
            if kind == "sum":
                nodes.append(make("Sum", inputs, [f"w{b}"]))
                nodes.append(make("Tanh", [f"w{b}"], [f"x{b + 1}"]))
            else:
                # The wide output is reduced back to [batch, 1] and broadcast on, so blocks chain.
                nodes.append(make("Concat", inputs, [f"w{b}"], axis=1))
                nodes.append(make("ReduceMean", [f"w{b}", "axes"], [f"r{b}"], keepdims=1))
                nodes.append(make("Add", [x, f"r{b}"], [f"x{b + 1}"]))
            x = f"x{b + 1}"
        return _model(nodes, x, f"wide_{kind}")

    build.__name__ = f"wide_{kind}"
    return build


def _layers(prefix: str, x: str, count: int) -> tuple[list, str]:
    nodes = []
    for i in range(count):
        nodes += [make("Expand", ["m", "s"], [f"{prefix}e{i}"]), make("Mul", [x, f"{prefix}e{i}"], [f"{prefix}x{i}"])]
        x = f"{prefix}x{i}"
    return nodes, x


def nested(size: int, _width: int) -> onnx.ModelProto:
    """If blocks of about 200 nodes: 40 layers a branch, 19 in a Loop body inside the then-branch."""
    per_block, branch_layers, body_layers = 200, 40, 19
    nodes, x, value_info = _statistic(), "x0", []
    initializers = [numpy_helper.from_array(np.array(0.0, np.float32), "zero"),
                    numpy_helper.from_array(np.array(2, np.int64), "trips"),
                    numpy_helper.from_array(np.array(True), "true")]
    for b in range(max(1, (size - 2) // per_block)):
        body_nodes, body_out = _layers(f"b{b}_", f"c{b}", body_layers)
        body_nodes.append(make("Identity", ["cond_in"], ["cond_out"]))
        body = helper.make_graph(
            body_nodes, f"body{b}",
            [helper.make_tensor_value_info("i", TensorProto.INT64, []),
             helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
             helper.make_tensor_value_info(f"c{b}", TensorProto.FLOAT, ["n", HIDDEN])],
            [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
             helper.make_tensor_value_info(body_out, TensorProto.FLOAT, ["n", HIDDEN])],
        )
        then_nodes, then_out = _layers(f"t{b}_", x, branch_layers)
        then_nodes.append(make("Loop", ["trips", "true", then_out], [f"l{b}"], body=body))
        else_nodes, else_out = _layers(f"f{b}_", x, branch_layers)
        else_nodes.append(make("Identity", [else_out], [f"g{b}"]))
        # Outputs declared [batch, 16], as exporters write them: without the
        # width no rule (ours or onnxscript's) can prove the next block's Expands.
        then_branch = helper.make_graph(then_nodes, f"then{b}", [],
                                        [helper.make_tensor_value_info(f"l{b}", TensorProto.FLOAT, ["n", HIDDEN])])
        else_branch = helper.make_graph(else_nodes, f"else{b}", [],
                                        [helper.make_tensor_value_info(f"g{b}", TensorProto.FLOAT, ["n", HIDDEN])])
        value_info.append(helper.make_tensor_value_info(f"y{b}", TensorProto.FLOAT, ["n", HIDDEN]))
        nodes += [make("ReduceSum", [x], [f"sum{b}"], keepdims=0), make("Greater", [f"sum{b}", "zero"], [f"k{b}"]),
                  make("If", [f"k{b}"], [f"y{b}"], then_branch=then_branch, else_branch=else_branch),
                  make("Tanh", [f"y{b}"], [f"x{b + 1}"])]
        x = f"x{b + 1}"
    model = _model(nodes, x, "nested", initializers)
    model.graph.value_info.extend(value_info)
    return model


def mixed(size: int, _width: int) -> onnx.ModelProto:
    """Fan-out layers; every other Expand feeds a Concat (kept), the others a Mul (removed)."""
    nodes, x, kept = _statistic(), "x0", []
    # Layers alternate 3 nodes (removed) and 2 (kept): 2.5 a layer, so that
    # a size of 100k is 100k nodes.
    for i in range(max(1, 2 * (size - 3) // 5)):
        nodes.append(make("Expand", ["m", "s"], [f"e{i}"]))
        if i % 2:
            kept.append(f"e{i}")
            nodes.append(make("Identity", [x], [f"i{i}"]))
            x = f"i{i}"
        else:
            nodes += [make("Mul", [x, f"e{i}"], [f"p{i}"]), make("Tanh", [f"p{i}"], [f"t{i}"])]
            x = f"t{i}"
    nodes.append(make("Concat", [x, *kept], ["y"], axis=1))
    return _model(nodes, "y", "mixed")


SHAPES = {"chain": chain, "fan-out": fan_out, "wide": None, "nested": nested, "mixed": mixed}
WIDE_KINDS = {"concat": wide("concat"), "sum": wide("sum"), "concat-kept": wide("concat-kept")}


# --------------------------------------------------------------------------- measuring


def static(model: onnx.ModelProto) -> onnx.ModelProto:
    """`model` with a fixed batch and every Shape (each reads a [batch, 16] value) a constant."""
    graph = model.graph
    graph.input[0].type.tensor_type.shape.dim[0].dim_value = STATIC_BATCH
    shapes = [node for node in graph.node if node.op_type == "Shape"]
    kept = [node for node in graph.node if node.op_type != "Shape"]
    del graph.node[:]
    graph.node.extend(kept)
    for node in shapes:
        graph.initializer.append(numpy_helper.from_array(np.array([STATIC_BATCH, HIDDEN], np.int64), node.output[0]))
    return model


def count(model: onnx.ModelProto) -> Counter:
    found: Counter = Counter()
    pending = [model.graph]
    while pending:
        graph = pending.pop()
        for node in graph.node:
            found[node.op_type] += 1
            for attribute in node.attribute:
                if attribute.type == onnx.AttributeProto.GRAPH:
                    pending.append(attribute.g)
                pending.extend(attribute.graphs)
    return found


def outputs(path: Path, batches=BATCHES):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 3
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    return [session.run(None, {"x0": rng.normal(size=(b, HIDDEN)).astype(np.float32)})[0] for b in batches]


def same_outputs(path: Path, reference, batches=BATCHES) -> str:
    try:
        got = outputs(path, batches)
    except Exception as error:  # noqa: BLE001 - any failure is a wrong result
        return f"WRONG ({str(error).splitlines()[0][:80]})"
    for want, have in zip(reference, got):
        if want.shape != have.shape or not np.allclose(want, have, rtol=1e-5, atol=1e-6, equal_nan=True):
            return "WRONG"
    return "same"


def run_ours(rules, source: Path, target: Path) -> dict:
    from rewrite.backends.onnx import files as onnx_files

    gc.collect()
    cpu = time.process_time()
    start = time.perf_counter()
    model, _ = onnx_files.read_onnx(source)
    loaded = time.perf_counter()
    rules.apply(model)
    applied = time.perf_counter()
    onnx_files.write_onnx(model, target)
    saved = time.perf_counter()
    cpu = time.process_time() - cpu
    del model
    return {"seconds": saved - start, "load": loaded - start, "apply": applied - loaded, "save": saved - applied,
            "cpu": cpu}


def run_theirs(source: Path, target: Path, infer: bool = False) -> float:
    from onnxscript.rewriter import rewrite
    from onnxscript.rewriter.rules.common import expand_before_binary_op_rules

    gc.collect()
    start = time.perf_counter()
    model = onnx.load(str(source))
    if infer:  # their rules read the shapes it writes
        model = onnx.shape_inference.infer_shapes(model)
    model = rewrite(model, pattern_rewrite_rules=expand_before_binary_op_rules)
    onnx.save(model, str(target))
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", default=",".join(SHAPES))
    parser.add_argument("--sizes", default="1000,10000,100000", help="approximate node counts")
    parser.add_argument("--big", action="store_true", help="add 1,000,000 nodes")
    parser.add_argument("--width", type=int, default=1000, help="inputs of each wide node")
    parser.add_argument("--wide-kinds", default="concat,sum,concat-kept")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--processes", action="store_true", help="also time onnxscript as a process")
    parser.add_argument("--theirs-limit", type=int, default=150_000, help="skip onnxscript above this size")
    parser.add_argument("--sum-limit", type=int, default=1_000_000,
                        help="largest wide-sum model (skip the bigger ones)")
    parser.add_argument("--check-limit", type=int, default=150_000, help="onnxruntime checks up to this size")
    parser.add_argument("--keep", metavar="DIR")
    parser.add_argument("--static", action="store_true",
                        help="fixed batch and constant Expand shapes, onnxscript given onnx shape inference: "
                             "both remove the same Expands")
    parser.add_argument("--library", action="store_true",
                        help="ours runs every shipped ONNX rule (default: remove_broadcast_expand.rules, the "
                             "rules doing what onnxscript's expand rules do)")
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()] + ([1_000_000] if args.big else [])
    builders = []
    for shape in args.shapes.split(","):
        if shape == "wide":
            builders += [(f"wide-{kind}", WIDE_KINDS[kind]) for kind in args.wide_kinds.split(",")]
        else:
            builders.append((shape, SHAPES[shape]))

    import onnxscript

    import rewrite

    # Like for like: onnxscript runs its expand rules only, so ours runs the
    # file of the rule that does that job; --library runs every shipped ONNX rule.
    rules_path = None if args.library else rewrite.shipped_rules_path() / "onnx" / "remove_broadcast_expand.rules"
    rules = rewrite.load_rules(dialects=["onnx"]) if args.library else rewrite.load_rules(rules_path)
    folder = Path(args.keep or tempfile.mkdtemp(prefix="bench_family_onnx_"))
    folder.mkdir(parents=True, exist_ok=True)
    cli = locate_cli()
    print(f"onnx {onnx.__version__}, onnxscript {onnxscript.__version__}; wide nodes of {args.width} inputs; "
          f"best of {args.repeat} (of at least {SMALL_REPEAT} up to {SMALL:,} nodes); in-process times are load + "
          f"rewrite + save; ours: "
          + ("every shipped ONNX rule" if rules_path is None else rules_path.name))
    header = (f"{'shape':<16} {'nodes':>8} | {'ours s':>8} {'us/node':>8} {'cpu/node':>8} {'load/apply/save':>17} | "
              f"{'theirs s':>8} {'theirs/ours':>11} | {'proc s':>7} {'th. proc':>8} {'RSS/load':>8} | "
              f"{'Expand left':>11} {'th. left':>8} {'output':>6}")
    print(header)
    print("-" * len(header))
    summary = []
    for name, build in builders:
        per_node, cpu_per_node = [], []
        # A first run pays for what is built once per process (schemas, compiled conditions).
        warm = folder / f"{name}_warm.onnx"
        warm_model = build(min(sizes) // 4 or 1, min(args.width, 50))
        onnx.save(static(warm_model) if args.static else warm_model, str(warm))
        run_ours(rules, warm, folder / f"{name}_warm.ours.onnx")
        run_theirs(warm, folder / f"{name}_warm.theirs.onnx", args.static)
        for path in folder.glob(f"{name}_warm*"):
            path.unlink()
        for size in sizes:
            if name == "wide-sum" and size > args.sum_limit:
                continue
            model = build(size, args.width)
            if args.static:
                model = static(model)
            nodes = sum(count(model).values())
            source = folder / f"{name}_{size}.onnx"
            onnx.save(model, str(source))
            expands = count(model)["Expand"]
            del model
            batches = (STATIC_BATCH,) if args.static else BATCHES
            reference = outputs(source, batches) if nodes <= args.check_limit else None
            ours_path, theirs_path = folder / f"{name}_{size}.ours.onnx", folder / f"{name}_{size}.theirs.onnx"
            # A run of a few thousand nodes takes milliseconds, within the noise
            # of one sample: small sizes are repeated more, for the flatness ratio.
            repeat = max(args.repeat, SMALL_REPEAT) if nodes <= SMALL else args.repeat
            ours = min((run_ours(rules, source, ours_path) for _ in range(repeat)), key=lambda r: r["seconds"])
            per_node.append(ours["seconds"] / nodes)
            cpu_per_node.append(ours["cpu"] / nodes)
            theirs = None
            if nodes <= args.theirs_limit:
                theirs = min(run_theirs(source, theirs_path, args.static) for _ in range(repeat))
            rules_arguments = [] if rules_path is None else ["--rules", str(rules_path)]
            process = best_of([*cli, "apply", str(source), *rules_arguments, "-o", str(ours_path)], repeat,
                              timeout=3600)
            plain = best_of([sys.executable, "-c", PLAIN_LOAD, str(source)], repeat, timeout=3600)
            theirs_process = None
            if args.processes and nodes <= args.theirs_limit:
                theirs_process = best_of([sys.executable, "-c", THEIRS_PROCESS, str(source), str(theirs_path),
                                          "infer" if args.static else "plain"], repeat, timeout=3600)
            left = count(onnx.load(str(ours_path)))["Expand"]
            verdict = same_outputs(ours_path, reference, batches) if reference is not None else "n/c"
            theirs_left = count(onnx.load(str(theirs_path)))["Expand"] if theirs is not None else "n/a"
            split = f"{ours['load']:.2f}/{ours['apply']:.2f}/{ours['save']:.2f}"
            ratio = f"{theirs / ours['seconds']:.1f}x" if theirs else "n/a"
            theirs_text = f"{theirs:.3f}" if theirs else "n/a"
            proc_theirs = f"{theirs_process.seconds:.2f}" if theirs_process and theirs_process.ok else "n/a"
            rss = process.peak_rss_kb / plain.peak_rss_kb if process.ok and plain.peak_rss_kb else float("nan")
            print(f"{name:<16} {nodes:>8} | {ours['seconds']:>8.3f} {ours['seconds'] * 1e6 / nodes:>8.2f} "
                  f"{ours['cpu'] * 1e6 / nodes:>8.2f} {split:>17} | {theirs_text:>8} {ratio:>11} | "
                  f"{process.seconds:>7.2f} {proc_theirs:>8} "
                  f"{rss:>8.2f} | {left:>5}/{expands:<5} {theirs_left:>8} {verdict:>6}", flush=True)
            summary.append((name, nodes, ours["seconds"], theirs, process, theirs_process, rss))
            for path in (source, ours_path, theirs_path):
                if not args.keep and path.exists():
                    os.unlink(path)
        flat = max(per_node) / min(per_node)
        flat_cpu = max(cpu_per_node) / min(cpu_per_node)
        print(f"{name:<16} time per node, largest/smallest over sizes: {flat:.2f} "
              f"({'within' if flat <= 1.25 else 'OUTSIDE'} 25%); CPU time per node: {flat_cpu:.2f} "
              f"({'within' if flat_cpu <= 1.25 else 'OUTSIDE'} 25%)", flush=True)
    print()
    print("ours s: read_onnx + RuleSet.apply + write_onnx in this process (cpu/node: its process CPU time, which")
    print("  other load on the machine does not inflate); theirs s: onnx.load + onnxscript")
    print("  rewrite(expand_before_binary_op_rules) + onnx.save in this process; theirs/ours > 1: ours faster.")
    print("proc s: `rewrite apply IN -o OUT` as a process (start-up included); th. proc: onnxscript as one;")
    print("RSS/load: that process's peak RSS over a plain `onnx.load` process's.")
    if not args.keep:
        try:
            folder.rmdir()
        except OSError:
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
