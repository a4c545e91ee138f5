"""Export tiny, randomly initialised torch models to ONNX as fixtures for the ONNX backend tests.

Every model is exported twice, once per torch exporter:

* ``dynamo``      -- ``torch.onnx.export(..., dynamo=True)`` with ``dynamic_shapes`` built from ``torch.export.Dim``;
* ``torchscript`` -- ``torch.onnx.export(..., dynamo=False)`` with ``dynamic_axes``.

Batch and sequence dims are dynamic. Each export is written next to this script as ``<name>_<exporter>.onnx`` with its
weights embedded, passed through ``onnx.checker.check_model(full_check=True)``, and then run with onnxruntime
(CPUExecutionProvider) at two shapes and compared against the torch model. ``manifest.json`` records, per file, the
opset, the inputs and their symbolic shapes, the test shapes, how to generate inputs, the Expand and Tile nodes (with
where their ``shape``/``repeats`` input comes from), the node count and the dim_param names seen in value_info.
Exports that fail are skipped and recorded in the manifest with the error.

Re-run (needs torch, transformers, onnxscript, onnx, onnxruntime) from the repository root with:

    python tests/backends/onnx_models/export_models.py

Re-running regenerates the .onnx files and the manifest and re-verifies every file; it exits non-zero if any
verification fails. ``--only bert t5_encoder`` re-exports only the named models and keeps the other files and their
manifest entries (the new entries record their own versions if they differ from the manifest's).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import os
import sys
import traceback
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import torch
from torch import nn

OUT_DIR = Path(__file__).resolve().parent
MANIFEST = OUT_DIR / "manifest.json"
SEED = 0
EXPORTERS = ("dynamo", "torchscript")

# Shape used while exporting; deliberately different from every static dim and from the test shapes, so that neither
# exporter can silently specialise a dynamic dim to a constant that happens to match.
EXPORT_DIMS = {"batch": 5, "seq": 11}
TEST_DIMS = [{"batch": 2, "seq": 5}, {"batch": 3, "seq": 7}]
RTOL, ATOL = 1e-4, 1e-5

HIDDEN = 32
HEADS = 4
VOCAB = 64
MAX_POSITIONS = 64
MASK_FILL = -1e9  # large negative instead of -inf, so fully masked rows stay finite (uniform) in torch and ORT


# --------------------------------------------------------------------------------------------------------------------
# Models
# --------------------------------------------------------------------------------------------------------------------


class HandLayerNorm(nn.Module):
    """LayerNorm over the last dim, written out op by op."""

    def __init__(self, hidden: int = HIDDEN, eps: float = 1e-5):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(hidden))
        self.bias = nn.Parameter(torch.randn(hidden))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mean = x.mean(-1, keepdim=True)
        var = (x - mean).pow(2).mean(-1, keepdim=True)
        return (x - mean) / torch.sqrt(var + self.eps) * self.weight + self.bias


class HandRMSNorm(nn.Module):
    """RMSNorm over the last dim, written out op by op."""

    def __init__(self, hidden: int = HIDDEN, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(hidden))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class MaskedSoftmax(nn.Module):
    """softmax(where(mask, scores, MASK_FILL)) with a padding mask broadcast to the scores via expand_as."""

    def forward(self, scores: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        mask = (attention_mask[:, None, None, :] != 0).expand_as(scores)
        masked = torch.where(mask, scores, torch.full_like(scores, MASK_FILL))
        return torch.softmax(masked, dim=-1)


class CausalSelfAttention(nn.Module):
    """Multi-head self-attention with a causal mask built from arange and expanded to (batch, heads, seq, seq)."""

    def __init__(self, hidden: int = HIDDEN, heads: int = HEADS):
        super().__init__()
        self.heads = heads
        self.head_dim = hidden // heads
        self.q_proj = nn.Linear(hidden, hidden)
        self.k_proj = nn.Linear(hidden, hidden)
        self.v_proj = nn.Linear(hidden, hidden)
        self.o_proj = nn.Linear(hidden, hidden)

    def _split_heads(self, t: torch.Tensor) -> torch.Tensor:
        batch, seq, _ = t.shape
        return t.reshape(batch, seq, self.heads, self.head_dim).transpose(1, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, hidden = x.shape
        q = self._split_heads(self.q_proj(x))
        k = self._split_heads(self.k_proj(x))
        v = self._split_heads(self.v_proj(x))
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.head_dim)
        pos = torch.arange(seq, device=x.device)
        causal = (pos[:, None] >= pos[None, :])[None, None].expand(batch, self.heads, seq, seq)
        probs = torch.softmax(torch.where(causal, scores, torch.full_like(scores, MASK_FILL)), dim=-1)
        out = (probs @ v).transpose(1, 2).reshape(batch, seq, hidden)
        return self.o_proj(out)


class CausalLMLogits(nn.Module):
    """Wrap a transformers causal LM so that forward(input_ids) returns only the logits, without a KV cache.

    With ``ones_mask`` the wrapper passes ``attention_mask=ones_like(input_ids)``. Without an attention mask,
    transformers looks for packed sequences in the position ids with ``torch.diff``, which the TorchScript exporter
    cannot translate; an explicit mask skips that check. The graph input stays ``input_ids`` only.
    """

    def __init__(self, model: nn.Module, ones_mask: bool = False):
        super().__init__()
        self.model = model
        self.ones_mask = ones_mask

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        attention_mask = torch.ones_like(input_ids) if self.ones_mask else None
        return self.model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits


def build_llama(ones_mask: bool = False) -> nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        hidden_size=HIDDEN,
        intermediate_size=2 * HIDDEN,
        num_hidden_layers=2,
        num_attention_heads=HEADS,
        num_key_value_heads=2,
        vocab_size=VOCAB,
        max_position_embeddings=MAX_POSITIONS,
        use_cache=False,
    )
    config._attn_implementation = "eager"
    return CausalLMLogits(LlamaForCausalLM(config), ones_mask)


def build_gpt2(ones_mask: bool = False) -> nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(
        n_embd=HIDDEN,
        n_head=HEADS,
        n_layer=2,
        vocab_size=VOCAB,
        n_positions=MAX_POSITIONS,
        bos_token_id=VOCAB - 1,
        eos_token_id=VOCAB - 1,
        use_cache=False,
    )
    config._attn_implementation = "eager"
    return CausalLMLogits(GPT2LMHeadModel(config), ones_mask)


class EncoderHidden(nn.Module):
    """Wrap a transformers encoder so that forward(input_ids, attention_mask) returns only last_hidden_state."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state


ENCODER_HIDDEN = 64
PERTURBATION = 0.02  # BERT's and T5's initializer_range scale


def perturbed(model: nn.Module) -> nn.Module:
    """Add N(0, PERTURBATION^2) noise to every parameter.

    transformers initialises every bias to 0 and every norm gain to 1 (and the dynamo exporter then shares all the
    equal ones as one initializer), so a tool could drop Add(x, 0) and Mul(x, 1) nodes that no trained model has.
    The noise keeps the initialiser's scale and makes no parameter exactly 0 or 1.
    """
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn_like(parameter) * PERTURBATION)
    return model


def build_bert() -> nn.Module:
    from transformers import BertConfig, BertModel

    config = BertConfig(
        hidden_size=ENCODER_HIDDEN,
        num_hidden_layers=2,
        num_attention_heads=HEADS,
        intermediate_size=2 * ENCODER_HIDDEN,
        vocab_size=VOCAB,
        max_position_embeddings=MAX_POSITIONS,
        type_vocab_size=2,
        pad_token_id=0,
    )
    config._attn_implementation = "eager"
    # No pooler: only last_hidden_state is an output, and a pooler nothing reads would be dropped by the exporters.
    return EncoderHidden(perturbed(BertModel(config, add_pooling_layer=False)))


def build_t5_encoder() -> nn.Module:
    from transformers import T5Config, T5EncoderModel

    config = T5Config(
        vocab_size=VOCAB,
        d_model=ENCODER_HIDDEN,
        d_kv=ENCODER_HIDDEN // HEADS,
        d_ff=2 * ENCODER_HIDDEN,
        num_layers=2,
        num_heads=HEADS,
        use_cache=False,
    )
    config._attn_implementation = "eager"
    return EncoderHidden(perturbed(T5EncoderModel(config)))


# --------------------------------------------------------------------------------------------------------------------
# Model specs
# --------------------------------------------------------------------------------------------------------------------


@dataclass
class InputSpec:
    name: str
    dims: tuple[str | int, ...]  # str entries are the dynamic dims ("batch" / "seq")
    dtype: str  # numpy dtype name
    hint: dict  # how to generate a test value: {"kind": "randn"} or {"kind": "randint", "low": .., "high": ..}

    def shape(self, dims: dict[str, int]) -> tuple[int, ...]:
        return tuple(dims[d] if isinstance(d, str) else d for d in self.dims)

    def make(self, dims: dict[str, int], rng: np.random.Generator) -> np.ndarray:
        shape = self.shape(dims)
        if self.hint["kind"] == "randn":
            return rng.standard_normal(shape).astype(self.dtype)
        return rng.integers(self.hint["low"], self.hint["high"], size=shape).astype(self.dtype)


@dataclass
class Variant:
    """One way of building the torch model; later variants are fallbacks tried only if an export fails."""

    note: str
    build: Callable[[], nn.Module]


@dataclass
class ModelSpec:
    name: str
    description: str
    variants: list[Variant]
    inputs: list[InputSpec]
    outputs: list[str]
    notes: list[str] = field(default_factory=list)
    require_expand: bool = False  # fail the run if the exported graph has no Expand node


def float_input(name: str, *dims: str | int) -> InputSpec:
    return InputSpec(name, dims, "float32", {"kind": "randn"})


def ids_input(name: str, *dims: str | int, high: int = VOCAB) -> InputSpec:
    return InputSpec(name, dims, "int64", {"kind": "randint", "low": 0, "high": high})


SPECS = [
    ModelSpec(
        "layernorm",
        "hand-written LayerNorm: (x - mean) / sqrt(var + eps) * w + b over the last dim",
        [Variant("default", HandLayerNorm)],
        [float_input("x", "batch", "seq", HIDDEN)],
        ["y"],
    ),
    ModelSpec(
        "rmsnorm",
        "hand-written RMSNorm: x * rsqrt(mean(x^2) + eps) * w over the last dim",
        [Variant("default", HandRMSNorm)],
        [float_input("x", "batch", "seq", HIDDEN)],
        ["y"],
    ),
    ModelSpec(
        "masked_softmax",
        "softmax(where(mask.expand_as(scores), scores, -1e9)) with mask = attention_mask[:, None, None, :] != 0",
        [Variant("default", MaskedSoftmax)],
        [float_input("scores", "batch", HEADS, "seq", "seq"), ids_input("attention_mask", "batch", "seq", high=2)],
        ["probs"],
        require_expand=True,
    ),
    ModelSpec(
        "attention",
        "q/k/v projections, scaled dot product, causal mask (arange compare + expand), softmax, output projection",
        [Variant("default", CausalSelfAttention)],
        [float_input("x", "batch", "seq", HIDDEN)],
        ["y"],
        require_expand=True,
    ),
    ModelSpec(
        "llama",
        "transformers LlamaForCausalLM, 2 layers, hidden 32, 4 heads / 2 kv heads, vocab 64; logits only",
        [
            Variant("no attention_mask", build_llama),
            Variant("attention_mask=ones_like(input_ids) inside the wrapper", partial(build_llama, ones_mask=True)),
        ],
        [ids_input("input_ids", "batch", "seq")],
        ["logits"],
        notes=["attn_implementation='eager'", "use_cache=False", f"seq must be <= {MAX_POSITIONS}"],
    ),
    ModelSpec(
        "gpt2",
        "transformers GPT2LMHeadModel, 2 layers, n_embd 32, 4 heads, vocab 64; logits only",
        [
            Variant("no attention_mask", build_gpt2),
            Variant("attention_mask=ones_like(input_ids) inside the wrapper", partial(build_gpt2, ones_mask=True)),
        ],
        [ids_input("input_ids", "batch", "seq")],
        ["logits"],
        notes=["attn_implementation='eager'", "use_cache=False", f"seq must be <= {MAX_POSITIONS} (n_positions)"],
    ),
    ModelSpec(
        "bert",
        f"transformers BertModel, 2 layers, hidden {ENCODER_HIDDEN}, 4 heads, intermediate {2 * ENCODER_HIDDEN}, "
        f"vocab {VOCAB}, no pooler; last_hidden_state only",
        [Variant("default", build_bert)],
        [ids_input("input_ids", "batch", "seq"), ids_input("attention_mask", "batch", "seq", high=2)],
        ["last_hidden_state"],
        notes=[
            "attn_implementation='eager'",
            "add_pooling_layer=False",
            f"every parameter perturbed by N(0, {PERTURBATION}^2): no bias is exactly 0, no LayerNorm gain exactly 1",
            "token_type_ids not given: the model expands its zero buffer to (batch, seq)",
            f"seq must be <= {MAX_POSITIONS} (max_position_embeddings)",
        ],
    ),
    ModelSpec(
        "t5_encoder",
        f"transformers T5EncoderModel, 2 layers, d_model {ENCODER_HIDDEN}, 4 heads, d_kv {ENCODER_HIDDEN // HEADS}, "
        f"d_ff {2 * ENCODER_HIDDEN}, vocab {VOCAB}, relative position buckets; last_hidden_state only",
        [Variant("default", build_t5_encoder)],
        [ids_input("input_ids", "batch", "seq"), ids_input("attention_mask", "batch", "seq", high=2)],
        ["last_hidden_state"],
        notes=[
            "attn_implementation='eager'",
            "use_cache=False",
            f"every parameter perturbed by N(0, {PERTURBATION}^2): no RMSNorm gain is exactly 1",
        ],
    ),
]


# --------------------------------------------------------------------------------------------------------------------
# Export
# --------------------------------------------------------------------------------------------------------------------

# Node metadata the dynamo exporter attaches (stack traces with local paths, fx node text, module hierarchy). It is
# about two thirds of a transformers export, so it is dropped; the short "namespace" entry is kept.
DROPPED_METADATA_PREFIX = "pkg.torch.onnx."


def export(spec: ModelSpec, model: nn.Module, exporter: str, path: Path) -> None:
    rng = np.random.default_rng(SEED)
    args = tuple(torch.from_numpy(inp.make(EXPORT_DIMS, rng)) for inp in spec.inputs)
    input_names = [inp.name for inp in spec.inputs]
    if exporter == "dynamo":
        dims = {
            "batch": torch.export.Dim("batch", min=1, max=1024),
            "seq": torch.export.Dim("seq", min=1, max=MAX_POSITIONS),
        }
        dynamic_shapes = {
            inp.name: {axis: dims[d] for axis, d in enumerate(inp.dims) if isinstance(d, str)} for inp in spec.inputs
        }
        program = torch.onnx.export(
            model,
            args,
            dynamo=True,
            dynamic_shapes=dynamic_shapes,
            input_names=input_names,
            output_names=spec.outputs,
            verbose=False,
        )
        proto = program.model_proto
        for node in all_nodes(proto.graph):
            kept = [p for p in node.metadata_props if not p.key.startswith(DROPPED_METADATA_PREFIX)]
            del node.metadata_props[:]
            node.metadata_props.extend(kept)
        onnx.save_model(proto, str(path), save_as_external_data=False)
    else:
        dynamic_axes = {
            inp.name: {axis: d for axis, d in enumerate(inp.dims) if isinstance(d, str)} for inp in spec.inputs
        }
        torch.onnx.export(
            model,
            args,
            str(path),
            dynamo=False,
            input_names=input_names,
            output_names=spec.outputs,
            dynamic_axes=dynamic_axes,
        )


# --------------------------------------------------------------------------------------------------------------------
# Graph inspection
# --------------------------------------------------------------------------------------------------------------------


def dims_of(value_type: onnx.TypeProto) -> list[str | int | None]:
    if not value_type.tensor_type.HasField("shape"):
        return []
    return [
        d.dim_param if d.HasField("dim_param") else d.dim_value if d.HasField("dim_value") else None
        for d in value_type.tensor_type.shape.dim
    ]


def value_spec(vi: onnx.ValueInfoProto) -> dict:
    elem_type = onnx.TensorProto.DataType.Name(vi.type.tensor_type.elem_type)
    return {"name": vi.name, "elem_type": elem_type, "shape": dims_of(vi.type)}


def dim_params(values) -> list[str]:
    return sorted({d for vi in values for d in dims_of(vi.type) if isinstance(d, str)})


def all_nodes(graph: onnx.GraphProto):
    for node in graph.node:
        yield node
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                yield from all_nodes(attr.g)
            for sub in attr.graphs:
                yield from all_nodes(sub)


class SourceDescriber:
    """Render the producer chain of a value as a compact expression.

    For example ``Concat(Shape[end=1](input:x), const[4], Shape[start=1,end=2](input:x))``. Integer attributes are
    shown in brackets; the argument of a Shape is only named (``%value``) unless it is a graph input.
    """

    MAX_CHARS = 600

    def __init__(self, model: onnx.ModelProto):
        graph = model.graph
        self.producers = {out: node for node in graph.node for out in node.output}
        self.initializers = {init.name: init for init in graph.initializer}
        self.inputs = {inp.name for inp in graph.input}

    @staticmethod
    def _const(tensor: onnx.TensorProto) -> str:
        values = onnx.numpy_helper.to_array(tensor)
        if values.size <= 8:
            return f"const{values.tolist()}"
        return f"const<shape {list(values.shape)}>"

    @staticmethod
    def _attrs(node: onnx.NodeProto) -> str:
        shown = []
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.INT:
                shown.append(f"{attr.name}={attr.i}")
            elif attr.type == onnx.AttributeProto.INTS:
                shown.append(f"{attr.name}={list(attr.ints)}")
        return f"[{','.join(shown)}]" if shown else ""

    def describe(self, name: str, depth: int = 8) -> str:
        text = self._describe(name, depth)
        return text if len(text) <= self.MAX_CHARS else text[: self.MAX_CHARS] + "..."

    def _describe(self, name: str, depth: int) -> str:
        if name in self.inputs:
            return f"input:{name}"
        if name in self.initializers:
            return self._const(self.initializers[name])
        node = self.producers.get(name)
        if node is None:
            return f"?{name}"
        if node.op_type == "Constant":
            value = next((a for a in node.attribute if a.name == "value"), None)
            return self._const(value.t) if value is not None else "Constant"
        head = f"{node.op_type}{self._attrs(node)}"
        if node.op_type == "Shape":
            source = node.input[0]
            return f"{head}({'input:' if source in self.inputs else '%'}{source})"
        if depth == 0:
            return f"{head}(...)"
        return f"{head}({', '.join(self._describe(i, depth - 1) for i in node.input if i)})"

    def is_constant(self, name: str) -> bool:
        """True if the value depends on no graph input and no Shape (i.e. it could be folded to a constant)."""
        if name in self.inputs:
            return False
        if name in self.initializers:
            return True
        node = self.producers.get(name)
        if node is None or node.op_type == "Shape":
            return False
        return all(self.is_constant(i) for i in node.input if i)


def inspect_graph(model: onnx.ModelProto) -> dict:
    describer = SourceDescriber(model)
    nodes = list(all_nodes(model.graph))
    stored_shapes = {vi.name: dims_of(vi.type) for vi in (*model.graph.value_info, *model.graph.output)}
    broadcast_nodes = [
        {
            "name": node.name,
            "op_type": node.op_type,
            "inputs": list(node.input),
            "outputs": list(node.output),
            "data_source": describer.describe(node.input[0], depth=2),
            "shape_source": describer.describe(node.input[1]),
            "shape_is_constant": describer.is_constant(node.input[1]),
            # Output shape as stored in the file (None: no value_info; null dims: unknown).
            "stored_output_shape": stored_shapes.get(node.output[0]),
        }
        for node in nodes
        if node.op_type in ("Expand", "Tile")
    ]
    op_counts: dict[str, int] = {}
    for node in nodes:
        op_counts[node.op_type] = op_counts.get(node.op_type, 0) + 1
    inferred = onnx.shape_inference.infer_shapes(model)
    return {
        "node_count": len(nodes),
        "op_counts": dict(sorted(op_counts.items())),
        "expand_tile_nodes": broadcast_nodes,
        "value_info_count": len(model.graph.value_info),
        # dim_param strings on intermediate values as stored in the file ...
        "value_info_dim_params": dim_params(model.graph.value_info),
        # ... and after onnx.shape_inference.infer_shapes (not stored in the file).
        "inferred_value_info_dim_params": dim_params(inferred.graph.value_info),
        "node_metadata_keys": sorted({p.key for node in nodes for p in node.metadata_props}),
        "local_functions": [f"{f.domain}::{f.name}" for f in model.functions],
    }


# --------------------------------------------------------------------------------------------------------------------
# Verification
# --------------------------------------------------------------------------------------------------------------------


def verify(spec: ModelSpec, model: nn.Module, path: Path) -> list[dict]:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    results = []
    for i, dims in enumerate(TEST_DIMS):
        rng = np.random.default_rng(SEED + 1 + i)
        feeds = {inp.name: inp.make(dims, rng) for inp in spec.inputs}
        with torch.no_grad():
            expected = model(*(torch.from_numpy(v) for v in feeds.values()))
        expected = [expected] if isinstance(expected, torch.Tensor) else list(expected)
        got = session.run(None, feeds)
        ok = len(got) == len(expected)
        max_abs = 0.0
        for e, g in zip(expected, got):
            e = e.numpy()
            same_shape = e.shape == g.shape
            ok = ok and same_shape and bool(np.allclose(g, e, rtol=RTOL, atol=ATOL))
            if same_shape:
                max_abs = max(max_abs, float(np.max(np.abs(g - e))))
        results.append({"dims": dims, "ok": ok, "max_abs_diff": max_abs})
    return results


# --------------------------------------------------------------------------------------------------------------------
# Driver
# --------------------------------------------------------------------------------------------------------------------


class ExportFailed(Exception):
    def __init__(self, failures: list[dict]):
        super().__init__("; ".join(f"{f['variant']}: {f['error']}" for f in failures))
        self.failures = failures


@contextlib.contextmanager
def quiet_stdout():
    """Send file descriptor 1 to /dev/null: the TorchScript exporter dumps the whole graph from C++ on failure."""
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 1)
            with contextlib.redirect_stdout(io.StringIO()):
                yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def try_export(spec: ModelSpec, exporter: str, path: Path) -> tuple[Variant, nn.Module, list[dict]]:
    """Export the first variant that works; return it with the failures of the variants tried before it."""
    failures = []
    for variant in spec.variants:
        torch.manual_seed(SEED)
        model = variant.build().eval()
        try:
            with warnings.catch_warnings(), quiet_stdout(), torch.no_grad():
                warnings.simplefilter("ignore")
                export(spec, model, exporter, path)
        except Exception as exc:
            path.unlink(missing_ok=True)
            message = traceback.format_exception_only(type(exc), exc)[-1].strip()
            failures.append({"variant": variant.note, "error": message[:1000]})
            continue
        return variant, model, failures
    raise ExportFailed(failures)


def export_one(spec: ModelSpec, exporter: str) -> dict:
    path = OUT_DIR / f"{spec.name}_{exporter}.onnx"
    entry = {"file": path.name, "model": spec.name, "exporter": exporter, "description": spec.description}
    try:
        variant, model, failures = try_export(spec, exporter, path)
    except ExportFailed as exc:
        entry.update(status="export_failed", error=str(exc), failed_attempts=exc.failures)
        return entry

    onnx.checker.check_model(str(path), full_check=True)
    proto = onnx.load(str(path))
    if any(init.data_location == onnx.TensorProto.EXTERNAL for init in proto.graph.initializer):
        raise RuntimeError(f"{path.name}: weights were written as external data")
    graph_info = inspect_graph(proto)
    if spec.require_expand and not any(n["op_type"] == "Expand" for n in graph_info["expand_tile_nodes"]):
        raise RuntimeError(f"{path.name}: expected at least one Expand node in the exported graph")

    inputs = {vi.name: vi for vi in proto.graph.input}
    entry.update(
        status="ok",
        variant=variant.note,
        failed_attempts=failures,
        size_bytes=path.stat().st_size,
        opset=next(o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")),
        opset_imports={o.domain or "ai.onnx": o.version for o in proto.opset_import},
        ir_version=proto.ir_version,
        inputs=[value_spec(vi) for vi in proto.graph.input],
        outputs=[value_spec(vi) for vi in proto.graph.output],
        # The dim_param each logical dim got on the graph inputs of this file.
        dim_names={
            logical: sorted(
                {
                    dims_of(inputs[inp.name].type)[axis]
                    for inp in spec.inputs
                    for axis, d in enumerate(inp.dims)
                    if d == logical
                },
                key=str,
            )
            for logical in ("batch", "seq")
        },
        test_shapes=[
            {"dims": dims, "inputs": {inp.name: list(inp.shape(dims)) for inp in spec.inputs}} for dims in TEST_DIMS
        ],
        input_generation={inp.name: {"dtype": inp.dtype, **inp.hint} for inp in spec.inputs},
        notes=spec.notes,
        **graph_info,
    )
    entry["verification"] = verify(spec, model, path)
    entry["verified"] = all(r["ok"] for r in entry["verification"])
    return entry


def summary_line(entry: dict) -> str:
    if entry["status"] != "ok":
        return f"SKIP {entry['file']:<32} export failed: {entry['error'][:300]}"
    diffs = " ".join(f"{r['dims']['batch']}x{r['dims']['seq']}:{r['max_abs_diff']:.1e}" for r in entry["verification"])
    return (
        f"{'OK  ' if entry['verified'] else 'FAIL'} {entry['file']:<32} opset {entry['opset']:>2}"
        f"  {entry['size_bytes'] / 1024:6.1f} KB  {entry['node_count']:4d} nodes"
        f"  expand/tile {len(entry['expand_tile_nodes'])}  max|diff| {diffs}"
    )


def versions() -> dict:
    import transformers

    return {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "onnx": onnx.__version__,
        "onnxruntime": ort.__version__,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Export the ONNX test models and write manifest.json.")
    parser.add_argument(
        "--only",
        nargs="+",
        choices=[spec.name for spec in SPECS],
        help="export only these models; the other files and their manifest entries are kept as they are, and the "
        "new entries record the versions they were made with when those differ from the manifest's",
    )
    arguments = parser.parse_args(argv)
    specs = [spec for spec in SPECS if arguments.only is None or spec.name in arguments.only]

    entries = []
    for spec in specs:
        for exporter in EXPORTERS:
            entries.append(export_one(spec, exporter))
            print(summary_line(entries[-1]), flush=True)

    if arguments.only is None:
        manifest_versions = versions()
        kept = []
    else:
        previous = json.loads(MANIFEST.read_text(encoding="utf-8"))
        manifest_versions = previous["versions"]
        if versions() != manifest_versions:
            for entry in entries:
                entry["versions"] = versions()
        # Keep the other models' entries, in SPECS order.
        kept = [e for e in previous["files"] if e["model"] not in arguments.only]
    order = {spec.name: i for i, spec in enumerate(SPECS)}
    merged = sorted(kept + entries, key=lambda e: order.get(e["model"], len(order)))

    manifest = {
        "generated_by": "python tests/backends/onnx_models/export_models.py",
        "versions": manifest_versions,
        "seed": SEED,
        "export_dims": EXPORT_DIMS,
        "test_dims": TEST_DIMS,
        "tolerance": {"rtol": RTOL, "atol": ATOL},
        "dropped_node_metadata": f"dynamo exports: node metadata_props with keys starting {DROPPED_METADATA_PREFIX!r}",
        "files": merged,
    }
    MANIFEST.write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")

    failed = [e["file"] for e in entries if e["status"] == "ok" and not e["verified"]]
    skipped = [e["file"] for e in entries if e["status"] != "ok"]
    total_kb = sum(e.get("size_bytes", 0) for e in entries) / 1024
    print(
        f"{len(entries) - len(skipped)} exported, {len(skipped)} skipped, {len(failed)} failed verification; "
        f"{total_kb:.1f} KB of .onnx"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
