"""Builds the bundled example models (run once; the outputs are committed).

`rmsnorm_symbolic.mlpackage` is an RMSNorm over x:(b, 16) with a symbolic
batch, laid out the way stablehlo-coreml lowers it: the per-row statistic is
materialised with a `tile` before the multiply. The shipped
`remove_broadcast_tiles` rule removes it. The 16-wide scale is stored as a
weight file, so the example also shows weights surviving a rewrite.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np

from rewrite.backends.mil import ct, mb

HERE = Path(__file__).resolve().parent
FEATURES = 16


def rmsnorm_symbolic():
    from coremltools.converters.mil.mil import get_new_symbol

    batch = get_new_symbol()
    scale = np.linspace(0.5, 1.5, FEATURES, dtype=np.float32)

    @mb.program(input_specs=[mb.TensorSpec(shape=(batch, FEATURES))], opset_version=ct.target.iOS18)
    def program(x):
        squares = mb.mul(x=x, y=x, name="squares")
        total = mb.reduce_sum(x=squares, axes=[1], keep_dims=True, name="sum_of_squares")
        mean = mb.real_div(x=total, y=np.float32(FEATURES), name="mean_square")
        shifted = mb.add(x=mean, y=np.float32(1e-6), name="mean_square_eps")
        inverse = mb.rsqrt(x=shifted, name="inverse_rms")
        wide = mb.tile(x=inverse, reps=[1, FEATURES], name="inverse_rms_tiled")
        normed = mb.mul(x=x, y=wide, name="normed")
        return mb.mul(x=normed, y=scale, name="y")

    return program


def main() -> None:
    target = HERE / "rmsnorm_symbolic.mlpackage"
    if target.exists():
        shutil.rmtree(target)
    program = rmsnorm_symbolic()
    # A flexible batch of 1..1024 rows.
    model = ct.convert(
        program,
        convert_to="mlprogram",
        pass_pipeline=ct.PassPipeline.EMPTY,
        minimum_deployment_target=ct.target.iOS18,
        inputs=[ct.TensorType(name="x", shape=ct.Shape((ct.RangeDim(1, 1024), FEATURES)))],
        skip_model_load=True,
    )
    model.save(str(target))
    print(f"wrote {target}")


if __name__ == "__main__":
    main()
