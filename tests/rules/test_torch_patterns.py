"""The patterns coremltools' torch frontend emits, each proved on a converted torch model.

Small hand-written torch modules that emit what transformers' models do (an
additive padding mask, masked_fill(~tril, -inf), GPT-2's causal buffer, SDPA
with `scale=`, a query scaled before the product, RMSNorm on (B, S, H), an
expand of a buffer and grouped-query attention's repeat_kv), traced with
`torch.jit.trace` and converted at iOS18 with a static and a `RangeDim`
sequence, once with coremltools' default pipeline and once with
`rewrite.mil.build_pass_pipeline()`. Each test checks which rules fired, the
op counts before and after, and the values against torch (fp32, rtol 1e-3,
by the reference evaluator; flexible models at two lengths), and the
negative cases check that a rule stays away where it must.
"""

from __future__ import annotations

import functools
import math
import warnings
from collections import Counter

import numpy as np
import pytest
import torch  # noqa: E402 - `.[test]` installs it: a missing one must fail, not skip
import torch.nn.functional as F  # noqa: E402
from coremltools.converters.mil.mil.passes.pass_registry import PASS_REGISTRY  # noqa: E402
from torch import nn  # noqa: E402

from rewrite.backends.mil import ct  # noqa: E402
from rewrite.backends.mil.reference import evaluate  # noqa: E402
from rewrite.mil import GROUPS, build_pass_pipeline  # noqa: E402

WIDTH, HEADS = 32, 4
HEAD = WIDTH // HEADS
LENGTH = 8  # static, and the RangeDim's default
LENGTHS = (5, 11)  # where flexible programs are evaluated
RTOL, ATOL = 1e-3, 1e-5


# ------------------------------------------------------------------ modules


class Heads(nn.Module):
    """q, k, v of shape (B, H, S, E) out of one projection, as GPT-2 and BERT split them."""

    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(WIDTH, 3 * WIDTH)

    def split(self, x):
        batch, length, _ = x.shape
        return (t.view(batch, length, HEADS, HEAD).transpose(1, 2) for t in self.qkv(x).split(WIDTH, dim=-1))

    @staticmethod
    def merge(out):
        batch, _, length, _ = out.shape
        return out.transpose(1, 2).reshape(batch, length, WIDTH)


class PaddingMaskAttention(Heads):
    """HF BERT's eager attention: the padding mask made additive, (1 - mask)·min, added to the scaled scores."""

    inputs = ("x", "mask")

    def forward(self, x, mask):
        q, k, v = self.split(x)
        scores = q @ k.transpose(-1, -2) / math.sqrt(HEAD)
        additive = (1.0 - mask[:, None, None, :].to(x.dtype)) * torch.finfo(x.dtype).min
        return self.merge(torch.softmax(scores + additive, dim=-1) @ v)


class ScaledCausalSdpa(Heads):
    """SDPA with is_causal and scale=, which coremltools lowers itself: mul(q, scale), then
    add(matmul(., k, transpose_y), mul(-30000, sub(1, cast(tril)))), softmax, matmul."""

    def forward(self, x):
        q, k, v = self.split(x)
        return self.merge(F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.3))


class MaskedFillAttention(Heads):
    """masked_fill(~tril, fill), which coremltools lowers to select(cond=~tril, a=fill, b=scores)
    with -inf written as -3.4e38. `diagonal=-1` leaves the first row nothing to keep."""

    def __init__(self, fill: float = float("-inf"), diagonal: int = 0):
        super().__init__()
        self.fill, self.diagonal = fill, diagonal

    def forward(self, x):
        q, k, v = self.split(x)
        scores = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(HEAD))
        length = x.shape[1]
        keep = torch.tril(torch.ones(length, length, dtype=torch.bool), diagonal=self.diagonal)
        return self.merge(torch.softmax(scores.masked_fill(~keep, self.fill), dim=-1) @ v)


class CausalBufferAttention(Heads):
    """HF GPT-2's eager attention: a causal `bias` buffer sliced to the runtime lengths, and
    torch.where(causal, scores, finfo.min)."""

    def __init__(self):
        super().__init__()
        self.register_buffer("bias", torch.tril(torch.ones(64, 64, dtype=torch.bool)).view(1, 1, 64, 64))

    def forward(self, x):
        q, k, v = self.split(x)
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(HEAD)
        query_length, key_length = q.size(-2), k.size(-2)
        causal = self.bias[:, :, key_length - query_length:key_length, :key_length]
        lowest = torch.full([], torch.finfo(scores.dtype).min, dtype=scores.dtype)
        return self.merge(torch.softmax(torch.where(causal, scores, lowest), dim=-1) @ v)


class CausalSdpa(Heads):
    """transformers' AttentionMaskConverter._make_causal_mask given to SDPA (GPT-2's sdpa
    attention): a (L, L) fill of the lowest float, masked_fill'ed with 0 where
    arange(L) < (arange(L) + 1) as a column, expanded to (B, 1, L, L)."""

    def forward(self, x):
        q, k, v = self.split(x)
        length = x.size(1)
        mask = torch.full((length, length), torch.finfo(x.dtype).min)
        mask_cond = torch.arange(mask.size(-1))
        mask = mask.masked_fill(mask_cond < (mask_cond + 1).view(mask.size(-1), 1), 0)
        mask = mask[None, None, :, :].expand(x.size(0), 1, length, length)
        return self.merge(F.scaled_dot_product_attention(q, k, v, attn_mask=mask))


class DecoderCausalMask(Heads):
    """Hugging Face's causal mask for decoders (Llama's _prepare_4d_causal_attention_mask_with_
    cache_position, no past): a (L, L + 1) fill of the lowest float, triu(diagonal=1), times
    arange(L + 1) > cache_position, expanded, and sliced to the keys' length."""

    def forward(self, x):
        q, k, v = self.split(x)
        length = x.size(1)
        cache_position = torch.arange(length)
        target = length + 1
        mask = torch.full((length, target), torch.finfo(x.dtype).min)
        mask = torch.triu(mask, diagonal=1)
        mask = mask * (torch.arange(target) > cache_position.reshape(-1, 1))
        mask = mask[None, None, :, :].expand(x.size(0), 1, -1, -1)
        mask = mask[:, :, :, : k.shape[-2]]
        return self.merge(F.scaled_dot_product_attention(q, k, v, attn_mask=mask))


class RotaryAttention(Heads):
    """transformers' rotary embedding (LlamaRotaryEmbedding and apply_rotary_pos_emb): cos and
    sin of positions times inverse frequencies, computed at run time under a flexible sequence,
    applied to q and k."""

    def __init__(self):
        super().__init__()
        self.register_buffer("inv_freq", 1.0 / (10000 ** (torch.arange(0, HEAD, 2).float() / HEAD)))

    @staticmethod
    def rotate_half(x):
        return torch.cat((-x[..., HEAD // 2:], x[..., : HEAD // 2]), dim=-1)

    def forward(self, x):
        q, k, v = self.split(x)
        position_ids = torch.arange(x.size(1))[None, :]
        inv_freq = self.inv_freq[None, :, None].float().expand(position_ids.shape[0], -1, 1)
        freqs = (inv_freq @ position_ids[:, None, :].float()).transpose(1, 2)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos()[:, None], emb.sin()[:, None]
        q, k = q * cos + self.rotate_half(q) * sin, k * cos + self.rotate_half(k) * sin
        return self.merge(F.scaled_dot_product_attention(q, k, v, is_causal=False))


class PrescaledQueryAttention(Heads):
    """The scale on the query, as some models write it: the fused op's own 1/sqrt(E) undoes it."""

    def forward(self, x):
        q, k, v = self.split(x)
        q = q * HEAD**-0.5
        return self.merge(torch.softmax(q @ k.transpose(-1, -2), dim=-1) @ v)


class ScalingChain(nn.Module):
    """Constant factors applied one after another: (h·0.5)·0.125, and (h·0.25)·4, which is h."""

    def __init__(self):
        super().__init__()
        self.up, self.down = nn.Linear(WIDTH, WIDTH), nn.Linear(WIDTH, WIDTH)

    def forward(self, x):
        h = torch.relu(self.up(x))
        return self.down(h * 0.5 * 0.125) + (h * 0.25) * 4.0


class RMSNorm(nn.Module):
    """transformers' LlamaRMSNorm, on (B, S, H)."""

    def __init__(self, axis: int = -1):
        super().__init__()
        self.axis = axis
        self.weight = nn.Parameter(1.0 + 0.2 * torch.randn(WIDTH))

    def forward(self, x):
        variance = x.pow(2).mean(self.axis, keepdim=True)
        return self.weight * (x * torch.rsqrt(variance + 1e-6))


class Embeddings(nn.Module):
    """BERT's embeddings: buffers sliced to the runtime length, the token types expanded
    (a tile by reps computed at run time under a flexible sequence)."""

    inputs = ("x",)
    integer_inputs = True

    def __init__(self):
        super().__init__()
        self.words, self.positions = nn.Embedding(50, WIDTH), nn.Embedding(64, WIDTH)
        self.types = nn.Embedding(2, WIDTH)
        self.register_buffer("position_ids", torch.arange(64).expand(1, -1))
        self.register_buffer("token_type_ids", torch.zeros(1, 64, dtype=torch.long))
        self.norm = nn.LayerNorm(WIDTH)

    def forward(self, ids):
        length = ids.size(1)
        types = self.token_type_ids[:, :length].expand(ids.size(0), length)
        positions = self.position_ids[:, :length]
        return self.norm(self.words(ids) + self.types(types) + self.positions(positions))


class ExpandedToken(nn.Module):
    """A learned token expanded along the runtime sequence and put beside each row (ViT's CLS
    token is the same expand along a flexible batch): a tile by reps computed at run time."""

    def __init__(self):
        super().__init__()
        self.token = nn.Parameter(torch.randn(1, 1, WIDTH))

    def forward(self, x):
        return torch.cat([self.token.expand(1, x.size(1), -1), x], dim=-1)


class RepeatKeyValue(Heads):
    """Llama's repeat_kv for grouped-query attention: (B, 2, S, E) expanded to 4 heads and reshaped."""

    def forward(self, x):
        q, k, v = self.split(x)
        k, v = k[:, :2], v[:, :2]
        batch, groups, length, head = k.shape

        def repeat(t):
            return t[:, :, None, :, :].expand(batch, groups, 2, length, head).reshape(batch, 2 * groups, length, head)

        return self.merge(F.scaled_dot_product_attention(q, repeat(k), repeat(v)))


class Transformers5EagerCausal(Heads):
    """transformers 5's eager attention under a causal mask (masking_utils.eager_mask): kv <= q
    over two aranges put on the last two axes, torch.where(mask, 0, finfo.min) added to the
    scores; the keys pass through an empty KV cache, torch.cat([past, new]) with nothing past
    (DynamicCache), which coremltools writes as a concat of the new keys alone."""

    def forward(self, x):
        q, k, v = self.split(x)
        past = torch.zeros(1, HEADS, 0, HEAD)
        k, v = torch.cat([past, k], dim=-2), torch.cat([past, v], dim=-2)
        positions = torch.arange(x.size(1))
        keep = positions[None, None, None, :] <= positions[None, None, :, None]
        additive = torch.where(keep, torch.tensor(0.0), torch.tensor(torch.finfo(x.dtype).min))
        scores = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(HEAD))
        return self.merge(torch.softmax(scores + additive, dim=-1) @ v)


class Transformers5Rotary(Heads):
    """transformers 5's LlamaRotaryEmbedding: freqs = position_ids[..., None] * inv_freq (a
    broadcast mul, where transformers 4 wrote a matmul), then cos and sin of concat(freqs,
    freqs), applied to q and k before causal SDPA with the scale given."""

    def __init__(self):
        super().__init__()
        self.register_buffer("inv_freq", 1.0 / (10000 ** (torch.arange(0, HEAD, 2).float() / HEAD)))

    @staticmethod
    def rotate_half(x):
        return torch.cat((-x[..., HEAD // 2:], x[..., : HEAD // 2]), dim=-1)

    def forward(self, x):
        q, k, v = self.split(x)
        position_ids = torch.arange(x.size(1))[None, :]
        freqs = position_ids[..., None].float() * self.inv_freq
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos()[:, None], emb.sin()[:, None]
        q, k = q * cos + self.rotate_half(q) * sin, k * cos + self.rotate_half(k) * sin
        return self.merge(F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=HEAD**-0.5))


class PositionEmbeddings(nn.Module):
    """GPT-2's embeddings: word embeddings of the ids plus position embeddings of
    arange(L)[None], the position table longer than the RangeDim's bound."""

    integer_inputs = True

    def __init__(self):
        super().__init__()
        self.words, self.positions = nn.Embedding(50, WIDTH), nn.Embedding(128, WIDTH)

    def forward(self, ids):
        positions = torch.arange(ids.size(1))[None, :]
        return self.words(ids) + self.positions(positions)


class Transformers5PaddingMask(Heads):
    """transformers 5's bidirectional mask with padding (masking_utils.sdpa_mask, no vmap): q >= 0
    over the query positions, and-ed with mask[batch, kv] read by advanced indexing (which the
    torch frontend lowers to gather_nd of stacked indices); given to SDPA with its scale, or
    (eager) as torch.where(keep, 0, min) added to the scores."""

    inputs = ("x", "mask")

    def __init__(self, eager: bool = False):
        super().__init__()
        self.eager = eager

    def forward(self, x, mask):
        q, k, v = self.split(x)
        length = x.size(1)
        batch = torch.arange(x.size(0))[:, None, None, None]
        queries = torch.arange(length)[None, None, :, None]
        keys = torch.arange(length)[None, None, None, :]
        keep = (queries >= 0) & mask.bool()[batch, keys]
        if not self.eager:
            return self.merge(F.scaled_dot_product_attention(q, k, v, attn_mask=keep, scale=HEAD**-0.5))
        additive = torch.where(keep, torch.tensor(0.0), torch.tensor(torch.finfo(x.dtype).min))
        scores = (q @ k.transpose(-1, -2)) * HEAD**-0.5
        return self.merge(torch.softmax(scores + additive, dim=-1) @ v)


class Transformers5TokenTypes(nn.Module):
    """transformers 5's BERT token types: a zero buffer expanded and read with torch.gather at
    the position ids (a slice of a position buffer), expanded to the ids' shape, looked up."""

    integer_inputs = True

    def __init__(self):
        super().__init__()
        self.words, self.types = nn.Embedding(50, WIDTH), nn.Embedding(2, WIDTH)
        self.register_buffer("position_ids", torch.arange(128)[None, :])
        self.register_buffer("token_type_ids", torch.zeros(1, 128, dtype=torch.long))

    def forward(self, ids):
        batch, length = ids.shape
        position_ids = self.position_ids[:, :length]
        buffered = torch.gather(self.token_type_ids.expand(position_ids.shape[0], -1), dim=1, index=position_ids)
        return self.words(ids) + self.types(buffered.expand(batch, length))


# ------------------------------------------------------------------ conversion


def _inputs(module, length: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    if getattr(module, "integer_inputs", False):
        return [rng.integers(0, 50, size=(1, length)).astype(np.int32)]
    x = rng.standard_normal((1, length, WIDTH)).astype(np.float32)
    if getattr(module, "inputs", ("x",)) == ("x", "mask"):
        mask = np.ones((1, length), dtype=np.int32)
        mask[0, -2:] = 0  # padding at the end
        return [x, mask]
    return [x]


def _tensors(arrays):
    return tuple(torch.from_numpy(a).long() if a.dtype == np.int32 else torch.from_numpy(a) for a in arrays)


def _input_types(module, flexible: bool):
    length = ct.RangeDim(1, 64, default=LENGTH) if flexible else LENGTH
    names = getattr(module, "inputs", ("x",))
    if getattr(module, "integer_inputs", False):
        return [ct.TensorType(name="x", shape=(1, length), dtype=np.int32)]
    types = [ct.TensorType(name="x", shape=(1, length, WIDTH))]
    if "mask" in names:
        types.append(ct.TensorType(name="mask", shape=(1, length), dtype=np.int32))
    return types


def _fired() -> Counter:
    """The rules that fired in the last conversion, over all rule groups."""
    counts: Counter = Counter()
    for group in GROUPS:
        statistics = PASS_REGISTRY[group.pass_name].last_statistics
        counts.update({name: s.fires for name, s in statistics.rules.items() if s.fires})
    return counts


@functools.cache
def converted(name: str, flexible: bool, ours: bool):
    """(module, program, rules fired) for MODELS[name], static or flexible, default pipeline or ours."""
    factory = MODELS[name]
    torch.manual_seed(0)
    module = factory().eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # tracer warnings
        traced = torch.jit.trace(module, _tensors(_inputs(module, LENGTH, 0)))
        program = ct.convert(
            traced,
            inputs=_input_types(module, flexible),
            convert_to="milinternal",
            minimum_deployment_target=ct.target.iOS18,
            compute_precision=ct.precision.FLOAT32,
            pass_pipeline=build_pass_pipeline() if ours else ct.PassPipeline.DEFAULT,
        )
    return module, program, _fired() if ours else Counter()


def histogram(program) -> Counter:
    counts: Counter = Counter()
    pending = [program.functions["main"]]
    while pending:
        for op in pending.pop().operations:
            counts[op.op_type] += 1
            pending.extend(op.blocks)
    counts.pop("const", None)
    return counts


def ops(program) -> int:
    return sum(histogram(program).values())


def assert_computes(name: str, flexible: bool, ours: bool = True) -> None:
    """The program computes what the torch module does (fp32), at two lengths if flexible."""
    module, program, _ = converted(name, flexible, ours)
    for seed, length in enumerate(LENGTHS if flexible else (LENGTH,), start=1):
        arrays = _inputs(module, length, seed)
        with torch.no_grad():
            want = module(*_tensors(arrays)).numpy()
        names = ["x", "mask"][: len(arrays)]
        (got,) = evaluate(program, dict(zip(names, arrays))).values()
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)


def assert_costs_over_static(name: str, flexible_program, extra: Counter) -> None:
    """Under our pipeline the flexible program of MODELS[name] has exactly `extra` ops more than
    the static one (the run-time work a flexible length needs), and the static one computes too."""
    _, static, _ = converted(name, False, True)
    assert histogram(flexible_program) - histogram(static) == extra
    assert_computes(name, False)


MODELS = {
    "padding_mask": PaddingMaskAttention,
    "scaled_sdpa": ScaledCausalSdpa,
    "masked_fill": MaskedFillAttention,
    "masked_fill_finite": lambda: MaskedFillAttention(fill=-1e4),
    "masked_fill_empty_row": lambda: MaskedFillAttention(diagonal=-1),
    "causal_buffer": CausalBufferAttention,
    "prescaled_query": PrescaledQueryAttention,
    "scaling_chain": ScalingChain,
    "rmsnorm": RMSNorm,
    "rmsnorm_other_axis": lambda: RMSNorm(axis=-2),
    "embeddings": Embeddings,
    "repeat_kv": RepeatKeyValue,
    "expanded_token": ExpandedToken,
    "causal_sdpa": CausalSdpa,
    "decoder_causal_mask": DecoderCausalMask,
    "rotary": RotaryAttention,
    "transformers5_eager_causal": Transformers5EagerCausal,
    "transformers5_rotary": Transformers5Rotary,
    "position_embeddings": PositionEmbeddings,
    "transformers5_padding_mask": Transformers5PaddingMask,
    "transformers5_padding_mask_eager": lambda: Transformers5PaddingMask(eager=True),
    "transformers5_token_types": Transformers5TokenTypes,
}

SHAPES = [pytest.param(False, id="static"), pytest.param(True, id="flexible")]


def fused_attention(name: str, flexible: bool, rule: str) -> None:
    """The attention of MODELS[name] became one scaled_dot_product_attention by `rule`."""
    _, default, _ = converted(name, flexible, False)
    _, ours, fired = converted(name, flexible, True)
    assert fired[rule] == 1, fired
    before, after = histogram(default), histogram(ours)
    assert before["softmax"] == 1 and after["softmax"] == 0
    assert after["scaled_dot_product_attention"] == 1
    assert ops(ours) < ops(default), (before, after)
    assert_computes(name, flexible)


# ------------------------------------------------------------------ attention with an additive mask


@pytest.mark.parametrize("flexible", SHAPES)
def test_an_additive_padding_mask_is_the_fused_ops_float_mask(flexible):
    fused_attention("padding_mask", flexible, "fuse_additive_mask_attention_to_sdpa")
    _, ours, _ = converted("padding_mask", flexible, True)
    # The scale went into the query and came out as exactly 1: no mul is left.
    assert histogram(ours)["mul"] == 1  # the mask's (1 - m)·min


@pytest.mark.parametrize("flexible", SHAPES)
def test_coremltools_own_lowering_of_sdpa_with_scale_is_fused_back(flexible):
    fused_attention("scaled_sdpa", flexible, "fuse_additive_mask_attention_to_sdpa")
    _, default, _ = converted("scaled_sdpa", flexible, False)
    _, ours, fired = converted("scaled_sdpa", flexible, True)
    # The query's mul(q, 0.3) now multiplies by 0.3·sqrt(8) instead: one mul
    # still, not a second one on top of it. Under a flexible length the causal
    # mask's -30000·(1 - cast(tril)) is a slice of a constant table, so its
    # mul (and cast, sub, fill, band_part) go too.
    if flexible:
        assert fired["float_band_mask_from_a_constant_band"] == 1
        assert histogram(ours)["mul"] == histogram(default)["mul"] - 1
        assert histogram(ours)["band_part"] == histogram(ours)["fill"] == histogram(ours)["cast"] == 0
    else:
        assert histogram(ours)["mul"] == histogram(default)["mul"]


def test_a_causal_mask_built_at_run_time_becomes_a_boolean_one():
    # Flexible: coremltools builds select(less(r, r + 1 as a column), 0, fill(L, L)) and
    # expands it twice; the length read back from the fill is the length
    # (shape_of_fill, gather_of_scalar_concat), the two ranges merge, the two
    # expand_dims are one, and the float mask becomes its condition. That
    # condition, r <= r as a column, is then the L-by-L corner of the same
    # comparison over the RangeDim's bound, a constant (causal_mask_from_a_
    # constant_triangle), cut without its leading unit axes, which SDPA
    # broadcasts back (sdpa_mask_slice_without_leading_unit_axes).
    _, default, _ = converted("causal_sdpa", True, False)
    _, ours, fired = converted("causal_sdpa", True, True)
    for rule in ("shape_of_fill", "gather_of_scalar_concat", "fuse_expand_dims", "sdpa_float_mask_to_bool",
                 "causal_mask_from_a_constant_triangle", "sdpa_mask_slice_without_leading_unit_axes"):
        assert fired[rule] >= 1, (rule, fired)
    before, after = histogram(default), histogram(ours)
    assert before["fill"] == 1 and before["select"] == 2 and before["tile"] == 1 and before["shape"] == 3
    assert after["fill"] == after["fill_like"] == after["select"] == after["tile"] == 0
    assert after["range_1d"] == after["expand_dims"] == after["less_equal"] == 0
    assert after["shape"] == after["gather"] == after["concat"] == after["slice_by_index"] == 1
    # r < r + 1 as a column is r <= the column (add_below_reshape, less_than_one_more)
    assert fired["less_than_one_more"] == 1 and after["add"] == after["less"] == 0
    assert ops(ours) == ops(default) - 15
    assert_computes("causal_sdpa", True)
    # the length read (shape, gather), the end (n, n) and the cut of the constant mask
    assert_costs_over_static("causal_sdpa", ours, Counter({"shape": 1, "gather": 1, "concat": 1, "slice_by_index": 1}))


def test_a_decoder_causal_mask_becomes_a_boolean_one():
    # Then the mask over L + 1 columns cut to L is the mask over L columns
    # (causal_mask_over_its_own_columns): one range, the positions'.
    _, default, _ = converted("decoder_causal_mask", True, False)
    _, ours, fired = converted("decoder_causal_mask", True, True)
    assert fired["sdpa_causal_fill_mask_to_bool"] == 1 and fired["causal_mask_over_its_own_columns"] == 1
    before, after = histogram(default), histogram(ours)
    assert before["band_part"] == 1 and before["fill"] == 1 and before["greater"] == 1
    assert after["band_part"] == after["fill"] == after["greater"] == after["cast"] == after["mul"] == 0
    assert after["less_equal"] == after["range_1d"] == 1 and after["slice_by_index"] == after["add"] == 0
    # SDPA takes the (L, L) mask as it is: its expand_dims to rank 4 goes
    # (sdpa_mask_without_leading_unit_axes).
    assert fired["sdpa_mask_without_leading_unit_axes"] == 1 and after["expand_dims"] == 0
    assert ops(ours) == ops(default) - 18
    assert_computes("decoder_causal_mask", True)
    _, static, _ = converted("decoder_causal_mask", False, True)
    # the length read (shape, gather), its range, the column (a reshape), less_equal
    assert histogram(ours) - histogram(static) == Counter(
        {"shape": 1, "gather": 1, "range_1d": 1, "reshape": 1, "less_equal": 1})


def test_rotary_tables_are_slices_of_constants():
    # cos and sin of positions times inverse frequencies, over range(0, L) with
    # L <= 64 (the RangeDim's bound): slices of the tables over range(0, 64).
    _, default, _ = converted("rotary", True, False)
    _, ours, fired = converted("rotary", True, True)
    assert fired["rotary_table_from_positions"] == 1
    assert fired["cos_of_a_constant_slice"] == fired["sin_of_a_constant_slice"] == 1
    assert fired["expand_dims_of_a_constant_slice"] == 2
    before, after = histogram(default), histogram(ours)
    assert before["cos"] == before["sin"] == before["matmul"] == before["range_1d"] == 1
    assert after["cos"] == after["sin"] == after["matmul"] == after["range_1d"] == after["expand_dims"] == 0
    assert ops(ours) == ops(default) - 8
    assert_computes("rotary", True)
    # the length read, its end for the slices, and the two slices of the tables
    assert_costs_over_static("rotary", ours, Counter({"shape": 1, "gather": 1, "concat": 1, "slice_by_index": 2}))


# ------------------------------------------------------------------ masked_fill(~mask, -inf)


@pytest.mark.parametrize("flexible", SHAPES)
def test_masked_fill_of_the_negated_causal_mask_is_fused(flexible):
    fused_attention("masked_fill", flexible, "fuse_masked_fill_attention_to_sdpa")
    _, ours, _ = converted("masked_fill", flexible, True)
    assert histogram(ours)["logical_not"] == 0  # not(not(tril)) is tril; a constant one is folded


@pytest.mark.parametrize("flexible", SHAPES)
def test_a_fill_that_is_not_minus_infinity_stays(flexible):
    # -1e4 is a number a row's scores can reach: the select is not the op's mask.
    _, default, _ = converted("masked_fill_finite", flexible, False)
    _, ours, fired = converted("masked_fill_finite", flexible, True)
    assert not any("sdpa" in rule for rule in fired)
    assert histogram(ours)["softmax"] == 1 and histogram(ours)["select"] == 1
    # At most the select's fill, widened to the scores' runtime shape for Core
    # ML's runtime (broadcast_select_operands): a fill_like, one op more.
    assert ops(ours) <= ops(default) + histogram(ours)["fill_like"]
    assert_computes("masked_fill_finite", flexible)


def test_a_mask_that_empties_a_row_stays_with_a_finite_fill():
    # tril(diagonal=-1) keeps nothing of the first row: under coremltools' finite
    # -3.4e38 the row is uniform, where the fused op's boolean mask gives NaN.
    _, default, _ = converted("masked_fill_empty_row", False, False)
    module, ours, fired = converted("masked_fill_empty_row", False, True)
    assert not any("sdpa" in rule for rule in fired)
    assert histogram(ours)["softmax"] == 1
    x = _inputs(module, LENGTH, 1)[0]
    (want,) = evaluate(default, {"x": x}).values()
    (got,) = evaluate(ours, {"x": x}).values()
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)


# ------------------------------------------------------------------ GPT-2's causal buffer


@pytest.mark.parametrize("flexible", SHAPES)
def test_gpt2_causal_buffer_attention_is_fused(flexible):
    fused_attention("causal_buffer", flexible, "fuse_masked_attention_to_sdpa")
    _, ours, fired = converted("causal_buffer", flexible, True)
    # the key's head split and Kᵀ, merged into one transpose, given back to matmul's flag
    assert fired["move_transpose_swap_into_matmul_y"] >= 1
    if flexible:
        # the select's fill that broadcast_select_operands widened, read as one fill
        assert fired["fold_scalar_into_zero_fill"] == 1
        assert histogram(ours)["select"] == 0


# ------------------------------------------------------------------ scaling chains


@pytest.mark.parametrize("flexible", SHAPES)
def test_a_query_scale_undone_by_the_fused_op_leaves_no_multiply(flexible):
    # (q·8^-0.5)·sqrt(8) is folded to one factor, rounded once: exactly 1.
    fused_attention("prescaled_query", flexible, "fuse_attention_to_sdpa")
    _, ours, fired = converted("prescaled_query", flexible, True)
    assert fired["remove_scaling_by_one"] == 1
    assert histogram(ours)["mul"] == 0


@pytest.mark.parametrize("flexible", SHAPES)
def test_a_chain_of_constant_scalings_is_one(flexible):
    _, default, _ = converted("scaling_chain", flexible, False)
    _, ours, fired = converted("scaling_chain", flexible, True)
    assert fired["fold_scaling_chain"] == 2 and fired["remove_scaling_by_one"] == 1
    assert histogram(default)["mul"] == 4 and histogram(ours)["mul"] == 1
    assert ops(ours) == ops(default) - 3
    assert_computes("scaling_chain", flexible)


# ------------------------------------------------------------------ RMSNorm


@pytest.mark.parametrize("flexible", SHAPES)
def test_rmsnorm_on_batch_sequence_hidden_takes_four_ops(flexible):
    _, default, _ = converted("rmsnorm", flexible, False)
    _, ours, fired = converted("rmsnorm", flexible, True)
    assert fired["fuse_rmsnorm_rows"] == 1 and fired["fold_norm_scale_into_weight"] == 1
    assert histogram(default) == Counter({"pow": 1, "reduce_mean": 1, "add": 1, "rsqrt": 1, "mul": 2})
    assert histogram(ours) == Counter({"reduce_sum_square": 1, "rsqrt": 1, "mul": 2})
    assert_computes("rmsnorm", flexible)


def test_a_mean_over_another_axis_is_no_rmsnorm():
    _, default, _ = converted("rmsnorm_other_axis", False, False)
    _, ours, fired = converted("rmsnorm_other_axis", False, True)
    assert "fuse_rmsnorm_rows" not in fired and "fuse_rmsnorm" not in fired
    assert histogram(ours) == histogram(default)
    assert_computes("rmsnorm_other_axis", False)


# ------------------------------------------------------------------ flexible-sequence plumbing


def test_an_expanded_buffer_slice_needs_no_runtime_tile():
    # Flexible: token_type_ids[:, :L].expand(1, L) is a tile by reps computed
    # from shape(x) at run time; the reps are proved to be ones and the tile,
    # with the equal/select/real_div plumbing, goes.
    _, default, _ = converted("embeddings", True, False)
    _, ours, fired = converted("embeddings", True, True)
    # The reps are proved to be ones: folded as a constant (fold_proved_int_value)
    # or given to the tile as one (constant_tile_reps), whichever comes first.
    assert fired["constant_tile_reps"] + fired["fold_proved_int_value"] >= 1 and fired["remove_identity_tile"] >= 1
    before, after = histogram(default), histogram(ours)
    assert before["tile"] == 1 and before["real_div"] == 1
    assert after["tile"] == after["real_div"] == after["equal"] == 0
    assert ops(ours) < ops(default)
    assert_computes("embeddings", True)
    assert_computes("embeddings", False)


def test_a_tile_by_a_runtime_length_takes_its_reps_from_the_size_list():
    # expand(1, L, -1): the frontend's size list is concat(1, L, -1), the reps
    # where(size == -1, shape, size) / shape; they are [1, L, 1], built from
    # the list's own L, and the equal/select/real_div go.
    _, default, _ = converted("expanded_token", True, False)
    _, ours, fired = converted("expanded_token", True, True)
    assert fired["tile_reps_from_size_list"] == 1
    before, after = histogram(default), histogram(ours)
    assert before["tile"] == after["tile"] == 1
    assert before["real_div"] == before["select"] == before["equal"] == 1
    assert after["real_div"] == after["select"] == after["equal"] == 0
    assert ops(ours) == ops(default) - 3
    assert_computes("expanded_token", True)


def test_token_types_of_a_zero_buffer_are_one_row_added():
    # token_type_ids[:, :L] of a zero buffer: the lookup is row 0 repeated;
    # the add reads the row (a folded constant) and the slice and lookup go.
    _, ours, fired = converted("embeddings", True, True)
    assert fired["add_uniform_embedding_row"] == 1
    _, static, _ = converted("embeddings", False, True)
    _, default, _ = converted("embeddings", True, False)
    # The positions' lookup through their buffer, gather(table, ids[:, :L]), is a cut of
    # the folded gather(table, ids) (gather_of_a_constant_slice).
    assert fired["gather_of_a_constant_slice"] == 1
    assert histogram(default)["gather"] == 4 and histogram(ours)["gather"] == 2
    assert histogram(ours)["gather"] == histogram(static)["gather"] + 1  # the length
    assert_computes("embeddings", True)


def test_gather_guards_of_positions_proved_non_negative_go():
    # coremltools guards every gather's indices: select(i >= 0, i, i + n).
    # The positions and token types are slices of constant non-negative
    # buffers, so their guards go; the word ids come from the user and keep theirs.
    _, default, _ = converted("embeddings", True, False)
    _, ours, fired = converted("embeddings", True, True)
    # (the positions' guard goes with their lookup, gather_of_a_constant_slice's cut of a constant)
    assert fired["remove_nonnegative_index_guard"] >= 1  # and guards of constant indices, before they fold
    before, after = histogram(default), histogram(ours)
    assert before["gather"] == 4  # three tables and the length read from shape(x)
    # the token types' table is one row, folded (add_uniform_embedding_row); the positions' a cut
    assert after["gather"] == 2
    assert before["greater_equal"] == 3 and after["greater_equal"] == 1
    assert after["select"] == 1  # the ids' guard (the default has the expand's size select too)
    assert after["add"] == before["add"] - 2
    assert_computes("embeddings", True)


def test_gather_guards_stay_where_an_index_may_be_negative():
    # The same program with its ids' guard: the user's ids have no bound.
    _, ours, fired = converted("embeddings", False, True)
    assert fired["remove_nonnegative_index_guard"] == 0
    assert histogram(ours)["select"] == 1
    assert_computes("embeddings", False)


def test_grouped_query_attention_repeats_by_constant_reps():
    _, default, _ = converted("repeat_kv", True, False)
    _, ours, fired = converted("repeat_kv", True, True)
    # The reps are proved constant: given to each tile (constant_tile_reps) or
    # folded first (fold_proved_int_value); the repeat itself stays.
    assert fired["constant_tile_reps"] + fired["fold_proved_int_value"] >= 2
    before, after = histogram(default), histogram(ours)
    assert before["tile"] == after["tile"] == 2  # the repeat itself stays; what computed its reps goes
    assert after["real_div"] == after["equal"] == after["shape"] == 0
    assert ops(ours) < ops(default)
    _, static, _ = converted("repeat_kv", False, True)
    assert ops(ours) == ops(static)
    assert_computes("repeat_kv", True)


# What a flexible program computes beyond its static twin: the mask, from the
# length read at run time. Nothing of the views' and expands' sizes.
RUNTIME_MASK = {
    "padding_mask": Counter(),
    "prescaled_query": Counter(),
    "rmsnorm": Counter(),
    "scaling_chain": Counter(),
    # tril(ones(L, L)): the length read, a fill of (L, L), cast to bool, its band
    "masked_fill": Counter({"shape": 1, "gather": 1, "concat": 1, "fill": 1, "cast": 1, "band_part": 1}),
    # bias[:, :, kl - ql:kl, :kl]: the length read once (both are the input's,
    # read_sizes_from_the_input), kl - ql proved 0 and folded (fold_proved_int_value),
    # the two slices by the length one (merge_slices_from_the_start)
    "causal_buffer": Counter({"shape": 1, "gather": 1, "concat": 1, "slice_by_index": 1}),
}


@pytest.mark.parametrize("name", sorted(RUNTIME_MASK))
def test_flexible_programs_are_their_static_twins_but_for_the_mask(name):
    _, static, _ = converted(name, False, True)
    _, flexible, _ = converted(name, True, True)
    assert histogram(flexible) - histogram(static) == RUNTIME_MASK[name]
    assert histogram(static) - histogram(flexible) == Counter()


# ------------------------------------------------------------------ the same rules on stablehlo-coreml's output


@pytest.fixture(scope="module")
def jax_side():
    import jax  # noqa: F401 - `.[test]` installs both: a missing one must fail, not skip
    import jax_programs
    import parity
    import stablehlo_coreml  # noqa: F401

    return jax_programs, parity


def test_stablehlo_rmsnorm_heads_with_a_weight_folds_sqrt_d_into_the_weight(jax_side):
    # l2_norm, mul(., 8.0), mul(., weight): stablehlo-coreml's own pipeline
    # leaves 2 ops; so does ours now (fuse_rmsnorm, fold_norm_scale_into_weight).
    jax_programs, parity = jax_side
    weight = np.random.default_rng(3).normal(size=(64,)).astype(np.float32)

    def rmsnorm_weighted(x):
        return jax_programs.rmsnorm(x) * weight

    for symbolic in (False, True):
        raw = jax_programs.convert(rmsnorm_weighted, [(("b", 1, 1, 64), np.float32)], symbolic)
        theirs = parity.optimized(raw, parity.their_pipeline())
        ours = parity.optimized(raw, parity.our_pipeline())
        assert histogram(ours) == Counter({"l2_norm": 1, "mul": 1})
        assert ops(ours) <= ops(theirs)  # theirs: the same 2 ops static, more under a symbolic batch
        for batch in (2, 3):
            x = np.random.default_rng(batch).normal(size=(batch if symbolic else jax_programs.STATIC_BATCH, 1, 1, 64))
            x = x.astype(np.float32)
            want = np.asarray(rmsnorm_weighted(x))
            (got,) = evaluate(ours, {list(ours.functions["main"].inputs)[0]: x}).values()
            np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)


def test_stablehlo_batch_one_causal_attention_is_one_op(jax_side):
    # stablehlo-coreml squeezes the batch of 1 around each 2-D matmul; lifted
    # back (lift_matmul_out_of_batch_one_reshapes), the key's transpose folds
    # into matmul's flag and the attention fuses: 12 ops (theirs too) to 1.
    jax_programs, parity = jax_side
    raw = jax_programs.converted("causal_attention_arange", False)
    theirs = parity.optimized(raw, parity.their_pipeline())
    ours = parity.optimized(raw, parity.our_pipeline())
    assert ops(theirs) == 12
    assert histogram(ours) == Counter({"scaled_dot_product_attention": 1})
    assert parity.agrees_with_jax("causal_attention_arange", ours, False).ok


# ------------------------------------------------------------------ what transformers 5 writes


def test_transformers5_eager_causal_mask_and_empty_cache_cost_four_ops_over_static():
    # The empty KV cache's concats of one value go (remove_single_value_concat),
    # so the keys' length is the query's; the additive mask then fuses, and
    # where(kv <= q, 0, min) over the aranges is the L-by-L corner of the same
    # mask over the RangeDim's bound, a folded constant.
    _, default, _ = converted("transformers5_eager_causal", True, False)
    _, ours, fired = converted("transformers5_eager_causal", True, True)
    assert fired["remove_single_value_concat"] == 2
    assert fired["fuse_additive_mask_attention_to_sdpa"] == 1
    assert fired["causal_select_mask_from_a_constant_triangle"] == 1
    before, after = histogram(default), histogram(ours)
    assert before["concat"] == 2 and before["less_equal"] == 1 and before["range_1d"] == 1
    assert after["less_equal"] == after["range_1d"] == after["select"] == after["fill_like"] == 0
    assert ops(ours) == ops(default) - 11
    assert_computes("transformers5_eager_causal", True)
    # the length read (shape, gather), the end (n, n) and the cut of the constant mask
    assert_costs_over_static(
        "transformers5_eager_causal", ours, Counter({"shape": 1, "gather": 1, "concat": 1, "slice_by_index": 1}))


def test_transformers5_rotary_table_and_causal_sdpa_mask_are_cuts_of_constants():
    # freqs = positions * inv_freq (a mul) over range(0, L): a slice of the table over
    # range(0, 64), whose cos and sin fold; coremltools' causal float mask for the SDPA it
    # decomposes (scale given) reads the query's and key's lengths from their shapes, which
    # are the input's (read_sliced_sizes_from_the_input), and its -30000·(1 - cast(tril))
    # is a cut of a folded constant (float_band_mask_from_a_constant_band).
    _, default, _ = converted("transformers5_rotary", True, False)
    _, ours, fired = converted("transformers5_rotary", True, True)
    assert fired["rotary_table_from_scaled_positions"] == 1
    assert fired["cos_of_a_constant_slice"] == fired["sin_of_a_constant_slice"] == 1
    assert fired["read_sliced_sizes_from_the_input"] == 2
    assert fired["float_band_mask_from_a_constant_band"] == 1
    after = histogram(ours)
    for gone in ("range_1d", "cos", "sin", "fill", "band_part", "cast", "sub"):
        assert after[gone] == 0, gone
    assert ops(ours) == ops(default) - 19
    assert_computes("transformers5_rotary", True)
    # the length read, the two ends (the mask's and the tables') and three cuts
    assert_costs_over_static(
        "transformers5_rotary", ours, Counter({"shape": 1, "gather": 1, "concat": 2, "slice_by_index": 3}))


def test_position_embeddings_of_an_arange_are_the_first_rows_of_the_table():
    # embedding(arange(L)[None]): the leading axis goes (add_rows_without_leading_axes),
    # and the gather of range(0, L), L <= 64 < 128 rows, is the table's first L rows.
    _, default, _ = converted("position_embeddings", True, False)
    _, ours, fired = converted("position_embeddings", True, True)
    assert fired["add_rows_without_leading_axes"] == 1 and fired["rows_of_a_table_by_position"] == 1
    before, after = histogram(default), histogram(ours)
    assert before["range_1d"] == 1 and after["range_1d"] == after["expand_dims"] == 0
    assert after["gather"] == before["gather"] - 1  # the word lookup and the length read stay
    assert ops(ours) == ops(default) - 4
    assert_computes("position_embeddings", True)
    _, static, _ = converted("position_embeddings", False, True)
    assert histogram(ours) - histogram(static) == Counter({"shape": 1, "gather": 1, "concat": 1, "slice_by_index": 1})


@pytest.mark.parametrize("eager", [False, True], ids=["sdpa", "eager"])
def test_transformers5_padding_mask_is_the_padding_row_broadcast_by_sdpa(eager):
    # mask[batch, kv] by advanced indexing is gather_nd of stacked indices: for a batch of
    # one, the mask itself with leading 1s (gather_nd_of_the_only_row; the stack, its tile
    # and the kv positions go). q >= 0 over the queries is true everywhere (its lower
    # bound), so SDPA's mask is the padding row alone, broadcast over the queries by SDPA
    # itself (sdpa_mask_without_a_true_conjunct, or the select form for eager attention).
    name = "transformers5_padding_mask_eager" if eager else "transformers5_padding_mask"
    _, default, _ = converted(name, True, False)
    _, ours, fired = converted(name, True, True)
    conjunct = "sdpa_select_mask_without_a_true_conjunct" if eager else "sdpa_mask_without_a_true_conjunct"
    assert fired["gather_nd_of_the_only_row"] == 1 and fired[conjunct] == 1
    assert fired["fuse_additive_mask_attention_to_sdpa"] == 1
    before, after = histogram(default), histogram(ours)
    assert before["gather_nd"] == before["stack"] == before["logical_and"] == 1 and before["range_1d"] == 1
    for gone in ("gather_nd", "stack", "tile", "logical_and", "greater_equal", "range_1d", "shape", "gather"):
        assert after[gone] == 0, gone
    assert ops(ours) == ops(default) - (25 if eager else 31)
    assert_computes(name, True)
    # The static program keeps its gather_nd of constant indices (one op either way); the
    # flexible one puts the leading axes in front instead, and the eager one has the two
    # fills Core ML's runtime needs beside a symbolic dim.
    extra = Counter({"expand_dims": 1, "fill_like": 2} if eager else {"expand_dims": 1})
    _, static, _ = converted(name, False, True)
    assert histogram(ours) - histogram(static) == extra
    kept = {"gather_nd": 1, "logical_and": 1} if eager else {"gather_nd": 1}
    assert histogram(static) - histogram(ours) == Counter(kept)
    assert_computes(name, False)


def test_transformers5_token_types_read_by_torch_gather_are_one_row_added():
    # torch.gather(zeros, 1, position_ids) has the indices' shape (the proof follows
    # gather_along_axis), so the expand's runtime reps are proved ones and the tile goes;
    # every type is 0, so the lookup is one row, added (add_uniform_embedding_row).
    _, default, _ = converted("transformers5_token_types", True, False)
    _, ours, fired = converted("transformers5_token_types", True, True)
    assert fired["remove_identity_tile"] == 1 and fired["add_uniform_embedding_row"] == 1
    before, after = histogram(default), histogram(ours)
    assert before["gather_along_axis"] == before["tile"] == 1
    assert after["gather_along_axis"] == after["tile"] == after["shape"] == 0
    assert ops(ours) == ops(default) - 14
    assert_computes("transformers5_token_types", True)
    assert_costs_over_static("transformers5_token_types", ours, Counter())
