"""Benchmark: `rewrite apply` on ONNX vs onnxscript's expand-before-binary-op rules.

Builds synthetic ONNX models (opset 18, float32) of about 1k, 10k and 100k nodes
made of chained instances of one pattern. With x the running activation, shape
["batch", 16] (symbolic batch from the graph input):

    y  = ReduceMean(x, axes=[-1], keepdims=1)      # [batch, 1]
    s  = Shape(x)                                  # even instances
    e  = Expand(y, s)       or  Expand(y, [1, 16]) # odd instances: shared int64 initializer
    z  = Mul(x, e)                                 # Mul broadcasts [batch,16] x [batch,1] natively
    a  = Add(z, x)
    x' = Tanh(a)                                   # keeps values bounded along a very long chain

Every Expand is semantically removable: Mul(x, y) broadcasts to the same
[batch, 16] result because x already carries both expanded dims. Only the graph
input and output carry shapes (no value_info), as in many real exports. Each
model is checked once with onnx.checker and run in onnxruntime at batch 3.

For each size, on the same file:

* ours: `rewrite apply IN -o OUT --json` as a subprocess (wall clock, so it
  includes interpreter start-up, imports, load and save), peak RSS via
  GNU `time -v` (or a tiny fork/exec launcher). If the CLI fails (the ONNX backend does not exist yet) ours is
  reported as "n/a" and the benchmark goes on. A tiny model (one instance) is
  run through the CLI too, and its time subtracted, to give a start-up-free
  "net" per-node time. `--in-process` also times `rewrite.cli.main([...])`
  in this process (see `run_ours_in_process`, the hook for an in-process API).
* onnxscript: onnx.load + onnxscript.rewriter.rewrite(model,
  pattern_rewrite_rules=onnxscript.rewriter.rules.common.expand_before_binary_op_rules)
  + onnx.save, timed in this process (imports excluded), and the same as a
  `python -c` process (start-up and imports included), to compare with the CLI. Extra variants that
  first run onnx.shape_inference.infer_shapes (with and without data_prop) are
  timed as well (`--theirs-variants`), because without intermediate shapes the
  onnxscript rule cannot prove anything.
* plain load: `python -c "import onnx; onnx.load(PATH)"` as a subprocess; its
  peak RSS is the memory baseline.

Every output is counted for Expand nodes and run in onnxruntime at two batch
sizes; its output must equal the original model's.

The speed target is judged like for like: in this process when --in-process
is given (both tools' load, rewrite and save), else process against process;
the other comparison is printed too.

Targets: ours >= 10x faster than onnxscript at 10k and 100k nodes; ours
per-node time flat within 25% from 1k to 100k; ours peak RSS <= 3x a plain
onnx.load of the same file.

Usage:
    python bench/bench_onnx_expand.py [--sizes 1000,10000,100000] [--repeat N] [--keep DIR]
                                      [--theirs-variants plain,infer,infer-dp] [--in-process]
                                      [--cli CMD] [--ours-timeout SECONDS]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import shlex
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _measure import Run, locate_cli, run_measured  # noqa: E402

HIDDEN = 16
OPSET = 18
IR_VERSION = 10
CHECK_BATCHES = (3, 7)
NODES_SHAPE_INSTANCE = 6  # ReduceMean, Shape, Expand, Mul, Add, Tanh
NODES_CONST_INSTANCE = 5  # ReduceMean, Expand, Mul, Add, Tanh
PLAIN_LOAD = "import sys, onnx; onnx.load(sys.argv[1])"
# onnxscript as a process, the way ours runs as one: start-up and imports count.
THEIRS_PROCESS = (
    "import sys, onnx\n"
    "from onnxscript.rewriter import rewrite\n"
    "from onnxscript.rewriter.rules.common import expand_before_binary_op_rules\n"
    "model = rewrite(onnx.load(sys.argv[1]), pattern_rewrite_rules=expand_before_binary_op_rules)\n"
    "onnx.save(model, sys.argv[2])\n"
)
THEIRS_VARIANTS = {
    "plain": "load + rewrite + save",
    "infer": "load + infer_shapes + rewrite + save",
    "infer-dp": "load + infer_shapes(data_prop=True) + rewrite + save",
}

# --------------------------------------------------------------------------- model construction


def build_model(target_nodes: int) -> onnx.ModelProto:
    """Chain of ReduceMean -> [Shape] -> Expand -> Mul -> Add -> Tanh instances, ~target_nodes nodes."""
    instances = max(1, round(target_nodes / ((NODES_SHAPE_INSTANCE + NODES_CONST_INSTANCE) / 2)))
    initializers = [
        numpy_helper.from_array(np.array([-1], dtype=np.int64), "axes_last"),
        numpy_helper.from_array(np.array([1, HIDDEN], dtype=np.int64), "shape_1x16"),
    ]
    nodes = []
    make = helper.make_node
    x = "x0"
    for i in range(instances):
        y, e, z, a, nxt = f"mean{i}", f"expand{i}", f"mul{i}", f"add{i}", f"x{i + 1}"
        nodes.append(make("ReduceMean", [x, "axes_last"], [y], name=f"ReduceMean_{i}", keepdims=1))
        if i % 2 == 0:
            shape = f"shape{i}"
            nodes.append(make("Shape", [x], [shape], name=f"Shape_{i}"))
        else:
            shape = "shape_1x16"
        nodes.append(make("Expand", [y, shape], [e], name=f"Expand_{i}"))
        nodes.append(make("Mul", [x, e], [z], name=f"Mul_{i}"))
        nodes.append(make("Add", [z, x], [a], name=f"Add_{i}"))
        nodes.append(make("Tanh", [a], [nxt], name=f"Tanh_{i}"))
        x = nxt
    graph = helper.make_graph(
        nodes,
        f"expand_chain_{instances}",
        [helper.make_tensor_value_info("x0", TensorProto.FLOAT, ["batch", HIDDEN])],
        [helper.make_tensor_value_info(x, TensorProto.FLOAT, ["batch", HIDDEN])],
        initializers,
    )
    return helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=IR_VERSION, producer_name="bench"
    )


def count_ops(model: onnx.ModelProto, op_type: str | None = None) -> int:
    return sum(1 for node in model.graph.node if op_type is None or node.op_type == op_type)


# --------------------------------------------------------------------------- onnxruntime checks


def _session(path: Path) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # run the graph as written
    options.intra_op_num_threads = 1
    options.log_severity_level = 3
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def _inputs(batch: int) -> np.ndarray:
    return np.random.default_rng(batch).standard_normal((batch, HIDDEN)).astype(np.float32)


def run_model(path: Path, batches=CHECK_BATCHES) -> dict[int, np.ndarray]:
    session = _session(path)
    name = session.get_inputs()[0].name
    return {b: session.run(None, {name: _inputs(b)})[0] for b in batches}


def compare(path: Path, reference: dict[int, np.ndarray]) -> str:
    """'exact', 'close (max |d| ...)', or 'WRONG: ...' against the original model's outputs."""
    try:
        got = run_model(path, tuple(reference))
    except Exception as error:  # noqa: BLE001 - any runtime failure is a wrong result
        return f"WRONG: onnxruntime failed: {str(error).splitlines()[0][:100]}"
    worst = 0.0
    for batch, want in reference.items():
        have = got[batch]
        if have.shape != want.shape:
            return f"WRONG: batch {batch} shape {have.shape} != {want.shape}"
        if not np.allclose(have, want, rtol=1e-5, atol=1e-6):
            return f"WRONG: batch {batch} max |diff| {float(np.max(np.abs(have - want))):.3g}"
        worst = max(worst, float(np.max(np.abs(have - want))))
    return "exact" if worst == 0.0 else f"close (max |diff| {worst:.2g})"


# --------------------------------------------------------------------------- processes


# --------------------------------------------------------------------------- ours


@dataclass
class Ours:
    available: bool
    seconds: float = float("nan")
    peak_rss_kb: int = 0
    expands_left: int | None = None
    nodes_left: int | None = None
    correctness: str = ""
    reason: str = ""
    stats: dict = field(default_factory=dict)
    in_process_seconds: float | None = None


def _first_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:160] if lines else "(no output)"


def run_ours_cli(cli: list[str] | None, src: Path, dst: Path, timeout: float) -> tuple[Run | None, str]:
    if cli is None:
        return None, "`rewrite` CLI not found"
    if dst.exists():
        dst.unlink()
    try:
        run = run_measured([*cli, "apply", str(src), "-o", str(dst), "--json"], timeout=timeout)
    except OSError as error:
        return None, f"could not start the CLI: {error}"
    if not run.ok:
        return run, f"CLI failed: {_first_line(run.stderr or run.stdout)}"
    if not dst.exists():
        return run, "CLI exited 0 but wrote no output"
    return run, ""


def run_ours_in_process(src: Path, dst: Path) -> float | None:
    """HOOK: time ours in this process (load + rewrite + save, no interpreter start-up or imports).

    Today this goes through `rewrite.cli.main(argv)`. Once the ONNX backend has a
    Python API (e.g. load / apply / save), call it here instead. Returns None when
    ours cannot do it.
    """
    try:
        from rewrite import cli
    except Exception:  # noqa: BLE001
        return None
    if dst.exists():
        dst.unlink()
    sink = io.StringIO()
    start = time.perf_counter()
    try:
        with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
            code = cli.main(["apply", str(src), "-o", str(dst), "--json"])
    except (Exception, SystemExit):  # noqa: BLE001
        return None
    seconds = time.perf_counter() - start
    return seconds if code == 0 and dst.exists() else None


def measure_ours(cli, src: Path, dst: Path, args, reference) -> Ours:
    best: Ours | None = None
    for _ in range(args.repeat):
        run, reason = run_ours_cli(cli, src, dst, args.ours_timeout)
        if reason:
            return Ours(False, reason=reason)
        if best is None or run.seconds < best.seconds:
            best = Ours(True, run.seconds, max(run.peak_rss_kb, best.peak_rss_kb if best else 0))
            with contextlib.suppress(ValueError):
                best.stats = json.loads(run.stdout)
        else:
            best.peak_rss_kb = max(best.peak_rss_kb, run.peak_rss_kb)
    try:
        out = onnx.load(str(dst))
    except Exception as error:  # noqa: BLE001
        return Ours(False, reason=f"output is not a loadable ONNX model: {error}")
    best.expands_left = count_ops(out, "Expand")
    best.nodes_left = count_ops(out)
    del out
    best.correctness = compare(dst, reference)
    if args.in_process:
        times = [run_ours_in_process(src, dst) for _ in range(args.repeat)]
        if all(t is not None for t in times):
            best.in_process_seconds = min(times)
    return best


# --------------------------------------------------------------------------- onnxscript


def _onnxscript_api():
    from onnxscript.rewriter import rewrite as os_rewrite
    from onnxscript.rewriter.rules.common import expand_before_binary_op_rules

    return os_rewrite, expand_before_binary_op_rules


@dataclass
class Theirs:
    seconds: float
    expands_left: int
    nodes_left: int
    correctness: str
    process_seconds: float | None = None  # plain only: as a process, start-up and imports included
    process_rss_kb: int = 0


def run_theirs_once(variant: str, src: Path, dst: Path) -> float:
    os_rewrite, rules = _onnxscript_api()
    start = time.perf_counter()
    model = onnx.load(str(src))
    if variant == "infer":
        model = onnx.shape_inference.infer_shapes(model)
    elif variant == "infer-dp":
        model = onnx.shape_inference.infer_shapes(model, data_prop=True)
    model = os_rewrite(model, pattern_rewrite_rules=rules)
    onnx.save(model, str(dst))
    return time.perf_counter() - start


def measure_theirs(variant: str, src: Path, dst: Path, repeat: int, reference) -> Theirs:
    seconds = min(run_theirs_once(variant, src, dst) for _ in range(repeat))
    out = onnx.load(str(dst))
    expands, nodes = count_ops(out, "Expand"), count_ops(out)
    del out
    result = Theirs(seconds, expands, nodes, compare(dst, reference))
    if variant == "plain":
        runs = [run_measured([sys.executable, "-c", THEIRS_PROCESS, str(src), str(dst)]) for _ in range(repeat)]
        if all(run.ok for run in runs):
            result.process_seconds = min(run.seconds for run in runs)
            result.process_rss_kb = max(run.peak_rss_kb for run in runs)
    return result


# --------------------------------------------------------------------------- driver


def _fmt(value: float | None, spec: str, width: int) -> str:
    if value is None or (isinstance(value, float) and value != value):
        return f"{'n/a':>{width}}"
    return f"{value:>{width}{spec}}"


def _ratio(theirs: float | None, ours: float | None) -> str:
    return "n/a" if theirs is None or not ours else f"{theirs / ours:.1f}x"


def _verdict(ok: bool | None) -> str:
    return "n/a (ours not available)" if ok is None else ("PASS" if ok else "FAIL")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1000,10000,100000", help="approximate node counts, comma separated")
    parser.add_argument("--repeat", type=int, default=1, help="timed runs per tool and size (best is kept)")
    parser.add_argument("--keep", metavar="DIR", help="keep generated and rewritten models in DIR")
    parser.add_argument(
        "--theirs-variants",
        default="plain,infer,infer-dp",
        help=f"onnxscript variants to time, from {','.join(THEIRS_VARIANTS)} ('plain' is the main column)",
    )
    parser.add_argument("--in-process", action="store_true", help="also time ours in-process (hook)")
    parser.add_argument("--cli", metavar="CMD", help="command for ours instead of `rewrite` (e.g. for testing)")
    parser.add_argument("--ours-timeout", type=float, default=900.0, help="kill the CLI after this many seconds")
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    variants = [v.strip() for v in args.theirs_variants.split(",") if v.strip()]
    if "plain" not in variants:
        variants.insert(0, "plain")
    unknown = set(variants) - set(THEIRS_VARIANTS)
    if unknown or args.repeat < 1:
        parser.error(f"unknown --theirs-variants {sorted(unknown)}" if unknown else "--repeat must be >= 1")

    import onnxscript

    print(
        f"python {sys.version.split()[0]}, onnx {onnx.__version__}, onnxruntime {ort.__version__}, "
        f"onnxscript {onnxscript.__version__}"
    )
    print(
        "onnxscript API: onnxscript.rewriter.rewrite(model, pattern_rewrite_rules="
        "onnxscript.rewriter.rules.common.expand_before_binary_op_rules)"
    )
    cli = shlex.split(args.cli) if args.cli else locate_cli()
    print(f"ours: {' '.join(cli) if cli else '(rewrite CLI not found)'} apply IN -o OUT --json")

    if args.keep:
        workdir = Path(args.keep)
        workdir.mkdir(parents=True, exist_ok=True)
        cleanup = None
    else:
        cleanup = tempfile.TemporaryDirectory(prefix="bench_onnx_expand_")
        workdir = Path(cleanup.name)

    # Fixed cost of the CLI (start-up, imports, rules, tiny load/save), subtracted for "net" per-node time.
    tiny = workdir / "expand_tiny.onnx"
    onnx.save(build_model(1), str(tiny))
    ours_fixed, ours_fixed_rss, base_reason = None, 0, ""
    for _ in range(3):
        base_run, base_reason = run_ours_cli(cli, tiny, workdir / "expand_tiny.ours.onnx", args.ours_timeout)
        if base_reason:
            ours_fixed = None
            break
        ours_fixed = base_run.seconds if ours_fixed is None else min(ours_fixed, base_run.seconds)
        ours_fixed_rss = max(ours_fixed_rss, base_run.peak_rss_kb)
    import_onnx = run_measured([sys.executable, "-c", "import onnx"])
    print(
        "ours fixed cost (tiny model): "
        + ("n/a" if ours_fixed is None else f"{ours_fixed:.3f} s, peak RSS {ours_fixed_rss / 1024:.0f} MB")
        + (f"  [{base_reason}]" if base_reason else "")
        + f"; `import onnx` alone: {import_onnx.seconds:.3f} s, peak RSS {import_onnx.peak_rss_kb / 1024:.0f} MB"
    )
    print()

    if args.in_process and ours_fixed is not None:
        run_ours_in_process(tiny, workdir / "expand_tiny.ours.onnx")  # warm-up: pay imports outside the timing

    rows = []
    for size in sizes:
        src = workdir / f"expand_{size}.onnx"
        start = time.perf_counter()
        model = build_model(size)
        built = time.perf_counter() - start
        nodes, expands = count_ops(model), count_ops(model, "Expand")
        start = time.perf_counter()
        onnx.checker.check_model(model)
        checked = time.perf_counter() - start
        start = time.perf_counter()
        onnx.save(model, str(src))
        saved = time.perf_counter() - start
        del model
        start = time.perf_counter()
        reference = run_model(src)
        validated = time.perf_counter() - start
        smoke = run_model(src, (3,))[3]
        if smoke.shape != (3, HIDDEN) or not np.all(np.isfinite(smoke)):
            raise SystemExit(f"generated model for {size} is broken: output {smoke.shape}")
        print(
            f"[{size}] generated {nodes} nodes / {expands} Expand ({src.stat().st_size / 1e6:.1f} MB): "
            f"build {built:.2f} s, checker {checked:.2f} s, save {saved:.2f} s, "
            f"onnxruntime (session + 2 runs) {validated:.2f} s",
            flush=True,
        )

        plain = [run_measured([sys.executable, "-c", PLAIN_LOAD, str(src)]) for _ in range(args.repeat)]
        if not all(p.ok for p in plain):
            raise SystemExit(f"plain onnx.load failed: {_first_line(plain[0].stderr)}")
        plain_rss = max(p.peak_rss_kb for p in plain)
        plain_s = min(p.seconds for p in plain)

        ours = measure_ours(cli, src, workdir / f"expand_{size}.ours.onnx", args, reference)
        if ours.available:
            extra = f", in-process {ours.in_process_seconds:.3f} s" if ours.in_process_seconds else ""
            print(
                f"[{size}] ours: {ours.seconds:.3f} s{extra}, peak RSS {ours.peak_rss_kb / 1024:.0f} MB, "
                f"{ours.expands_left} Expand / {ours.nodes_left} nodes left, output {ours.correctness}",
                flush=True,
            )
        else:
            print(f"[{size}] ours: not available ({ours.reason})", flush=True)

        theirs = {}
        for variant in variants:
            result = measure_theirs(
                variant, src, workdir / f"expand_{size}.onnxscript-{variant}.onnx", args.repeat, reference
            )
            theirs[variant] = result
            print(
                f"[{size}] onnxscript {variant:<8} ({THEIRS_VARIANTS[variant]}): {result.seconds:.3f} s, "
                f"{result.expands_left} Expand / {result.nodes_left} nodes left, output {result.correctness}",
                flush=True,
            )
        print(f"[{size}] plain onnx.load process: {plain_s:.3f} s, peak RSS {plain_rss / 1024:.0f} MB", flush=True)
        rows.append((size, nodes, expands, ours, theirs, plain_rss))

    # ----------------------------------------------------------------------- table
    # Two like-for-like comparisons: both tools as processes (start-up and
    # imports included, what a user at a shell waits for), and both in this
    # process (load + rewrite + save, imports excluded: the tools' own work).
    print()
    header = (
        f"{'nodes':>7} {'expands':>7} | {'ours proc s':>11} {'theirs proc s':>13} {'speedup':>7} | "
        f"{'ours in-proc s':>14} {'theirs in-proc s':>16} {'speedup':>7} | {'ours us/node':>12} "
        f"{'net us/node':>11} {'RSS ours/load':>13} {'RSS ours/theirs':>15} {'expands left ours/theirs':>24}"
    )
    print(header)
    print("-" * len(header))
    for _, nodes, expands, ours, theirs, plain_rss in rows:
        t = theirs["plain"]
        ours_s = ours.seconds if ours.available else None
        in_process = ours.in_process_seconds if ours.available else None
        net = None if ours_s is None or ours_fixed is None else (ours_s - ours_fixed) * 1e6 / nodes
        per_node = None if in_process is None else in_process * 1e6 / nodes
        rss_theirs = None if ours_s is None or not t.process_rss_kb else ours.peak_rss_kb / t.process_rss_kb
        left = f"{ours.expands_left if ours.available else 'n/a'}/{t.expands_left}"
        print(
            f"{nodes:>7} {expands:>7} | {_fmt(ours_s, '.3f', 11)} {_fmt(t.process_seconds, '.3f', 13)} "
            f"{_ratio(t.process_seconds, ours_s):>7} | {_fmt(in_process, '.3f', 14)} {t.seconds:>16.3f} "
            f"{_ratio(t.seconds, in_process):>7} | "
            f"{_fmt(per_node, '.2f', 12)} {_fmt(net, '.2f', 11)} "
            f"{_fmt(None if ours_s is None else ours.peak_rss_kb / plain_rss, '.2f', 13)} "
            f"{_fmt(rss_theirs, '.2f', 15)} {left:>24}"
        )
    print("proc s: each tool as its own process, wall clock incl. interpreter start-up, imports, load and save")
    print("  (ours: the `rewrite apply` CLI; theirs: a python -c script calling onnxscript.rewriter.rewrite).")
    print("in-proc s: load + rewrite + save inside this process, imports excluded (ours through rewrite.cli.main).")
    print("us/node: in-process seconds per node; net us/node: the CLI minus its tiny-model run, per node.")
    if len(variants) > 1:
        print()
        print("onnxscript variants (s / expands left / output vs original):")
        for _, nodes, _, _, theirs, _ in rows:
            cells = "  ".join(
                f"{v}: {r.seconds:.3f} s, {r.expands_left} left, {r.correctness}" for v, r in theirs.items()
            )
            print(f"  {nodes:>7}: {cells}")
        for _, nodes, _, ours, theirs, _ in rows:
            if ours.available:
                # The variants run in this process: against ours in-process when measured.
                mine, how = (
                    (ours.in_process_seconds, "in-process") if ours.in_process_seconds else (ours.seconds, "CLI")
                )
                print(
                    f"  {nodes:>7}: speedup vs each variant (ours {how}): "
                    + ", ".join(f"{v} {r.seconds / mine:.1f}x" for v, r in theirs.items())
                )

    # ----------------------------------------------------------------------- targets
    print()
    print("targets:")
    available = [r for r in rows if r[3].available]
    big = [r for r in available if r[1] >= 5000]
    # Judged like for like: in this process when measured (both tools' load,
    # rewrite and save, neither's interpreter start-up), else as processes.
    in_process = bool(big) and all(r[3].in_process_seconds is not None for r in big)
    ratios = [
        r[4]["plain"].seconds / r[3].in_process_seconds if in_process
        else (r[4]["plain"].process_seconds or float("nan")) / r[3].seconds
        for r in big
    ]
    speed_ok = None if not big else all(ratio >= 10 for ratio in ratios)
    how = "in-process" if in_process else "processes"
    detail = ", ".join(f"{r[1]}: {ratio:.1f}x" for r, ratio in zip(big, ratios))
    processes = ", ".join(f"{r[1]}: {_ratio(r[4]['plain'].process_seconds, r[3].seconds)}" for r in big)
    print(f"  >= 10x faster than onnxscript at 10k and 100k nodes ({how}): {_verdict(speed_ok)} ({detail})")
    if in_process:
        print(f"    as processes, start-up and imports included: {processes}")
    per_node = []
    for _, nodes, _, ours, _, _ in available:
        if ours.in_process_seconds is not None:
            per_node.append(ours.in_process_seconds / nodes)
        elif ours_fixed is not None:
            per_node.append((ours.seconds - ours_fixed) / nodes)
    flat_ok = None
    if len(per_node) >= 2 and len(per_node) == len(available):
        flat_ok = max(per_node) <= 1.25 * min(per_node)
        spread = f" (min {min(per_node) * 1e6:.2f}, max {max(per_node) * 1e6:.2f} us/node)"
    else:
        spread = ""
    print(
        f"  ours per-node time flat within 25% from 1k to 100k (in-process if measured, else net of start-up): "
        f"{_verdict(flat_ok)}{spread}"
    )
    mem_ok = None if not available else all(r[3].peak_rss_kb <= 3 * r[5] for r in available)
    print(f"  ours peak RSS <= 3x plain onnx.load: {_verdict(mem_ok)}")
    removed_ok = (
        None
        if not available
        else all(r[3].expands_left == 0 and not r[3].correctness.startswith("WRONG") for r in available)
    )
    print(f"  ours removes every Expand with outputs unchanged: {_verdict(removed_ok)}")
    if args.keep:
        print(f"\nmodels kept in {workdir}")
    if cleanup:
        cleanup.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
