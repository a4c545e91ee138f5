"""The reference evaluator on the ops coremltools' torch frontend emits, against torch.

Each case is a small torch module, traced and converted with no pass at all
(`PassPipeline.EMPTY`, so that e.g. a batch_norm is not fused into a conv
first), checked to contain the op under test, and evaluated: fp32, rtol 1e-3.
The ops coremltools has no value inference for are computed by the numpy
kernels of `rewrite.backends.mil.reference.KERNELS`.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch  # noqa: E402 - `.[test]` installs it: a missing one must fail, not skip
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

from rewrite.backends.mil import count_ops, ct, mb  # noqa: E402
from rewrite.backends.mil.reference import KERNELS, evaluate  # noqa: E402

RTOL, ATOL = 1e-3, 1e-5


class Function(nn.Module):
    def __init__(self, function):
        super().__init__()
        self.function = function

    def forward(self, x):
        return self.function(x)


def _batch_norm(channels: int, dims: int) -> nn.Module:
    norm = (nn.BatchNorm1d if dims == 1 else nn.BatchNorm2d)(channels)
    generator = torch.Generator().manual_seed(3)
    with torch.no_grad():
        norm.running_mean.copy_(torch.randn(channels, generator=generator))
        norm.running_var.copy_(torch.rand(channels, generator=generator) + 0.5)
        norm.weight.copy_(torch.randn(channels, generator=generator))
        norm.bias.copy_(torch.randn(channels, generator=generator))
    return norm


def _indices(*rows):
    return torch.tensor(rows)


class Embedded(nn.Module):
    """Token embeddings (a `gather` of a table), scaled by the input."""

    def __init__(self):
        super().__init__()
        self.table = nn.Embedding(50, 8)

    def forward(self, x):
        return self.table(_indices([3, 1, 49])) * x


# name -> (module factory, input shape, the MIL op it must convert to)
CASES = {
    "silu": (lambda: nn.SiLU(), (2, 5, 16), "silu"),
    "gelu_mlp": (lambda: nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 8)), (2, 5, 16), "gelu"),
    "conv2d": (lambda: nn.Conv2d(3, 8, 3, stride=2, padding=1), (1, 3, 11, 12), "conv"),
    "conv2d_groups_dilation_same": (
        lambda: nn.Conv2d(4, 6, 3, groups=2, dilation=2, padding="same", bias=False), (2, 4, 9, 10), "conv",
    ),
    "conv2d_rectangular_strides": (
        lambda: nn.Conv2d(2, 3, (3, 2), stride=(2, 3), padding=(1, 0)), (1, 2, 8, 9), "conv",
    ),
    "conv1d": (lambda: nn.Conv1d(4, 6, 3, padding=1), (2, 4, 10), "conv"),
    "conv1d_depthwise": (lambda: nn.Conv1d(4, 4, 5, groups=4, padding=2), (1, 4, 7), "conv"),
    "conv3d": (lambda: nn.Conv3d(2, 3, 2, stride=(1, 2, 1)), (1, 2, 4, 5, 3), "conv"),
    "max_pool": (lambda: nn.MaxPool2d(3, stride=2, padding=1), (1, 3, 9, 8), "max_pool"),
    "max_pool_ceil": (lambda: nn.MaxPool2d(2, stride=2, ceil_mode=True), (1, 2, 7, 5), "max_pool"),
    "avg_pool": (lambda: nn.AvgPool2d(3, stride=2, padding=1), (1, 3, 9, 8), "avg_pool"),
    "avg_pool_exclude_padding": (
        lambda: nn.AvgPool2d(3, stride=2, padding=1, count_include_pad=False), (1, 3, 9, 8), "avg_pool",
    ),
    "avg_pool1d": (lambda: nn.AvgPool1d(2), (1, 3, 8), "avg_pool"),
    "batch_norm2d": (lambda: _batch_norm(3, 2), (2, 3, 4, 5), "batch_norm"),
    "batch_norm1d": (lambda: _batch_norm(4, 1), (2, 4, 6), "batch_norm"),
    "instance_norm": (lambda: nn.InstanceNorm2d(3, affine=True), (2, 3, 4, 5), "instance_norm"),
    "layer_norm": (lambda: nn.LayerNorm(16), (2, 5, 16), "layer_norm"),
    "layer_norm_two_axes": (lambda: nn.LayerNorm((5, 16)), (2, 5, 16), "layer_norm"),
    "layer_norm_no_affine": (lambda: nn.LayerNorm(16, elementwise_affine=False), (2, 5, 16), "layer_norm"),
    "embedding": (Embedded, (1, 3, 8), "gather"),
    "gather_nd": (lambda: Function(lambda x: x[_indices(0, 1, 1), _indices(2, 0, -1)]), (2, 5, 16), "gather_nd"),
    "gather_nd_rows": (lambda: Function(lambda x: x[:, _indices(4, 0, 2)] * 2), (2, 5, 3), "gather"),
    "gather_along_axis": (
        lambda: Function(lambda x: torch.gather(x, 1, _indices([[0] * 4, [2] * 4]).expand(2, 2, 4))), (2, 5, 4),
        "gather_along_axis",
    ),
    "one_hot": (lambda: Function(lambda x: F.one_hot(x.argmax(-1), 16).float() + x), (2, 5, 16), "one_hot"),
    "upsample_nearest": (lambda: Function(lambda x: F.interpolate(x, scale_factor=2, mode="nearest")), (1, 3, 4, 5),
                         "upsample_nearest_neighbor"),
    "pixel_shuffle": (lambda: nn.PixelShuffle(2), (1, 8, 3, 4), "pixel_shuffle"),
    "softmax_attention": (
        lambda: Function(lambda x: F.scaled_dot_product_attention(x, x * 0.5, x, is_causal=True, scale=0.3)),
        (1, 2, 5, 8), "softmax",
    ),
}


def _convert(module: nn.Module, x: torch.Tensor):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        traced = torch.jit.trace(module, x)
        return ct.convert(
            traced,
            inputs=[ct.TensorType(name="x", shape=tuple(x.shape))],
            convert_to="milinternal",
            minimum_deployment_target=ct.target.iOS18,
            compute_precision=ct.precision.FLOAT32,
            pass_pipeline=ct.PassPipeline.EMPTY,
        )


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_evaluator_computes_what_torch_does(name):
    factory, shape, op_type = CASES[name]
    torch.manual_seed(0)
    module = factory().eval()
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = module(x).numpy()
    program = _convert(module, x)
    assert count_ops(program, op_type) >= 1
    (got,) = evaluate(program, {"x": x.numpy()}).values()
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)


def test_every_kernel_is_checked_against_torch():
    # Or by the pad-type tests below: a kernel without a test is a guess.
    converted = {op_type for _, _, op_type in CASES.values()}
    assert set(KERNELS) <= converted


@pytest.mark.parametrize("pad_type", ["valid", "same", "same_lower", "custom"])
def test_conv_pad_types_against_torch(pad_type):
    # torch's frontend emits "custom" pads; the MIL spec's other pad types are
    # checked here against torch's conv of an explicitly padded input.
    rng = np.random.default_rng(0)
    x = rng.normal(size=(1, 2, 7, 6)).astype(np.float32)
    weight = rng.normal(size=(3, 2, 3, 2)).astype(np.float32)
    strides, dilations = [2, 1], [1, 2]
    # (top, bottom, left, right): the MIL spec's padding for each pad type
    # (height: kernel 3, stride 2 over 7 rows; width: dilated kernel 3 over 6).
    pads = {"valid": (0, 0, 0, 0), "same": (1, 1, 1, 1), "same_lower": (1, 1, 1, 1), "custom": (2, 0, 1, 3)}[pad_type]
    if pad_type == "same":
        x = x[:, :, :6]  # an odd total: "same" puts it at the end ...
        pads = (0, 1, 1, 1)
    elif pad_type == "same_lower":
        x = x[:, :, :6]  # ... and "same_lower" at the start
        pads = (1, 0, 1, 1)
    arguments = {"pad": np.array(pads, np.int32)} if pad_type == "custom" else {}

    @mb.program(input_specs=[mb.TensorSpec(shape=x.shape)], opset_version=ct.target.iOS18)
    def program(x_in):
        return mb.conv(x=x_in, weight=weight, strides=strides, dilations=dilations, pad_type=pad_type,
                       name="out", **arguments)

    padded = torch.nn.functional.pad(torch.tensor(x), (pads[2], pads[3], pads[0], pads[1]))
    want = torch.nn.functional.conv2d(padded, torch.tensor(weight), stride=strides, dilation=dilations).numpy()
    got = evaluate(program, {"x_in": x})["out"]
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)
