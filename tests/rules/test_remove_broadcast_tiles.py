"""remove_broadcast_tiles on small hand-built MIL programs.

Every case checks the op counts before/after and runs the reference
evaluator on concrete inputs before and after the rewrite (at two sizes
when a dimension is symbolic): the outputs must keep their names, shapes,
dtypes and values.
"""

from __future__ import annotations

import numpy as np
import pytest
from coremltools.converters.mil.mil import get_new_symbol
from mil_cases import (
    IOS18,
    RULE,
    SIZES,
    op_counts,
    ops_of_type,
    output_names,
    random_feeds,
    rewrite_and_compare,
)

from rewrite.backends.mil import mb, types
from rewrite.backends.mil.reference import evaluate


def program(*specs):
    """`mb.program` at iOS18 (the default opset, iOS13, lacks newer op versions)."""
    return mb.program(input_specs=list(specs), opset_version=IOS18)


def spec(*shape, dtype=types.fp32):
    return mb.TensorSpec(shape=shape, dtype=dtype)


# ------------------------------------------------------------------ cases: removed


def mul_const_tile():
    @program(spec(4, 8))
    def prog(x):
        one_by_one = mb.const(val=np.array([[3.0]], dtype=np.float32), name="c")
        return mb.mul(x=x, y=mb.tile(x=one_by_one, reps=[4, 8]), name="out")

    return prog, {"x": (4, 8)}


def add_column_tile():
    @program(spec(4, 8), spec(4, 1))
    def prog(x, y):
        return mb.add(x=x, y=mb.tile(x=y, reps=[1, 8]), name="out")

    return prog, {"x": (4, 8), "y": (4, 1)}


def symbolic_batch_rank3():
    batch = get_new_symbol()

    @program(spec(batch, 4, 8), spec(batch, 4, 1))
    def prog(x, y):
        return mb.sub(x=x, y=mb.tile(x=y, reps=[1, 1, 8]), name="out")

    return prog, {"x": ("B", 4, 8), "y": ("B", 4, 1)}


def different_symbols_one_dimension():
    # The converter's situation: two names for one runtime dimension. The
    # tile passes axis 0 through (reps 1), so the names are never compared.
    batch, batch2 = get_new_symbol(), get_new_symbol()

    @program(spec(batch, 8), spec(batch2, 1))
    def prog(x, y):
        return mb.mul(x=x, y=mb.tile(x=y, reps=[1, 8]), name="out")

    return prog, {"x": ("B", 8), "y": ("B", 1)}


def other_operand_of_lower_rank():
    @program(spec(4, 1), spec(8))
    def prog(y, x):
        return mb.add(x=mb.tile(x=y, reps=[1, 8]), y=x, name="out")

    return prog, {"y": (4, 1), "x": (8,)}


def comparison_consumer():
    @program(spec(4, 8), spec(4, 1))
    def prog(x, y):
        return mb.greater(x=mb.tile(x=y, reps=[1, 8]), y=x, name="out")

    return prog, {"x": (4, 8), "y": (4, 1)}


def two_broadcasting_consumers():
    @program(spec(4, 8), spec(4, 1))
    def prog(x, y):
        t = mb.tile(x=y, reps=[1, 8])
        return mb.add(x=x, y=t, name="sum"), mb.real_div(x=t, y=x, name="ratio")

    return prog, {"x": (4, 8), "y": (4, 1)}


REMOVED = [
    pytest.param(mul_const_tile, (4, 8), id="mul-const(1,1)-reps[4,8]"),
    pytest.param(add_column_tile, (4, 8), id="add-(4,1)-reps[1,8]"),
    pytest.param(symbolic_batch_rank3, ("B", 4, 8), id="symbolic-(B,4,1)-reps[1,1,8]"),
    pytest.param(different_symbols_one_dimension, ("B", 8), id="different-symbols-B-B2"),
    pytest.param(other_operand_of_lower_rank, (4, 8), id="other-operand-lower-rank"),
    pytest.param(comparison_consumer, (4, 8), id="greater-consumer"),
    pytest.param(two_broadcasting_consumers, (4, 8), id="two-broadcasting-consumers"),
]


@pytest.mark.parametrize("case, out_shape", REMOVED)
def test_removed(rules, case, out_shape):
    prog, shapes = case()
    feeds = random_feeds(shapes)
    outcome = rewrite_and_compare(prog, rules, feeds)

    assert outcome.before["tile"] == 1
    assert outcome.after["tile"] == 0
    assert outcome.fired() == 1
    # Only the tile and its `reps` const go; nothing is added.
    assert outcome.removed == {"tile": 1, "const": 1}
    assert not outcome.added
    assert outcome.statistics.removed_ops == 2
    for feed, outputs in zip(feeds, outcome.outputs):
        size = next(iter(feed.values())).shape[0]
        want = tuple(size if d == "B" else d for d in out_shape)
        assert all(v.shape == want for v in outputs.values())


def test_both_tiles_of_one_add_removed(rules):
    @program(spec(4, 1), spec(1, 8))
    def prog(x, y):
        return mb.add(x=mb.tile(x=x, reps=[1, 8]), y=mb.tile(x=y, reps=[4, 1]), name="out")

    outcome = rewrite_and_compare(prog, rules, random_feeds({"x": (4, 1), "y": (1, 8)}))
    assert outcome.before["tile"] == 2
    assert outcome.after["tile"] == 0
    assert outcome.fired() == 2
    assert outcome.removed == {"tile": 2, "const": 2}
    assert outcome.outputs[0]["out"].shape == (4, 8)
    assert prog.functions["main"].outputs[0].shape == (4, 8)
    add = ops_of_type(prog, "add")[0]
    assert (add.x.name, add.y.name) == ("x", "y")


def test_one_of_two_scalar_like_tiles_left(rules):
    # Whichever tile goes first, the other then faces a (1,) operand and stays.
    @program(spec(1), spec(1))
    def prog(x, z):
        return mb.add(x=mb.tile(x=x, reps=[8]), y=mb.tile(x=z, reps=[8]), name="out")

    outcome = rewrite_and_compare(prog, rules, random_feeds({"x": (1,), "z": (1,)}))
    assert outcome.before["tile"] == 2
    assert outcome.after["tile"] == 1
    assert outcome.fired() == 1
    assert outcome.removed == {"tile": 1, "const": 1}
    assert outcome.outputs[0]["out"].shape == (8,)
    assert prog.functions["main"].outputs[0].shape == (8,)


# ------------------------------------------------------------------ cases: kept


def other_operand_lacks_size():
    batch = get_new_symbol()

    @program(spec(batch, 1), spec(batch, 1))
    def prog(x, y):
        return mb.add(x=x, y=mb.tile(x=y, reps=[1, 8]), name="out")

    return prog, {"x": ("B", 1), "y": ("B", 1)}


def tile_is_both_operands():
    @program(spec(4, 1))
    def prog(y):
        t = mb.tile(x=y, reps=[1, 8])
        return mb.mul(x=t, y=t, name="out")

    return prog, {"y": (4, 1)}


def symbolic_dim_tiled():
    batch = get_new_symbol()

    @program(spec(batch, 8), spec(1, 8))
    def prog(x, y):
        return mb.add(x=mb.tile(x=x, reps=[4, 1]), y=y, name="out")

    return prog, {"x": ("B", 8), "y": (1, 8)}


def real_tile():
    @program(spec(2), spec(6))
    def prog(x, y):
        return mb.add(x=mb.tile(x=x, reps=[3]), y=y, name="out")

    return prog, {"x": (2,), "y": (6,)}


def select_consumer():
    @program(spec(4, 8, dtype=types.bool), spec(4, 8), spec(4, 1))
    def prog(mask, x, y):
        return mb.select(cond=mask, a=mb.tile(x=y, reps=[1, 8]), b=x, name="out")

    return prog, {"mask": (4, 8), "x": (4, 8), "y": (4, 1)}


def add_and_select_consumers():
    @program(spec(4, 8, dtype=types.bool), spec(4, 8), spec(4, 1))
    def prog(mask, x, y):
        t = mb.tile(x=y, reps=[1, 8])
        return mb.select(cond=mask, a=mb.add(x=x, y=t), b=t, name="out")

    return prog, {"mask": (4, 8), "x": (4, 8), "y": (4, 1)}


def tile_is_function_output():
    @program(spec(4, 8), spec(4, 1))
    def prog(x, y):
        t = mb.tile(x=y, reps=[1, 8], name="tiled")
        return mb.add(x=x, y=t, name="out"), t

    return prog, {"x": (4, 8), "y": (4, 1)}


def tile_is_only_function_output():
    @program(spec(4, 1))
    def prog(y):
        return mb.tile(x=y, reps=[1, 8], name="tiled")

    return prog, {"y": (4, 1)}


def tile_outside_consumed_in_branch():
    @program(spec(4, 8), spec(4, 1), spec(1))
    def prog(x, y, p):
        t = mb.tile(x=y, reps=[1, 8])
        return mb.cond(
            pred=mb.greater(x=mb.reduce_sum(x=p, axes=[0], keep_dims=False), y=0.0),
            _true_fn=lambda: mb.add(x=x, y=t),
            _false_fn=lambda: mb.sub(x=x, y=y),
            name="out",
        )

    return prog, {"x": (4, 8), "y": (4, 1), "p": (1,)}


def tile_is_branch_output():
    @program(spec(4, 8), spec(4, 1), spec(1))
    def prog(x, y, p):
        return mb.cond(
            pred=mb.greater(x=mb.reduce_sum(x=p, axes=[0], keep_dims=False), y=0.0),
            _true_fn=lambda: mb.tile(x=y, reps=[1, 8]),
            _false_fn=lambda: mb.sub(x=x, y=y),
            name="out",
        )

    return prog, {"x": (4, 8), "y": (4, 1), "p": (1,)}


def reps_from_runtime_input():
    @program(spec(4, 8), spec(4, 1), spec(2, dtype=types.int32))
    def prog(x, y, reps):
        return mb.add(x=x, y=mb.tile(x=y, reps=reps), name="out")

    reps = [np.array([1, 8], dtype=np.int32), np.array([1, 1], dtype=np.int32)]
    return prog, {"x": (4, 8), "y": (4, 1), "reps": reps}


def reps_from_runtime_shape():
    # reps = [1, len(z)]: known only at run time (a symbol at compile time).
    length = get_new_symbol()

    @program(spec(4, 8), spec(4, 1), spec(length))
    def prog(x, y, z):
        reps = mb.concat(values=[np.array([1], dtype=np.int32), mb.shape(x=z)], axis=0)
        return mb.add(x=x, y=mb.tile(x=y, reps=reps), name="out")

    return prog, {"x": (4, 8), "y": (4, 1), "z": [np.ones(8, np.float32), np.ones(1, np.float32)]}


def non_broadcasting_consumer():
    @program(spec(4, 1))
    def prog(y):
        return mb.reduce_sum(x=mb.tile(x=y, reps=[1, 8]), axes=[1], keep_dims=True, name="out")

    return prog, {"y": (4, 1)}


def unary_consumer():
    @program(spec(4, 8), spec(4, 1))
    def prog(x, y):
        return mb.add(x=x, y=mb.exp(x=mb.tile(x=y, reps=[1, 8])), name="out")

    return prog, {"x": (4, 8), "y": (4, 1)}


KEPT = [
    pytest.param(other_operand_lacks_size, id="other-operand-lacks-replicated-size"),
    pytest.param(tile_is_both_operands, id="mul(t,t)"),
    pytest.param(symbolic_dim_tiled, id="symbolic-dim-tiled"),
    pytest.param(real_tile, id="real-tile-(2,)-reps[3]"),
    pytest.param(select_consumer, id="select-consumer"),
    pytest.param(add_and_select_consumers, id="add-and-select-consumers"),
    pytest.param(tile_is_function_output, id="tile-is-function-output"),
    pytest.param(tile_is_only_function_output, id="tile-is-only-function-output"),
    pytest.param(tile_outside_consumed_in_branch, id="tile-outside-consumer-in-branch"),
    pytest.param(tile_is_branch_output, id="tile-is-branch-output"),
    pytest.param(reps_from_runtime_input, id="reps-is-function-input"),
    pytest.param(reps_from_runtime_shape, id="reps-from-shape-of-input"),
    pytest.param(non_broadcasting_consumer, id="reduce_sum-consumer"),
    pytest.param(unary_consumer, id="exp-consumer"),
]


def feeds_for(shapes):
    """random_feeds, except that an input given as a list of arrays takes each
    of them in turn, and a `p` input (a cond predicate) is tried both positive
    and negative, so both branches run."""
    if "p" in shapes:
        shapes = dict(shapes, p=[np.array([1.0], np.float32), np.array([-1.0], np.float32)])
    choices = {k: v for k, v in shapes.items() if isinstance(v, list)}
    random = {k: v for k, v in shapes.items() if not isinstance(v, list)}
    feeds = random_feeds(random, {"mask": bool})
    for name, arrays in choices.items():
        feeds = [dict(feed, **{name: array}) for feed in feeds for array in arrays]
    return feeds


@pytest.mark.parametrize("case", KEPT)
def test_kept(rules, case):
    prog, shapes = case()
    printed = str(prog)
    outcome = rewrite_and_compare(prog, rules, feeds_for(shapes))

    assert outcome.before["tile"] == 1
    assert outcome.after == outcome.before
    assert outcome.fired() == 0
    assert outcome.statistics.removed_ops == 0
    assert str(prog) == printed


# ------------------------------------------------------------------ nested blocks


def test_tile_and_consumer_in_cond_branch_removed(rules):
    @program(spec(4, 8), spec(4, 1), spec(1))
    def prog(x, y, p):
        return mb.cond(
            pred=mb.greater(x=mb.reduce_sum(x=p, axes=[0], keep_dims=False), y=0.0),
            _true_fn=lambda: mb.add(x=x, y=mb.tile(x=y, reps=[1, 8])),
            _false_fn=lambda: mb.sub(x=x, y=y),
            name="out",
        )

    # p > 0 takes the branch with the tile, p < 0 the other one.
    outcome = rewrite_and_compare(prog, rules, feeds_for({"x": (4, 8), "y": (4, 1), "p": (1,)}))
    assert outcome.before["tile"] == 1
    assert outcome.after["tile"] == 0
    assert outcome.fired() == 1
    assert outcome.removed == {"tile": 1, "const": 1}
    assert outcome.outputs[0]["out"].shape == (4, 8)
    cond = ops_of_type(prog, "cond")[0]
    add = cond.blocks[0].operations[-1]
    assert add.op_type == "add" and add.y.name == "y"


def test_tile_and_consumer_in_while_body_removed(rules):
    # The loop body's own block: the tile is handled there. (Evaluated by
    # the reference evaluator's loop interpreter.)
    @program(spec(4, 8), spec(4, 1))
    def prog(x, y):
        def cond(i, acc):
            return mb.less(x=i, y=3)

        def body(i, acc):
            return mb.add(x=i, y=1), mb.add(x=acc, y=mb.tile(x=y, reps=[1, 8]))

        _, acc = mb.while_loop(_cond=cond, _body=body, loop_vars=(np.int32(0), x))
        return mb.identity(x=acc, name="out")

    outcome = rewrite_and_compare(prog, rules, random_feeds({"x": (4, 8), "y": (4, 1)}))
    assert outcome.before["tile"] == 1
    assert outcome.after["tile"] == 0
    assert outcome.fired() == 1
    assert outcome.outputs[0]["out"].shape == (4, 8)


# ------------------------------------------------------------------ names, idempotence


def test_function_output_name_preserved(rules):
    prog, shapes = add_column_tile()
    outcome = rewrite_and_compare(prog, rules, random_feeds(shapes))
    assert outcome.fired() == 1
    assert output_names(prog) == ["out"]
    out = prog.functions["main"].outputs[0]
    assert out.op.op_type == "add" and out.op.name == "out"
    assert out.shape == (4, 8)
    assert set(outcome.outputs[0]) == {"out"}


def test_symbolic_output_type_after_rewrite(rules):
    # The consumer's output keeps its rank and literal 8 after re-inference.
    prog, shapes = different_symbols_one_dimension()
    rewrite_and_compare(prog, rules, random_feeds(shapes))
    out = prog.functions["main"].outputs[0]
    assert out.rank == 2 and out.shape[1] == 8


def test_idempotent(rules):
    # One tile that goes and one that stays (it feeds a select).
    @program(spec(4, 8, dtype=types.bool), spec(4, 8), spec(4, 1), spec(4, 1))
    def prog(mask, x, y, z):
        added = mb.add(x=x, y=mb.tile(x=y, reps=[1, 8]))
        return mb.select(cond=mask, a=added, b=mb.tile(x=z, reps=[1, 8]), name="out")

    feeds = feeds_for({"mask": (4, 8), "x": (4, 8), "y": (4, 1), "z": (4, 1)})
    first = rewrite_and_compare(prog, rules, feeds)
    assert first.fired() == 1
    assert first.before["tile"] == 2 and first.after["tile"] == 1
    printed = str(prog)

    second = rewrite_and_compare(prog, rules, feeds)
    assert second.fired() == 0
    assert second.statistics.sweeps == 1
    assert second.after == second.before == first.after
    assert str(prog) == printed
    for a, b in zip(first.outputs, second.outputs):
        np.testing.assert_array_equal(a["out"], b["out"])


def test_shipped_library_removes_the_tile(library):
    # Through the whole library (not only the rule under test).
    assert RULE in {rule.name for rule in library.rules}
    prog, shapes = add_column_tile()
    outcome = rewrite_and_compare(prog, library, random_feeds(shapes))
    assert outcome.fired() == 1
    assert outcome.after["tile"] == 0


def test_evaluator_sees_symbolic_sizes():
    # Sanity check of the harness itself: two sizes, two output shapes.
    prog, shapes = symbolic_batch_rank3()
    feeds = random_feeds(shapes)
    assert [f["x"].shape[0] for f in feeds] == list(SIZES)
    shapes_out = [evaluate(prog, f)["out"].shape for f in feeds]
    assert shapes_out == [(n, 4, 8) for n in SIZES]
    assert op_counts(prog)["tile"] == 1


# ------------------------------------------------------------------ matmul batch axes (remove_matmul_batch_tiles)


def test_matmul_batch_tile_removed(library):
    @program(spec(1, 4, 8), spec(2, 8, 4))
    def prog(x, y):
        return mb.matmul(x=mb.tile(x=x, reps=[2, 1, 1]), y=y, name="out")

    rules = library.only("remove_matmul_batch_tiles")
    outcome = rewrite_and_compare(prog, rules, random_feeds({"x": (1, 4, 8), "y": (2, 8, 4)}))
    assert outcome.outputs[0]["out"].shape == (2, 4, 4)
    assert outcome.before["tile"] == 1
    assert outcome.after["tile"] == 0
    assert outcome.fired("remove_matmul_batch_tiles") == 1


# narrow_broadcast_tile with issue 11's fix taken out (`one_use(%t) and %other
# is not %t`): the engine's shape guard alone must keep these graphs whole.
def _unfixed_narrow_rules(tmp_path):
    import rewrite

    folder = tmp_path / "unfixed"
    folder.mkdir()
    source = rewrite.shipped_rules_path() / "mil"
    for path in source.glob("*.rules"):
        text = path.read_text()
        if path.name == "remove_broadcast_tiles.rules":
            assert "one_use(%t) and %other is not %t and " in text
            text = text.replace("one_use(%t) and %other is not %t and ", "")
        (folder / path.name).write_text(text)
    return rewrite.load_rules(folder).only("narrow_broadcast_tile")


def _narrow_case(second_use: bool):
    from rewrite.backends.mil import build_example
    from rewrite.engine.interfaces import NamedValue as V

    if second_use:  # the tile also feeds an exp, which needs it whole
        ops = [("t", "tile", {"x": V("b"), "reps": [8, 8]}), ("out", "add", {"x": V("a"), "y": V("t")}),
               ("e", "exp", {"x": V("t")})]
        return build_example([("a", "fp32", [8, 1]), ("b", "fp32", [1, 1])], ops, ["out", "e"])
    ops = [("t", "tile", {"x": V("b"), "reps": [8, 8]}), ("out", "add", {"x": V("t"), "y": V("t")})]
    return build_example([("b", "fp32", [1, 1])], ops, ["out"])


@pytest.mark.parametrize("second_use", [True, False], ids=["a tile with a second use", "the tile as both operands"])
def test_the_guard_keeps_narrow_broadcast_tile_sound_without_its_fix(tmp_path, second_use):
    rules = _unfixed_narrow_rules(tmp_path)
    built = _narrow_case(second_use)
    before = op_counts(built)
    feeds = {name: np.random.default_rng(0).standard_normal(shape).astype(np.float32)
             for name, shape in (("a", (8, 1)), ("b", (1, 1)))
             if name in built.functions["main"].inputs}
    expected = evaluate(built, feeds)
    statistics = rules.apply(built)
    assert statistics.fires == 0 and statistics.refused >= 1  # the guard, not the rule, said no
    assert op_counts(built) == before
    after = evaluate(built, feeds)
    for name, value in expected.items():
        np.testing.assert_array_equal(value, after[name])
