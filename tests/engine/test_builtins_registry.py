"""Every builtin the checker knows has one definition in the engine's registry, and no other."""

from __future__ import annotations

from rewrite.engine import builtins
from rewrite.language.types import BUILTINS


def test_the_registry_and_the_signatures_name_the_same_builtins():
    assert set(builtins.REGISTRY) | {"internal"} == set(BUILTINS)


def test_each_builtin_says_what_its_unknown_answer_means():
    for name, builtin in builtins.REGISTRY.items():
        assert builtin.name == name and callable(builtin.function)
        assert len(builtin.unknown) > 10, name


def test_what_reads_uses_or_follows_producers_is_not_kept_between_anchors():
    # `UseVerdicts` keeps a use's verdict only over builtins a run does not change.
    assert {"use_count", "one_use", "block_output", "unscaled", "scale_of", "elements", "lower_bound",
            "upper_bound"}.isdisjoint(builtins.STABLE)
    assert {"rank", "dim", "dtype", "op_type", "is_const", "uniform"} <= builtins.STABLE
