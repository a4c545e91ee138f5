"""Mutation score of the shipped rule library: is every condition needed, or known harmless to drop?

    python bench/mutation_score.py [--trials 200] [--rule NAME ...] [--markdown]

Each mutant is the shipped library with one change to one rule, as an
author would make it in the text:

- each `where` clause deleted, whole;
- each top-level conjunct of a clause that has several (`a and b and c`) deleted;
- with `--constants`, each number of a condition or of the rewrite changed
  (a float to one significant digit, or halved where that is itself; an int
  plus one): 0.044715 -> 0.04, 0.5 -> 0.25, an axis -1 -> -2. Keyword
  arguments (tolerances such as `close(..., rel=1e-6)`) are not changed. A constant
  mutant that verify finds nothing wrong with and that no instance fires
  (NONE) is sound by default: it rewrites nothing.

A mutant that loads is *caught* when one of the rule's own examples fails,
or when `verify` finds a counterexample (on instances shaped by the full
rule, so the generator aims where the deleted condition mattered). A
mutant that is not caught must have an entry in `ARGUMENTS`: a one-line
reason the rule is sound without that condition. The script exits 1 if
any uncaught mutant lacks one, so the table in a closing note is complete.
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

import rewrite
from rewrite.examples import run_examples
from rewrite.language import ast
from rewrite.verify import verify_rule

# Why a rule stays sound without a condition, for the classes of condition
# whose argument is the same in every rule (`general_argument`), and then one
# by one (`ARGUMENTS`, keyed by rule and deleted text, whitespace collapsed).
GUARD = ("where the replacement's type differs, the engine's shape guard lets the rewrite through only if every "
         "consumer's output type provably stays (never for a block output); the values agree elementwise")
FP_ONLY = "MIL's {op} takes only fp16 and fp32, and the pattern has one on this value's path"
ARGUMENTS: dict[tuple[str, str], str] = {
    ("fuse_gelu_tanh", 'contains(["fp16", "fp32"], dtype(%out))'): FP_ONLY.format(op="tanh"),
    ("fuse_gelu_erf", 'contains(["fp16", "fp32"], dtype(%out))'): FP_ONLY.format(op="erf"),
    ("fuse_logit_softcap", 'contains(["fp16", "fp32"], dtype(%out))'): FP_ONLY.format(op="tanh"),
    ("fuse_masked_attention_to_sdpa", 'contains(["fp16", "fp32"], dtype(%q))'): FP_ONLY.format(op="softmax (of q·kᵀ)"),
    ("fuse_attention_to_sdpa", 'contains(["fp16", "fp32"], dtype(%q))'): FP_ONLY.format(op="softmax (of q·kᵀ)"),
    ("fuse_gelu_tanh", "shape(%out) == shape(%x)"): GUARD,
    ("fuse_gelu_erf", "shape(%out) == shape(%x)"): GUARD,
    ("fuse_rmsnorm", "shape(%out) == shape(%x)"): GUARD,
    ("remove_maximum_with_lowest", "shape(%m) == shape(%x)"): GUARD,
    ("drop_softmax_constant_shift", "shape(%shifted) == shape(%x)"): GUARD + "; a uniform c widens x only by "
        "copies, whose softmax is the same",
    ("remove_select_of_masked_exp", "shape(%kept) == shape(%e)"): GUARD,
    ("replace_masked_decomposed_softmax", "shape(%out) == shape(%div)"): "%out is kept; only %div is replaced, and "
        + GUARD,
    ("fuse_selects_on_one_condition", "shape(%inner) == shape(%a)"): GUARD + " (select reads a where c holds, in "
        "both selects alike)",
    ("fuse_selects_on_one_condition", "dtype(%inner) == dtype(%a)"): "a select's output has its a's dtype",
    ("fuse_reduce_keep_dims_reshape", "rank(%restored) == rank(%x)"): GUARD,
    ("fuse_reduce_keep_dims_reshape", "const(%keep) == false"): "with keep_dims already true the reshape restores "
        "the reduction's own shape, and the reduction rebuilt with keep_dims=true is that very value",
    ("remove_scaling_by_one", "not is_const(%x)"): "x·1 is x for a constant x too; the clause leaves constants "
        "to constant folding",
    ("remove_scaling_by_one", "dtype(%m) == dtype(%x)"): "MIL's mul takes operands of one dtype and gives it",
    ("remove_maximum_with_lowest", "not is_const(%x)"): "maximum(x, -inf) is x for a constant x too; the clause "
        "leaves constants to constant folding",
    ("fold_transpose_into_matmul_y", "rank(%y) >= 2"): "for a rank-1 y the perm clause compares [0] with [-1] and "
        "fails; a rank-0 y feeds no matmul",
    ("fold_transpose_into_matmul_x", "rank(%x) >= 2"): "for a rank-1 x the perm clause compares [0] with [-1] and "
        "fails; a rank-0 x feeds no matmul",
    ("fuse_rmsnorm", "rank(%x) >= 3"): "dim(%x, -3) == 1 is unknown below rank 3, so nothing fires",
    ("fuse_rmsnorm", "is_known(dim(%x, -1))"): "the rewrite computes sqrt(dim(%x, -1)) and d·e: of a symbolic d "
        "those are no values to build with, and the rule does not fire",
    ("fuse_rmsnorm", "const(%keep) == true"): "without keep_dims the mean broadcasts across other rows and %out "
        "changes shape; shape(%out) == shape(%x) then fails except for a single row, where the values agree",
    ("fuse_rmsnorm", "is_finite(uniform(%epsilon))"): "with e = ±inf or NaN both forms are 0 or NaN alike: "
        "x·rsqrt(m + inf) = 0 = x/sqrt(s + d·inf)",
    ("fuse_reduce_keep_dims", "len(const(%axes)) == len(normalized_axes(const(%axes), rank(%x)))"): "a reduction "
        "given an axis twice reduces it once, as normalized_axes counts it, so the positions compare as they are",
    ("remove_matmul_batch_tiles", "forall axis in axes(%x): %reps[axis] == 1 or dim(%x, axis) == 1"): "implied: the "
        "every-use clause has the other operand carry r on each axis tiled by r > 1, and a matmul broadcasts the "
        "tile's x·r against r only where x is 1",
    ("replace_decomposed_softmax_wide_sum", "dtype(%narrow) == dtype(%e)"): "MIL's real_div takes operands of one "
        "dtype, so the sum is cast back to e's",
    ("replace_masked_decomposed_softmax", "uniform(%zero) == 0"): "%zero belongs to the outer select, which the "
        "rewrite keeps: only %div is replaced, and e/sum(select(m, e, 0)) is softmax(z) in every row",
    ("fuse_logit_softcap", "abs(scale_of(%out)) <= max_finite(dtype(%out))"): "the innermost scaling of a chain "
        "comes first in program order, which the driver keeps, and fuses with its own finite constant; the rest "
        "of the chain is folded by fold_scaling_into_scaled_tanh, whose own guard stops an alpha that overflows",
    ("drop_softmax_constant_shift", "is_finite(uniform(%c))"): "implied: abs(uniform(%c)) <= 1 fails for ±inf "
        "and NaN",
    ("replace_masked_decomposed_softmax", "one_use(%div)"): "%div is replaced in every use by softmax(z), which is "
        "e/sum(select(m, e, 0)) in every row (exp(z) is 0 where m is false), so each use reads the same values",
    ("remove_broadcast_tile", "dim(%repeats, 0) == rank(%x)"): "with repeats of another length the Tile's rank is "
        "unknown (onnx_shapes gives no shape), so axes(%t) in the every-use clause is unknown and nothing fires",
    ("remove_broadcast_tile", "forall axis in axes(%x): %repeats[axis] == 1 or dim(%x, axis) == 1"): "implied: the "
        "every-use clause has another operand carry r on each axis repeated r != 1, and the consumer broadcasts "
        "the Tile's d·r against r only where d is 1 (or r is 0, where both are 0)",
    ("narrow_broadcast_tile", "same_block(%u, %t)"): "the rebuilt tile takes %t's place in %t's own block, where "
        "%x is visible; the clause keeps the rule to what it was written for",
}
for _rule in ("broadcast_select_operands", "broadcast_select_bool_operands"):
    _zeros = "adding zeros of a shape the select broadcasts to changes no element (the rule's header)"
    ARGUMENTS.update({
        (_rule, "rank(%v) <= rank(%s)"): _zeros + ", whatever the operand's rank; " + GUARD,
        (_rule, "forall axis in axes(%s): aligned_dim(%v, axis, of=%s) == 1 or aligned_dim(%v, axis, of=%s) == "
                "dim(%s, axis)"): _zeros + "; " + GUARD,
        (_rule, "rank(%reference) == rank(%s)"): _zeros + ": the reference is an operand of the same select; "
                                                          + GUARD,
        (_rule, "%reference is not %v"): _zeros + "; zeros shaped like %v itself widen nothing, so the clause "
                                                  "only keeps the rule from firing on its own output",
        (_rule, "%other is not %v"): _zeros + "; with %v in two places both become the widened value, which "
                                              "holds the same elements",
        (_rule, "%reference is not %v and %other is not %v"): _zeros + " (see the two halves)",
    })
_CHAIN = "unscaled(%outer) is %x, and each step of a scaling chain (MIL's Adapter.scaling) keeps its operand's "
ARGUMENTS.update({
    ("fold_scaling_chain", "one_use(%inner) and unscaled(%inner) is %x and %x is not %inner"): "implied: the next "
        "clause then binds %x to an operand of %inner, and unscaled(%outer) is %x walks from %outer through "
        "%inner, which must then be a scaling with no other use, to that operand",
    ("fold_scaling_chain", "%x is not %inner"): "implied: the next clause has %x as an operand of %inner, and no "
        "value is its own operand",
    ("fold_scaling_chain", "shape(%x) == shape(%outer)"): "implied: " + _CHAIN + "shape (it takes only a factor "
        "of one element and no more axes, or of provably the same shape)",
    ("fold_scaling_chain", "dtype(%x) == dtype(%outer)"): "implied: " + _CHAIN + "dtype (it checks that for mul "
        "and real_div; MIL's sub takes operands of one dtype)",
    ("fuse_rmsnorm_rows", "is_known(dim(%x, -1))"): ARGUMENTS[("fuse_rmsnorm", "is_known(dim(%x, -1))")],
    ("fuse_rmsnorm_rows", "is_finite(uniform(%epsilon))"): "implied: abs(d·(e + rsqrt's epsilon)) <= "
        "max_finite(...) fails for an infinite or NaN e",
    ("fuse_rmsnorm_rows", "shape(%out) == shape(%x)"): GUARD,
    ("fold_norm_scale_into_weight", "rank(%w) >= 1"): "for a rank-0 w the forall-v clause ranges over const(%w) "
        "itself, a number, which it cannot: unknown, so nothing fires",
    ("fold_norm_scale_into_weight", "rank(%w) <= 4"): "from rank 5 the forall-v clause ranges over const(%w) itself, "
        "whose elements are lists: abs(v * scale_of(%scaled)) is unknown, so nothing fires",
    ("fold_norm_scale_into_weight", "not is_const(%scaled)"): "implied: unscaled(%scaled) is not %scaled makes "
        "%scaled a scaling of a non-constant (Adapter.scaling skips a scaled operand that has a value), and such "
        "a product has no constant value",
    ("fold_norm_scale_into_weight", "dtype(%w) == dtype(%out)"): "MIL's mul takes operands of one dtype and gives it",
    ("fold_norm_scale_into_weight", "shape(unscaled(%scaled)) == shape(%out)"): "the replacement broadcasts n "
        "against c·w, of w's own shape, as (n·c)·w broadcast n·c (a scaling keeps n's shape): %out keeps its shape "
        "and each element n_i·c·w_j; the clause keeps the rule to gains laid out along n's rows",
    ("fold_norm_scale_into_weight", "is_finite(scale_of(%scaled))"): "implied for a nonempty weight: with an "
        "infinite or NaN factor abs(v * scale_of(%scaled)) is inf or NaN for every v, and the forall-v clause "
        "fails; an empty weight makes an empty product either way",
    ("constant_tile_reps", "not is_const(%reps)"): "the rewrite reads only the proved dims of %t and %x, which the "
        "reps decide whatever computed them; for constant reps it rebuilds the same tile",
    ("constant_tile_reps", "rank(%t) == rank(%x)"): "MIL's tile takes one rep per axis of x and keeps x's rank",
    ("constant_tile_reps", "forall axis in axes(%x): dim(%t, axis) == dim(%x, axis) or is_known(dim(%t, axis)) and "
                           "is_known(dim(%x, axis)) and dim(%x, axis) >= 1 and mod(dim(%t, axis), dim(%x, axis)) == "
                           "0"): "implied where the rule can fire: the rewrite's rep is 1 where the dims are proved "
        "equal and dim(%t, axis) / dim(%x, axis) elsewhere, a number only for literal dims, and a tile's literal "
        "dim is x's times the rep (proven_shape multiplies them), so the ratio is that rep; otherwise there is no "
        "value to build with and nothing fires",
    ("constant_reshape_shape", "not is_const(%shape)"): "the rewrite reads only the proved dims of %r, which are "
        "the reshape's output whatever computed its shape; for a constant shape it rebuilds the same reshape",
    ("fold_scalar_into_zero_fill", "rank(%c) == 0"): "for a c of rank >= 1 const(%c) is a list, and "
        "const(%c) + const(%zero) (a list plus a number) is unknown: no value to build with, so nothing fires",
    ("fold_scalar_into_zero_fill", "rank(%zero) == 0"): "for a fill value of rank >= 1 const(%zero) is a list, and "
        "const(%c) + const(%zero) (a number plus a list) is unknown: no value to build with, so nothing fires",
    ("fold_scalar_into_zero_fill", "shape(%a) == shape(%zeros)"): "implied: rank(%c) == 0, and a scalar added to "
        "the fill cannot widen it",
    ("fold_scalar_into_zero_fill", "dtype(%a) == dtype(%zeros)"): "MIL's add takes operands of one dtype and "
        "gives it",
    ("fuse_gelu_tanh", "one_use(unscaled(%cdf))"): "only %out is replaced; unscaled(%cdf), the add of 1 and the "
        "tanh, stays for its other uses and computes what it did: the clause is about profit (no work duplicated)",
    ("fuse_gelu_erf", "one_use(unscaled(%cdf))"): "only %out is replaced; unscaled(%cdf), the add or sub of 1 and "
        "the erf, stays for its other uses and computes what it did: the clause is about profit (no work "
        "duplicated)",
    ("fuse_rmsnorm", "one_use(unscaled(%scaled))"): "only %out is replaced; unscaled(%scaled), the rsqrt, stays "
        "for its other uses and computes what it did: the clause is about profit (no work duplicated)",
    ("fuse_rmsnorm_rows", "one_use(unscaled(%scaled))"): "only %out is replaced; unscaled(%scaled), the rsqrt, "
        "stays for its other uses and computes what it did: the clause is about profit (no work duplicated)",
    ("remove_nonnegative_index_guard", "rank(%floor) == 0"): "for a floor of rank >= 1 const(%floor) is a list, "
        "and lower_bound(%i) >= const(%floor) (a number against a list) is unknown, so nothing fires",
    ("remove_nonnegative_index_guard", "shape(%out) == shape(%i)"): GUARD + " (the condition holds everywhere, "
        "so select reads i wherever it broadcasts to)",
    ("remove_nonnegative_index_guard", "dtype(%out) == dtype(%i)"): "a select's output has its a's dtype",
})

# rules/mil/attention.rules
_SDPA = ("fuse_attention_to_sdpa", "fuse_masked_attention_to_sdpa", "fuse_masked_fill_attention_to_sdpa",
         "fuse_additive_mask_attention_to_sdpa")
_SCORES_RANK = ("rank(%masked), which is rank(%scaled) by the shape clause, which is rank(%q): a scaling widens "
                "nothing (Adapter.scaling) and k has q's rank")
_OUT_DIM = ("implied for a product with {rows}: the reshape keeps mm's element count, %out's leading dims are 1 (the "
            "forall) and dim(%out, {other}) == dim(%mm, {other_mm}), so this dim is mm's too; otherwise both are "
            "empty, and " + GUARD)
ARGUMENTS.update({
    ("move_transpose_swap_into_matmul_y", "rank(%y) >= 2"): "for a rank-1 y both sides of the order clause are "
        "mod(%perm[0], 1) = 0, so it fails; for a rank-0 y, %perm[-2] is out of range (unknown), and no matmul "
        "takes one",
    ("lift_matmul_out_of_batch_one_reshapes", "rank(%a) >= 3"): "at rank 2 the dim clauses make each reshape keep "
        "its input's shape (the identity), so the product is the same matmul; below rank 2 dim(%a, -2) is unknown "
        "and nothing fires",
    ("lift_matmul_out_of_batch_one_reshapes", "dim(%out, -2) == dim(%mm, 0)"): _OUT_DIM.format(
        rows="columns", other=-1, other_mm=1),
    ("lift_matmul_out_of_batch_one_reshapes", "dim(%out, -1) == dim(%mm, 1)"): _OUT_DIM.format(
        rows="rows", other=-2, other_mm=0),
    ("fuse_masked_attention_to_sdpa", 'dtype(%m) == "bool"'): "MIL's select takes only a bool cond",
    ("fuse_masked_fill_attention_to_sdpa", 'dtype(%drop) == "bool"'): "MIL's select takes only a bool cond",
    ("fuse_masked_attention_to_sdpa", "rank(%m) <= rank(%q)"): "implied: select broadcasts its cond, so rank(%m) "
        "<= " + _SCORES_RANK,
    ("fuse_masked_fill_attention_to_sdpa", "rank(%drop) <= rank(%q)"): "implied: select broadcasts its cond, so "
        "rank(%drop) <= " + _SCORES_RANK,
    ("fuse_additive_mask_attention_to_sdpa", "rank(%mask) <= rank(%q)"): "implied: add broadcasts, so rank(%mask) "
        "<= " + _SCORES_RANK,
    ("fuse_additive_mask_attention_to_sdpa", "rank(%mask) >= 1"): "for a rank-0 mask dim(%mask, -1) is out of "
        "range (unknown), so the clause's next conjunct is never yes and nothing fires",
    ("fuse_additive_mask_attention_to_sdpa", "dtype(%mask) == dtype(%scaled)"): "MIL's add takes operands of one "
        "dtype",
    ("fuse_masked_fill_attention_to_sdpa", 'contains(["fp16", "fp32"], dtype(%q))'): FP_ONLY.format(
        op="softmax (of q·kᵀ)"),
    ("fuse_additive_mask_attention_to_sdpa", 'contains(["fp16", "fp32"], dtype(%q))'): FP_ONLY.format(
        op="softmax (of q·kᵀ)"),
})
for _rule in _SDPA:
    ARGUMENTS.update({
        (_rule, "is_finite(scale_of(%scaled))"): "implied: abs(scale_of(%scaled)) <= 1 fails for ±inf and NaN",
        (_rule, "is_known(dim(%q, -1))"): "the rewrite computes sqrt(dim(%q, -1)): of a symbolic E that is no value "
            "to build with, and the rule does not fire",
    })
for _rule in _SDPA[1:3]:
    ARGUMENTS[(_rule, "unscaled(%scaled) is %scaled or one_use(unscaled(%scaled))")] = (
        "only %out is replaced; the scores' matmul stays for its other uses and computes what it did: the clause is "
        "about profit (no work duplicated)")


# The ONNX cleanup and chain rules.
_SAME_TYPE = "ONNX's {op} takes its two operands of one type T and gives T"
_IN_ORDER = ("Squeeze and Unsqueeze keep every element in order, only the shape changes; ")
ARGUMENTS.update({
    ("fuse_additive_mask_attention_to_sdpa", "one_use(unscaled(%scaled))"): "only %out is replaced; the scores' "
        "matmul stays for its other uses and computes what it did: the clause is about profit (no work duplicated)",
    ("fuse_attention_to_sdpa", "one_use(unscaled(%scaled))"): "only %out is replaced; the scores' matmul stays for "
        "its other uses and computes what it did: the clause is about profit (no work duplicated)",
    ("onnx_fuse_transposes", 'len(attribute(%inner, "perm")) == rank(%x)'): "a perm of another length than the "
        "input's rank makes an invalid Transpose (onnx's checker and onnxruntime refuse it): no valid model has one",
    ("onnx_fuse_transposes", 'len(attribute(%outer, "perm")) == rank(%x)'): "a perm of another length than the "
        "input's rank makes an invalid Transpose (onnx's checker and onnxruntime refuse it): no valid model has one",
    ("onnx_remove_mul_by_one", "dtype(%m) == dtype(%x)"): _SAME_TYPE.format(op="Mul"),
    ("onnx_remove_div_by_one", "dtype(%d) == dtype(%x)"): _SAME_TYPE.format(op="Div"),
    ("onnx_remove_int_add_zero", "dtype(%a) == dtype(%x)"): _SAME_TYPE.format(op="Add"),
    ("onnx_remove_int_sub_zero", "dtype(%s) == dtype(%x)"): _SAME_TYPE.format(op="Sub"),
    ("onnx_remove_inference_dropout", "use_count(%d) >= 1 or block_output(%d)"): "with no use of %d the rewrite "
        "replaces nothing, so every value stays; the clause only keeps the rule from matching the same node forever "
        "(where only the mask is read), which the sweep cap would stop",
    ("onnx_remove_wider_clip_under_clip", '(const(%lo2) if is_const(%lo2) else attribute(%outer, "min")) <= '
     '(const(%hi2) if is_const(%hi2) else attribute(%outer, "max"))'): "both forms apply the outer bounds last, "
        "with the same max-then-min order, to values the inner bounds already hold inside them: they agree for "
        "any lo2, hi2; the clause keeps the rule off the order in which runtimes apply inverted bounds",
})
for _deleted in (
    'len(const(%b) if is_const(%b) else attribute(%s, "axes")) >= 1',
    'len(const(%a) if is_const(%a) else attribute(%u, "axes")) == len(const(%b) if is_const(%b) else '
    'attribute(%s, "axes"))',
    'normalized_axes(const(%a) if is_const(%a) else attribute(%u, "axes"), rank(%u)) == normalized_axes(const(%b) '
    'if is_const(%b) else attribute(%s, "axes"), rank(%u))',
):
    ARGUMENTS[("onnx_cancel_squeeze_of_unsqueeze", _deleted)] = (
        _IN_ORDER + "with shape(%s) == shape(%x) (kept) the result is x elementwise, whatever the axes")
ARGUMENTS[("onnx_cancel_squeeze_of_unsqueeze", "shape(%s) == shape(%x)")] = (
    _IN_ORDER + "squeezing exactly the axes just inserted (the same normalized axes, kept) restores x's shape")
for _deleted in (
    'len(const(%a) if is_const(%a) else attribute(%s, "axes")) >= 1',
    'len(const(%a) if is_const(%a) else attribute(%s, "axes")) == len(const(%b) if is_const(%b) else '
    'attribute(%u, "axes"))',
    'normalized_axes(const(%a) if is_const(%a) else attribute(%s, "axes"), rank(%x)) == normalized_axes(const(%b) '
    'if is_const(%b) else attribute(%u, "axes"), rank(%x))',
):
    ARGUMENTS[("onnx_cancel_unsqueeze_of_squeeze", _deleted)] = _IN_ORDER + GUARD


def _sorted_axes(value: str, op: str) -> str:
    """The clause that asks `value`'s axes (or `op`'s attribute) in increasing order."""
    axes = f'(const(%{value}) if is_const(%{value}) else attribute(%{op}, "axes"))'
    return (f'forall i in range(len(const(%{value}) if is_const(%{value}) else attribute(%{op}, "axes")) - 1): '
            f"mod({axes}[i], rank(%u)) < mod({axes}[i + 1], rank(%u))")


_SORTED = {("onnx_cancel_squeeze_of_unsqueeze", _sorted_axes("a", "u")),
           ("onnx_cancel_unsqueeze_of_squeeze", _sorted_axes("b", "u"))}
for _rule, _deleted in _SORTED:
    ARGUMENTS[(_rule, _deleted)] = (
        _IN_ORDER + "the axes' order changes no shape or element where the shapes agree, which the other clauses "
        "(and the guard) prove; the clause keeps the rule off onnx's reference, which reads unsorted axes in turn")


def general_argument(rule: ast.Rule, deleted: str) -> str:
    """The argument for a condition of a class that is sound to drop in any rule, or ""."""
    written = rule_text(rule)
    replaced = {getattr(action, "target", None) for action in rule.actions}
    match = re.fullmatch(r"is_const\((%\w+)\)", deleted)
    if match:
        var = match.group(1)
        rest = written.replace(deleted, "")
        if any(read in rest for read in (f"const({var})", f"{var}[", f"uniform({var})")):
            return (f"{var} is read as a constant elsewhere in the rule; of a non-constant that is unknown, which "
                    "proves nothing (in the rewrite, no value to build with), so the rule does not fire")
    match = re.fullmatch(r"(one_use|internal)\(((?:[^()]|\([^()]*\))+)\)", deleted)
    if match and match.group(2) not in replaced:
        return (f"only {', '.join(sorted(v for v in replaced if v))} is replaced; {match.group(2)} stays for "
                "its other uses and computes what it did: the clause is about profit (no work duplicated)")
    if re.fullmatch(r'available\("\w+"\)', deleted):
        return "the rewriter refuses a rewrite that builds an op the program's target lacks (`Unavailable`)"
    match = re.fullmatch(r"(?:shape|rank)\((%\w+)\) == (?:shape|rank)\((%\w+)\)", deleted)
    if match and replaced & {match.group(1), match.group(2)}:
        return GUARD
    match = re.fullmatch(r"is_known\(dim\((%\w+), (-?\d+)\)\)", deleted)
    if match and f"dim({match.group(1)}, {match.group(2)})" in _rewrite_text(written):
        return (f"the rewrite builds with dim({match.group(1)}, {match.group(2)}) as a number; of a symbolic dim "
                "that is no value to build with, and the rule does not fire")
    match = re.fullmatch(r"(?:is_finite\(uniform\((%\w+)\)\)|uniform\((%\w+)\) >= 0)", deleted)
    if match and f"epsilon=uniform({match.group(1) or match.group(2)})" in _rewrite_text(written):
        return ("an epsilon the fused op takes as it is: both forms add the same constant to the same statistic "
                "before the root, so a negative or non-finite one gives the same values (NaN or 0) on both sides")
    if re.fullmatch(r'contains\(\[[^]]*\], dtype\((%\w+)\)\)|dtype\((%\w+)\) == "?fp32"?', deleted):
        return ("a dtype the ops of the pattern take only in float: the clause keeps out the float types the fused "
                "op is not run in (bf16 by onnxruntime, fp16 where it computes in fp32): values differ there by "
                "that dtype's rounding only, within what verify compares")
    return ""


def _rewrite_text(written: str) -> str:
    """The `rewrite` part of a rule's text."""
    return written[written.find("rewrite"):]


def rule_text(rule: ast.Rule) -> str:
    """The rule's source, from `rule` to its first example."""
    lines = Path(rule.span.file).read_text().splitlines()
    end = rule.span.line
    while end < len(lines) and not lines[end].lstrip().startswith("example") and not lines[end].startswith("rule "):
        end += 1
    return "\n".join(lines[rule.span.line - 1:end])


@dataclass(frozen=True)
class Mutant:
    rule: str
    deleted: str  # the condition text taken out
    location: str
    files: dict  # file name -> mutated text


@dataclass(frozen=True)
class Outcome:
    mutant: Mutant
    verdict: str  # "does not load", "caught by examples", "caught by verify", "not caught"
    detail: str = ""


def _squash(text: str) -> str:
    return " ".join(text.split())


def _offset(lines: list[str], line: int, column: int) -> int:
    return sum(len(text) for text in lines[: line - 1]) + column - 1


def _cut(text: str, span: ast.Span) -> tuple[int, int]:
    lines = text.splitlines(keepends=True)
    return _offset(lines, span.line, span.column), _offset(lines, span.end_line, span.end_column)


def _rules_and_texts(folder: Path, only: set[str] | None):
    """(every file's text by name, the rule, its file's name) for each rule of `folder` (of `only`)."""
    sources = {path.name: path.read_text() for path in sorted(folder.glob("*.rules"))}
    for rule in rewrite.load_rules(folder).rules:
        if not only or rule.name in only:
            yield sources, rule, Path(rule.span.file).name


def mutants(folder: Path, only: set[str] | None = None):
    for sources, rule, name in _rules_and_texts(folder, only):
        text = sources[name]
        for condition in rule.conditions:
            lines = text.splitlines(keepends=True)
            # The whole clause: from `where` to the end of its last line.
            start = _offset(lines, condition.span.line, 1)
            end = _offset(lines, condition.span.end_line + 1, 1) if condition.span.end_line < len(lines) else len(text)
            yield Mutant(rule.name, _squash(condition.text), str(condition.span),
                         {**sources, name: text[:start] + text[end:]})
            parts = ast.conjuncts(condition.expr)
            if len(parts) < 2:
                continue
            begin, finish = _cut(text, condition.expr.span)
            for index, part in enumerate(parts):
                kept = [text[slice(*_cut(text, p.span))] for i, p in enumerate(parts) if i != index]
                rewritten = " and ".join(f"({k})" for k in kept)
                deleted = text[slice(*_cut(text, part.span))]
                yield Mutant(rule.name, _squash(deleted), str(part.span),
                             {**sources, name: text[:begin] + rewritten + text[finish:]})


def _literals(node, inside_available: bool = False):
    """Every int or float literal under `node` (tuples walked too), but for those `available(...)` names."""
    if isinstance(node, tuple):
        for item in node:
            yield from _literals(item, inside_available)
        return
    if isinstance(node, ast.Literal):
        if type(node.value) in (int, float) and not inside_available:
            yield node
        return
    if isinstance(node, ast.Call) and node.function == "available":
        inside_available = True
    if isinstance(node, ast.Call) and node.function == "close":
        # A tolerance (`close(..., rel=1e-6, ulps=4)`) is no value a rewrite computes with: a changed
        # one moves what passes for equal by rounding, and no instance could tell.
        yield from _literals(node.arguments, inside_available)
        return
    if hasattr(node, "__dataclass_fields__") and not isinstance(node, ast.Span):
        for name in node.__dataclass_fields__:
            yield from _literals(getattr(node, name), inside_available)


def _changed(value) -> str:
    if type(value) is int:
        return str(value + 1)
    rounded = float(f"{value:.1g}")
    return repr(rounded if rounded != value else value / 2)


def constant_mutants(folder: Path, only: set[str] | None = None):
    """Each number of each rule's conditions and rewrite changed, one at a time."""
    for sources, rule, name in _rules_and_texts(folder, only):
        text = sources[name]
        seen = set()
        for literal in _literals((rule.conditions, rule.actions)):
            begin, end = _cut(text, literal.span)
            if (begin, end) in seen:
                continue
            seen.add((begin, end))
            new = _changed(literal.value)
            yield Mutant(rule.name, f"{text[begin:end]} -> {new}", str(literal.span),
                         {**sources, name: text[:begin] + new + text[end:]})


def judge(mutant: Mutant, original: ast.Rule, trials: int, strip_examples: bool = False) -> Outcome:
    with tempfile.TemporaryDirectory() as scratch:
        for name, text in mutant.files.items():
            (Path(scratch) / name).write_text(text)
        try:
            rule_set = rewrite.load_rules(scratch).only(mutant.rule)
            (rule,) = rule_set.rules
        except Exception as error:  # the deletion left the rule ill-formed: no mutant
            return Outcome(mutant, "does not load", str(error).splitlines()[0])
        if strip_examples:
            # verify alone: no example of the rule's file helps it, nor catches the mutant
            rule, original = replace(rule, examples=()), replace(original, examples=())
        else:
            failed = [r for r in run_examples(rule_set) if not r.passed]
            if failed:
                return Outcome(mutant, "caught by examples", failed[0].description)
        verdict = verify_rule(rule, trials=trials, seed=0, necessity=False, shaped_by=original)
        if verdict.counterexample is not None:
            return Outcome(mutant, "caught by verify", verdict.counterexample.problem)
        if " -> " in mutant.deleted and verdict.instances == 0:
            return Outcome(mutant, "not caught", "no instance fires the changed rule (NONE): it rewrites nothing")
    argument = ARGUMENTS.get((mutant.rule, mutant.deleted)) or general_argument(original, mutant.deleted)
    if " -> " in mutant.deleted:  # a changed constant: argued one by one, or not
        return Outcome(mutant, "not caught", argument)
    if not argument:  # a conjunction of clauses each argued is argued too
        parts = [_squash(_source(original, part)) for part in ast.conjuncts(_parse_condition(original, mutant))]
        arguments = [ARGUMENTS.get((mutant.rule, part)) or general_argument(original, part) for part in parts]
        if len(parts) > 1 and all(arguments):
            argument = "each part: " + " / ".join(arguments)
    return Outcome(mutant, "not caught", argument)


def _parse_condition(rule: ast.Rule, mutant: Mutant):
    """The expression of `rule` whose text `mutant` deleted (a whole clause or a conjunct)."""
    for condition in rule.conditions:
        if _squash(condition.text) == mutant.deleted:
            return condition.expr
        for part in ast.conjuncts(condition.expr):
            if _squash(_source(rule, part)) == mutant.deleted:
                return part
    return None


def _source(rule: ast.Rule, expr) -> str:
    text = Path(rule.span.file).read_text()
    return text[slice(*_cut(text, expr.span))]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=200)
    parser.add_argument("--rule", action="append", help="only these rules")
    parser.add_argument("--markdown", action="store_true", help="print the uncaught mutants as a table")
    parser.add_argument("--constants", action="store_true",
                        help="also change each number of each rule, one at a time (value-level mutants)")
    parser.add_argument("--strip-examples", action="store_true",
                        help="judge by verify alone: the rules' in-file examples neither shape instances nor catch")
    args = parser.parse_args(argv)
    warnings.simplefilter("ignore")
    np.seterr(all="ignore")
    started = time.perf_counter()
    shipped = rewrite.shipped_rules_path()
    originals = {rule.name: rule for rule in rewrite.load_rules().rules}
    outcomes = []
    for dialect_folder in sorted(p for p in shipped.iterdir() if p.is_dir()):
        only = set(args.rule) if args.rule else None
        found = list(mutants(dialect_folder, only))
        if args.constants:
            found += list(constant_mutants(dialect_folder, only))
        for mutant in found:
            outcome = judge(mutant, originals[mutant.rule], args.trials, args.strip_examples)
            outcomes.append(outcome)
            print(f"{outcome.verdict:20} {mutant.rule}: {mutant.deleted[:70]}", file=sys.stderr)
    loaded = [o for o in outcomes if o.verdict != "does not load"]
    caught = [o for o in loaded if o.verdict.startswith("caught")]
    uncaught = [o for o in loaded if o.verdict == "not caught"]
    unargued = [o for o in uncaught if not o.detail]
    print(f"\n{len(outcomes)} mutants, {len(loaded)} load; caught {len(caught)} "
          f"({sum(o.verdict == 'caught by examples' for o in caught)} by examples, "
          f"{sum(o.verdict == 'caught by verify' for o in caught)} by verify); "
          f"{len(uncaught)} not caught, {len(uncaught) - len(unargued)} of them argued sound; "
          f"{time.perf_counter() - started:.0f} s")
    if args.markdown:
        print("\n| rule | deleted condition | why the rule is sound without it |\n|---|---|---|")
        for o in uncaught:
            print(f"| {o.mutant.rule} | `{o.mutant.deleted}` | {o.detail or '**no argument**'} |")
    for o in unargued:
        print(f"NO ARGUMENT  {o.mutant.rule} ({o.mutant.location}): {o.mutant.deleted}")
    return 1 if unargued else 0


if __name__ == "__main__":
    sys.exit(main())
