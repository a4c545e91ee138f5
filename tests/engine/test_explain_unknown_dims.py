"""Where a condition failed on a dim that is `?`, `explain` names the op whose shape
inference lost it: the first op up the producers whose output has the dim
unknown while its inputs had it known (`Adapter.unknown_dim_origin`)."""

from __future__ import annotations

import pytest

from rewrite.engine.explain import explain, format_text
from rewrite.engine.interfaces import Capability, follow_unknown_dim
from tests.engine.toy_ir import Graph, ToyAdapter, load_toy_rules

# In the toy IR a dim of None is unknown.
ROWS = """
dialect toy
rule four_rows "an engine test: reads dim 0 of the negated value"
  match %o = neg(x=%v)
  where dim(%v, 0) == 4
  rewrite %o -> %v
"""

ALIGNED = """
dialect toy
rule aligned_rows "an engine test: reads a dim through aligned_dim"
  match %o = neg(x=%v)
  where aligned_dim(%v, 1, of=%o) == 4
  rewrite %o -> %v
"""

SHAPE = """
dialect toy
rule whole_shape "an engine test: reads the whole shape"
  match %o = neg(x=%v)
  where shape(%v) == [4, 8]
  rewrite %o -> %v
"""


class ProvenanceAdapter(ToyAdapter):
    """The toy adapter with the optional method, as a backend would add it."""

    capabilities = ToyAdapter.capabilities | {Capability.UNKNOWN_DIM_ORIGINS}

    def unknown_dim_origin(self, value, axis):
        return follow_unknown_dim(self, value, axis)


def _lost_by_exp(x_shape=(4, 8), out_shape=(None, 8)):
    """x -> exp (loses dim 0) -> add with a rank-1 y -> sub -> neg."""
    graph = Graph()
    x = graph.input("x", x_shape)
    y = graph.input("y", (8,))
    lost = graph.op("exp", x=x, shape=(None, 8))
    added = graph.op("add", x=lost, y=y, shape=(None, 8))
    value = graph.op("sub", x=added, y=y, shape=(None, 8))
    graph.main.outputs = [graph.op("neg", x=value, shape=out_shape)]
    return graph, lost.producer, value


def test_the_walk_finds_the_op_that_lost_the_dim():
    graph, exp, value = _lost_by_exp()
    adapter = ProvenanceAdapter(graph)
    assert adapter.unknown_dim_origin(value, 0) is exp
    assert adapter.unknown_dim_origin(value, -2) is exp
    assert adapter.unknown_dim_origin(value, 1) is None  # a known dim was lost by no one


def test_an_input_declared_unknown_is_lost_by_no_op():
    graph, _, value = _lost_by_exp(x_shape=(None, 8))
    assert ProvenanceAdapter(graph).unknown_dim_origin(value, 0) is None


def test_a_broadcast_follows_the_operand_aligned_with_the_axis():
    graph = Graph()
    wide = graph.input("wide", (4, 8))
    narrow = graph.op("exp", x=graph.input("n", (8,)), shape=(None,))  # lost dim 0 of a rank-1 value
    row = graph.op("neg", x=wide, shape=(None, 8))  # lost dim 0 of a rank-2 value
    total = graph.op("add", x=row, y=narrow, shape=(None, None))
    adapter = ProvenanceAdapter(graph)
    assert adapter.unknown_dim_origin(total, 0) is row.producer  # narrow has no axis 0 there
    assert adapter.unknown_dim_origin(total, 1) is narrow.producer


def test_an_unknown_rank_is_followed_to_the_op_that_lost_it():
    graph = Graph()
    x = graph.input("x", (4, 8))
    ranked = graph.op("exp", x=x, shape=None)
    value = graph.op("neg", x=ranked, shape=(None, 8))
    assert ProvenanceAdapter(graph).unknown_dim_origin(value, 0) is ranked.producer


@pytest.mark.parametrize("text", [ROWS, ALIGNED, SHAPE])
def test_explain_names_the_op_that_lost_the_dim(write_rules, text):
    # Axis 1 of a rank-3 output is axis 0 of the rank-2 operand (the toy takes any shape it is told).
    graph, exp, value = _lost_by_exp(out_shape=(1, None, 8) if text is ALIGNED else (None, 8))
    (item,) = explain(load_toy_rules(write_rules(text)).rules, ProvenanceAdapter(graph), {})
    assert not item.fired and item.truth == "unknown"
    assert item.origins == (f"dim 0 of %{value.name}(?, 8) was lost by the shape inference of '{exp.name}' (exp)",)
    assert f"  unknown: dim 0 of %{value.name}(?, 8) was lost" in format_text([item])


def test_no_origin_where_the_dim_is_known_or_the_adapter_cannot_tell(write_rules):
    rules = load_toy_rules(write_rules(ROWS)).rules
    graph, _, _ = _lost_by_exp()
    (item,) = explain(rules, ToyAdapter(graph), {})  # no unknown_dim_origin: None by default
    assert item.truth == "unknown" and item.origins == ()

    graph = Graph()
    value = graph.op("exp", x=graph.input("x", (3, 8)), shape=(3, 8))
    graph.main.outputs = [graph.op("neg", x=value, shape=(3, 8))]
    (item,) = explain(rules, ProvenanceAdapter(graph), {})
    assert item.truth == "no" and item.origins == ()
    assert "unknown:" not in format_text([item])
