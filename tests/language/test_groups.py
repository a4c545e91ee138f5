"""A rule's `group` clause: parsing, checking against the dialect's groups, and MIL's pipeline built from it."""

from __future__ import annotations

import shutil

import pytest

import rewrite
from rewrite import RuleError
from rewrite.backends import pass_groups, schema_for
from rewrite.language import ast
from rewrite.language.fast_parser import parse_fast
from tests.conftest import REPO
from tests.language.test_fast_parser import difference, lark_parse, outcome

RULE = """
dialect {dialect}
rule r "d"
  {group}
  match %o = {op}(x=%i)
  match %i = {op}(x=_)
  rewrite %o -> %i
"""


def mil_rule(group: str) -> str:
    return RULE.format(dialect="mil", group=group, op="relu")


# What the pipeline ran before membership moved from rewrite/mil.py into the
# rules' `group` clauses: each group's rules, in the order they run.
EXPECTED = {
    "cleanup": (
        "sdpa_float_mask_to_bool", "sdpa_causal_fill_mask_to_bool", "gather_nd_of_one_row",
        "gather_nd_of_the_only_row", "fuse_transposes", "fuse_expand_dims", "remove_identity_transpose",
        "remove_cast_round_trip", "fuse_reshapes", "remove_maximum_with_lowest", "remove_noop_slice_update",
        "fold_transpose_into_matmul_y", "fold_transpose_into_matmul_x", "remove_single_value_concat",
        "remove_logical_and_with_true", "add_uniform_embedding_row", "fill_to_scalar",
        "rotary_table_from_positions", "cos_of_a_constant_slice", "sin_of_a_constant_slice",
        "expand_dims_of_a_constant_slice", "causal_mask_over_its_own_columns", "add_rows_without_leading_axes",
        "add_below_reshape", "less_than_one_more", "rows_of_a_table_by_position", "gather_of_a_constant_slice",
        "rotary_table_from_scaled_positions", "fuse_reduce_keep_dims", "fuse_reduce_keep_dims_reshape",
        "remove_broadcast_tiles", "narrow_broadcast_tile", "remove_identity_tile", "remove_matmul_batch_tiles",
        "broadcast_select_operands", "broadcast_select_bool_operands", "constant_tile_reps",
        "tile_reps_from_size_list", "shape_of_fill", "gather_of_scalar_concat", "read_sizes_from_the_input",
        "fold_proved_int_value", "constant_reshape_shape", "merge_slices_from_the_start",
        "read_sliced_sizes_from_the_input",
    ),
    "fusion": (
        "fuse_gelu_tanh", "fuse_gelu_erf", "fuse_logit_softcap", "fold_scaling_into_scaled_tanh",
        "move_transpose_swap_into_matmul_y", "lift_matmul_out_of_batch_one_reshapes",
        "fuse_masked_attention_to_sdpa", "fuse_masked_fill_attention_to_sdpa",
        "fuse_additive_mask_attention_to_sdpa", "remove_double_logical_not", "fuse_attention_to_sdpa",
        "remove_scaling_by_one", "sdpa_float_mask_to_bool", "sdpa_causal_fill_mask_to_bool",
        "gather_nd_of_one_row", "gather_nd_of_the_only_row", "fuse_expand_dims", "remove_identity_transpose",
        "remove_maximum_with_lowest", "fold_transpose_into_matmul_y", "fold_transpose_into_matmul_x",
        "fold_scaling_chain", "remove_single_value_concat", "remove_logical_and_with_true", "fill_to_scalar",
        "rotary_table_from_positions", "cos_of_a_constant_slice", "sin_of_a_constant_slice",
        "expand_dims_of_a_constant_slice", "causal_mask_over_its_own_columns", "add_rows_without_leading_axes",
        "add_below_reshape", "less_than_one_more", "rows_of_a_table_by_position", "gather_of_a_constant_slice",
        "rotary_table_from_scaled_positions", "fuse_reduce_keep_dims", "fuse_reduce_keep_dims_reshape",
        "remove_broadcast_tiles", "remove_identity_tile", "constant_tile_reps", "tile_reps_from_size_list",
        "shape_of_fill", "gather_of_scalar_concat", "read_sizes_from_the_input", "fold_proved_int_value",
        "constant_reshape_shape", "fold_scalar_into_zero_fill", "merge_slices_from_the_start",
        "read_sliced_sizes_from_the_input", "replace_decomposed_softmax", "replace_decomposed_softmax_wide_sum",
        "drop_softmax_max_shift", "drop_softmax_constant_shift", "remove_select_of_masked_exp",
        "replace_masked_decomposed_softmax", "fuse_selects_on_one_condition",
    ),
    "late": (
        "remove_scaling_by_one", "fold_scaling_chain", "fill_to_scalar", "fuse_rmsnorm", "fuse_rmsnorm_rows",
        "fold_norm_scale_into_weight", "fuse_reduce_keep_dims", "fuse_reduce_keep_dims_reshape",
        "replace_decomposed_softmax", "drop_softmax_max_shift", "replace_masked_decomposed_softmax",
    ),
    "settle": (
        "sdpa_causal_fill_mask_to_bool", "sdpa_mask_without_leading_unit_axes",
        "sdpa_mask_slice_without_leading_unit_axes", "gather_nd_of_one_row", "gather_nd_of_the_only_row",
        "sdpa_mask_without_a_true_conjunct", "sdpa_select_mask_without_a_true_conjunct", "fuse_expand_dims",
        "remove_logical_and_with_true", "fill_to_scalar", "rotary_table_from_positions",
        "cos_of_a_constant_slice", "sin_of_a_constant_slice", "expand_dims_of_a_constant_slice",
        "causal_mask_over_its_own_columns", "add_rows_without_leading_axes", "add_below_reshape",
        "less_than_one_more", "rows_of_a_table_by_position", "causal_mask_from_a_constant_triangle",
        "gather_of_a_constant_slice", "rotary_table_from_scaled_positions",
        "float_band_mask_from_a_constant_band", "causal_select_mask_from_a_constant_triangle",
        "fuse_reduce_keep_dims", "fuse_reduce_keep_dims_reshape", "read_sizes_from_the_input",
        "fold_proved_int_value", "merge_slices_from_the_start", "read_sliced_sizes_from_the_input",
        "replace_decomposed_softmax", "drop_softmax_max_shift", "replace_masked_decomposed_softmax",
        "fuse_selects_on_one_condition",
    ),
    "index_guards": (
        "remove_nonnegative_index_guard",
    ),
}


@pytest.fixture(scope="module")
def library():
    return rewrite.load_rules(dialects=["mil"])


def test_each_pipeline_group_has_the_rules_it_had(library):
    assert {group: tuple(r.name for r in library.group(group).rules) for group in pass_groups("mil")} == EXPECTED


def test_every_shipped_mil_rule_is_in_a_group(library):
    assert [rule.name for rule in library.rules if not rule.group_names] == []


def test_the_pipeline_places_every_group_the_backend_names():
    from rewrite.mil import GROUPS

    assert tuple(group.group for group in GROUPS) == pass_groups("mil")


def test_the_registered_passes_run_each_groups_rules(library):
    from coremltools.converters.mil.mil.passes.pass_registry import PASS_REGISTRY

    from rewrite.mil import GROUPS, register_groups

    register_groups(library)
    for group in GROUPS:
        assert [r.name for r in PASS_REGISTRY[group.pass_name].rule_set.rules] == list(EXPECTED[group.group])


def test_a_renamed_rule_stays_in_its_groups(tmp_path):
    folder = tmp_path / "mil"
    shutil.copytree(REPO / "rules" / "mil", folder)
    path = folder / "activations.rules"
    path.write_text(path.read_text().replace("rule fuse_gelu_tanh\n", "rule gelu_tanh_renamed\n"))
    rules = rewrite.load_rules(folder)
    fusion = [r.name for r in rules.group("fusion").rules]
    assert fusion == [name.replace("fuse_gelu_tanh", "gelu_tanh_renamed") for name in EXPECTED["fusion"]]


def test_a_rule_in_no_group_is_not_in_the_pipeline(write_rules):
    rules = rewrite.load_rules(write_rules(mil_rule("")))
    assert rules.rules and all(not rules.group(group).rules for group in pass_groups("mil"))


def test_several_clauses_and_names(write_rules):
    (rule,) = rewrite.load_rules(write_rules(mil_rule("group cleanup, settle group late"))).rules
    assert rule.group_names == ("cleanup", "settle", "late")
    assert rule.groups[0] == ast.Group(("cleanup", "settle"), rule.span)


@pytest.mark.parametrize("text", [
    mil_rule("group cleanup"),
    mil_rule("group cleanup, fusion,late"),
    mil_rule("group cleanup group settle"),
    'dialect mil\nrule r "d" match %o = relu(x=%i) where rank(%i) == 2 group fusion rewrite %o -> %i group late\n',
    # `group` is a name where a name is asked for.
    'dialect onnx\nrule r "d" group a match %c = Conv(X=%x, group=%g) rewrite %c -> %x\n',
])
def test_both_parsers_read_a_group_clause_alike(text):
    assert outcome(text) == "same"
    assert lark_parse(text).rules[0].groups


@pytest.mark.parametrize("text", [
    mil_rule("group"),
    mil_rule("group cleanup,"),
    mil_rule("group cleanup fusion"),
    mil_rule('group "cleanup"'),
])
def test_both_parsers_refuse_a_malformed_group_clause(text):
    assert outcome(text) == "both refuse"


def test_spans_point_at_each_name():
    text = mil_rule("group cleanup, fusion").lstrip("\n")
    lark_file, fast_file = lark_parse(text), parse_fast(text, "t.rules", text.split("\n"))
    assert difference(lark_file, fast_file) is None
    (group,) = lark_file.rules[0].groups
    assert (group.span.line, group.span.column, group.span.end_line, group.span.end_column) == (3, 3, 3, 24)
    assert [(s.line, s.column, s.end_column) for s in group.name_spans] == [(3, 9, 16), (3, 18, 24)]


def _error(write_rules, text) -> str:
    path = write_rules(text)
    with pytest.raises(RuleError) as raised:
        rewrite.load_rules(path)
    return raised.value.render().replace(str(path), "test.rules")


def test_an_unknown_group_is_an_error_at_its_name(write_rules):
    assert _error(write_rules, mil_rule("group cleanup, fusoin")) == (
        "test.rules:3:18: error: unknown mil group 'fusoin' (the groups are cleanup, fusion, late, settle, "
        "index_guards); did you mean 'fusion'?\n"
        "    group cleanup, fusoin\n"
        "                   ^"
    )


def test_a_group_named_twice_is_an_error(write_rules):
    assert _error(write_rules, mil_rule("group late group late")).startswith(
        "test.rules:3:20: error: rule 'r' is in group 'late' already"
    )


def test_an_onnx_rule_names_no_group(write_rules):
    text = RULE.format(dialect="onnx", group="group cleanup", op="Relu").replace("(x=", "(X=")
    assert _error(write_rules, text) == (
        "test.rules:3:9: error: unknown onnx group 'cleanup': onnx rules have no groups (the backend has no pass "
        "pipeline to place them in); remove the 'group' clause\n"
        "    group cleanup\n"
        "          ^"
    )
    rewrite.load_rules(write_rules(text.replace("group cleanup", "")))  # and loads without it


def test_each_schema_names_its_backends_groups():
    from rewrite.backends.mil import SCHEMA as MIL_SCHEMA
    from rewrite.backends.onnx import SCHEMA as ONNX_SCHEMA

    assert schema_for("mil").groups == MIL_SCHEMA.groups == ("cleanup", "fusion", "late", "settle", "index_guards")
    assert schema_for("onnx").groups == ONNX_SCHEMA.groups == ()
