"""The ONNX fusion rules (rules/onnx/fusions.rules) on real torch.onnx exports and hand-built models.

Each fusion is proved on a tiny torch module exported in the test, with the
TorchScript exporter (`dynamo=False`) and the dynamo one, a dynamic batch dim
each: the op counts say what became what, and onnxruntime gives the same
outputs before and after at two batch sizes (within rounding: a fused op
rounds differently from its decomposition). RMSNormalization (opset 23) runs
in onnxruntime 1.32, and its fused models are also checked with onnx's
reference evaluator. The negative cases are the ones each rule must not fire
on: an opset too old for the fused op, a runtime weight, a value with other
uses, a BatchNormalization in training mode.
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
from onnx import TensorProto, helper, numpy_helper, version_converter
from onnx.reference import ReferenceEvaluator
from onnx_cases import counts, run

import rewrite
from rewrite.onnx import optimize

FUSIONS_FILE = Path(__file__).resolve().parents[2] / "rules" / "onnx" / "fusions.rules"
SHIPPED = rewrite.load_rules(dialects=["onnx"])
FUSION_NAMES = [
    "onnx_fuse_layer_norm", "onnx_fold_scale_into_layer_norm", "onnx_fold_bias_into_layer_norm",
    "onnx_fuse_gelu_erf", "onnx_fuse_gelu_tanh",
    "onnx_fuse_rms_norm", "onnx_fuse_rms_norm_div", "onnx_fold_scale_into_rms_norm",
    "onnx_fuse_matmul_add_into_gemm", "onnx_fold_batch_norm_into_conv",
]
FUSIONS = SHIPPED.only(*FUSION_NAMES)


# ---------------------------------------------------------------- exporting and comparing


def export(module: torch.nn.Module, example: torch.Tensor, *, dynamo: bool, opset: int, **options) -> onnx.ModelProto:
    """A torch.onnx export of `module` with a dynamic dim 0 named batch."""
    torch.manual_seed(0)
    module = module.eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if dynamo:
            program = torch.onnx.export(module, (example,), dynamo=True, opset_version=opset,
                                        dynamic_shapes=({0: torch.export.Dim("batch")},), **options)
            return program.model_proto
        buffer = io.BytesIO()
        torch.onnx.export(module, (example,), buffer, dynamo=False, opset_version=opset, input_names=["x"],
                          dynamic_axes={"x": {0: "batch"}}, **options)
        return onnx.load_from_string(buffer.getvalue())


def copy(model: onnx.ModelProto) -> onnx.ModelProto:
    duplicate = onnx.ModelProto()
    duplicate.CopyFrom(model)
    return duplicate


def feeds(model: onnx.ModelProto, *batches: int) -> list[dict]:
    """Random float feeds for the model's one input, at each batch size (dim 0)."""
    (graph_input,) = model.graph.input
    dims = [d.dim_value for d in graph_input.type.tensor_type.shape.dim]
    rng = np.random.default_rng(0)
    return [{graph_input.name: rng.standard_normal([b, *dims[1:]]).astype(np.float32)} for b in batches]


def close(before: onnx.ModelProto, after: onnx.ModelProto, cases: list[dict], reference: bool = False) -> None:
    """The same outputs, shapes and dtypes within rounding; with `reference`, onnx's evaluator agrees too."""
    onnx.checker.check_model(after, full_check=True)
    assert [o.name for o in after.graph.output] == [o.name for o in before.graph.output]
    for case in cases:
        expected = run(before, case)
        outputs = [run(after, case)] + ([ReferenceEvaluator(after).run(None, case)] if reference else [])
        for got in outputs:
            for old, new in zip(expected, got):
                assert old.shape == new.shape and old.dtype == new.dtype
                np.testing.assert_allclose(new, old, rtol=1e-5, atol=1e-5)


def fused(model: onnx.ModelProto, rules=FUSIONS, reference: bool = False) -> tuple[Counter, Counter, dict]:
    """Apply `rules` to a copy; check its outputs; (counts before, counts after, fires per rule)."""
    after = copy(model)
    statistics = rules.apply(after)
    close(model, after, feeds(model, 2, 5), reference)
    fires = {name: rule.fires for name, rule in statistics.rules.items() if rule.fires}
    return counts(model), counts(after), fires


def optimized(model: onnx.ModelProto, reference: bool = False) -> tuple[Counter, dict]:
    """`rewrite.onnx.optimize` on a copy, with the shipped library; (counts after, fusion fires)."""
    after = copy(model)
    result = optimize(after)
    close(model, after, feeds(model, 2, 5), reference)
    fires = {name: rule.fires for name, rule in result.statistics.rules.items() if rule.fires and name in FUSION_NAMES}
    return counts(after), fires


def unchanged(model: onnx.ModelProto, rules=FUSIONS) -> None:
    after = copy(model)
    statistics = rules.apply(after)
    assert statistics.fires == 0 and counts(after) == counts(model)


def converted(model: onnx.ModelProto, opset: int) -> onnx.ModelProto:
    """The model at a newer opset, as `onnx.version_converter` makes it (how a user upgrades one)."""
    return version_converter.convert_version(model, opset)


def test_optimize_loads_the_fusions():
    assert set(FUSION_NAMES) <= {rule.name for rule in SHIPPED.rules}
    from rewrite.onnx import _shipped_rules

    assert set(FUSION_NAMES) <= {rule.name for rule in _shipped_rules().rules}
    assert {rule.name for rule in rewrite.load_rules(FUSIONS_FILE).rules} == set(FUSION_NAMES)


# ---------------------------------------------------------------- LayerNormalization


class HandWrittenLayerNorm(torch.nn.Module):
    """(x - mean) / sqrt(var + eps) * w + b over the last dim, as models write it by hand."""

    def __init__(self, size: int = 8, eps: float = 1e-5):
        super().__init__()
        generator = torch.Generator().manual_seed(1)
        self.weight = torch.nn.Parameter(torch.randn(size, generator=generator))
        self.bias = torch.nn.Parameter(torch.randn(size, generator=generator))
        self.eps = eps

    def forward(self, x):
        mean = x.mean(-1, keepdim=True)
        centered = x - mean
        variance = centered.pow(2).mean(-1, keepdim=True)
        return centered / torch.sqrt(variance + self.eps) * self.weight + self.bias


LAYER_NORM_INPUT = torch.randn(3, 4, 8)


@functools.cache
def layer_norm_export(dynamo: bool, opset: int) -> onnx.ModelProto:
    return export(HandWrittenLayerNorm(), LAYER_NORM_INPUT, dynamo=dynamo, opset=opset)


@pytest.mark.parametrize("dynamo, opset", [(False, 17), (False, 18), (True, 18)],
                         ids=["torchscript-17 (axes attributes)", "torchscript-18", "dynamo-18"])
def test_hand_written_layer_norm_becomes_one_layer_normalization(dynamo, opset):
    model = layer_norm_export(dynamo, opset)
    before, after, fires = fused(model)
    assert before["ReduceMean"] == 2 and before["Sqrt"] == 1 and before["Div"] == 1
    assert after == Counter({"LayerNormalization": 1})
    assert fires == {"onnx_fuse_layer_norm": 1, "onnx_fold_scale_into_layer_norm": 1,
                     "onnx_fold_bias_into_layer_norm": 1}
    (node,) = [n for n in copy_and_fuse(model).graph.node]
    attributes = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    assert attributes["axis"] == -1 and attributes["epsilon"] == pytest.approx(1e-5)
    assert list(node.input[1:]) == [i.name for i in model.graph.initializer if i.name.endswith("weight")] + [
        i.name for i in model.graph.initializer if i.name.endswith("bias")]
    after_optimize, optimize_fires = optimized(model)
    assert after_optimize == Counter({"LayerNormalization": 1}) and optimize_fires == fires


def copy_and_fuse(model: onnx.ModelProto) -> onnx.ModelProto:
    after = copy(model)
    FUSIONS.apply(after)
    return after


@functools.cache
def torch_layer_norm_at_16() -> onnx.ModelProto:
    # Before opset 17 the TorchScript exporter decomposes nn.LayerNorm itself.
    return export(torch.nn.LayerNorm(8), LAYER_NORM_INPUT, dynamo=False, opset=16)


def test_torch_layer_norm_at_opset_16_stays_and_fuses_once_converted_to_17():
    model = torch_layer_norm_at_16()
    assert counts(model)["ReduceMean"] == 2 and "LayerNormalization" not in counts(model)
    unchanged(model)  # opset 16 has no LayerNormalization
    _, after, fires = fused(converted(model, 17))
    assert after == Counter({"LayerNormalization": 1}) and fires["onnx_fuse_layer_norm"] == 1


def test_layer_norm_whose_variance_is_also_an_output_stays():
    model = copy(layer_norm_export(False, 18))
    (variance,) = [n.output[0] for n in model.graph.node if n.op_type == "ReduceMean" and "Pow" in n.input[0]]
    model.graph.output.append(helper.make_tensor_value_info(variance, TensorProto.FLOAT, None))
    after = copy(model)
    statistics = FUSIONS.apply(after)
    assert statistics.fired("onnx_fuse_layer_norm") == 0 and "LayerNormalization" not in counts(after)


# ---------------------------------------------------------------- Gelu


class HandWrittenGelu(torch.nn.Module):
    """x * 0.5 * (1 + erf(x / sqrt(2))), as transformers' `_gelu_python` writes it."""

    def forward(self, x):
        return x * 0.5 * (1.0 + torch.erf(x / math.sqrt(2.0)))


class NewGelu(torch.nn.Module):
    """transformers' NewGELUActivation (GPT-2's "gelu_new"): the tanh approximation by hand."""

    def forward(self, x):
        return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


GELU_INPUT = torch.randn(2, 16)


@functools.cache
def gelu_export(kind: str, dynamo: bool, opset: int) -> onnx.ModelProto:
    module = {"erf": HandWrittenGelu(), "tanh": NewGelu(), "nn-erf": torch.nn.GELU(),
              "nn-tanh": torch.nn.GELU(approximate="tanh")}[kind]
    return export(module, GELU_INPUT, dynamo=dynamo, opset=opset)


@pytest.mark.parametrize("dynamo", [False, True], ids=["torchscript", "dynamo"])
@pytest.mark.parametrize("kind, approximate", [("erf", "none"), ("tanh", "tanh")])
def test_hand_written_gelu_becomes_gelu(kind, approximate, dynamo):
    model = gelu_export(kind, dynamo, 20)
    before, after, fires = fused(model)
    assert before[{"erf": "Erf", "tanh": "Tanh"}[kind]] == 1
    assert after == Counter({"Gelu": 1}) and fires == {f"onnx_fuse_gelu_{kind}": 1}
    (node,) = copy_and_fuse(model).graph.node
    assert helper.get_attribute_value(node.attribute[0]).decode() == approximate
    after_optimize, optimize_fires = optimized(model)
    assert after_optimize == Counter({"Gelu": 1}) and optimize_fires == fires


@pytest.mark.parametrize("dynamo", [False, True], ids=["torchscript", "dynamo"])
@pytest.mark.parametrize("kind", ["nn-erf", "nn-tanh"])
def test_torch_gelu_exported_at_opset_18_stays_and_fuses_once_converted_to_20(kind, dynamo):
    # At opset 20 both exporters write Gelu themselves; before it they decompose it.
    model = gelu_export(kind, dynamo, 18)
    assert "Gelu" not in counts(model)
    unchanged(model)  # opset 18 has no Gelu
    _, after, fires = fused(converted(model, 20))
    assert after == Counter({"Gelu": 1}) and sum(fires.values()) == 1


def test_gelu_whose_erf_is_also_an_output_stays():
    model = copy(gelu_export("erf", False, 20))
    (erf,) = [n.output[0] for n in model.graph.node if n.op_type == "Erf"]
    model.graph.output.append(helper.make_tensor_value_info(erf, TensorProto.FLOAT, None))
    unchanged(model)


# ---------------------------------------------------------------- RMSNormalization


class RMSNorm(torch.nn.Module):
    """transformers' LlamaRMSNorm: x · rsqrt(mean(x²) + eps) · w, with its casts to fp32 and back."""

    def __init__(self, size: int = 8, eps: float = 1e-6):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(size, generator=torch.Generator().manual_seed(2)))
        self.eps = eps

    def forward(self, x):
        dtype = x.dtype
        x = x.to(torch.float32)
        variance = x.pow(2).mean(-1, keepdim=True)
        x = x * torch.rsqrt(variance + self.eps)
        return self.weight * x.to(dtype)


RMS_INPUT = torch.randn(3, 4, 8)


@functools.cache
def rms_norm_export(dynamo: bool, opset: int) -> onnx.ModelProto:
    # The dynamo exporter's own optimizer already writes RMSNormalization at
    # opset 23; exported at 20 and converted, the model is what a user upgrading one has.
    if dynamo:
        return converted(export(RMSNorm(), RMS_INPUT, dynamo=True, opset=20), opset)
    return export(RMSNorm(), RMS_INPUT, dynamo=False, opset=opset)


@pytest.mark.parametrize("dynamo", [False, True], ids=["torchscript", "dynamo"])
def test_rms_norm_becomes_rms_normalization_at_opset_23(dynamo):
    model = rms_norm_export(dynamo, 23)
    assert counts(model)["ReduceMean"] == 1 and "RMSNormalization" not in counts(model)
    before, after, fires = fused(model, reference=True)
    # The fusions alone: TorchScript's fp32-to-fp32 Cast between the product and the weight stays
    # (the cleanups remove it), so the weight is not folded there and the scale of ones stays a Constant.
    if dynamo:
        assert after == Counter({"RMSNormalization": 1})
        assert fires == {"onnx_fuse_rms_norm": 1, "onnx_fold_scale_into_rms_norm": 1}
    else:
        assert after == Counter({"Cast": 2, "Constant": 1, "RMSNormalization": 1, "Mul": 1})
        assert fires == {"onnx_fuse_rms_norm": 1}
    after_optimize, optimize_fires = optimized(model, reference=True)
    assert after_optimize == Counter({"RMSNormalization": 1})
    assert optimize_fires == {"onnx_fuse_rms_norm": 1, "onnx_fold_scale_into_rms_norm": 1}


def test_rms_norm_before_opset_23_stays():
    unchanged(rms_norm_export(False, 20))
    after_optimize, fires = optimized(rms_norm_export(False, 20))
    assert "RMSNormalization" not in after_optimize and fires == {}


def test_rms_norm_div_spelling_on_a_hand_built_model_matches_onnx_reference():
    # x / sqrt(mean(x·x) + e) · w, the spelling of the op's own definition.
    nodes = [
        helper.make_node("Mul", ["x", "x"], ["square"]),
        helper.make_node("ReduceMean", ["square", "axes"], ["mean"]),
        helper.make_node("Add", ["mean", "eps"], ["shifted"]),
        helper.make_node("Sqrt", ["shifted"], ["root"]),
        helper.make_node("Div", ["x", "root"], ["normalized"]),
        helper.make_node("Mul", ["w", "normalized"], ["y"]),
    ]
    initializers = [numpy_helper.from_array(np.array([-1], np.int64), "axes"),
                    numpy_helper.from_array(np.array(1e-5, np.float32), "eps"),
                    numpy_helper.from_array(np.linspace(-1, 1, 8).astype(np.float32), "w")]
    graph = helper.make_graph(nodes, "rms", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 8])], initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)])
    _, after, fires = fused(model, reference=True)
    assert after == Counter({"RMSNormalization": 1})
    assert fires == {"onnx_fuse_rms_norm_div": 1, "onnx_fold_scale_into_rms_norm": 1}


# ---------------------------------------------------------------- Gemm


class MatMulAdd(torch.nn.Module):
    """x @ w + b with a weight stored (in, out), as hand-written layers do; nn.Linear exports as Gemm already."""

    def __init__(self):
        super().__init__()
        generator = torch.Generator().manual_seed(3)
        self.w = torch.nn.Parameter(torch.randn(8, 4, generator=generator))
        self.b = torch.nn.Parameter(torch.randn(4, generator=generator))

    def forward(self, x):
        return x @ self.w + self.b


@functools.cache
def matmul_add_export(dynamo: bool, rank: int) -> onnx.ModelProto:
    return export(MatMulAdd(), torch.randn(*([3] * (rank - 1)), 8), dynamo=dynamo, opset=18)


@pytest.mark.parametrize("dynamo", [False, True], ids=["torchscript", "dynamo"])
def test_matmul_add_on_a_batch_of_rows_becomes_gemm(dynamo):
    model = matmul_add_export(dynamo, 2)
    before, after, fires = fused(model)
    assert before == Counter({"MatMul": 1, "Add": 1})
    assert after == Counter({"Gemm": 1}) and fires == {"onnx_fuse_matmul_add_into_gemm": 1}
    after_optimize, optimize_fires = optimized(model)
    assert after_optimize == Counter({"Gemm": 1}) and optimize_fires == fires


@pytest.mark.parametrize("dynamo", [False, True], ids=["torchscript", "dynamo"])
def test_nn_linear_is_gemm_already(dynamo):
    model = export(torch.nn.Linear(8, 4), torch.randn(2, 8), dynamo=dynamo, opset=18)
    assert counts(model) == Counter({"Gemm": 1})
    unchanged(model)


@pytest.mark.parametrize("dynamo", [False, True], ids=["torchscript", "dynamo"])
def test_matmul_add_on_a_rank_3_input_stays(dynamo):
    model = matmul_add_export(dynamo, 3)
    assert counts(model)["MatMul"] == 1
    unchanged(model)


def test_matmul_by_a_runtime_weight_stays():
    model = copy(matmul_add_export(False, 2))
    (weight,) = [i for i in model.graph.initializer if i.name == "w"]
    model.graph.input.append(helper.make_tensor_value_info("w", TensorProto.FLOAT, [8, 4]))
    model.graph.initializer.remove(weight)
    unchanged(model)


# ---------------------------------------------------------------- BatchNormalization into Conv


def conv_batch_norm(conv_bias: bool = True) -> torch.nn.Module:
    module = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, bias=conv_bias), torch.nn.BatchNorm2d(4))
    generator = torch.Generator().manual_seed(4)
    with torch.no_grad():
        norm = module[1]
        norm.running_mean.copy_(torch.randn(4, generator=generator))
        norm.running_var.copy_(torch.rand(4, generator=generator) + 0.5)
        norm.weight.copy_(torch.randn(4, generator=generator))
        norm.bias.copy_(torch.randn(4, generator=generator))
    return module.eval()


CONV_INPUT = torch.randn(2, 3, 6, 6)


@functools.cache
def conv_batch_norm_export(dynamo: bool, conv_bias: bool = True, opset: int = 18) -> onnx.ModelProto:
    # Left to themselves both exporters fold the BatchNormalization already: the
    # TorchScript one without constant folding, the dynamo one without its optimizer, keep it.
    options = {"optimize": False} if dynamo else {"do_constant_folding": False}
    return export(conv_batch_norm(conv_bias), CONV_INPUT, dynamo=dynamo, opset=opset, **options)


@pytest.mark.parametrize("conv_bias", [True, False], ids=["conv bias", "no conv bias"])
@pytest.mark.parametrize("dynamo", [False, True], ids=["torchscript", "dynamo"])
def test_batch_norm_after_conv_folds_into_its_weights(dynamo, conv_bias):
    model = conv_batch_norm_export(dynamo, conv_bias)
    runtime_zero_bias = dynamo and not conv_bias
    if runtime_zero_bias:
        # The dynamo exporter gives the Conv a zero bias, Expand(CastLike(0.0, input), Shape(W)[0:1]):
        # no constant until optimize's cleanups (onnx_remove_noop_castlike) and folding make it one.
        assert counts(model)["CastLike"] == 1 and counts(model)["Conv"] == 1
        unchanged(model)
    else:
        assert counts(model) == Counter({"Conv": 1, "BatchNormalization": 1})
        before, after, fires = fused(model)
        assert after["BatchNormalization"] == 0 and after["Conv"] == 1
        assert fires == {"onnx_fold_batch_norm_into_conv": 1}
        # The rules leave the arithmetic on the constants as ops; optimize folds it into initializers.
        assert after["Mul"] == 2 and after["Sqrt"] == 1
    after_optimize, optimize_fires = optimized(model)
    assert after_optimize == Counter({"Conv": 1}) and optimize_fires == {"onnx_fold_batch_norm_into_conv": 1}


def _with_batch_norm_attributes(model: onnx.ModelProto, **attributes) -> onnx.ModelProto:
    model = copy(model)
    (norm,) = [n for n in model.graph.node if n.op_type == "BatchNormalization"]
    for name, value in attributes.items():
        for existing in [a for a in norm.attribute if a.name == name]:
            norm.attribute.remove(existing)
        norm.attribute.append(helper.make_attribute(name, value))
    return model


def test_batch_norm_in_training_mode_with_its_running_outputs_stays():
    model = _with_batch_norm_attributes(conv_batch_norm_export(False), training_mode=1)
    (norm,) = [n for n in model.graph.node if n.op_type == "BatchNormalization"]
    norm.output.extend(["running_mean_out", "running_var_out"])
    model.graph.output.extend([helper.make_tensor_value_info(name, TensorProto.FLOAT, [4])
                               for name in ("running_mean_out", "running_var_out")])
    onnx.checker.check_model(model, full_check=True)
    unchanged(model)


def test_batch_norm_in_training_mode_stays():
    unchanged(_with_batch_norm_attributes(conv_batch_norm_export(True), training_mode=1))


def test_batch_norm_at_opset_13_stays():
    # Before 14 the mode is the number of outputs, which a rule cannot see.
    model = conv_batch_norm_export(False, opset=13)
    assert counts(model) == Counter({"Conv": 1, "BatchNormalization": 1})
    unchanged(model)


def test_batch_norm_after_conv_of_runtime_weights_stays():
    model = copy(conv_batch_norm_export(False))
    (conv,) = [n for n in model.graph.node if n.op_type == "Conv"]
    (weight,) = [i for i in model.graph.initializer if i.name == conv.input[1]]
    model.graph.input.append(helper.make_tensor_value_info(weight.name, TensorProto.FLOAT, list(weight.dims)))
    model.graph.initializer.remove(weight)
    unchanged(model)


def test_batch_norm_after_conv_with_other_uses_stays():
    model = copy(conv_batch_norm_export(True))
    (conv,) = [n for n in model.graph.node if n.op_type == "Conv"]
    model.graph.output.append(helper.make_tensor_value_info(conv.output[0], TensorProto.FLOAT, None))
    unchanged(model)


# ---------------------------------------------------------------- the bundled exports

MODELS = Path(__file__).resolve().parent.parent / "backends" / "onnx_models"
# What the fusions do to the exports of tests/backends/onnx_models under `optimize` (all at opset 20,
# so RMSNormalization, opset 23, never fires there; GPT-2's MLP is transformers' NewGELUActivation,
# and the layernorm models are the hand-written LayerNorm). nn.LayerNorm is LayerNormalization already.
BUNDLED_FIRES = {
    "layernorm_dynamo.onnx": {"onnx_fuse_layer_norm": 1, "onnx_fold_scale_into_layer_norm": 1,
                              "onnx_fold_bias_into_layer_norm": 1},
    "layernorm_torchscript.onnx": {"onnx_fuse_layer_norm": 1, "onnx_fold_scale_into_layer_norm": 1,
                                   "onnx_fold_bias_into_layer_norm": 1},
    "gpt2_dynamo.onnx": {"onnx_fuse_gelu_tanh": 2},
    "gpt2_torchscript.onnx": {"onnx_fuse_gelu_tanh": 2},
    **{f"{name}_{exporter}.onnx": {} for name in ("rmsnorm", "masked_softmax", "attention", "llama")
       for exporter in ("dynamo", "torchscript")},
}


@pytest.mark.parametrize("name", sorted(BUNDLED_FIRES))
def test_fusions_on_the_bundled_exports(name):
    from test_onnx_exported_models import MANIFEST, _feeds

    (entry,) = [e for e in MANIFEST["files"] if e["file"] == name]
    model = onnx.load(str(MODELS / name))
    after = copy(model)
    result = optimize(after)
    fires = {rule: n.fires for rule, n in result.statistics.rules.items() if n.fires and rule in FUSION_NAMES}
    assert fires == BUNDLED_FIRES[name]
    if name.startswith("layernorm"):
        assert counts(after) == Counter({"LayerNormalization": 1})
    onnx.checker.check_model(after, full_check=True)
    for seed, shape in enumerate(entry["test_shapes"]):
        case = _feeds(entry, shape, seed)
        for old, new in zip(run(model, case), run(after, case)):
            assert old.shape == new.shape and old.dtype == new.dtype
            np.testing.assert_allclose(new, old, rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------ optimize(model, opset)


def test_optimize_to_a_newer_opset_converts_first_so_the_fusions_fire():
    # TorchScript's RMSNorm at opset 20 has no RMSNormalization to become; asked for opset 23,
    # optimize upgrades the model (onnx.version_converter) and fuses it, values the same.
    model = rms_norm_export(False, 20)
    after = copy(model)
    result = optimize(after, 23)
    assert [e.version for e in after.opset_import if e.domain in ("", "ai.onnx")] == [23]
    assert counts(after) == Counter({"RMSNormalization": 1})
    assert result.statistics.fired("onnx_fuse_rms_norm") == 1
    close(model, after, feeds(model, 2, 5), reference=True)


def test_optimize_at_the_models_own_opset_converts_nothing():
    model = rms_norm_export(False, 20)
    after = copy(model)
    optimize(after, 20)
    assert [e.version for e in after.opset_import if e.domain in ("", "ai.onnx")] == [20]
    assert "RMSNormalization" not in counts(after)


def test_an_opset_the_converter_cannot_reach_is_a_model_error_and_changes_nothing():
    from rewrite.engine.interfaces import ModelError

    model = rms_norm_export(False, 20)
    after = copy(model)
    with pytest.raises(ModelError, match="cannot convert the model from opset 20 to 1"):
        optimize(after, 1)
    assert after == model


def test_rewrite_apply_with_opset_writes_the_upgraded_fused_model(tmp_path):
    from rewrite import cli

    model = rms_norm_export(False, 20)
    source, target = tmp_path / "rms.onnx", tmp_path / "out.onnx"
    onnx.save(model, str(source))
    assert cli.main(["apply", str(source), "-o", str(target), "--opset", "23"]) == 0
    written = onnx.load(str(target))
    assert [e.version for e in written.opset_import if e.domain in ("", "ai.onnx")] == [23]
    assert counts(written) == Counter({"RMSNormalization": 1})
    close(model, written, feeds(model, 2, 5))
    assert onnx.load(str(source)) == model  # the input untouched


def test_rewrite_apply_opset_on_a_core_ml_package_is_a_usage_error(tmp_path, capsys):
    from rewrite import cli

    (tmp_path / "m.mlpackage").mkdir()
    assert cli.main(["apply", str(tmp_path / "m.mlpackage"), "-o", str(tmp_path / "o.mlpackage"),
                     "--opset", "23"]) != 0
    assert "--opset is for ONNX models" in capsys.readouterr().err
