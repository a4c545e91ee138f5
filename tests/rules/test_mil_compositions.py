"""Shipped MIL rules working together, and the cases a single rule example cannot show.

Every case checks op counts and runs the reference evaluator before and
after on concrete inputs (two sizes for a symbolic dim).
"""

from __future__ import annotations

import numpy as np
import pytest
from coremltools.converters.mil.mil import get_new_symbol
from mil_cases import IOS18, op_counts, ops_of_type, random_feeds, rewrite_and_compare

from rewrite.backends.mil import MilAdapter, ct, mb, types


def spec(*shape, dtype=types.fp32):
    return mb.TensorSpec(shape=shape, dtype=dtype)


def test_the_issue_partial_tile_keeps_one_smaller_tile(library):
    @mb.program(input_specs=[spec(8, 1), spec(1, 1)], opset_version=IOS18)
    def program(a, b):
        return mb.add(x=mb.tile(x=a, reps=[1, 8]), y=mb.tile(x=b, reps=[8, 8]))

    outcome = rewrite_and_compare(program, library, random_feeds({"a": (8, 1), "b": (1, 1)}))
    assert outcome.before["tile"] == 2 and outcome.after["tile"] == 1
    (tile,) = ops_of_type(program, "tile")
    assert tile.x.name == "b" and list(tile.reps.val) == [1, 8]  # the 8x8 one is gone
    assert outcome.outputs[0][program.functions["main"].outputs[0].name].shape == (8, 8)


def test_a_softcap_scaled_twice_after_the_tanh_folds_into_one_op(library):
    @mb.program(input_specs=[spec(get_new_symbol(), 8)], opset_version=IOS18)
    def program(x):
        t = mb.tanh(x=mb.real_div(x=x, y=np.float32(30.0)))
        return mb.mul(x=mb.mul(x=t, y=np.float32(3.0)), y=np.float32(10.0))

    outcome = rewrite_and_compare(program, library, random_feeds({"x": ("b", 8)}))
    assert outcome.after == op_counts(program)
    assert {k: v for k, v in outcome.after.items() if k != "const"} == {"scaled_tanh": 1}
    (op,) = ops_of_type(program, "scaled_tanh")
    assert op.alpha.val == pytest.approx(30.0) and op.beta.val == pytest.approx(1 / 30)


def _attention(opset):
    @mb.program(input_specs=[spec(2, 4, 16), spec(2, 4, 16), spec(2, 4, 8)], opset_version=opset)
    def program(q, k, v):
        scores = mb.mul(x=mb.matmul(x=q, y=k, transpose_y=True), y=np.float32(0.25))
        return mb.matmul(x=mb.softmax(x=scores, axis=-1), y=v)

    return program


def test_attention_becomes_sdpa_at_ios18(library):
    program = _attention(IOS18)
    feeds = random_feeds({"q": (2, 4, 16), "k": (2, 4, 16), "v": (2, 4, 8)})
    outcome = rewrite_and_compare(program, library, feeds)
    assert {k: v for k, v in outcome.after.items() if k != "const"} == {"scaled_dot_product_attention": 1}


def test_attention_stays_where_the_target_has_no_sdpa(library):
    program = _attention(ct.target.iOS17)
    feeds = random_feeds({"q": (2, 4, 16), "k": (2, 4, 16), "v": (2, 4, 8)})
    outcome = rewrite_and_compare(program, library, feeds)
    assert outcome.after["scaled_dot_product_attention"] == 0
    assert outcome.after["softmax"] == 1 and outcome.after["matmul"] == 2


def test_a_converter_scalar_fill_is_proved_through_its_shape_plumbing(library):
    # shape -> slice_by_index -> cast -> reshape -> concat -> fill, as converters
    # write scalars under a symbolic batch: the cast drops coremltools' own
    # symbolic value, so the fill's type has a fresh symbol; the adapter's
    # shape values prove it is the batch.
    batch = get_new_symbol()

    @mb.program(input_specs=[spec(batch, 8)], opset_version=IOS18)
    def program(x):
        rows = mb.slice_by_index(x=mb.shape(x=x), begin=[0], end=[1], squeeze_mask=[True])
        rows = mb.reshape(x=mb.cast(x=rows, dtype="int32"), shape=[1])
        half = mb.fill(shape=mb.concat(values=[rows, np.array([8], np.int32)], axis=0), value=np.float32(0.5))
        return mb.mul(x=x, y=half)

    fill = ops_of_type(program, "fill")[0].outputs[0]
    assert fill.shape[0] != batch  # coremltools alone cannot tell
    adapter = MilAdapter(program)
    assert adapter.proven_shape(fill)[0] == adapter.shape(program.functions["main"].inputs["x"])[0]

    outcome = rewrite_and_compare(program, library, random_feeds({"x": ("b", 8)}))
    assert outcome.before["fill"] == 1 and outcome.after["fill"] == 0
    assert {k: v for k, v in outcome.after.items() if k != "const"} == {"mul": 1}  # the plumbing is dead too


def test_a_fill_of_another_size_stays(library):
    @mb.program(input_specs=[spec(get_new_symbol(), 1), spec(get_new_symbol(), 8)], opset_version=IOS18)
    def program(x, y):
        # Filled to y's runtime shape: x alone does not carry those dims.
        return mb.mul(x=x, y=mb.fill(shape=mb.shape(x=y), value=np.float32(2.0)))

    outcome = rewrite_and_compare(program, library, random_feeds({"x": ("b", 1), "y": ("b", 8)}))
    assert outcome.after["fill"] == 1


@pytest.mark.parametrize("restore", ["expand_dims", "reshape"])
def test_a_softmax_whose_sum_was_dropped_restored_and_tiled_becomes_one_op(library, restore):
    batch = get_new_symbol()

    @mb.program(input_specs=[spec(batch, 8)], opset_version=IOS18)
    def program(x):
        e = mb.exp(x=mb.sub(x=x, y=mb.reduce_max(x=x, axes=[-1], keep_dims=True)))
        total = mb.reduce_sum(x=e, axes=[1], keep_dims=False)
        if restore == "expand_dims":
            total = mb.expand_dims(x=total, axes=[1])
        else:
            total = mb.reshape(x=total, shape=mb.concat(values=[mb.shape(x=total), np.array([1], np.int32)], axis=0))
        return mb.real_div(x=e, y=mb.tile(x=total, reps=[1, 8]))

    outcome = rewrite_and_compare(program, library, random_feeds({"x": ("b", 8)}))
    assert outcome.before["tile"] == 1 and outcome.before["exp"] == 1
    assert {k: v for k, v in outcome.after.items() if k != "const"} == {"softmax": 1}


def test_an_fp16_softmax_with_an_fp32_sum_becomes_one_op(library):
    @mb.program(input_specs=[spec(get_new_symbol(), 8, dtype=types.fp16)], opset_version=IOS18)
    def program(x):
        e = mb.exp(x=x)
        total = mb.reduce_sum(x=mb.cast(x=e, dtype="fp32"), axes=[-1], keep_dims=True)
        return mb.real_div(x=e, y=mb.cast(x=total, dtype="fp16"))

    before = op_counts(program)
    feeds = random_feeds({"x": ("b", 8)}, {"x": np.float16})
    from rewrite.backends.mil.reference import evaluate

    expected = [evaluate(program, feed) for feed in feeds]
    library.apply(program, check_types=True)
    assert before["cast"] == 2 and {k: v for k, v in op_counts(program).items() if k != "const"} == {"softmax": 1}
    for want, feed in zip(expected, feeds):
        (got,) = evaluate(program, feed).values()
        (want,) = want.values()
        np.testing.assert_allclose(got, want, rtol=2e-3, atol=2e-3)  # fp16 rounds the sum differently
