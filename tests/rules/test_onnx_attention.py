"""The ONNX Attention and RotaryEmbedding fusions (rules/onnx/attention.rules, rules/onnx/rotary.rules).

Each fusion is proved on tiny torch modules exported in the test with the
TorchScript exporter (`dynamo=False`) and the dynamo one, batch and sequence
dynamic, at opset 18 and converted to opset 23 with `onnx.version_converter`
(how a user upgrades a model; the dynamo exporter writes Attention itself
when asked for opset 23). `rewrite.onnx.optimize` must leave the fused op
where the decomposition was, and onnxruntime 1.32 (which runs Attention-23
and RotaryEmbedding-23 on CPU in fp32) must give the same outputs before and
after at two shapes; onnx's reference evaluator is run on the fused models
too. The negative cases: opset 22, a scale the op cannot take, a softmax over
another axis, a finite fill that is no mask, rotary tables whose halves are not proved equal.
"""

from __future__ import annotations

import functools
import io
import math
import warnings
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from onnx import version_converter
from onnx_cases import counts
from test_onnx_fusions import close, copy

import rewrite
from rewrite.onnx import optimize

RULES_DIR = Path(__file__).resolve().parents[2] / "rules" / "onnx"
ATTENTION_NAMES = [
    "onnx_fuse_attention", "onnx_fuse_attention_additive_mask", "onnx_fuse_attention_bool_mask",
    "onnx_fuse_attention_masked_fill", "onnx_fuse_attention_nan_guarded",
    "onnx_fuse_attention_one_row_mask",
]
ROTARY_NAMES = ["onnx_fuse_rotary_embedding"]
NEW_NAMES = ATTENTION_NAMES + ROTARY_NAMES

HEADS, HEAD_SIZE = 2, 8


def test_optimize_loads_the_attention_and_rotary_rules():
    from rewrite.onnx import _shipped_rules

    assert set(NEW_NAMES) <= {rule.name for rule in _shipped_rules().rules}
    assert {rule.name for rule in rewrite.load_rules(RULES_DIR / "attention.rules").rules} == set(ATTENTION_NAMES)
    assert {rule.name for rule in rewrite.load_rules(RULES_DIR / "rotary.rules").rules} == set(ROTARY_NAMES)


# ---------------------------------------------------------------- exporting and comparing


def export(module: torch.nn.Module, examples: tuple, dynamic: list[dict[int, str]], *, dynamo: bool,
           opset: int = 18) -> onnx.ModelProto:
    """A torch.onnx export of `module`; `dynamic[i]` names the dynamic axes of input i."""
    module = module.eval()
    names = [f"in{i}" for i in range(len(examples))]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if dynamo:
            dims = {name: torch.export.Dim(name, min=2, max=64) for axes in dynamic for name in axes.values()}
            shapes = tuple({axis: dims[name] for axis, name in axes.items()} for axes in dynamic)
            return torch.onnx.export(module, examples, dynamo=True, opset_version=opset,
                                     dynamic_shapes=shapes).model_proto
        buffer = io.BytesIO()
        torch.onnx.export(module, examples, buffer, dynamo=False, opset_version=opset, input_names=names,
                          dynamic_axes=dict(zip(names, dynamic)))
        return onnx.load_from_string(buffer.getvalue())


def random_feeds(model: onnx.ModelProto, sizes: dict[str, int], seed: int) -> dict:
    """Feeds for every graph input, its symbolic dims set from `sizes` (by the exporter's own names)."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for graph_input in model.graph.input:
        tensor_type = graph_input.type.tensor_type
        shape = [d.dim_value if d.HasField("dim_value") else sizes[d.dim_param] for d in tensor_type.shape.dim]
        if tensor_type.elem_type == onnx.TensorProto.BOOL:
            feeds[graph_input.name] = rng.random(shape) > 0.4
        else:
            feeds[graph_input.name] = rng.standard_normal(shape).astype(np.float32)
    return feeds


def symbol_sizes(model: onnx.ModelProto, batch: int, seq: int) -> dict[str, int]:
    """The exporters name the dims differently: the first symbol met is the batch, the next the sequence."""
    names = []
    for graph_input in model.graph.input:
        for d in graph_input.type.tensor_type.shape.dim:
            if d.dim_param and d.dim_param not in names:
                names.append(d.dim_param)
    return dict(zip(names, [batch, seq]))


def same_outputs(before: onnx.ModelProto, after: onnx.ModelProto, reference: bool = True) -> None:
    """onnxruntime gives the same outputs at two shapes (within rounding), and so does onnx's evaluator."""
    cases = [random_feeds(before, symbol_sizes(before, batch, seq), seed)
             for seed, (batch, seq) in enumerate([(2, 5), (3, 7)])]
    close(before, after, cases, reference)


GRANTED = ("no_nans", "no_fully_masked_rows")


def optimized(model: onnx.ModelProto, reference: bool = True, assume=GRANTED) -> tuple[onnx.ModelProto, dict]:
    """`optimize` (the shipped library) on a copy, granting what the fusions assume (a row masked
    whole may become zeros); the outputs compared; (the model, fires of the new rules)."""
    after = copy(model)
    result = optimize(after, assume=assume)
    same_outputs(model, after, reference)
    fires = {name: rule.fires for name, rule in result.statistics.rules.items() if rule.fires and name in NEW_NAMES}
    return after, fires


def at_23(model: onnx.ModelProto) -> onnx.ModelProto:
    return version_converter.convert_version(model, 23)


# ---------------------------------------------------------------- attention modules


class SDPA(torch.nn.Module):
    """torch's scaled_dot_product_attention, with a mask or a scale if given."""

    def __init__(self, scale: float | None = None):
        super().__init__()
        self.scale = scale

    def forward(self, q, k, v, mask=None):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.scale)


class HandWritten(torch.nn.Module):
    """softmax(Q·Kᵀ·scale, masked) · V written out, as models write it; the diagonal always kept."""

    def __init__(self, fill: float = float("-inf"), scale: float | None = None, dim: int = -1,
                 drop_marked: bool = True):
        super().__init__()
        self.fill, self.scale, self.dim, self.drop_marked = fill, scale, dim, drop_marked

    def forward(self, q, k, v, keep):
        scale = 1 / math.sqrt(q.shape[-1]) if self.scale is None else self.scale
        scores = torch.matmul(q, k.transpose(-2, -1)) * scale
        seq = q.shape[-2]
        positions = torch.arange(seq)
        keep = keep | (positions[:, None] == positions[None, :])  # every row keeps a score
        if self.drop_marked:
            scores = scores.masked_fill(~keep, self.fill)  # Where(Not(keep), fill, scores)
        else:
            scores = torch.where(keep, scores, self.fill)
        return torch.matmul(torch.softmax(scores, dim=self.dim), v)


def qkv(batch: int = 3, seq: int = 6):
    generator = torch.Generator().manual_seed(0)
    return tuple(torch.randn(batch, HEADS, seq, HEAD_SIZE, generator=generator) for _ in range(3))


HEAD_AXES = {0: "batch", 2: "seq"}
MASK_AXES = {0: "batch", 2: "seq", 3: "seq"}


@functools.cache
def sdpa_export(kind: str, dynamo: bool, opset: int = 18) -> onnx.ModelProto:
    q, k, v = qkv()
    if kind == "none":
        return export(SDPA(), (q, k, v), [HEAD_AXES] * 3, dynamo=dynamo, opset=opset)
    if kind == "scale":
        return export(SDPA(scale=0.3), (q, k, v), [HEAD_AXES] * 3, dynamo=dynamo, opset=opset)
    if kind == "float":
        mask = torch.randn(3, 1, 6, 6)
        return export(SDPA(), (q, k, v, mask), [HEAD_AXES] * 3 + [MASK_AXES], dynamo=dynamo, opset=opset)
    if kind == "bool":
        mask = torch.rand(3, 1, 6, 6) > 0.4
        return export(SDPA(), (q, k, v, mask), [HEAD_AXES] * 3 + [MASK_AXES], dynamo=dynamo, opset=opset)
    raise ValueError(kind)


@functools.cache
def hand_written_export(dynamo: bool, opset: int = 18, **options) -> onnx.ModelProto:
    q, k, v = qkv()
    keep = torch.rand(3, 1, 6, 6) > 0.4
    return export(HandWritten(**options), (q, k, v, keep), [HEAD_AXES] * 3 + [MASK_AXES], dynamo=dynamo, opset=opset)


DYNAMO = pytest.mark.parametrize("dynamo", [False, True], ids=["torchscript", "dynamo"])


@DYNAMO
@pytest.mark.parametrize("kind, rule", [
    ("none", "onnx_fuse_attention"), ("scale", "onnx_fuse_attention"),
    ("float", "onnx_fuse_attention_additive_mask"), ("bool", "onnx_fuse_attention_nan_guarded"),
])
def test_sdpa_at_opset_23_becomes_attention(kind, rule, dynamo):
    model = at_23(sdpa_export(kind, dynamo))
    assert counts(model)["Softmax"] == 1 and "Attention" not in counts(model)
    after, fires = optimized(model)
    assert fires == {rule: 1}
    assert counts(after)["Attention"] == 1 and "Softmax" not in counts(after) and "MatMul" not in counts(after)
    (node,) = [n for n in after.graph.node if n.op_type == "Attention"]
    attributes = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    assert attributes["scale"] == pytest.approx(0.3 if kind == "scale" else 1 / math.sqrt(HEAD_SIZE), rel=1e-6)
    assert len(node.input) == (4 if kind in ("float", "bool") else 3)


@DYNAMO
@pytest.mark.parametrize("drop_marked, rule", [(True, "onnx_fuse_attention_masked_fill"),
                                               (False, "onnx_fuse_attention_bool_mask")],
                         ids=["masked_fill(~keep, -inf)", "where(keep, scores, -inf)"])
def test_hand_written_masked_attention_becomes_attention(drop_marked, rule, dynamo):
    model = at_23(hand_written_export(dynamo, drop_marked=drop_marked))
    after, fires = optimized(model)
    assert fires == {rule: 1}
    assert counts(after)["Attention"] == 1 and "Softmax" not in counts(after)


def test_attention_node_counts_before_and_after():
    # The TorchScript SDPA of a float mask: Transpose, two Muls by sqrt(scale), MatMul, Add, Softmax,
    # MatMul, and the scale computed from Shape at run time (folded by optimize), become one Attention
    # and the Transpose of Kᵀ composed with the key's own (an identity, removed).
    model = at_23(sdpa_export("float", False))
    before = copy(model)
    optimize(before, rules=rewrite.load_rules(dialects=["onnx"]).only(
        *[r.name for r in rewrite.load_rules(dialects=["onnx"]).rules if r.name not in NEW_NAMES]))
    assert counts(before) == Counter({"Transpose": 1, "Mul": 2, "MatMul": 2, "Add": 1, "Softmax": 1})
    after, _ = optimized(model)
    assert counts(after) == Counter({"Attention": 1})


# ---------------------------------------------------------------- what must stay


@DYNAMO
@pytest.mark.parametrize("kind, rule", [("none", "onnx_fuse_attention"), ("float", "onnx_fuse_attention_additive_mask"),
                                        ("bool", "onnx_fuse_attention_nan_guarded")])
def test_without_a_grant_the_fusions_are_kept_and_counted(kind, rule, dynamo):
    model = at_23(sdpa_export(kind, dynamo))
    after = copy(model)
    result = optimize(after)
    assert result.statistics.rules[rule].fires == 0 and result.statistics.rules[rule].kept == 1
    assert "Attention" not in counts(after) and counts(after)["Softmax"] == 1
    same_outputs(model, after)


@DYNAMO
def test_torchs_nan_guard_needs_the_grant_too(dynamo):
    # dynamo fills with the lowest finite value, whose row masked whole the op zeroes and the guard does not.
    after, fires = optimized(at_23(sdpa_export("bool", dynamo)), assume=())
    assert fires == {} and counts(after)["Softmax"] == 1
    after, fires = optimized(at_23(sdpa_export("bool", dynamo)), assume=("no_fully_masked_rows",))
    assert fires == {"onnx_fuse_attention_nan_guarded": 1} and counts(after)["Attention"] == 1


@pytest.mark.parametrize("fill", [-np.inf, np.finfo(np.float32).min], ids=["-inf", "lowest finite"])
def test_why_the_masked_fusions_assume_no_fully_masked_rows(fill):
    # A row the mask drops whole: the decomposition's softmax is 0/0 there (-inf) or uniform (the
    # lowest finite value), onnxruntime's op a row of zeros either way.
    model = at_23(sdpa_export("float", False))
    after, fires = optimized(model)
    assert fires == {"onnx_fuse_attention_additive_mask": 1}
    import onnxruntime

    feeds = random_feeds(model, symbol_sizes(model, 2, 5), 0)
    feeds[model.graph.input[-1].name][0, 0, 0, :] = fill

    def run(graph):
        return onnxruntime.InferenceSession(graph.SerializeToString(), providers=["CPUExecutionProvider"]).run(
            None, feeds)[0]

    before_out, after_out = run(model), run(after)
    assert (np.isnan(before_out[0, :, 0]).all() if fill == -np.inf else np.all(before_out[0, :, 0] != 0))
    assert np.all(after_out[0, :, 0] == 0)
    assert np.allclose(before_out[1], after_out[1], atol=1e-5)  # rows with a key kept agree


@DYNAMO
def test_sdpa_at_opset_22_stays(dynamo):
    model = version_converter.convert_version(sdpa_export("float", dynamo), 22)
    after, fires = optimized(model, reference=False)
    assert fires == {} and "Attention" not in counts(after) and counts(after)["Softmax"] == 1


@DYNAMO
def test_a_negative_scale_stays(dynamo):
    # The op scales Q and K by the square root of its scale.
    after, fires = optimized(at_23(hand_written_export(dynamo, scale=-0.5)))
    assert fires == {} and counts(after)["Softmax"] == 1


@DYNAMO
def test_a_softmax_over_the_queries_stays(dynamo):
    after, fires = optimized(at_23(hand_written_export(dynamo, dim=-2)))
    assert fires == {} and counts(after)["Softmax"] == 1


@DYNAMO
@pytest.mark.parametrize("fill", [-1e9, torch.finfo(torch.float32).min], ids=["-1e9", "lowest finite"])
def test_a_finite_fill_is_no_mask_and_stays(fill, dynamo):
    # A row that the mask drops whole is uniform under a finite fill and zeros in the op.
    after, fires = optimized(at_23(hand_written_export(dynamo, fill=fill)))
    assert fires == {} and counts(after)["Softmax"] == 1


class PaddingMask(torch.nn.Module):
    """BERT's additive padding mask, (B, 1, 1, S), broadcast over the queries."""

    def forward(self, q, k, v, mask):
        scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(q.shape[-1]) + mask[:, None, None, :]
        return torch.matmul(torch.softmax(scores, dim=-1), v)


@DYNAMO
def test_a_mask_broadcast_over_the_queries_is_expanded_to_them(dynamo):
    # onnxruntime 1.32's Attention kernel refuses a mask of one query row; the rule expands it.
    q, k, v = qkv()
    model = at_23(export(PaddingMask(), (q, k, v, torch.randn(3, 6)), [HEAD_AXES] * 3 + [{0: "batch", 1: "seq"}],
                         dynamo=dynamo))
    after, fires = optimized(model)
    assert fires == {"onnx_fuse_attention_one_row_mask": 1}
    assert counts(after)["Attention"] == 1 and counts(after)["Expand"] == 1 and "Softmax" not in counts(after)


# ---------------------------------------------------------------- RotaryEmbedding


class Rotary(torch.nn.Module):
    """transformers' LlamaRotaryEmbedding and apply_rotary_pos_emb on a query and a key."""

    def __init__(self, head_size: int = HEAD_SIZE, base: float = 10000.0, same_halves: bool = True):
        super().__init__()
        inv_freq = 1.0 / (base ** (torch.arange(0, head_size, 2, dtype=torch.float32) / head_size))
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self.same_halves = same_halves

    @staticmethod
    def rotate_half(x):
        half = x.shape[-1] // 2
        return torch.cat((-x[..., half:], x[..., :half]), dim=-1)

    def forward(self, q, k):
        positions = torch.arange(q.shape[-2]).unsqueeze(0)  # (1, S), as HF's cache_position.unsqueeze(0)
        freqs = (self.inv_freq[None, :, None] @ positions[:, None, :].float()).transpose(1, 2)
        emb = torch.cat((freqs, freqs if self.same_halves else 2 * freqs), dim=-1)
        cos, sin = emb.cos().unsqueeze(1), emb.sin().unsqueeze(1)
        return q * cos + self.rotate_half(q) * sin, k * cos + self.rotate_half(k) * sin


@functools.cache
def rotary_export(dynamo: bool, same_halves: bool = True) -> onnx.ModelProto:
    q, k, _ = qkv()
    return export(Rotary(same_halves=same_halves), (q, k), [HEAD_AXES] * 2, dynamo=dynamo)


@DYNAMO
def test_llama_rotary_becomes_rotary_embedding_at_opset_23(dynamo):
    model = at_23(rotary_export(dynamo))
    assert counts(model)["Neg"] == 2 and counts(model)["Cos"] == 1
    after, fires = optimized(model)
    assert fires == {"onnx_fuse_rotary_embedding": 2}
    assert counts(after)["RotaryEmbedding"] == 2 and "Neg" not in counts(after)


@DYNAMO
def test_rotary_before_opset_23_stays(dynamo):
    after, fires = optimized(version_converter.convert_version(rotary_export(dynamo), 22), reference=False)
    assert fires == {} and "RotaryEmbedding" not in counts(after)


@DYNAMO
def test_rotary_whose_halves_differ_stays(dynamo):
    after, fires = optimized(at_23(rotary_export(dynamo, same_halves=False)))
    assert fires == {} and counts(after)["Neg"] == 2


# ---------------------------------------------------------------- the bundled exports

MODELS = Path(__file__).resolve().parent.parent / "backends" / "onnx_models"
# At opset 23 (converted from the bundled opset 20): the llama and GPT-2 attention of HF's additive
# mask fuses in both layers, and llama's rotary embedding of the query and the key. BERT's padding
# mask (B, 1, 1, S) broadcasts over the queries, which onnxruntime 1.32's Attention kernel refuses:
# it is expanded to the queries first.
BUNDLED_FIRES = {
    "llama": {"onnx_fuse_attention_additive_mask": 2, "onnx_fuse_rotary_embedding": 4},
    "gpt2": {"onnx_fuse_attention_additive_mask": 2},
    "bert": {"onnx_fuse_attention_one_row_mask": 2},
}


@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
@pytest.mark.parametrize("name", sorted(BUNDLED_FIRES))
def test_the_bundled_exports_at_opset_23(name, exporter):
    from test_onnx_exported_models import MANIFEST, _feeds

    file = f"{name}_{exporter}.onnx"
    (entry,) = [e for e in MANIFEST["files"] if e["file"] == file]
    model = at_23(onnx.load(str(MODELS / file)))
    after = copy(model)
    result = optimize(after, assume=GRANTED)
    fires = {rule: n.fires for rule, n in result.statistics.rules.items() if n.fires and rule in NEW_NAMES}
    assert fires == BUNDLED_FIRES[name]
    assert counts(after)["Attention"] == sum(v for k, v in fires.items() if k in ATTENTION_NAMES)
    assert counts(after)["RotaryEmbedding"] == fires.get("onnx_fuse_rotary_embedding", 0)
    close(model, after, [_feeds(entry, shape, seed) for seed, shape in enumerate(entry["test_shapes"])])
