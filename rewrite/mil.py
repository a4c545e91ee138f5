"""The shipped MIL rules as coremltools graph passes, placed in a pipeline.

    import coremltools as ct
    from rewrite.mil import build_pass_pipeline

    model = ct.convert(program, pass_pipeline=build_pass_pipeline(), ...)

The rules run in five groups, each registered as one graph pass and placed
relative to coremltools' default passes, the way a converter places its
hand-written passes: cleanups before constants are folded, fusions before
matmul/bias fusion, a late group after `reduce_mean` is formed (which can
expose reductions to fuse again), a settling group after coremltools
first merges duplicate ops (which makes equal values identical), and the
index guards coremltools adds last, removed where the indices are proved
non-negative.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass

from rewrite.api import RuleSet, load_rules
from rewrite.backends.mil import Program, ct, register_graph_pass
from rewrite.backends.mil import validation as mil_validation
from rewrite.engine.driver import Statistics
from rewrite.engine.steps import StepLimitReached, Steps, first_breaking_step


@dataclass(frozen=True)
class PassGroup:
    name: str  # the graph pass's registered name
    rules: tuple[str, ...]
    anchor: str  # a default pass to place the group next to
    after: bool  # after the anchor (else before its first occurrence)


# Rules worth running again whenever coremltools' passes may have exposed
# more: runtime fills proved scalar, reductions given their axes back, and the
# softmax steps that need both.
_RESETTLING = (
    "fill_to_scalar", "fuse_reduce_keep_dims", "fuse_reduce_keep_dims_reshape",
    "replace_decomposed_softmax", "replace_masked_decomposed_softmax", "drop_softmax_max_shift",
)

# Rules for programs converted with a flexible input, worth running again once
# coremltools has merged duplicate ops: what reads a runtime length from
# several places reads it from one, which these rules then see.
_FLEXIBLE_SHAPES = (
    "read_sizes_from_the_input", "read_sliced_sizes_from_the_input", "fold_proved_int_value", "fuse_expand_dims",
    "sdpa_decoder_causal_mask_to_bool", "rotary_table_from_scaled_positions",
    "rotary_table_from_positions", "cos_of_a_constant_slice", "sin_of_a_constant_slice",
    "expand_dims_of_a_constant_slice", "causal_mask_over_its_own_columns", "add_rows_without_leading_axes",
    "add_below_reshape", "less_than_one_more", "merge_slices_from_the_start",
    "rows_of_a_table_by_position", "gather_of_a_constant_slice", "gather_nd_of_one_row", "gather_nd_of_the_only_row",
    "remove_logical_and_with_true",
)

GROUPS = (
    PassGroup(
        "rewrite::cleanup",
        (
            "fill_to_scalar", "remove_broadcast_tiles", "narrow_broadcast_tile", "remove_identity_tile",
            "remove_matmul_batch_tiles", "fuse_transposes",
            "remove_identity_transpose", "remove_cast_round_trip", "fuse_reshapes",
            "remove_maximum_with_lowest", "fuse_reduce_keep_dims", "fuse_reduce_keep_dims_reshape",
            "remove_noop_slice_update", "fold_transpose_into_matmul_x", "fold_transpose_into_matmul_y",
            "broadcast_select_operands", "broadcast_select_bool_operands",
            "constant_tile_reps", "tile_reps_from_size_list", "constant_reshape_shape", "add_uniform_embedding_row",
            "shape_of_fill", "gather_of_scalar_concat", "sdpa_float_mask_to_bool", "remove_single_value_concat",
        ) + _FLEXIBLE_SHAPES,
        "common::const_elimination",
        after=False,
    ),
    PassGroup(
        "rewrite::fusion",
        _RESETTLING + (
            "remove_broadcast_tiles", "remove_maximum_with_lowest", "remove_select_of_masked_exp",
            "fuse_selects_on_one_condition", "replace_decomposed_softmax_wide_sum", "drop_softmax_constant_shift",
            "fuse_logit_softcap", "fold_scaling_into_scaled_tanh", "fuse_gelu_erf", "fuse_gelu_tanh",
            "fold_transpose_into_matmul_x", "fold_transpose_into_matmul_y",
            "constant_tile_reps", "tile_reps_from_size_list", "remove_identity_tile", "constant_reshape_shape",
            "fold_scalar_into_zero_fill",
            "lift_matmul_out_of_batch_one_reshapes", "move_transpose_swap_into_matmul_y", "remove_identity_transpose",
            "fuse_masked_attention_to_sdpa", "fuse_masked_fill_attention_to_sdpa",
            "fuse_additive_mask_attention_to_sdpa", "fuse_attention_to_sdpa", "remove_double_logical_not",
            "fold_scaling_chain", "remove_scaling_by_one",
            "shape_of_fill", "gather_of_scalar_concat", "sdpa_float_mask_to_bool", "remove_single_value_concat",
        ) + _FLEXIBLE_SHAPES,
        "common::fuse_matmul_weight_bias",
        after=False,
    ),
    # coremltools' reduction passes can expose a keep_dims max shift only now.
    PassGroup(
        "rewrite::late",
        _RESETTLING + (
            "fuse_rmsnorm", "fuse_rmsnorm_rows", "fold_norm_scale_into_weight", "fold_scaling_chain",
            "remove_scaling_by_one",
        ),
        "common::fuse_reduce_mean",
        after=True,
    ),
    # Once coremltools has merged duplicate ops (two selects by one mask, say),
    # values that were merely equal are the same value, which rules can see.
    PassGroup(
        "rewrite::settle",
        # The causal masks' chains, once the attention they feed is fused (and
        # a float mask it can take as a boolean one is that boolean, which a
        # mask cut from a constant table no longer shows).
        _RESETTLING + (
            "fuse_selects_on_one_condition", "causal_float_mask_from_a_constant_band",
            "causal_select_mask_from_a_constant_triangle", "causal_mask_from_a_constant_triangle",
            "sdpa_mask_without_leading_unit_axes", "sdpa_mask_slice_without_leading_unit_axes",
            "sdpa_mask_without_a_true_conjunct", "sdpa_select_mask_without_a_true_conjunct",
        ) + _FLEXIBLE_SHAPES,
        "common::remove_redundant_ops", after=True,
    ),
    # coremltools guards every gather's indices against negative values only
    # now; the guards of indices proved non-negative go again at once.
    PassGroup(
        "rewrite::index_guards", ("remove_nonnegative_index_guard",), "common::guard_negative_gather_indices",
        after=True,
    ),
)


def register_groups(rules: RuleSet | None = None) -> tuple[str, ...]:
    """Register every group as a coremltools graph pass; return their names."""
    rules = rules if rules is not None else load_rules(dialects=["mil"])
    known = {rule.name for rule in rules.rules}
    for group in GROUPS:
        register_graph_pass(rules.only(*[r for r in group.rules if r in known]), group.name)
    return tuple(group.name for group in GROUPS)


def build_pass_pipeline(base: ct.PassPipeline | None = None, rules: RuleSet | None = None) -> ct.PassPipeline:
    """`base` (default: coremltools' default pipeline) with the rule groups placed in it.

    `base` itself is not changed, and a pipeline that already has the groups
    comes back as it is: calling this twice adds nothing.

    Only the groups are added, no pass of coremltools': a rule removes what
    its rewrite made dead itself, so where no rule fires the program every
    later pass sees is the one the default pipeline would give it. (An extra
    `dead_code_elimination` after each group removed the frontend's dead ops
    earlier than the default pipeline does, which changed what
    `add_int16_cast` and `guard_negative_gather_indices` made of the rest.)
    """
    pipeline = copy.deepcopy(base) if base is not None else ct.PassPipeline.DEFAULT
    register_groups(rules)
    for group in GROUPS:
        if group.name in pipeline.passes:
            continue
        passes = list(pipeline.passes)
        if group.anchor in passes:
            index = passes.index(group.anchor) + (1 if group.after else 0)
        else:
            index = 0 if not group.after else len(passes)
        pipeline.insert_pass(index, group.name)
    return pipeline


def apply(
    program: Program,
    rules: RuleSet | None = None,
    *,
    validate: bool = True,
    original: Callable[[], Program] | None = None,
    **apply_options,
) -> Statistics:
    """Rewrite `program` in place with `rules` (default: the shipped MIL rules), as `RuleSet.apply` does.

    With `validate`, the result must pass coremltools' `Program.validate`
    if the program did; if it does not, `InvalidProgramError` names the rule
    whose rewrite broke it, found by replaying the run on `original()` (the
    program again, as it was: the CLI loads its package again). Without
    `original` the error names only the rules that fired. The program is
    then not to be used.
    """
    rules = rules if rules is not None else load_rules(dialects=["mil"])
    statistics = rules.apply(program, **apply_options)
    if not validate or not statistics.fires:
        return statistics  # nothing changed: whatever validation finds is no change of ours
    found = mil_validation.problem(program)
    if found is None:
        return statistics
    fired = ", ".join(name for name, rule in statistics.rules.items() if rule.fires)
    if original is None:
        raise mil_validation.InvalidProgramError(found, None, None, f"the run, in which fired {fired}")
    if mil_validation.problem(original()) is not None:
        return statistics  # it was not valid to begin with: no promise to keep
    quiet = {**apply_options, "progress": None}

    def replay(steps: Steps) -> Program:
        copy = original()
        try:
            rules.apply(copy, steps=steps, **quiet)
        except StepLimitReached:
            pass
        return copy

    culprit = first_breaking_step(replay, statistics.fires, mil_validation.problem)
    step, maker = culprit if culprit is not None else (None, None)
    raise mil_validation.InvalidProgramError(found, maker, step)
