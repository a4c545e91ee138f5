"""rewrite.mil.build_pass_pipeline: placement among coremltools' passes, idempotence, end to end."""

from __future__ import annotations

import numpy as np

from rewrite.backends.mil import count_ops, ct, mb
from rewrite.backends.mil.reference import evaluate
from rewrite.mil import GROUPS, build_pass_pipeline


def test_groups_sit_where_the_converter_puts_its_passes():
    base = ct.PassPipeline.DEFAULT
    before = list(base.passes)
    passes = build_pass_pipeline(base).passes
    assert list(base.passes) == before  # the base is not changed
    assert passes.index("rewrite::cleanup") < passes.index("common::const_elimination")
    assert passes[passes.index("common::fuse_matmul_weight_bias") - 1] == "rewrite::fusion"
    assert passes[passes.index("common::fuse_reduce_mean") + 1] == "rewrite::late"
    assert passes[passes.index("common::remove_redundant_ops") + 1] == "rewrite::settle"
    # The groups and nothing else: every pass of the base, in its order.
    assert [name for name in passes if name not in {group.pass_name for group in GROUPS}] == before


def test_building_twice_adds_nothing():
    once = build_pass_pipeline()
    assert build_pass_pipeline(once).passes == once.passes


def test_end_to_end_in_the_default_pipeline():
    from coremltools.converters.mil.mil.passes.pass_pipeline import PassPipelineManager

    @mb.program(input_specs=[mb.TensorSpec(shape=(4, 8)), mb.TensorSpec(shape=(4, 1))],
                opset_version=ct.target.iOS18)
    def program(x, y):
        wide = mb.tile(x=y, reps=[1, 8])
        flipped = mb.transpose(x=mb.transpose(x=mb.mul(x=x, y=wide), perm=[1, 0]), perm=[1, 0])
        return mb.relu(x=flipped, name="out")

    inputs = {"x": np.random.default_rng(0).normal(size=(4, 8)), "y": np.arange(4.0).reshape(4, 1)}
    before = evaluate(program, inputs)["out"]
    pipeline = build_pass_pipeline()
    pipeline.remove_passes({"common::add_fp16_cast"})  # compare in fp32
    PassPipelineManager.apply_pipeline(program, pipeline)
    assert count_ops(program, "tile") == 0 and count_ops(program, "transpose") == 0
    np.testing.assert_allclose(evaluate(program, inputs)["out"], before, rtol=1e-6)
