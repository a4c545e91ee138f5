"""Checking: names, bindings, types and the backend's op schema, each reported at file:line:col."""

from __future__ import annotations

import pytest

import rewrite
from rewrite import RuleError

GOOD = """
dialect mil
class binary = add | mul
rule r "d"
  match %t = tile(x=%x, reps=%reps)
  where every use %u of %t: %u is binary(%t, %other) in any order and rank(%other) == 2
  rewrite %t -> %x
"""


def test_a_good_file_loads(write_rules):
    rule_set = rewrite.load_rules(write_rules(GOOD))
    (rule,) = rule_set.rules
    assert rule.anchor.pattern.types == frozenset({"tile"})


def _error(write_rules, text):
    path = write_rules(text)
    with pytest.raises(RuleError) as raised:
        rewrite.load_rules(path)
    return raised.value, path


@pytest.mark.parametrize(
    "line, replacement, message, column",
    [
        (4, '  match %t = tlie(x=%x, reps=%reps)', "unknown mil op or class 'tlie'; did you mean 'tile'?", 14),
        (4, '  match %t = tile(z=%x, reps=%reps)', "op 'tile' has no operand 'z'", 19),
        (5, '  where rank(%y) == 2', "'%y' is not bound here", 14),
        (5, '  where rank(3) == 2', "argument 'value' of 'rank' must be value, not number", 14),
        (5, '  where rnak(%x) == 2', "unknown function 'rnak'; did you mean 'rank'?", 9),
        (5, '  where (1 if rank(%x) == 2 else "a") == 1',
         "the branches of 'if ... else' differ: number and string", 10),
        (5, '  where [i for i in 3] == []', "the domain of 'for' must be list, not number", 21),
        (5, '  where close(1.0, 2.0, tolerance=1)', "'close' has no keyword argument 'tolerance'", 35),
        (5, '  where rank(%z) == 2 or %x is %z', "'%z' is not bound here", 14),
        (5, '  where %x is not %fresh', "'%fresh' is not bound here", 9),
        (5, '  where rank(%x)', "an operand of 'where' must be bool, not number", 9),
        (5, '  where %x == 2', "a graph value cannot be compared", 9),
        (5, '  where forall i in 3: i == 1', "the domain of 'forall' must be list, not number", 21),
        (5, '  where dim(%x, axis) == 1', "unknown name 'axis'", 17),
        (5, '  where aligned_dim(%x, 0) == 1', "'aligned_dim' needs the keyword argument 'of='", 9),
        (6, '  rewrite %t -> %nothing', "'%nothing' is not bound here", 17),
        (6, '  rewrite %t -> tile(x=%x)', "op 'tile' needs operand(s) reps", 17),
        (2, 'class binary = add | mull', "class 'binary': unknown mil op 'mull'; did you mean 'mul'?", 7),
    ],
)
def test_errors_name_the_place(write_rules, line, replacement, message, column):
    lines = GOOD.strip("\n").splitlines()
    lines[line - 1] = replacement
    error, path = _error(write_rules, "\n".join(lines) + "\n")
    diagnostic = error.first
    assert message in diagnostic.message
    assert diagnostic.span.line == line
    assert diagnostic.span.column == column
    rendered = str(error)
    assert f":{line}:{column}: error:" in rendered
    assert replacement.strip() in rendered
    assert "^" in rendered


def test_missing_dialect(write_rules):
    error, _ = _error(write_rules, 'rule r "d" match %t = tile(x=%x, reps=%r) rewrite %t -> %x\n')
    assert "missing 'dialect' declaration" in error.first.message


def test_unknown_dialect(write_rules):
    error, _ = _error(write_rules, "dialect tflite\n")
    assert "unknown dialect 'tflite'" in error.first.message


def test_imports_resolve_relative_to_the_file(write_rules):
    write_rules("dialect mil\nclass unary = exp | log\n", "classes.rules")
    path = write_rules(
        'dialect mil\nimport unary from "classes.rules"\n'
        'rule r "d" match %y = unary(x=%x) rewrite %y -> %x\n'
    )
    (rule,) = rewrite.load_rules(path).rules
    assert rule.anchor.pattern.types == frozenset({"exp", "log"})


def test_import_of_a_missing_class_or_file(write_rules):
    write_rules("dialect mil\nclass unary = exp | log\n", "classes.rules")
    error, _ = _error(write_rules, 'dialect mil\nimport binary from "classes.rules"\nimport "nope.rules"\n')
    messages = [d.message for d in error.diagnostics]
    assert any("has no class 'binary'" in m for m in messages)
    assert any("cannot import" in m and "nope.rules" in m for m in messages)


def test_import_cycle(write_rules):
    write_rules('dialect mil\nimport "b.rules"\nclass a = exp\n', "a.rules")
    write_rules('dialect mil\nimport "a.rules"\nclass b = log\n', "b.rules")
    error, _ = _error(write_rules, 'dialect mil\nimport "b.rules"\n')
    assert any("import cycle" in d.message for d in error.diagnostics)


def test_duplicate_rule_names(write_rules):
    text = 'dialect mil\nrule r "d" match %t = tile(x=%x, reps=%r) rewrite %t -> %x\n' * 2
    error, _ = _error(write_rules, text)
    assert "already defined" in error.first.message


def test_negated_patterns_bind_nothing(write_rules):
    error, _ = _error(write_rules, """
        dialect mil
        rule r "d"
          match %t = tile(x=%x, reps=%r)
          where not (%x is exp(x=%inner)) and rank(%inner) == 1
          rewrite %t -> %x
        """)
    assert "'%inner' is not bound here" in error.first.message


def test_registered_predicates_are_known_only_once_registered(write_rules):
    text = 'dialect mil\nrule r "d" match %t = tile(x=%x, reps=%r) where is_weight(%x) rewrite %t -> %x\n'
    error, _ = _error(write_rules, text)
    assert "unknown function 'is_weight'" in error.first.message
    rewrite.register_predicate("is_weight", "value")(lambda context, value: True)
    try:
        assert len(rewrite.load_rules(write_rules(text)).rules) == 1
    finally:
        rewrite.unregister_predicate("is_weight")


def test_every_error_is_reported(write_rules):
    error, _ = _error(write_rules, """
        dialect mil
        rule a "d" match %t = tlie(x=%x) rewrite %t -> %x
        rule b "d" match %t = tile(x=%x, reps=%r) where rank(%q) == 1 rewrite %t -> %x
        """)
    assert len(error.diagnostics) == 2
    assert [d.span.line for d in error.diagnostics] == [2, 3]


def test_rebuild_operands_are_checked_against_the_schema(write_rules):
    text = 'dialect mil\nrule r "d" match %t = tile(x=%x, reps=%r) rewrite %t -> %t with bogus=1\n'
    error, _ = _error(write_rules, text)
    assert "op 'tile' has no operand 'bogus'" in error.first.message
    assert (error.first.span.line, error.first.span.column) == (2, 65)


def test_a_quantifier_body_that_runs_on_is_a_warning(write_rules):
    text = """
        dialect mil
        rule r "d"
          match %t = tile(x=%x, reps=_)
          where forall i in axes(%x): dim(%x, i) == 1 and rank(%x) == 2
          rewrite %t -> %x
        """
    rule_set = rewrite.load_rules(write_rules(text))
    (warning,) = rule_set.warnings
    assert warning.severity == "warning"
    assert "inside 'forall i' but does not use 'i'" in warning.message
    assert (warning.span.line, warning.span.column) == (4, 51)
    parenthesized = text.replace("where forall i in axes(%x): dim(%x, i) == 1",
                                 "where (forall i in axes(%x): dim(%x, i) == 1)")
    assert rewrite.load_rules(write_rules(parenthesized)).warnings == ()


# The lint cannot read conditions: this rule rebuilds the matmul it is
# anchored on, and fires only while its perm has the last two axes out of
# order, which the transpose it builds never has (its example fires once).
# Each re-fire the lint suspects is ruled out by the pattern or a condition:
# tile_reps_from_size_list builds reps with a concat, and matches only reps
# computed by a real_div; read_sizes_from_the_input reads from the input at
# the symbol's own axis, which its last condition leaves alone; the
# positions.rules rules build their ops on constants (a table, its cos or
# sin, its expand_dims) where their patterns ask for a range or a slice.
KNOWN_WARNINGS = {
    ("move_transpose_swap_into_matmul_y", "it may fire again on its own result"),
    ("tile_reps_from_size_list", "it may fire again on its own result"),
    ("read_sizes_from_the_input", "it may fire again on its own result"),
    ("rotary_table_from_positions", "it may fire again on its own result"),
    ("cos_of_a_constant_slice", "it may fire again on its own result"),
    ("sin_of_a_constant_slice", "it may fire again on its own result"),
    ("expand_dims_of_a_constant_slice", "it may fire again on its own result"),
    # add_below_reshape's new reshape reads x, not an add; merge_slices_from_the_start's
    # new slice reads the constant, not a slice.
    ("add_below_reshape", "it may fire again on its own result"),
    ("merge_slices_from_the_start", "it may fire again on its own result"),
    # The constant triangle's less_equal reads a constant, not a range; the
    # folded gather's indices are a constant, not a slice.
    ("causal_mask_from_a_constant_triangle", "it may fire again on its own result"),
    ("gather_of_a_constant_slice", "it may fire again on its own result"),
    # The rebuilt SDPA's mask is cut from a rank-2 table, where the pattern asks
    # for one of rank 3 or more; the scaled positions' table concat reads a
    # constant chain, not a mul of a cast range.
    ("sdpa_mask_slice_without_leading_unit_axes", "it may fire again on its own result"),
    ("rotary_table_from_scaled_positions", "it may fire again on its own result"),
    # The causal masks' tables are built over a constant shape or a constant
    # range, where the patterns ask for a runtime one.
    ("float_band_mask_from_a_constant_band", "it may fire again on its own result"),
    ("causal_select_mask_from_a_constant_triangle", "it may fire again on its own result"),
    # The rebuilt SDPA's mask has no conjunction: the pattern asks for one.
    ("sdpa_mask_without_a_true_conjunct", "it may fire again on its own result"),
    ("sdpa_select_mask_without_a_true_conjunct", "it may fire again on its own result"),
    # Each firing drops one constant bound, so it stops when one is left.
    ("onnx_drop_weaker_max_min_bound", "it may fire again on its own result"),
}


def test_the_shipped_library_has_no_warnings():
    rule_set = rewrite.load_rules()
    rules_at = {(r.span.file, r.span.line): r.name for r in rule_set.rules}

    def rule_of(warning):
        lines = [line for file, line in rules_at if file == warning.span.file and line <= warning.span.line]
        return rules_at[(warning.span.file, max(lines))] if lines else None

    unexplained = [w for w in rule_set.warnings
                   if not any(rule_of(w) == name and text in w.message for name, text in KNOWN_WARNINGS)]
    assert unexplained == [], [w.render() for w in unexplained]


def _warnings(write_rules, text, name="test.rules"):
    return [w.message for w in rewrite.load_rules(write_rules(text, name)).warnings]


def test_unused_bindings_are_warnings(write_rules):
    messages = _warnings(write_rules, """
        dialect mil
        rule r "d"
          match %t = tile(x=%x, reps=%reps)
          rewrite %t -> %x
        """)
    assert messages == ["'%reps' is bound but never used; write '_' where any operand will do"]


def test_a_condition_that_folds_to_false_is_a_warning(write_rules):
    messages = _warnings(write_rules, """
        dialect mil
        rule r "d"
          match %t = tile(x=%x, reps=_)
          where 1 + 1 == 3 or false
          rewrite %t -> %x
        """)
    assert messages == ["this condition is never true, so the rule never fires"]


def test_a_shadowed_rule_is_a_warning(write_rules):
    messages = _warnings(write_rules, """
        dialect mil
        rule first "tried first"
          match %t = tile(x=%x, reps=_)
          where rank(%x) == 2
          rewrite %t -> %x
        rule second "same pattern, stronger conditions"
          match %t = tile(x=%x, reps=_)
          where rank(%x) == 2
          where dim(%x, 0) == 1
          rewrite %t -> %x
        """)
    assert len(messages) == 1 and messages[0].startswith("rule 'second' never fires: 'first'")


def test_a_higher_benefit_rule_is_not_shadowed(write_rules):
    messages = _warnings(write_rules, """
        dialect mil
        rule first "tried second: lower benefit"
          match %t = tile(x=%x, reps=_)
          rewrite %t -> %x
        rule second "tried first"
          match %t = tile(x=%x, reps=_)
          where dim(%x, 0) == 1
          benefit 2
          rewrite %t -> %x
        """)
    assert messages == []


def test_rebuilding_the_anchor_type_is_a_warning(write_rules):
    messages = _warnings(write_rules, """
        dialect mil
        rule r "d"
          match %y = exp(x=%x)
          rewrite %y -> exp(x=%x)
        """)
    assert len(messages) == 1 and "may fire again on its own result" in messages[0]


def test_wrong_arity_is_an_error(write_rules):
    error, _ = _error(write_rules, 'dialect mil\nrule r "d" match %t = tile(%a, %b, %c) rewrite %t -> %a\n')
    assert "op 'tile' takes at most 2 operands; the pattern lists 3" in error.first.message
    assert (error.first.span.line, error.first.span.column) == (2, 23)
