"""Wide variadic nodes: one `Sum` of hundreds or thousands of `Expand`s.

Each Expand is an anchor of `remove_broadcast_expand`, whose conditions bind
the Sum's other operands (`%others...`) and quantify over them three times,
and whose rewrite the shape guard checks against all of them. The cost is
checked without a clock: the operand visits an adapter sees (shapes read,
operands listed) per removed Expand must not grow with the width, which
holds only if every question about the Sum is answered from the summary
its record keeps. The verdicts are checked too: onnxruntime's outputs before
and after, how many Expands go (the last one whose widening no other operand
provably carries stays, and a symbolic or unknown dim never carries one),
the summarized quantifiers against the loop, and the records against a
recount after edits.
"""

from __future__ import annotations

import random
from collections import Counter

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import TensorProto, helper, numpy_helper

import rewrite
from rewrite.backends.onnx import OnnxAdapter
from rewrite.backends.onnx import adapter as onnx_adapter
from rewrite.engine.builtins import _one_use, _use_count
from rewrite.engine.conditions import lazy_rests
from rewrite.engine.driver import Driver
from rewrite.engine.guard import ShapeGuard
from rewrite.engine.interfaces import Capability
from rewrite.engine.operands import Counts, OperandsExcept, OperandTable, Shapes
from rewrite.language.logic import Truth
from rewrite.predicates import registered_predicates

OPSET = 18
HIDDEN = 16
BATCHES = (3, 5)


@pytest.fixture(scope="module")
def rules():
    return rewrite.load_rules(dialects=["onnx"]).only("remove_broadcast_expand")


def _input(name: str, shape):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


def wide_sum(n: int, extra=(("x", ["batch", HIDDEN]),), op_type: str = "Sum") -> onnx.ModelProto:
    """`op_type`(e0, ..., e{n-1}, *extra): each e = Expand(m [batch, 1], Shape(x)) [batch, 16].

    The extra inputs come last, so that a walk over the other operands in
    order meets the one that carries the width at the end.
    """
    nodes = [
        helper.make_node("ReduceMean", ["x", "axes"], ["m"], keepdims=1),
        helper.make_node("Shape", ["x"], ["s"]),
    ]
    operands = []
    for i in range(n):
        nodes.append(helper.make_node("Expand", ["m", "s"], [f"e{i}"]))
        operands.append(f"e{i}")
    inputs = [_input("x", ["batch", HIDDEN])]
    for name, shape in extra:
        if name != "x":
            inputs.append(_input(name, shape))
        operands.append(name)
    nodes.append(helper.make_node(op_type, operands, ["out"]))
    graph = helper.make_graph(
        nodes, "wide", inputs, [_input("out", ["batch", HIDDEN])],
        [numpy_helper.from_array(np.array([-1], np.int64), "axes")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])


def rank_raising(n: int) -> onnx.ModelProto:
    """Sum(e0, ..., e{n-1}) with e = Expand(v [16], [4, 16]): each Expand raises the rank."""
    nodes = [helper.make_node("Expand", ["v", "target"], [f"e{i}"]) for i in range(n)]
    nodes.append(helper.make_node("Sum", [f"e{i}" for i in range(n)], ["y"]))
    graph = helper.make_graph(
        nodes, "rank_raising", [_input("v", [HIDDEN])], [_input("y", [4, HIDDEN])],
        [numpy_helper.from_array(np.array([4, HIDDEN], np.int64), "target")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])


def _feeds(model: onnx.ModelProto, batch: int) -> dict:
    rng = np.random.default_rng(batch)
    feeds = {}
    for info in model.graph.input:
        tensor = info.type.tensor_type
        if not tensor.HasField("shape"):
            dims = [batch, HIDDEN]  # of unknown rank: fed as x is
        else:
            dims = [d.dim_value if d.HasField("dim_value") else (batch if d.dim_param == "batch" else HIDDEN)
                    for d in tensor.shape.dim]
        feeds[info.name] = rng.normal(size=dims).astype(np.float32)
    return feeds


def _run(model: onnx.ModelProto) -> list:
    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return [session.run(None, _feeds(model, batch)) for batch in BATCHES]


class CountingAdapter:
    """An `OnnxAdapter` that counts the operand visits it serves: each shape
    read, and each operand or consumer in a list it returns."""

    def __init__(self, inner: OnnxAdapter):
        self._inner = inner
        self.visits = 0

    def shape(self, value):
        self.visits += 1
        return self._inner.shape(value)

    def operands(self, op):
        found = self._inner.operands(op)
        self.visits += len(found)
        return found

    def broadcast_operands(self, op):
        found = self._inner.broadcast_operands(op)
        self.visits += len(found) if found is not None else 0
        return found

    def consumers(self, value):
        found = self._inner.consumers(value)
        self.visits += len(found)
        return found

    def __getattr__(self, name):
        return getattr(self._inner, name)


def _rewrite(rules, model: onnx.ModelProto) -> tuple[Counter, Counter, int]:
    """Apply the rules; outputs must not change. Returns the op counts before and after, and the visits."""
    before, expected = Counter(n.op_type for n in model.graph.node), _run(model)
    adapter = CountingAdapter(OnnxAdapter(model))
    rules.apply_with(adapter)
    adapter.release()
    onnx.checker.check_model(model)
    for old, new in zip(expected, _run(model)):
        for a, b in zip(old, new):
            assert a.shape == b.shape
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    return before, Counter(n.op_type for n in model.graph.node), adapter.visits


# ---------------------------------------------------------------- the cost does not grow with the width


@pytest.mark.parametrize("build, removed", [
    (lambda n: wide_sum(n), lambda n: n),  # x carries the width: every Expand goes
    (lambda n: wide_sum(n, extra=()), lambda n: n - 1),  # the last one stays
    (rank_raising, lambda n: n - 1),  # the rank quantifier: the last one stays
])
def test_operand_visits_per_removed_expand_do_not_grow_with_the_width(rules, build, removed):
    per_expand = {}
    for width in (200, 2000):
        before, after, visits = _rewrite(rules, build(width))
        gone = before["Expand"] - after["Expand"]
        assert gone == removed(width)
        per_expand[width] = visits / gone
    # Walking the other operands, each anchor visited all of them several
    # times over: 10x the visits per Expand at 10x the width. Read from the
    # Sum's record, each anchor costs the same; what is left grows by the
    # record's one pass over the operands, shared by them all.
    assert per_expand[2000] <= 1.1 * per_expand[200], per_expand
    assert per_expand[2000] < 40, per_expand


@pytest.mark.parametrize("op_type", ["Sum", "Max", "Min", "Mean"])
def test_every_expand_a_wide_node_broadcasts_anyway_is_removed(rules, op_type):
    before, after, _ = _rewrite(rules, wide_sum(300, op_type=op_type))
    assert before["Expand"] == 300 and after["Expand"] == 0
    assert after[op_type] == 1 and after["Shape"] == 0


def test_the_last_expand_whose_width_nothing_else_carries_stays(rules):
    before, after, _ = _rewrite(rules, wide_sum(300, extra=()))
    assert after["Expand"] == 1 and after["Shape"] == 1


@pytest.mark.parametrize("shape", [["batch", "w"], ["batch", None], [1, None]],
                         ids=["symbolic", "unknown", "unknown-with-1"])
def test_a_symbolic_or_unknown_dim_carries_nothing(rules, shape):
    # y's width may be 16 at run time, but nothing proves it: it cannot stand
    # in for the last Expand.
    before, after, _ = _rewrite(rules, wide_sum(300, extra=(("y", shape),)))
    assert after["Expand"] == 1


def test_an_operand_of_unknown_rank_stops_every_removal(rules):
    # Nothing proves the Sum's output rank without the Expands: the guard refuses each.
    model = wide_sum(100, extra=(("x", ["batch", HIDDEN]), ("y", None)))
    statistics = rules.apply(model)
    assert Counter(n.op_type for n in model.graph.node)["Expand"] == 100
    assert statistics.refused == 100


def test_a_narrow_node_takes_the_general_way(rules):
    before, after, _ = _rewrite(rules, wide_sum(4))
    assert after["Expand"] == 0
    before, after, _ = _rewrite(rules, wide_sum(4, extra=()))
    assert after["Expand"] == 1


# ---------------------------------------------------------------- summarized quantifiers agree with the loop

QUANTIFIERS = [
    "forall other in %others: other is not %e",
    "exists other in %others: other is %e",
    "exists other in %others: other is %m",
    "exists other in %others: rank(other) >= rank(%e)",
    "forall other in %others: rank(other) == 2",
    "forall other in %others: rank(other) != 3",
    "exists other in %others: rank(other) < 2",
    "forall axis in axes(%e): exists other in %others: aligned_dim(other, axis, of=%e) == dim(%e, axis)",
    "exists other in %others: aligned_dim(other, 1, of=%e) == 16",
    "forall other in %others: aligned_dim(other, -1, of=%e) != 1",
    "exists other in %others: aligned_dim(other, 0, of=%e) == dim(%e, 0)",
    "forall other in %others: 1 == aligned_dim(other, 0, of=%e)",
    "exists other in %others: aligned_dim(other, 5, of=%e) == 1",
    "exists other in %others: dim(other, 0) == dim(%e, 0)",
    "forall other in %others: dim(other, 1) > 8",
    "exists other in %others: dim(other, 1) <= dim(%e, 0)",
    "forall other in %others: dtype(other) == fp32",
    'exists other in %others: op_type(other) == "Expand"',
    'forall other in %others: op_type(other) != "Relu"',
    "exists other in %others: is_const(other)",
    "len(%others) > 10",
    "forall other in %others where rank(other) == 2: dim(other, 1) == 16",
    "exists other in %others: aligned_dim(other, 1, of=%e) == dim(%e, 1) and rank(other) == 2",
]


def _probe_rules(write_rules, quantifier: str):
    text = f"""
    dialect onnx
    rule probe "asks about the Sum's other operands"
      match %e = Expand(input=%m, shape=_)
      where every use %u of %e: %u is Sum(%e, %others...) in any order and ({quantifier})
      rewrite %e -> %m
    """
    return rewrite.load_rules(write_rules(text)).for_dialect("onnx")


def _mixed_sum(unknown_rank: bool = True) -> onnx.ModelProto:
    """A Sum of Expands and of inputs of every kind of dim: literal, symbolic, unknown, shorter, longer, and
    (with `unknown_rank`) of unknown rank."""
    extra = (("x", ["batch", HIDDEN]), ("w", ["batch", "w"]), ("u", ["batch", None]), ("r", [HIDDEN]),
             ("o", [1, 1]), ("big", [2, 1, HIDDEN]), ("z", None if unknown_rank else ["batch", 1]))
    model = wide_sum(60, extra=extra)
    # Some Expands read the same value twice, one operand repeats.
    model.graph.node[-1].input.extend(["e3", "e3", "x"])
    return model


@pytest.mark.parametrize("quantifier", QUANTIFIERS)
@pytest.mark.parametrize("unknown_rank", [False, True], ids=["known-ranks", "an-unknown-rank"])
def test_summarized_quantifiers_agree_with_the_loop(write_rules, quantifier, unknown_rank):
    rules = _probe_rules(write_rules, quantifier)
    adapter = OnnxAdapter(_mixed_sum(unknown_rank))
    driver = Driver(rules, adapter, registered_predicates())
    (rule,) = rules
    anchors = [node for node in adapter.main.nodes if node.type == "Expand"]
    looped = [driver.decide(rule, anchor).truth for anchor in anchors]
    traced = [driver.decide(rule, anchor, traced=True).truth for anchor in anchors]
    driver.operand_table.start()
    try:
        summarized = [driver.decide(rule, anchor).truth for anchor in anchors]
        sum_node = adapter.main.nodes[-1]
        record = driver.operand_table.get(sum_node)
        assert record is not None  # the Sum is wide: it has one
    finally:
        driver.operand_table.stop()
    assert summarized == looped == traced


def test_only_a_rest_read_as_a_domain_binds_a_view(write_rules):
    text = """
    dialect onnx
    rule probe "counts the other operands"
      match %e = Expand(input=%m, shape=_)
      where every use %u of %e: %u is Sum(%e, %others...) in any order and len(%others) > 0
      rewrite %e -> %m
    rule keeps "passes the other operands to a builtin"
      match %e = Expand(input=%m, shape=_)
      where every use %u of %e: %u is Sum(%e, %others...) in any order and contains(%others, %m)
      rewrite %e -> %m
    """
    probe, keeps = rewrite.load_rules(write_rules(text)).for_dialect("onnx")
    assert len(lazy_rests([probe])) == 1
    assert lazy_rests([keeps]) == frozenset()


@pytest.mark.parametrize("unknown_rank", [False, True], ids=["known-ranks", "an-unknown-rank"])
@pytest.mark.parametrize("proving", [False, True], ids=["stated", "proven"])
def test_the_guard_reads_the_same_verdicts_from_the_summary(proving, unknown_rank):
    adapter = OnnxAdapter(_mixed_sum(unknown_rank))
    if proving:
        # As if shape arithmetic proved the symbolic width 16.
        def proven_shape(value):
            shape = adapter.shape(value)
            return None if shape is None else tuple(HIDDEN if str(dim) == "w" else dim for dim in shape)

        adapter.proven_shape = proven_shape
        adapter.capabilities = adapter.capabilities | {Capability.SHAPE_PROOFS}
    table = OperandTable(adapter)
    sum_node = adapter.main.nodes[-1]
    olds = [node.outputs[0] for node in adapter.main.nodes if node.type == "Expand"][:5]
    olds += [adapter.main.values[name] for name in ("x", "w", "r", "z", "big")]
    news = [adapter.main.values[name] for name in ("m", "x", "w", "u", "r", "o", "z", "big", "e7")]
    general, summarized = ShapeGuard(adapter), ShapeGuard(adapter, table)
    general._proving = summarized._proving = proving
    table.start()
    verdicts = set()
    for old in olds:
        for new in news:
            expected = general._consumer_keeps_its_types(sum_node, old, new)
            found = summarized._consumer_keeps_its_types(sum_node, old, new)
            assert found == expected, (old, new)
            verdicts.add(None if expected is None else " ".join(expected.reason.split()[:3]))
    assert table.get(sum_node) is not None
    if not unknown_rank:
        assert len(verdicts) >= 3, verdicts  # kept, and refused for more than one reason


# ---------------------------------------------------------------- records follow every edit


def _expected_counts(values, feature) -> dict:
    counts: dict = {}
    for value in values:
        key = feature(value)
        counts[key] = counts.get(key, 0) + 1
    return counts


@pytest.mark.parametrize("seed", range(4))
def test_records_agree_with_a_recount_after_random_edits(seed):
    rng = random.Random(seed)
    adapter = OnnxAdapter(_mixed_sum())
    table = OperandTable(adapter)
    table.start()
    sum_node = adapter.main.nodes[-1]
    record = table.record(sum_node)
    rank = record.summary(("rank",), lambda: Counts(lambda v: len(adapter.shape(v)) if adapter.shape(v) else None))
    shapes = record.summary(("shapes",), lambda: Shapes(lambda v: None if adapter.shape(v) is None
                                                        else tuple(adapter.shape(v))))
    pool = [v for v in adapter.main.values.values() if v.dtype == "fp32" and v is not sum_node.outputs[0]]
    for _ in range(200):
        values = list(adapter.operands(sum_node))
        old, new = rng.choice(values), rng.choice(pool)
        if rng.random() < 0.6:
            table.replacing_operand(sum_node, old, new)
            adapter.replace_operand(sum_node, old, new)
        else:
            table.replacing_all(old, new)
            adapter.replace_all_uses(old, new)
        values = list(adapter.operands(sum_node))
        assert record.values == values
        assert {v: sorted(p) for v, p in record.positions.items()} == {
            v: [i for i, w in enumerate(values) if w is v] for v in dict.fromkeys(values)
        }
        assert rank.counts == _expected_counts(values, lambda v: len(adapter.shape(v)) if adapter.shape(v) else None)
        known = [tuple(adapter.shape(v)) for v in values if adapter.shape(v) is not None]
        assert shapes.unknown == len(values) - len(known)
        assert shapes.ranks == _expected_counts(known, len)
        for offset in range(1, 4):
            assert shapes.dims.get(offset, {}) == _expected_counts(
                [s for s in known if len(s) >= offset], lambda s, k=offset: s[-k])
        position = rng.randrange(len(values))
        view = OperandsExcept(record, position)
        assert view.materialize() == tuple(values[:position] + values[position + 1:]) == tuple(view)
        assert view.count(values[position]) == values.count(values[position]) - 1
    table.removing(sum_node)
    assert table.get(sum_node) is None
    table.stop()
    assert table.get(sum_node) is None


def test_records_are_kept_only_while_a_run_edits():
    adapter = OnnxAdapter(wide_sum(50))
    table = OperandTable(adapter)
    sum_node = adapter.main.nodes[-1]
    assert table.record(sum_node) is None  # not running
    table.start()
    assert table.record(sum_node) is not None
    narrow = OnnxAdapter(wide_sum(3))
    assert OperandTable(narrow).record(narrow.main.nodes[-1]) is None


# ---------------------------------------------------------------- use counts without listing the uses


@pytest.mark.parametrize("seed", range(4))
def test_use_count_agrees_with_a_recount_after_random_edits(seed):
    rng = random.Random(seed)
    nodes = [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Neg", ["x"], ["b"]),
             helper.make_node("Abs", ["x"], ["c"])]
    for i in range(60):
        nodes.append(helper.make_node("Add", [rng.choice("abc"), rng.choice("abc")], [f"n{i}"]))
    nodes.append(helper.make_node("Sum", [rng.choice("abc") for _ in range(40)], ["wide"]))
    nodes.append(helper.make_node("Sum", [f"n{i}" for i in range(60)] + ["wide"], ["y"]))
    graph = helper.make_graph(nodes, "uses", [_input("x", ["batch", HIDDEN])], [_input("y", None)])
    adapter = OnnxAdapter(helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)]))
    values = [adapter.main.values[name] for name in "abc"]
    for value in values:
        assert adapter.use_count(value) == len(adapter.consumers(value))
    consumers = [node for node in adapter.main.nodes if node.type in ("Add", "Sum") and node.outputs[0].name != "y"]
    for _ in range(300):
        node = rng.choice(consumers)
        if not node.live:
            continue
        action = rng.random()
        old, new = rng.choice(values), rng.choice(values)
        if action < 0.6:
            adapter.replace_operand(node, old, new)
        elif action < 0.7:
            adapter.replace_all_uses(old, new)
        elif action < 0.8:
            adapter.build("Add", {"A": old, "B": new}, node, "built")
        else:
            adapter.remove_op(node)
        for value in values:
            listed = len(adapter.consumers(value))
            assert adapter.use_count(value) == listed
            assert adapter.use_count(value, 2) == min(listed, 2)


def test_one_use_does_not_list_a_shared_value(monkeypatch):
    adapter = OnnxAdapter(wide_sum(500))
    m = adapter.main.values["m"]
    listed = []
    original = onnx_adapter.live_uses
    monkeypatch.setattr(onnx_adapter, "live_uses", lambda value: listed.append(value) or original(value))
    assert _one_use(adapter, m) is Truth.NO
    assert _use_count(adapter, m) == 500
    expands = [node for node in adapter.main.nodes if node.type == "Expand"]
    for node in expands[:-2]:
        # Each removal: the count follows, nothing lists m's uses again.
        adapter.remove_op(node)
        assert _one_use(adapter, m) is Truth.NO
    adapter.remove_op(expands[-2])
    assert _use_count(adapter, m) == 1 and _one_use(adapter, m) is Truth.YES
    assert listed.count(m) == 1  # counted once, the first time
