"""verify: shipped rules pass; deliberately broken variants fail with a counterexample."""

from __future__ import annotations

import re
import warnings

import numpy as np
import pytest

import rewrite
from rewrite.verify import format_verdict, verify_rule

SHIPPED = rewrite.load_rules()
TRIALS, SEED = 200, 0


@pytest.fixture(autouse=True)
def _quiet_numpy():
    # Random operands make pow/mod/divide produce nan and inf before and after alike.
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


@pytest.mark.parametrize("rule", SHIPPED.rules, ids=[r.name for r in SHIPPED.rules])
def test_every_shipped_rule_verifies(rule):
    verdict = verify_rule(rule, trials=TRIALS, seed=SEED)
    assert verdict.passed, format_verdict(verdict)
    assert verdict.instances >= 5 and verdict.nested_instances >= 1
    every_use = [n for n in verdict.necessity if n.condition.startswith("every use")]
    assert all(n.noticed for n in every_use)  # dropping a consumer check is caught


def test_the_cast_rule_needs_its_exactness_condition():
    (rule,) = SHIPPED.only("remove_cast_round_trip").rules
    verdict = verify_rule(rule, trials=TRIALS, seed=SEED)
    (exact,) = [n for n in verdict.necessity if n.condition.startswith("represents")]
    assert exact.noticed  # without it, int32 -> fp16 -> int32 round trips go too


def _variant(write_rules, path: str, old: str, new: str, name: str, also: tuple = ()):
    """The shipped rules of `path`'s folder with `old` replaced by `new` (and the `also` changes)."""
    changes = {path: [(old, new)]}
    for other_path, other_old, other_new in also:
        changes.setdefault(other_path, []).append((other_old, other_new))
    folder = None
    source_folder = (rewrite.shipped_rules_path() / path).parent
    for source in source_folder.glob("*.rules"):
        text = source.read_text()
        for old_text, new_text in changes.get(f"{source_folder.name}/{source.name}", []):
            assert old_text in text
            text = text.replace(old_text, new_text)
        folder = write_rules(text, source.name).parent
    return rewrite.load_rules(folder).only(name).rules[0]


TILES = "mil/remove_broadcast_tiles.rules"
EXPAND = "onnx/remove_broadcast_expand.rules"


def test_tile_rule_without_the_per_axis_condition_fails(write_rules):
    rule = _variant(write_rules, TILES, """
          and forall axis in axes(%t) where %reps[axis] > 1:
                aligned_dim(%other, axis, of=%t) == %reps[axis]""", "", "remove_broadcast_tiles")
    verdict = verify_rule(rule, trials=TRIALS, seed=SEED, necessity=False)
    assert not verdict.passed and "tile" in verdict.counterexample.graph
    problem = verdict.counterexample.problem
    assert "shape" in problem or "value" in problem or "not proved to stay" in problem


def test_tile_rule_without_the_both_operands_guard_fails(write_rules):
    rule = _variant(write_rules, TILES, "          and %other is not %t\n", "", "remove_broadcast_tiles")
    verdict = verify_rule(rule, trials=200, seed=SEED, necessity=False)
    assert not verdict.passed, format_verdict(verdict)
    assert re.search(r"x=%(\w+), y=%\1\)", verdict.counterexample.graph)  # the tile as both operands


def test_tile_rule_with_select_in_the_class_fails_on_shape_semantics(write_rules):
    # `select` in the class alone is harmless: the pattern takes two operands
    # and select has three. Opened to a third with `%rest...`, the rule drops
    # tiles into selects: the values stay equal, the shape semantics do not.
    rule = _variant(write_rules, TILES, "%u is broadcasting(%t, %other) in any order",
                    "%u is broadcasting(%t, %other, %rest...) in any order", "remove_broadcast_tiles",
                    also=(("mil/elementwise.rules", "logical_xor", "logical_xor | select"),))
    verdict = verify_rule(rule, trials=300, seed=SEED, necessity=False)
    assert not verdict.passed, format_verdict(verdict)
    assert "select" in verdict.counterexample.problem and "implicitly" in verdict.counterexample.problem


def test_expand_rule_that_treats_unknown_dims_as_equal_fails(write_rules):
    rule = _variant(
        write_rules, EXPAND,
        "exists other in %others: aligned_dim(other, axis, of=%e) == dim(%e, axis)",
        "exists other in %others: aligned_dim(other, axis, of=%e) == dim(%e, axis)"
        " or is_symbolic(aligned_dim(other, axis, of=%e))",
        "remove_broadcast_expand",
    )
    verdict = verify_rule(rule, trials=300, seed=SEED, necessity=False)
    assert not verdict.passed, format_verdict(verdict)
    assert "Expand" in verdict.counterexample.graph
