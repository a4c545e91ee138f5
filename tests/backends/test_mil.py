"""The MIL adapter, .mlpackage I/O and the coremltools pass integration."""

from __future__ import annotations

import numpy as np
import pytest

import rewrite
from rewrite.backends.mil import (
    SCHEMA,
    MilAdapter,
    MilError,
    count_ops,
    ct,
    load_mlpackage,
    mb,
    register_graph_pass,
    save_mlpackage,
)
from rewrite.backends.mil.reference import evaluate
from rewrite.language.logic import Symbol

TILES = rewrite.load_rules().only("remove_broadcast_tiles")


def _symbolic_program():
    from coremltools.converters.mil.mil import get_new_symbol

    batch = get_new_symbol()
    weight = np.arange(32, dtype=np.float32).reshape(8, 4) / 32

    @mb.program(input_specs=[mb.TensorSpec(shape=(batch, 8)), mb.TensorSpec(shape=(batch, 1))],
                opset_version=ct.target.iOS18)
    def program(x, y):
        wide = mb.tile(x=y, reps=[1, 8], name="wide")
        product = mb.mul(x=x, y=wide, name="product")
        return mb.matmul(x=product, y=weight, name="out")

    return program


def test_schema_reads_the_coremltools_registry():
    tile = SCHEMA.signature("tile")
    assert [i.name for i in tile.inputs] == ["x", "reps"]
    concat = SCHEMA.signature("concat")
    assert concat.input("values").variadic and not concat.input("values").optional
    assert SCHEMA.signature("cond").input("_true_fn") is None  # python plumbing is not an operand
    assert SCHEMA.signature("tlie") is None
    assert "scaled_dot_product_attention" in SCHEMA.op_types()


def test_adapter_view_of_a_program():
    program = _symbolic_program()
    adapter = MilAdapter(program)
    (function,) = adapter.top_blocks()
    tile, mul, matmul = [op for op in adapter.operations(function) if op.op_type != "const"]
    wide = adapter.outputs(tile)[0]
    y = adapter.operand(tile, "x")
    assert adapter.producer(y) is None and adapter.defining_block(y) is function
    assert adapter.consumers(wide) == [mul]
    shape = adapter.shape(wide)
    assert isinstance(shape[0], Symbol) and shape[1] == 8
    assert adapter.dtype(wide) == "fp32"
    np.testing.assert_array_equal(adapter.constant(adapter.operand(tile, "reps")), [1, 8])
    assert adapter.constant(wide) is None
    assert adapter.is_block_output(adapter.outputs(matmul)[0])
    assert not adapter.is_block_output(wide)


def test_round_trip_through_mlpackage_keeps_program_weights_and_target(tmp_path):
    program = _symbolic_program()
    path = tmp_path / "model.mlpackage"
    save_mlpackage(program, path)
    loaded, source = load_mlpackage(path)
    assert source.spec.specificationVersion == ct.target.iOS18
    assert count_ops(loaded, "tile") == 1 and count_ops(loaded, "matmul") == 1
    inputs = {"x": np.random.default_rng(0).normal(size=(3, 8)), "y": np.ones((3, 1))}
    np.testing.assert_allclose(evaluate(loaded, inputs)["out"], evaluate(program, inputs)["out"], rtol=1e-6)

    statistics = TILES.apply(loaded)
    assert statistics.fired("remove_broadcast_tiles") == 1
    loaded.validate()
    again = tmp_path / "again.mlpackage"
    save_mlpackage(loaded, again, source)
    reloaded, resource = load_mlpackage(again)
    assert resource.spec.specificationVersion == source.spec.specificationVersion
    assert count_ops(reloaded, "tile") == 0
    assert count_ops(reloaded) == count_ops(loaded)
    np.testing.assert_allclose(evaluate(reloaded, inputs)["out"], evaluate(program, inputs)["out"], rtol=1e-6)


def test_saving_without_rules_changes_nothing(tmp_path):
    path = tmp_path / "a.mlpackage"
    save_mlpackage(_symbolic_program(), path)
    first, source = load_mlpackage(path)
    save_mlpackage(first, tmp_path / "b.mlpackage", source)
    second, _ = load_mlpackage(tmp_path / "b.mlpackage")
    # The milproto frontend mints fresh symbols and block names on each load; all else is equal.
    assert _without_symbols(first) == _without_symbols(second)


def _without_symbols(program) -> str:
    import re

    text = re.sub(r"\bis\d+\b", "SYMBOL", str(program))
    return re.sub(r"\bblock\d+\b", "BLOCK", text)


def test_function_output_keeps_its_name():
    @mb.program(input_specs=[mb.TensorSpec(shape=(4, 8)), mb.TensorSpec(shape=(4, 1))],
                opset_version=ct.target.iOS18)
    def program(x, y):
        wide = mb.tile(x=y, reps=[1, 8], name="wide")
        return mb.add(x=x, y=wide, name="result")

    inputs = {"x": np.ones((4, 8)), "y": np.arange(4.0).reshape(4, 1)}
    before = evaluate(program, inputs)
    adapter = MilAdapter(program)
    function = program.functions["main"]
    add = [op for op in function.operations if op.op_type == "add"][0]
    x = adapter.operand(add, "x")
    new = adapter.build("sub", {"x": x, "y": 0.0}, add, "subtract_zero")
    adapter.replace_all_uses(adapter.outputs(add)[0], new)
    assert [v.name for v in function.outputs] == ["result"]
    program.validate()
    after = evaluate(program, inputs)
    assert list(after) == ["result"]
    assert after["result"].shape == before["result"].shape


def test_missing_and_corrupt_packages_are_clear_errors(tmp_path):
    with pytest.raises(MilError, match="no such file"):
        load_mlpackage(tmp_path / "nothing.mlpackage")
    broken = tmp_path / "broken.mlpackage"
    broken.mkdir()
    (broken / "Manifest.json").write_text("{ not json")
    with pytest.raises(MilError, match="broken.mlpackage"):
        load_mlpackage(broken)


def test_rule_set_as_a_coremltools_pass_in_a_pipeline():
    from coremltools.converters.mil.mil.passes.pass_pipeline import PassPipeline, PassPipelineManager

    name = register_graph_pass(TILES, "rewrite_tests::remove_broadcast_tiles")
    pipeline = PassPipeline.EMPTY
    pipeline.append_pass(name)
    pipeline.append_pass("common::dead_code_elimination")
    program = _symbolic_program()
    inputs = {"x": np.random.default_rng(1).normal(size=(2, 8)), "y": np.full((2, 1), 3.0)}
    before = evaluate(program, inputs)["out"]
    PassPipelineManager.apply_pipeline(program, pipeline)
    assert count_ops(program, "tile") == 0
    np.testing.assert_allclose(evaluate(program, inputs)["out"], before, rtol=1e-6)
    with pytest.raises(ValueError):
        register_graph_pass(TILES, "no_namespace")


def test_a_pass_inside_ct_convert(tmp_path):
    register_graph_pass(TILES, "rewrite_tests::tiles_in_convert")
    pipeline = ct.PassPipeline.EMPTY
    pipeline.append_pass("rewrite_tests::tiles_in_convert")

    @mb.program(input_specs=[mb.TensorSpec(shape=(4, 8)), mb.TensorSpec(shape=(4, 1))],
                opset_version=ct.target.iOS18)
    def program(x, y):
        return mb.add(x=x, y=mb.tile(x=y, reps=[1, 8]), name="out")

    model = ct.convert(program, convert_to="mlprogram", pass_pipeline=pipeline,
                       minimum_deployment_target=ct.target.iOS18, skip_model_load=True)
    model.save(str(tmp_path / "m.mlpackage"))
    loaded, _ = load_mlpackage(tmp_path / "m.mlpackage")
    assert count_ops(loaded, "tile") == 0
    inputs = {"x": np.ones((4, 8)), "y": np.arange(4.0).reshape(4, 1)}
    np.testing.assert_allclose(evaluate(loaded, inputs)["out"], np.ones((4, 8)) + np.arange(4.0).reshape(4, 1))


def _program_from_example(rules_text: str, tmp_path):
    from rewrite.backends.mil.examples import build_example
    from rewrite.examples import example_ops

    path = tmp_path / "program.rules"
    path.write_text(rules_text)
    (example,) = rewrite.load_rules(path).rules[0].examples
    inputs = [(s.var.lstrip("%"), s.dtype, s.dims) for s in example.inputs]
    return build_example(inputs, example_ops(example.statements), [v.lstrip("%") for v in example.outputs])


@pytest.mark.parametrize("check_types", [False, True])
def test_a_consumer_whose_type_inference_rejects_the_new_operand_refuses_the_rewrite(tmp_path, check_types):
    """The tile's reps are proved [B, 1, 1], so its old and new types are proved equal, but the
    concat after it cannot take a (B, 1, 1) next to a (B, 1, 2) (a program that fails at run
    time anyway): coremltools' own inference refuses, so the guard does. Checked mode says so
    with the rule's name, as for every refusal; neither mode changes the program."""
    program = _program_from_example("""dialect mil
rule program "holds the program"
  match %r = relu(x=%x)
  rewrite %r -> %x
  example "a CLS token of one column concatenated to rows of two"
    input %x: fp32[B, 1, 2]
    input %token: fp32[1, 1, 1]
    %shape = shape(x=%x)
    %b = gather(x=%shape, indices=0, axis=0)
    %size = concat(values=(%b, -1, -1), axis=0, interleave=false)
    %free = equal(x=%size, y=-1)
    %picked = select(cond=%free, a=[1, 1, 4], b=%size)
    %reps = real_div(x=%picked, y=[1, 1, 4])
    %t = tile(x=%token, reps=%reps)
    %out = concat(values=(%t, %x), axis=1, interleave=false)
    output %out
  unchanged
""", tmp_path)
    before = [op.op_type for op in program.functions["main"].operations]
    rules = rewrite.load_rules().only("tile_reps_from_size_list")
    if check_types:
        with pytest.raises(rewrite.UnsoundRewriteError, match="tile_reps_from_size_list.*rejects the new operand"):
            rules.apply(program, check_types=True)
    else:
        statistics = rules.apply(program)
        assert statistics.fired("tile_reps_from_size_list") == 0
        assert statistics.rules["tile_reps_from_size_list"].refused == 1
    assert [op.op_type for op in program.functions["main"].operations] == before


@pytest.mark.parametrize("check_types", [False, True])
def test_a_replacement_coremltools_types_apart_must_be_taken_by_the_consumers_own_inference(tmp_path, check_types):
    """coremltools types select(cond, a, b) by a and b alone: with a (L, L) cond and scalar
    branches it states (), though at run time it is (L, L). The adapter's shape is the run
    time one, so the mask's old and new shapes agree; but SDPA's own type inference, which
    coremltools' later passes run, fails on a rank-0 mask. Where the IR states the two types
    apart, the guard has the consumers' inference take the new operand, so the rule is refused
    (in checked mode with its name) and the program is left as it was, instead of a pass later
    crashing on it."""
    program = _program_from_example("""dialect mil
rule program "holds the program"
  match %r = relu(x=%x)
  rewrite %r -> %x
  example "a causal float mask into SDPA"
    input %q: fp32[1, 2, L, 8]
    %size = shape(x=%q)
    %n = gather(x=%size, indices=2, axis=0)
    %pair = concat(values=(%n, %n), axis=0, interleave=false)
    %all = fill(shape=%pair, value=true)
    %tril = band_part(x=%all, lower=-1, upper=0)
    %float = cast(x=%tril, dtype="fp32")
    %complement = sub(x=1.0, y=%float)
    %mask = mul(x=-30000.0, y=%complement)
    %out = scaled_dot_product_attention(query=%q, key=%q, value=%q, attn_mask=%mask)
    output %out
  unchanged
""", tmp_path)
    rules_path = tmp_path / "select.rules"
    rules_path.write_text("""dialect mil
rule mask_as_select "k(1 - cast(m)) as select(m, k0, k), which coremltools types by its branches"
  match %mask = mul(x=%k, y=sub(x=_, y=cast(x=%m, dtype=_)))
  where is_const(%k) and rank(%k) == 0
  rewrite %mask -> select(cond=%m, a=as_dtype(const(%k) * 0.0, dtype(%mask)), b=as_dtype(const(%k), dtype(%mask)))
""")
    rules = rewrite.load_rules(rules_path)
    before = [op.op_type for op in program.functions["main"].operations]
    if check_types:
        with pytest.raises(rewrite.UnsoundRewriteError, match="mask_as_select.*rejects the new operand"):
            rules.apply(program, check_types=True)
    else:
        statistics = rules.apply(program)
        assert statistics.fired("mask_as_select") == 0
        assert statistics.rules["mask_as_select"].refused == 1
    assert [op.op_type for op in program.functions["main"].operations] == before
    sdpa = [op for op in program.functions["main"].operations if op.op_type == "scaled_dot_product_attention"]
    sdpa[0].type_value_inference(overwrite_output=True)  # still a program coremltools can type


def test_a_slice_coremltools_types_wrongly_has_no_shape_nor_does_what_is_computed_from_it(tmp_path):
    """x[1:] of a (1, n) tensor, with the end a runtime value: coremltools states (1, n), though
    it is (0, n) at run time, and the add after it (1, 2, 4) though it is (0, 2, 4). The adapter
    states no shape for either (its own proof gives the true one), so the rule that would read
    the add's shape does not fire; a slice from the start is typed right and keeps its shape."""
    from rewrite.backends.mil.adapter import MilAdapter

    def program(begin: str):
        return _program_from_example(f"""dialect mil
rule program "holds the program"
  match %r = relu(x=%x)
  rewrite %r -> %x
  example "token types sliced"
    input %words: fp32[1, 2, 4]
    input %ids: int32[1, B]
    %shape = shape(x=%ids)
    %zeros = fill(shape=%shape, value=0)
    %types = slice_by_index(x=%zeros, begin={begin}, end=%shape, end_mask=[true, false])
    %rows = gather(x=[[0.5, 1.0, -2.0, 3.0], [1.0, 2.0, 3.0, 4.0]], indices=%types, axis=0, batch_dims=0)
    %sum = add(x=%words, y=%rows)
    output %sum
  unchanged
""", tmp_path)

    wrong = program("[1, 0]")
    adapter = MilAdapter(wrong)
    values = {op.outputs[0].name: op.outputs[0] for op in wrong.functions["main"].operations}
    assert _shape_of(values["types"]) == (1, "is") and _shape_of(values["sum"]) == (1, 2, 4)  # as stated
    assert adapter.shape(values["types"]) is None and adapter.shape(values["sum"]) is None
    assert adapter.proven_shape(values["sum"])[0] == 0
    assert adapter.shape(values["zeros"]) is not None
    rules = rewrite.load_rules().only("add_uniform_embedding_row")
    assert rules.apply(wrong).fired("add_uniform_embedding_row") == 0

    right = program("[0, 0]")
    values = {op.outputs[0].name: op.outputs[0] for op in right.functions["main"].operations}
    assert MilAdapter(right).shape(values["sum"]) == (1, 2, 4)


def _shape_of(var):
    return tuple(d if isinstance(d, int) else "is" for d in var.shape)
