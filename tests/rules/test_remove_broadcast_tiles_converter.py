"""remove_broadcast_tiles on real converter output (JAX -> StableHLO -> MIL).

The motivating case: under a symbolic batch, MIL gives the two operands of
one elementwise op different symbols for the same runtime dimension, and the
tiles the converter emits for `keepdims` broadcasts must still all go.
"""

from __future__ import annotations

import jax  # noqa: E402,F401 - `.[test]` installs it: a missing one must fail, not skip
import numpy as np
import pytest
import stablehlo_coreml  # noqa: E402,F401
from jax_programs import concrete_arguments, converted, feed, jax_result  # noqa: E402
from mil_cases import RULE, SIZES, ops_of_type, rewrite_and_compare  # noqa: E402

NORMALISATIONS = ["mean_mul", "rmsnorm", "layernorm", "softmax"]


def check_against_jax(name, outcome, argument_sets):
    for arrays, outputs in zip(argument_sets, outcome.outputs):
        (result,) = outputs.values()
        want = jax_result(name, arrays)
        assert result.shape == want.shape
        np.testing.assert_allclose(result, want, rtol=1e-5, atol=1e-6)


def check_only_tiles_removed(outcome, tiles_before):
    """Each fire removed one tile (and perhaps its reps const); nothing else changed."""
    assert outcome.fired() == tiles_before
    assert not outcome.added
    assert set(outcome.removed) <= {"tile", "const"}
    assert outcome.removed["tile"] == tiles_before
    assert outcome.removed["const"] <= tiles_before
    assert outcome.statistics.removed_ops == sum(outcome.removed.values())


@pytest.mark.parametrize("name", NORMALISATIONS)
def test_symbolic_batch_no_tile_survives(rules, name):
    program = converted(name, symbolic=True)
    assert program.functions["main"].inputs["arg0"].shape[0] != 2  # a symbol, not a size
    argument_sets = [concrete_arguments(name, batch) for batch in SIZES]
    feeds = [feed(program, arrays) for arrays in argument_sets]

    outcome = rewrite_and_compare(program, rules, feeds)

    tiles_before = outcome.before["tile"]
    assert tiles_before >= 1
    assert outcome.after["tile"] == 0
    check_only_tiles_removed(outcome, tiles_before)
    assert [out.shape for outputs in outcome.outputs for out in outputs.values()] == [(n, 8) for n in SIZES]
    check_against_jax(name, outcome, argument_sets)


@pytest.mark.parametrize("name", NORMALISATIONS)
def test_static_batch_no_tile_survives(rules, name):
    program = converted(name, symbolic=False)
    assert program.functions["main"].inputs["x"].shape == (4, 8)
    argument_sets = [concrete_arguments(name, 4, seed) for seed in (0, 1)]
    feeds = [feed(program, arrays) for arrays in argument_sets]

    outcome = rewrite_and_compare(program, rules, feeds)

    tiles_before = outcome.before["tile"]
    assert tiles_before >= 2  # the row broadcast and the scalar broadcast(s)
    assert outcome.after["tile"] == 0
    check_only_tiles_removed(outcome, tiles_before)
    check_against_jax(name, outcome, argument_sets)


def test_symbolic_is_idempotent(rules):
    program = converted("layernorm", symbolic=True)
    rules.apply(program, check_types=True)
    printed = str(program)
    again = rules.apply(program, check_types=True)
    assert again.fired(RULE) == 0
    assert str(program) == printed


WHERE_CASES = [
    # (function, symbolic, tiles left: those that feed the select)
    pytest.param("where_column_mask", True, 1, id="where(mask(b,1),s,-1e9)-symbolic"),
    pytest.param("where_column_mask", False, 2, id="where(mask(b,1),s,-1e9)-static"),
    pytest.param("where_full_mask", False, 1, id="where(mask(b,8),s,-1e9)-static"),
    pytest.param("where_row_mean", True, 1, id="where(s>0,s,mean(s))-symbolic"),
    pytest.param("where_row_mean", False, 1, id="where(s>0,s,mean(s))-static"),
]


@pytest.mark.parametrize("name, symbolic, tiles_after", WHERE_CASES)
def test_tile_feeding_select_is_kept(rules, name, symbolic, tiles_after):
    program = converted(name, symbolic=symbolic)
    sizes = SIZES if symbolic else (4,)
    argument_sets = [concrete_arguments(name, batch) for batch in sizes]
    feeds = [feed(program, arrays) for arrays in argument_sets]

    feeding_select = {
        tile.name
        for tile in ops_of_type(program, "tile")
        if any(op.op_type == "select" for op in tile.outputs[0].child_ops)
    }
    assert feeding_select

    outcome = rewrite_and_compare(program, rules, feeds)

    assert outcome.after["tile"] == tiles_after
    check_only_tiles_removed(outcome, outcome.before["tile"] - outcome.after["tile"])
    # What survives is exactly the tiles that fed a select.
    assert {tile.name for tile in ops_of_type(program, "tile")} == feeding_select
    check_against_jax(name, outcome, argument_sets)
