"""Benchmark family, MIL: `remove_broadcast_tiles` against stablehlo-coreml's hand-written pass, five shapes.

Programs are iOS18, x: (b, 8) with b symbolic, built of layers around a
`tile(reps=[1, 8])` of a (b, 1) statistic into an op that broadcasts anyway:

* chain: bench_remove_broadcast_tiles.py's RMSNorm / LayerNorm blocks, as
  stablehlo-coreml's converter writes them.
* fan-out: one m = reduce_mean(x) tiled into every layer: x = tanh(mul(x, tile(m))).
  m has as many uses as there are layers.
* wide: blocks of one concat of --width values (default 1,000), each
  mul(x, tile(m)) (the tiles go; the concat is wide), reduced back and added on.
* nested: cond blocks whose branches hold fan-out layers reading the outer m,
  and a while_loop whose body holds more.
* mixed: fan-out layers where every other tile feeds a concat (kept) and the
  others a mul (removed), all from the same m.

For each shape and size (ops, nested blocks included), both run on copies of
the same program (`copy_program`, untimed), in this process, the cyclic GC
paused as timeit does: ours = `RuleSet.apply` of the one rule; theirs =
PASS_REGISTRY["common::remove_broadcast_tiles"]. Both must leave no
removable tile, and, after an untimed dead-code elimination on both, the same
op count (the hand-written pass leaves dead `reps` consts behind; ours
removes what its rewrites made dead). Ratios are ours over theirs (the
target: at most 1.2) and time per op must stay flat within 25% over sizes.

Usage:
    python bench/bench_family_mil.py [--shapes chain,fan-out,wide,nested,mixed] [--sizes 1000,10000]
        [--big] [--width 1000] [--repeat 3]
--big adds 100,000 and 200,000 ops.
"""

from __future__ import annotations

import argparse
import gc
import logging
import os
import sys
import time
from collections import Counter
from pathlib import Path

os.environ.setdefault("TQDM_DISABLE", "1")
logging.getLogger("coremltools").setLevel(logging.ERROR)

import coremltools as ct  # noqa: E402
import numpy as np  # noqa: E402
import stablehlo_coreml  # noqa: E402, F401  (registers common::remove_broadcast_tiles)
from coremltools.converters.mil import Builder as mb  # noqa: E402
from coremltools.converters.mil.mil import get_new_symbol  # noqa: E402
from coremltools.converters.mil.mil.passes.pass_registry import PASS_REGISTRY  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_remove_broadcast_tiles as chain_bench  # noqa: E402

import rewrite  # noqa: E402
from rewrite.backends.mil import copy_program  # noqa: E402

HIDDEN = 8
THEIRS = "common::remove_broadcast_tiles"
DCE = "common::dead_code_elimination"


def _program(body):
    batch = get_new_symbol()
    return mb.program(input_specs=[mb.TensorSpec(shape=(batch, HIDDEN))], opset_version=ct.target.iOS18)(body)


def _tile(m):
    return mb.tile(x=m, reps=[1, HIDDEN])


def chain(size: int, _width: int):
    return chain_bench.program_of_size(size)


def fan_out(size: int, _width: int):
    layers = max(1, (size - 2) // 4)  # tile, its reps const, mul, tanh

    def body(x):
        m = mb.reduce_mean(x=x, axes=[1], keep_dims=True)
        for _ in range(layers):
            x = mb.tanh(x=mb.mul(x=x, y=_tile(m)))
        return x

    return _program(body)


def wide(size: int, width: int):
    blocks = max(1, (size - 2) // (3 * width + 6))

    def body(x):
        m = mb.reduce_mean(x=x, axes=[1], keep_dims=True)
        for _ in range(blocks):
            values = [mb.mul(x=x, y=_tile(m)) for _ in range(width)]
            joined = mb.concat(values=values, axis=1)
            x = mb.add(x=x, y=mb.reduce_mean(x=joined, axes=[1], keep_dims=True))
        return x

    return _program(body)


def nested(size: int, _width: int):
    branch_layers, body_layers = 20, 10
    per_block = 2 * 3 * branch_layers + 3 * body_layers + 12
    blocks = max(1, (size - 2) // per_block)

    def layers(x, m, count):
        for _ in range(count):
            x = mb.mul(x=x, y=_tile(m))
        return x

    def body(x):
        m = mb.reduce_mean(x=x, axes=[1], keep_dims=True)
        for _ in range(blocks):
            flag = mb.greater(x=mb.reduce_sum(x=x, axes=[0, 1]), y=np.float32(0.0))
            branched = mb.cond(
                pred=flag,
                _true_fn=lambda x=x: layers(x, m, branch_layers),
                _false_fn=lambda x=x: layers(mb.mul(x=x, y=np.float32(-1.0)), m, branch_layers),
            )

            def loop_body(i, carried):
                return mb.add(x=i, y=np.int32(1)), layers(carried, m, body_layers)

            _, x = mb.while_loop(
                _cond=lambda i, carried: mb.less(x=i, y=np.int32(2)),
                _body=loop_body,
                loop_vars=(np.int32(0), branched),
            )
        return x

    return _program(body)


def mixed(size: int, _width: int):
    layers = max(2, (size - 3) // 3)

    def body(x):
        m = mb.reduce_mean(x=x, axes=[1], keep_dims=True)
        kept = []
        for i in range(layers):
            tiled = _tile(m)
            if i % 2:
                kept.append(tiled)
            else:
                x = mb.tanh(x=mb.mul(x=x, y=tiled))
        return mb.concat(values=[x, *kept], axis=1)

    return _program(body)


SHAPES = {"chain": chain, "fan-out": fan_out, "wide": wide, "nested": nested, "mixed": mixed}


def count(program) -> Counter:
    found: Counter = Counter()

    def walk(block):
        for op in block.operations:
            found[op.op_type] += 1
            for inner in op.blocks:
                walk(inner)

    for function in program.functions.values():
        walk(function)
    return found


def timed(run, program) -> float:
    gc.collect()
    gc.disable()
    try:
        start = time.perf_counter()
        run(program)
        return time.perf_counter() - start
    finally:
        gc.enable()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", default=",".join(SHAPES))
    parser.add_argument("--sizes", default="1000,10000", help="approximate op counts")
    parser.add_argument("--big", action="store_true", help="add 100,000 and 200,000 ops")
    parser.add_argument("--width", type=int, default=1000, help="values of each wide concat")
    parser.add_argument("--repeat", type=int, default=3, help="best of N (sizes over 10k: max(1, N - 2))")
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()] + ([100_000, 200_000] if args.big else [])
    rules = rewrite.load_rules(dialects=["mil"]).only("remove_broadcast_tiles")
    theirs_pass = PASS_REGISTRY[THEIRS]
    print(f"coremltools {ct.__version__}; wide concats of {args.width} values; GC paused while timed")
    header = (f"{'shape':<8} {'ops':>7} {'tiles':>6} | {'ours s':>8} {'theirs s':>8} {'ours/theirs':>11} | "
              f"{'ours us/op':>10} {'theirs us/op':>12} | {'tiles left':>10} {'ops after DCE':>13}")
    print(header)
    print("-" * len(header))
    for name in args.shapes.split(","):
        build = SHAPES[name]
        warm = build(200, min(args.width, 20))  # pays for what is built once per process
        rules.apply(copy_program(warm))
        per_op, ratios = [], []
        for size in sizes:
            program = build(size, args.width)
            before = count(program)
            ops, tiles = sum(before.values()), before["tile"]
            repeat = args.repeat if ops <= 10_000 else max(1, args.repeat - 2)
            ours_times, theirs_times = [], []
            for _ in range(repeat):
                mine, theirs = copy_program(program), copy_program(program)
                ours_times.append(timed(rules.apply, mine))
                theirs_times.append(timed(theirs_pass, theirs))
            left_ours, left_theirs = count(mine)["tile"], count(theirs)["tile"]
            PASS_REGISTRY[DCE](mine)
            PASS_REGISTRY[DCE](theirs)
            after_ours, after_theirs = sum(count(mine).values()), sum(count(theirs).values())
            ours, theirs_s = min(ours_times), min(theirs_times)
            per_op.append(ours / ops)
            ratios.append(ours / theirs_s)
            same = "same" if after_ours == after_theirs else f"{after_ours} vs {after_theirs}"
            print(f"{name:<8} {ops:>7} {tiles:>6} | {ours:>8.3f} {theirs_s:>8.3f} {ours / theirs_s:>11.2f} | "
                  f"{ours * 1e6 / ops:>10.2f} {theirs_s * 1e6 / ops:>12.2f} | {left_ours:>4}/{left_theirs:<5} "
                  f"{same:>13}", flush=True)
            del program, mine, theirs
        flat = max(per_op) / min(per_op)
        print(f"{name:<8} ours us/op largest/smallest: {flat:.2f} ({'within' if flat <= 1.25 else 'OUTSIDE'} 25%); "
              f"ours/theirs worst: {max(ratios):.2f} (target <= 1.2)", flush=True)
    print()
    print("ours/theirs: our time over the hand-written pass's on copies of the same program (below 1: ours faster).")
    print("tiles left: ours/theirs; ops after DCE: equal when both end with the same program size.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
