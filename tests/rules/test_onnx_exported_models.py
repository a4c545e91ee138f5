"""The ONNX rules on real exporter output: small torch models, both exporters.

The models are made by tests/backends/onnx_models/export_models.py (torch
2.13, dynamic batch and sequence dims) and committed. For each, which Expand
and Tile nodes go is pinned below, with the reason the others stay, and how
many Reshapes get a constant target; onnxruntime must give the same outputs
before and after at two shapes.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx_cases import RULES, run

MODELS = Path(__file__).resolve().parent.parent / "backends" / "onnx_models"
MANIFEST = json.loads((MODELS / "manifest.json").read_text())

# file -> the Expand/Tile nodes the shipped rules remove. Every other one stays, because:
#   position_ids / mask-index Expands feed Slice, Concat, GatherND or Unsqueeze (not broadcasting);
#   key/value head repeats feed Reshape.
REMOVED = {
    "layernorm_dynamo.onnx": [],
    "layernorm_torchscript.onnx": [],
    "rmsnorm_dynamo.onnx": [],
    "rmsnorm_torchscript.onnx": [],
    "masked_softmax_dynamo.onnx": ["node_expand", "node_full_like"],
    "masked_softmax_torchscript.onnx": ["/Expand"],
    "attention_dynamo.onnx": ["node_expand", "node_full_like"],
    "attention_torchscript.onnx": ["/Expand"],
    "llama_dynamo.onnx": [],
    # The mask Expand's input already has the target shape: a no-op.
    "llama_torchscript.onnx": ["/model/model/Expand"],
    "gpt2_dynamo.onnx": [],
    # The mask Expand feeds Where with two scalars, but its input provably has
    # the target shape already (Reshape's -1 and Flatten solved symbolically).
    "gpt2_torchscript.onnx": ["/model/transformer/Expand"],
    # The token_type_ids Expand (the zero buffer's [1, seq] slice to (batch, seq)) feeds Gather's indices.
    "bert_dynamo.onnx": [],
    "bert_torchscript.onnx": [],
    # full_like(rel_pos, num_buckets - 1) for the bucket clamp feeds Min, which broadcasts the scalar itself.
    "t5_encoder_dynamo.onnx": ["node_full_like"],
    # TorchScript writes that full_like as ConstantOfShape(Shape(rel_pos)): no Expand.
    "t5_encoder_torchscript.onnx": [],
}


def _feeds(entry: dict, shape: dict, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    feeds = {}
    for name, dims in shape["inputs"].items():
        hint = entry["input_generation"][name]
        if hint["kind"] == "randint":
            feeds[name] = rng.integers(hint["low"], hint["high"], size=dims).astype(hint["dtype"])
        else:
            feeds[name] = rng.standard_normal(size=dims).astype(hint["dtype"])
    return feeds


def _expands(model: onnx.ModelProto) -> list[str]:
    return [n.name for n in model.graph.node if n.op_type in ("Expand", "Tile")]


@pytest.mark.parametrize("entry", MANIFEST["files"], ids=[e["file"] for e in MANIFEST["files"]])
def test_exported_model(entry):
    model = onnx.load(str(MODELS / entry["file"]))
    feeds = [_feeds(entry, shape, seed) for seed, shape in enumerate(entry["test_shapes"])]
    assert len({tuple(f[k].shape for k in sorted(f)) for f in feeds}) == 2  # two different shapes
    expected = [run(model, f) for f in feeds]
    before = _expands(model)
    nodes_before = len(model.graph.node)
    # The broadcast rules alone: the rest of the library is measured in tests/backends/test_onnx_folding.py.
    statistics = RULES.only("remove_broadcast_expand", "remove_broadcast_tile").apply(model)
    onnx.checker.check_model(model, full_check=True)
    after = _expands(model)
    assert sorted(set(before) - set(after)) == sorted(REMOVED[entry["file"]])
    assert statistics.fires == len(REMOVED[entry["file"]])
    assert len(model.graph.node) <= nodes_before - len(REMOVED[entry["file"]])
    for feed, outputs in zip(feeds, expected):
        for old, new in zip(outputs, run(model, feed)):
            assert old.shape == new.shape and old.dtype == new.dtype
            np.testing.assert_allclose(new, old, rtol=1e-6, atol=1e-6)


# file -> how many Reshapes onnx_reshape_runtime_target_to_constant gives a constant target. The TorchScript
# exporter computes each head split and merge target from Shape/Gather/Unsqueeze/Concat, one Concat per Reshape,
# and each goes: 4 per layer, plus input_ids.view(-1, seq) (T5, GPT-2) and GPT-2's mask and final hidden-state
# views. What stays: Llama's repeat_kv and GPT-2's Conv1D un-flattening, whose dims come from another axis or
# another tensor (a 0 would copy the wrong dim); the dynamo exporter's split targets, one Concat shared by q, k
# and v (a Constant each would add nodes), so only its unshared ones go (the head merge, view(-1, seq)).
RESHAPE_TARGETS = {
    "layernorm_dynamo.onnx": 0,
    "layernorm_torchscript.onnx": 0,
    "rmsnorm_dynamo.onnx": 0,
    "rmsnorm_torchscript.onnx": 0,
    "masked_softmax_dynamo.onnx": 0,
    "masked_softmax_torchscript.onnx": 0,
    "attention_dynamo.onnx": 1,
    "attention_torchscript.onnx": 4,
    "llama_dynamo.onnx": 0,
    "llama_torchscript.onnx": 8,
    "gpt2_dynamo.onnx": 2,
    "gpt2_torchscript.onnx": 11,
    "bert_dynamo.onnx": 0,
    "bert_torchscript.onnx": 8,
    "t5_encoder_dynamo.onnx": 1,
    "t5_encoder_torchscript.onnx": 9,
}


@pytest.mark.parametrize("entry", MANIFEST["files"], ids=[e["file"] for e in MANIFEST["files"]])
def test_run_time_reshape_targets_become_constants(entry):
    model = onnx.load(str(MODELS / entry["file"]))
    feeds = [_feeds(entry, shape, seed) for seed, shape in enumerate(entry["test_shapes"])]
    expected = [run(model, f) for f in feeds]
    nodes_before = len(model.graph.node)
    statistics = RULES.only("onnx_reshape_runtime_target_to_constant").apply(model)
    onnx.checker.check_model(model, full_check=True)
    assert statistics.fires == RESHAPE_TARGETS[entry["file"]]
    assert len(model.graph.node) <= nodes_before
    for feed, outputs in zip(feeds, expected):
        for old, new in zip(outputs, run(model, feed)):
            assert old.shape == new.shape and old.dtype == new.dtype
            np.testing.assert_allclose(new, old, rtol=1e-6, atol=1e-6)
