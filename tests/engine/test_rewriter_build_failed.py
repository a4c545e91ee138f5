"""An op the backend refuses to build means "do not fire": nothing changes, nothing built stays,
the statistics count it as refused, and checked mode names the rule. Never a crash of the pass."""

from __future__ import annotations

import numpy as np
import pytest

import rewrite
from rewrite.backends.mil import Function, Program, count_ops, mb, types
from rewrite.backends.mil.reference import evaluate

# Core ML's attention op takes rank >= 3; this rule does not say so.
CARELESS = """dialect mil
rule attention_of_products "an engine test, not a sound rule"
  match %out = matmul(x=%a, y=%b, transpose_x=_, transpose_y=_)
  rewrite
    %scaled = mul(x=%a, y=2.0)
    %out -> scaled_dot_product_attention(query=%scaled, key=%b, value=%b)
"""


def program(rank: int) -> Program:
    shape = (4, 4) if rank == 2 else (1, 4, 4)
    with Function({"a": mb.placeholder(shape=shape, dtype=types.fp32),
                   "b": mb.placeholder(shape=shape, dtype=types.fp32)},
                  opset_version=rewrite.backends.mil.ct.target.iOS18) as function:
        function.set_outputs([mb.matmul(x=function.inputs["a"], y=function.inputs["b"], name="out")])
    built = Program()
    built.add_function("main", function)
    return built


@pytest.fixture
def rules(tmp_path):
    path = tmp_path / "careless.rules"
    path.write_text(CARELESS)
    return rewrite.load_rules(path)


def test_an_op_the_backend_refuses_is_not_built_and_nothing_changes(rules):
    graph = program(rank=2)
    feeds = {"a": np.eye(4, dtype=np.float32), "b": np.arange(16, dtype=np.float32).reshape(4, 4)}
    before = evaluate(graph, feeds)
    statistics = rules.apply(graph)
    assert statistics.fired("attention_of_products") == 0
    assert statistics.refused == 1
    assert count_ops(graph, "matmul") == 1 and count_ops(graph, "mul") == 0  # the mul it built went
    np.testing.assert_array_equal(evaluate(graph, feeds)["out"], before["out"])


def test_checked_mode_names_the_rule_and_the_op(rules):
    with pytest.raises(rewrite.UnsoundRewriteError, match=r"attention_of_products.*could not build "
                                                          r"'scaled_dot_product_attention'"):
        rules.apply(program(rank=2), check_types=True)


def test_where_the_backend_builds_it_the_rule_fires(rules):
    # The same rule at rank 3 builds; whether it computes the same is verify's business.
    graph = program(rank=3)
    assert rules.apply(graph).fired("attention_of_products") == 1
    assert count_ops(graph, "scaled_dot_product_attention") == 1
