"""Benchmark: `rewrite`'s `remove_broadcast_tiles` rule vs stablehlo-coreml's hand-written pass.

Builds MIL programs of about 1k, 10k and 100k ops out of chained symbolic-batch
RMSNorm and LayerNorm blocks (input x: (b, 8), b symbolic), shaped like
stablehlo_coreml.convert output: reduce_sum -> expand_dims -> real_div by a
`fill` (RMSNorm) or mul by a const 1/8 (LayerNorm) for the mean, fill for eps,
rsqrt / sqrt, and a `tile(reps=[1, 8])` broadcasting each (b, 1) statistic
before the mul / sub / real_div with the (b, 8) activations.

For each size the program is copied (`copy_program`) twice per repetition; one copy is
rewritten by `rewrite.load_rules().only("remove_broadcast_tiles").apply(prog)`
(rules loaded once, outside the timing), the other by
`PASS_REGISTRY["common::remove_broadcast_tiles"](prog)`. Construction and
copying are not timed. Both must remove every tile and, after an (untimed)
dead-code elimination on both copies, end with the same op count. (The
hand-written pass leaves each tile's dead `reps` const behind; `rewrite` removes
what its rewrite made dead as part of the rule application.)

Usage:
    python bench/bench_remove_broadcast_tiles.py [--sizes 1000,10000,100000] [--repeat N]
                                                 [--budget SECONDS] [--check-structure] [--gc]
                                                 [--profile SIZE]
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import io
import logging
import math
import os
import pstats
import sys
import time
from collections import Counter

os.environ.setdefault("TQDM_DISABLE", "1")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
logging.getLogger("coremltools").setLevel(logging.ERROR)

import coremltools as ct  # noqa: E402
import numpy as np  # noqa: E402
import stablehlo_coreml  # noqa: E402, F401  (registers common::remove_broadcast_tiles)
from coremltools.converters.mil import Builder as mb  # noqa: E402
from coremltools.converters.mil.mil import get_new_symbol  # noqa: E402
from coremltools.converters.mil.mil.passes.pass_registry import PASS_REGISTRY  # noqa: E402

import rewrite  # noqa: E402
from rewrite.backends.mil import copy_program  # noqa: E402

HIDDEN = 8
THEIRS = "common::remove_broadcast_tiles"
DCE = "common::dead_code_elimination"

# --------------------------------------------------------------------------- program construction


class _Plumbing:
    """The converter's per-fill shape plumbing: reshape(b) -> concat([b], [1]) -> fill."""

    def __init__(self, x):
        shape = mb.shape(x=x)
        batch = mb.slice_by_index(x=shape, begin=[0], end=[1], squeeze_mask=[True])
        batch = mb.cast(x=batch, dtype="int32")
        self.batch = mb.reshape(x=batch, shape=(1,))

    def fill(self, value: float):
        batch = mb.reshape(x=self.batch, shape=[1])
        shape = mb.concat(values=(batch, np.array([1], dtype=np.int32)), axis=0)
        return mb.fill(shape=shape, value=np.float32(value))


def _broadcast(stat):
    """The converter's broadcast_in_dim of a (b, 1) statistic to (b, 8)."""
    return mb.tile(x=stat, reps=[1, HIDDEN])


def rmsnorm_block(x, plumbing: _Plumbing):
    """x * rsqrt(mean(x*x, -1) + eps); mean as real_div by a fill (3 tiles: 1)."""
    square = mb.mul(x=x, y=x)
    total = mb.reduce_sum(x=square, axes=[1], keep_dims=False)
    total = mb.expand_dims(x=total, axes=[1])
    mean = mb.real_div(x=total, y=plumbing.fill(float(HIDDEN)))
    shifted = mb.add(x=mean, y=plumbing.fill(1e-6))
    scale = mb.rsqrt(x=shifted, epsilon=np.float32(1e-12))
    return mb.mul(x=x, y=_broadcast(scale))


def layernorm_block(x, plumbing: _Plumbing):
    """(x - m) / sqrt(var + eps); means as mul by a const 1/8 (tiles: 3)."""
    total = mb.reduce_sum(x=x, axes=[1], keep_dims=False)
    total = mb.expand_dims(x=total, axes=[1])
    mean = mb.mul(x=total, y=np.float32(1.0 / HIDDEN))
    centered = mb.sub(x=x, y=_broadcast(mean))
    square = mb.mul(x=centered, y=centered)
    var = mb.reduce_sum(x=square, axes=[1], keep_dims=False)
    var = mb.expand_dims(x=var, axes=[1])
    var = mb.mul(x=var, y=np.float32(1.0 / HIDDEN))
    centered_again = mb.sub(x=x, y=_broadcast(mean))
    std = mb.sqrt(x=mb.add(x=var, y=plumbing.fill(1e-5)))
    return mb.real_div(x=centered_again, y=_broadcast(std))


def build_program(pairs: int):
    """`pairs` x (RMSNorm block, LayerNorm block), each chained on the previous output."""
    batch = get_new_symbol()

    @mb.program(input_specs=[mb.TensorSpec(shape=(batch, HIDDEN))], opset_version=ct.target.iOS18)
    def prog(x):
        plumbing = _Plumbing(x)
        for _ in range(pairs):
            x = rmsnorm_block(x, plumbing)
            x = layernorm_block(x, plumbing)
        return x

    return prog


def count_ops(prog, op_type: str | None = None) -> int:
    n = 0

    def walk(block):
        nonlocal n
        for op in block.operations:
            if op_type is None or op.op_type == op_type:
                n += 1
            for nested in op.blocks:
                walk(nested)

    for function in prog.functions.values():
        walk(function)
    return n


def _ops_per_pair() -> tuple[int, int]:
    """(ops of a pair of blocks, fixed ops) measured from two small programs."""
    one, two = count_ops(build_program(1)), count_ops(build_program(2))
    return two - one, one - (two - one)


def program_of_size(size: int):
    per_pair, fixed = _ops_per_pair()
    return build_program(max(1, round((size - fixed) / per_pair)))


# --------------------------------------------------------------------------- structure check


def _single_block_program(block_fn):
    batch = get_new_symbol()

    @mb.program(input_specs=[mb.TensorSpec(shape=(batch, HIDDEN))], opset_version=ct.target.iOS18)
    def prog(x):
        return block_fn(x, _Plumbing(x))

    return prog


def check_structure() -> None:
    """Compare op-type histograms of our blocks with a real stablehlo_coreml conversion."""
    sys.path.insert(0, "/tmp/notes")
    try:
        import jax
        import jax.numpy as jnp
        from jax_to_mil import convert_jax
    except Exception as error:  # pragma: no cover - optional
        print(f"structure check skipped: {error}")
        return

    def rmsnorm(x):
        return x * jax.lax.rsqrt(jnp.mean(x * x, -1, keepdims=True) + 1e-6)

    def layernorm(x):
        m = jnp.mean(x, -1, keepdims=True)
        var = jnp.mean((x - m) ** 2, -1, keepdims=True)
        return (x - m) / jnp.sqrt(var + 1e-5)

    interesting = ("tile", "reduce_sum", "expand_dims", "fill", "real_div", "mul", "sub", "add",
                   "rsqrt", "sqrt", "concat")
    for name, fn, ours_fn in (("rmsnorm", rmsnorm, rmsnorm_block), ("layernorm", layernorm, layernorm_block)):
        real = convert_jax(fn, ((None, HIDDEN), jnp.float32), symbolic=True)
        PASS_REGISTRY[DCE](real)
        ours = _single_block_program(ours_fn)

        hist = []
        for prog in (real, ours):
            counts = Counter(op.op_type for op in prog.functions["main"].operations)
            hist.append({k: counts.get(k, 0) for k in interesting})
        print(f"structure {name:9s} real (after DCE): {hist[0]}")
        print(f"structure {name:9s} bench block     : {hist[1]}")
        for prog in (real, ours):
            PASS_REGISTRY[THEIRS](prog)
        print(f"structure {name:9s} tiles left after {THEIRS}: real={count_ops(real, 'tile')} "
              f"bench={count_ops(ours, 'tile')}")


# --------------------------------------------------------------------------- timing


# Like timeit: collect before, and keep the cyclic GC off inside, the timed region
# (unless --gc), so a full collection of the large untimed copies is not billed to
# whichever implementation happens to trigger it.
KEEP_GC = False


def _timed(fn, prog) -> float:
    gc.collect()
    was_enabled = gc.isenabled()
    if not KEEP_GC:
        gc.disable()
    try:
        start = time.perf_counter()
        fn(prog)
        return time.perf_counter() - start
    finally:
        if was_enabled:
            gc.enable()


def run_ours(rules, prog) -> float:
    return _timed(rules.apply, prog)


def run_theirs(prog) -> float:
    return _timed(PASS_REGISTRY[THEIRS], prog)


def project(rows: list[dict], ops: int) -> float | None:
    """Ours' projected time at `ops`, from the growth between the last two measured sizes."""
    measured = [r for r in rows if r["ours"] is not None]
    if not measured:
        return None
    last = measured[-1]
    exponent = 1.0
    if len(measured) >= 2:
        prev = measured[-2]
        if last["ops"] > prev["ops"] and last["ours"] > 0 and prev["ours"] > 0:
            exponent = max(1.0, math.log(last["ours"] / prev["ours"]) / math.log(last["ops"] / prev["ops"]))
    return last["ours"] * (ops / last["ops"]) ** exponent


def bench_size(rules, size: int, repeat: int, rows: list[dict], budget: float) -> dict:
    prog = program_of_size(size)
    ops = count_ops(prog)
    tiles = count_ops(prog, "tile")
    projected = project(rows, ops)
    skip_ours = budget > 0 and projected is not None and projected > budget
    ours_times, theirs_times = [], []
    for _ in range(repeat):
        mine, theirs = copy_program(prog), copy_program(prog)
        if skip_ours:
            theirs_times.append(run_theirs(theirs))
            if count_ops(theirs, "tile"):
                raise SystemExit(f"size {ops}: theirs left tiles")
            continue
        ours_times.append(run_ours(rules, mine))
        theirs_times.append(run_theirs(theirs))
        left_ours, left_theirs = count_ops(mine, "tile"), count_ops(theirs, "tile")
        if left_ours or left_theirs:
            raise SystemExit(f"size {ops}: tiles left: ours={left_ours} theirs={left_theirs} of {tiles}")
        PASS_REGISTRY[DCE](mine)  # untimed; removes nothing if ours cleaned up after itself
        PASS_REGISTRY[DCE](theirs)  # untimed; drops the dead reps consts the pass leaves
        end_ours, end_theirs = count_ops(mine), count_ops(theirs)
        if end_ours != end_theirs:
            raise SystemExit(f"size {ops}: final op counts differ: ours={end_ours} theirs={end_theirs}")
    return {
        "ops": ops,
        "tiles": tiles,
        "ours": min(ours_times) if ours_times else None,
        "projected": projected if skip_ours else None,
        "theirs": min(theirs_times),
        "final_ops": None if skip_ours else end_ours,
        "repeat": repeat,
    }


def profile_ours(rules, size: int, top: int = 25) -> None:
    prog = program_of_size(size)
    mine = copy_program(prog)
    profiler = cProfile.Profile()
    gc.collect()
    if not KEEP_GC:
        gc.disable()
    profiler.enable()
    rules.apply(mine)
    profiler.disable()
    gc.enable()
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).sort_stats("cumulative").print_stats(top)
    print(f"\ncProfile of ours on a {count_ops(prog)}-op program (sorted by cumulative time):")
    print(out.getvalue())


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,10000,100000",
                        help="comma-separated approximate program sizes in ops")
    parser.add_argument("--repeat", type=int, default=3,
                        help="best of N for sizes <= 10k (default 3); sizes above use max(1, N-2)")
    parser.add_argument("--check-structure", action="store_true",
                        help="compare one block with a real stablehlo_coreml conversion (needs jax)")
    parser.add_argument("--budget", type=float, default=600.0, metavar="SECONDS",
                        help="skip ours at a size where its time, extrapolated from the two previous "
                             "sizes, would exceed SECONDS per run (0: never skip; default 600)")
    parser.add_argument("--gc", action="store_true",
                        help="keep Python's cyclic GC enabled inside the timed region")
    parser.add_argument("--profile", type=int, default=0, metavar="SIZE",
                        help="also cProfile ours on a program of about SIZE ops")
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    global KEEP_GC
    KEEP_GC = args.gc

    if args.check_structure:
        check_structure()

    rules = rewrite.load_rules().only("remove_broadcast_tiles")
    rows: list[dict] = []
    for size in sizes:
        repeat = args.repeat if size <= 10_000 else max(1, args.repeat - 2)
        rows.append(bench_size(rules, size, repeat, rows, args.budget))

    header = (f"{'size (ops)':>10}  {'tiles':>6}  {'ours s':>9}  {'theirs s':>9}  "
              f"{'ours µs/op':>10}  {'theirs µs/op':>12}  {'ours/theirs':>11}")
    print(header)
    print("-" * len(header))
    for row in rows:
        theirs_us = row["theirs"] / row["ops"] * 1e6
        if row["ours"] is None:
            ours = f"~{row['projected']:.1f}*"
            print(f"{row['ops']:>10}  {row['tiles']:>6}  {ours:>9}  {row['theirs']:>9.4f}  "
                  f"{row['projected'] / row['ops'] * 1e6:>9.0f}*  {theirs_us:>12.2f}  "
                  f"{row['projected'] / row['theirs']:>10.0f}*")
            continue
        ours_us = row["ours"] / row["ops"] * 1e6
        print(f"{row['ops']:>10}  {row['tiles']:>6}  {row['ours']:>9.4f}  {row['theirs']:>9.4f}  "
              f"{ours_us:>10.2f}  {theirs_us:>12.2f}  {row['ours'] / row['theirs']:>11.2f}")
    print(f"(best of {', '.join(str(r['repeat']) for r in rows)} runs per size)")
    if any(r["ours"] is None for r in rows):
        print(f"* ours not run: projected (from the growth between the previous two sizes) to take "
              f"more than --budget {args.budget:g} s; figures marked * are that projection")

    measured = [r for r in rows if r["ours"] is not None]
    per_op = [r["ours"] / r["ops"] for r in measured]
    per_op += [r["projected"] / r["ops"] for r in rows if r["ours"] is None]
    flatness = max(per_op) / min(per_op)
    worst_ratio = max([r["ours"] / r["theirs"] for r in measured]
                      + [r["projected"] / r["theirs"] for r in rows if r["ours"] is None])
    star = "*" if len(measured) < len(rows) else ""
    print(f"\nflatness of ours µs/op ({rows[0]['ops']}..{rows[-1]['ops']} ops): max/min = "
          f"{flatness:.2f}{star} (target <= 1.25: {'met' if flatness <= 1.25 else 'MISSED'})")
    print(f"worst ratio ours/theirs = {worst_ratio:.2f}{star} "
          f"(target <= 1.5: {'met' if worst_ratio <= 1.5 else 'MISSED'})")
    print(f"cyclic GC inside timed region: {'on' if KEEP_GC else 'off (timeit convention; --gc to keep it)'}")
    print("both removed every tile; op counts equal after DCE on both copies "
          f"(final ops: {', '.join(str(r['final_ops']) for r in measured)})")

    if args.profile:
        profile_ours(rules, args.profile)
    return 0


if __name__ == "__main__":
    sys.exit(main())
