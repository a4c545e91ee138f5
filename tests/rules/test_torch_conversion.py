"""The PyTorch path, as most Core ML users convert: `torch.jit.trace` (or
`torch.export`), then `ct.convert` with coremltools' own torch frontend, at
iOS18, static and with a `RangeDim` sequence; with coremltools' default pass
pipeline and with `rewrite.mil.build_pass_pipeline()`; and `rewrite apply` on
the raw `.mlpackage`.

Every conversion here goes through `aten::size` arithmetic (a view by the
input's length, a causal mask built from it), which coremltools 9.0 casts
with `int()` of a one-element array: numpy 2.4 made that an error, so these
tests fail under the numpy pyproject.toml keeps out.

Values are the reference evaluator's (coremltools cannot run a model off
macOS) against torch's, in fp32, at two sequence lengths for flexible models.
"""

from __future__ import annotations

import math
import warnings
from collections import Counter

import numpy as np
import pytest
import torch  # noqa: E402 - `.[test]` installs it: a missing one must fail, not skip
from coremltools.converters.mil.mil.passes.pass_registry import PASS_REGISTRY  # noqa: E402
from coremltools.converters.mil.mil.scope import ScopeSource  # noqa: E402
from torch import nn  # noqa: E402

import rewrite  # noqa: E402
from rewrite import cli  # noqa: E402
from rewrite.backends.mil import count_ops, ct, load_mlpackage  # noqa: E402
from rewrite.backends.mil.reference import evaluate  # noqa: E402
from rewrite.mil import GROUPS, build_pass_pipeline, register_groups  # noqa: E402

WIDTH = 32
DEFAULT_LENGTH = 8
LENGTHS = (5, 11)  # what flexible models are evaluated at, besides neither being the default
RTOL, ATOL = 1e-3, 1e-5


# ------------------------------------------------------------------ models


class Conv1D(nn.Module):
    """GPT-2's projection: `addmm` on the input viewed as rows, viewed back by
    its `size()`. The `size()` reads the input before the view, a use the
    frontend leaves dead, which decides what coremltools' reshape merging does
    (see the pipeline placement tests)."""

    def __init__(self, inputs: int, outputs: int):
        super().__init__()
        self.outputs = outputs
        self.weight = nn.Parameter(torch.randn(inputs, outputs) * 0.2)
        self.bias = nn.Parameter(torch.randn(outputs) * 0.1)

    def forward(self, x):
        shape = x.size()[:-1] + (self.outputs,)
        return torch.addmm(self.bias, x.view(-1, x.size(-1)), self.weight).view(shape)


class CausalSelfAttention(nn.Module):
    """A GPT-2 block as transformers' eager attention writes it: a causal mask
    from `tril`, applied with `masked_fill(~mask, -inf)`, which coremltools
    lowers to a `select` whose fill broadcasts into the sequence
    (`broadcast_select_operands`); heads merged by `view(size()[:-2] + ...)`."""

    def __init__(self, width: int = WIDTH, heads: int = 4, gelu: str = "tanh"):
        super().__init__()
        self.heads = heads
        self.ln_1, self.ln_2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv, self.proj = Conv1D(width, 3 * width), Conv1D(width, width)
        self.mlp = nn.Sequential(Conv1D(width, 4 * width), nn.GELU(approximate=gelu), Conv1D(4 * width, width))

    def forward(self, x):
        batch, length, width = x.shape
        head = width // self.heads
        q, k, v = (
            t.view(batch, length, self.heads, head).transpose(1, 2)
            for t in self.qkv(self.ln_1(x)).split(width, dim=-1)
        )
        scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(head))
        mask = torch.tril(torch.ones(length, length, dtype=torch.bool))
        weights = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)
        merged = (weights @ v).transpose(1, 2).contiguous()
        x = x + self.proj(merged.view(merged.size()[:-2] + (width,)))
        return x + self.mlp(self.ln_2(x))


class SiluMlp(nn.Module):
    """LayerNorm, then a SiLU MLP, with a residual."""

    def __init__(self, width: int = WIDTH):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.up, self.down = nn.Linear(width, 2 * width), nn.Linear(2 * width, width)

    def forward(self, x):
        return x + self.down(nn.functional.silu(self.up(self.norm(x))))


class Plain(nn.Module):
    """Linear, relu, linear: nothing for any shipped rule to do."""

    def __init__(self, width: int = WIDTH):
        super().__init__()
        self.up, self.down = nn.Linear(width, 2 * width), nn.Linear(2 * width, width)

    def forward(self, x):
        return self.down(torch.relu(self.up(x)))


MODELS = {"attention": CausalSelfAttention, "mlp": SiluMlp, "plain": Plain}


def make(name: str, **options) -> nn.Module:
    torch.manual_seed(0)
    return MODELS[name](**options).eval()


def example(length: int = DEFAULT_LENGTH, seed: int = 0):
    return torch.randn(1, length, WIDTH, generator=torch.Generator().manual_seed(seed))


def input_type(flexible: bool):
    length = ct.RangeDim(1, 64, default=DEFAULT_LENGTH) if flexible else DEFAULT_LENGTH
    return ct.TensorType(name="x", shape=(1, length, WIDTH))


def convert(module: nn.Module, flexible: bool, pipeline=None, precision=ct.precision.FLOAT32, **options):
    """`module` traced and converted to a pymil Program (`milinternal`) at iOS18."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # tracer and renaming warnings
        traced = torch.jit.trace(module, example())
        return ct.convert(
            traced,
            inputs=[input_type(flexible)],
            convert_to=options.pop("convert_to", "milinternal"),
            minimum_deployment_target=ct.target.iOS18,
            compute_precision=precision,
            pass_pipeline=pipeline if pipeline is not None else ct.PassPipeline.DEFAULT,
            **options,
        )


def assert_computes(program, module: nn.Module, flexible: bool) -> None:
    """`program` computes what `module` does (fp32), at two lengths if flexible."""
    for seed, length in enumerate(LENGTHS if flexible else (DEFAULT_LENGTH,)):
        x = example(length, seed + 1)
        with torch.no_grad():
            want = module(x).numpy()
        (got,) = evaluate(program, {"x": x.numpy()}).values()
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)


def fired(group: str) -> dict[str, int]:
    """The rules that fired in the last run of pass `group`, with their counts."""
    statistics = PASS_REGISTRY[group].last_statistics
    return {name: s.fires for name, s in statistics.rules.items() if s.fires}


@pytest.fixture
def library_registered():
    """Tests that register the groups with other rules put the library back after."""
    yield
    register_groups()


def op_types(program) -> list[str]:
    types = []
    pending = [program.functions["main"]]
    while pending:
        for op in pending.pop(0).operations:
            types.append(op.op_type)
            pending.extend(op.blocks)
    return types


# ------------------------------------------------------------------ the frontend itself


@pytest.mark.parametrize("flexible", [False, True], ids=["static", "flexible"])
def test_the_torch_frontend_converts_and_computes_what_torch_does(flexible):
    module = make("attention")
    program = convert(module, flexible)
    assert count_ops(program, "softmax") == 1 and count_ops(program, "select") == 1
    assert_computes(program, module, flexible)


# ------------------------------------------------------------------ scopes


def _scopes_of_created_ops(program, rule: str):
    created = [op for op in program.functions["main"].operations if op.name.startswith(rule)]
    assert created, f"{rule} made no op"
    return created


def test_ops_a_rule_creates_carry_the_scopes_of_the_op_they_stand_for(library_registered):
    # Only the rule that widens the select's fill: it fires on a flexible
    # causal mask whatever the other rules do to the attention around it.
    rule = "broadcast_select_operands"
    module = make("attention")
    program = convert(module, True, build_pass_pipeline(rules=rewrite.load_rules().only(rule)))
    assert fired("rewrite::cleanup") == {rule: 1}
    (select,) = [op for op in program.functions["main"].operations if op.op_type == "select"]
    for op in _scopes_of_created_ops(program, rule):
        # The torch module the masked_fill came from, as on the select itself;
        # and the pass history names the pass and the rule.
        for source in (ScopeSource.TORCHSCRIPT_MODULE_NAME, ScopeSource.TORCHSCRIPT_MODULE_TYPE):
            assert op.scopes[source] == select.scopes[source] != []
        history = op.scopes[ScopeSource.COREMLTOOLS_GRAPH_PASS]
        assert history[:2] == ["cleanup", rule], history
    assert_computes(program, module, True)


def test_the_whole_pipeline_converts_a_flexible_masked_fill_attention():
    # It used to fail in the first dead_code_elimination after the rule fired:
    # "op broadcast_select_operands_0_value_0 ... is missing essential scopes
    # ScopeSource.TORCHSCRIPT_MODULE_NAME".
    module = make("attention")
    program = convert(module, True, build_pass_pipeline())
    assert fired("rewrite::cleanup").get("broadcast_select_operands") == 1
    assert_computes(program, module, True)


def test_scopes_under_torch_export(library_registered):
    rule = "broadcast_select_operands"
    # coremltools 9.0's torch.export frontend converts gelu(approximate="tanh")
    # as the exact gelu (1.5e-4 off): an exact one here.
    module = make("attention", gelu="none")
    length = torch.export.Dim("length", min=2, max=64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        exported = torch.export.export(module, (example(),), dynamic_shapes={"x": {1: length}})
        program = ct.convert(
            exported.run_decompositions({}),
            convert_to="milinternal",
            minimum_deployment_target=ct.target.iOS18,
            compute_precision=ct.precision.FLOAT32,
            pass_pipeline=build_pass_pipeline(rules=rewrite.load_rules().only(rule)),
        )
    assert fired("rewrite::cleanup") == {rule: 1}
    for op in _scopes_of_created_ops(program, rule):
        (trace,) = op.scopes[ScopeSource.EXIR_STACK_TRACE]
        assert "masked_fill" in trace  # the source line of the op it stands for
        assert rule in op.scopes[ScopeSource.COREMLTOOLS_GRAPH_PASS]
    assert_computes(program, module, True)


# ------------------------------------------------------------------ placement in the pipeline


@pytest.mark.parametrize("name", ["attention", "mlp", "plain"])
@pytest.mark.parametrize("flexible", [False, True], ids=["static", "flexible"])
def test_the_groups_alone_change_nothing_coremltools_passes_do(name, flexible, library_registered):
    # fp16, as ct.convert does by default (add_int16_cast runs). What
    # coremltools' passes make of a program depends on which dead ops are
    # still there when they run: a dead_code_elimination after each group
    # (as the pipeline once had) let the flexible attention's two reshapes
    # merge, which the default pipeline does not do (92 ops against 94).
    module = make(name)
    default = convert(module, flexible, precision=ct.precision.FLOAT16)
    nothing = rewrite.load_rules().only()
    ours = convert(module, flexible, build_pass_pipeline(rules=nothing), precision=ct.precision.FLOAT16)
    assert count_ops(ours) == count_ops(default)
    assert op_types(ours) == op_types(default)


@pytest.mark.parametrize("flexible", [False, True], ids=["static", "flexible"])
def test_the_library_where_no_rule_fires_changes_nothing(flexible):
    module = make("plain")
    default = convert(module, flexible, precision=ct.precision.FLOAT16)
    ours = convert(module, flexible, build_pass_pipeline(), precision=ct.precision.FLOAT16)
    assert all(fired(group.pass_name) == {} for group in GROUPS)
    assert op_types(ours) == op_types(default)
    fp32 = convert(module, flexible, build_pass_pipeline())
    assert Counter(op_types(fp32)) == Counter({"const": 4, "linear": 2, "relu": 1})
    assert_computes(fp32, module, flexible)


# ------------------------------------------------------------------ rewrite apply on the raw package


def _feature(spec, name):
    (feature,) = [f for f in spec.description.input if f.name == name]
    return feature


def test_rewrite_apply_keeps_the_input_spec_and_the_values(tmp_path, capsys):
    module = make("attention")
    raw, out = tmp_path / "raw.mlpackage", tmp_path / "out.mlpackage"
    convert(
        module, True, ct.PassPipeline.EMPTY, convert_to="mlprogram", skip_model_load=True
    ).save(str(raw))
    assert cli.main(["apply", str(raw), "-o", str(out)]) == 0
    assert "wrote" in capsys.readouterr().out
    before, _ = load_mlpackage(raw)
    after, source = load_mlpackage(out)
    feature = _feature(source.spec, "x")
    assert feature == _feature(load_mlpackage(raw)[1].spec, "x")  # name, dtype, ranges, default
    array = feature.type.multiArrayType
    assert array.dataType == array.FLOAT32
    assert list(array.shape) == [1, DEFAULT_LENGTH, WIDTH]  # the RangeDim's default, not its lower bound
    assert [(r.lowerBound, r.upperBound) for r in array.shapeRange.sizeRanges] == [(1, 1), (1, 64), (WIDTH, WIDTH)]
    assert count_ops(after) <= count_ops(before) + 3  # at most the select's widening (fill_like, add, const)
    assert_computes(after, module, True)
