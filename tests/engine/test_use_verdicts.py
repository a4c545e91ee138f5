"""Verdicts of `every use` kept per value while its uses stay the same.

A value that feeds every layer is walked once for all the anchors that ask
about it, and walked again as soon as an op starts or stops using it
(`Adapter.uses_version`, kept by both backends). Only bodies that read
nothing but the use (and the value, and named constants) through builtins a
run does not change are kept; explain and apply give the same verdicts.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime
from onnx import TensorProto, helper

import rewrite
from rewrite.backends.mil import MilAdapter
from rewrite.backends.onnx import OnnxAdapter
from rewrite.engine.conditions import UseVerdicts
from rewrite.engine.driver import Driver
from rewrite.engine.explain import explain
from rewrite.language import ast
from rewrite.predicates import registered_predicates
from tests.engine.test_scale_mil import fan_out

RULES = """
dialect onnx
rule drop_double_neg_under_a_shared_reshape
  "A Reshape to a shape every use of which is a Reshape reads -(-y) as y."
  match %r = Reshape(data=%n, shape=%s)
  where %n is Neg(X=%m) and %m is Neg(X=%y)
  where every use %u of %s: op_type(%u) == "Reshape"
  rewrite %n -> %y
"""
LAYERS = 40


def _model(extra_use: bool = False) -> onnx.ModelProto:
    """x -> per layer Reshape(Neg(Neg(prev)), Shape(x)); with `extra_use`, Shape(x) also feeds an Identity out."""
    nodes = [helper.make_node("Shape", ["x"], ["s"])]
    previous = "x"
    for layer in range(LAYERS):
        nodes += [helper.make_node("Neg", [previous], [f"a{layer}"]),
                  helper.make_node("Neg", [f"a{layer}"], [f"b{layer}"]),
                  helper.make_node("Reshape", [f"b{layer}", "s"], [f"r{layer}"], name=f"reshape{layer}")]
        previous = f"r{layer}"
    outputs = [helper.make_tensor_value_info(previous, TensorProto.FLOAT, ["batch", 4])]
    if extra_use:
        nodes.append(helper.make_node("Identity", ["s"], ["shape_out"]))
        outputs.append(helper.make_tensor_value_info("shape_out", TensorProto.INT64, [2]))
    graph = helper.make_graph(nodes, "fan_out", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
                              outputs)
    built = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    onnx.checker.check_model(built, full_check=True)
    return built


class Counting(OnnxAdapter):
    """Counts the consumers listed (what walking the uses costs), in all and per value name."""

    def __init__(self, model):
        super().__init__(model)
        self.listed = 0
        self.of: dict[str, int] = {}

    def consumers(self, value):
        found = super().consumers(value)
        self.listed += len(found)
        self.of[value.name] = self.of.get(value.name, 0) + len(found)
        return found


def _run(built, feeds):
    return onnxruntime.InferenceSession(built.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)


def test_the_shared_value_is_walked_once_and_the_rule_fires_at_every_layer(write_rules):
    built = _model()
    feeds = {"x": np.random.default_rng(0).normal(size=(3, 4)).astype(np.float32)}
    expected = _run(built, feeds)
    rules = rewrite.load_rules(write_rules(RULES))
    adapter = Counting(built)
    statistics = rules.apply_with(adapter)
    adapter.release()
    assert statistics.fires == LAYERS
    assert sum(n.op_type == "Neg" for n in built.graph.node) == 0
    assert sum(n.op_type == "Reshape" for n in built.graph.node) == LAYERS
    np.testing.assert_array_equal(_run(built, feeds)[0], expected[0])
    # The uses of s (LAYERS Reshapes) once in sweep 1; the rewrites leave them
    # as they are, so sweep 2 walks nothing either. Without the kept verdict
    # each of the 2 * LAYERS decisions lists them all.
    assert adapter.listed < 3 * LAYERS


def test_a_use_added_or_dropped_is_seen_at_the_next_anchor(write_rules):
    rules = rewrite.load_rules(write_rules(RULES))
    (rule,) = rules.rules
    adapter = OnnxAdapter(_model())
    driver = Driver(rules.rules, adapter, registered_predicates())
    anchors = list(driver.candidates(rule))
    assert driver.decide(rule, anchors[0]).fires
    shape = adapter.operand(anchors[0], "shape")
    version = adapter.uses_version(shape)
    # An Identity starts reading s: no longer every use is a Reshape.
    built = adapter.build("Identity", {"input": shape}, anchors[1], "probe")
    assert adapter.uses_version(shape) != version
    decision = driver.decide(rule, anchors[1])
    assert not decision.fires and decision.matched
    explained = {e.anchor: e for e in explain(rules.rules, adapter, registered_predicates())}
    assert not explained["reshape1"].fired and explained["reshape1"].truth == "no"
    # It goes again: every use is a Reshape once more.
    adapter.remove_op(adapter.producer(built))
    assert driver.decide(rule, anchors[1]).fires
    assert explain(rules.rules, adapter, registered_predicates())[1].fired


def test_a_graph_with_another_use_of_the_value_is_left_alone(write_rules):
    built = _model(extra_use=True)
    before = [n.op_type for n in built.graph.node]
    statistics = rewrite.load_rules(write_rules(RULES)).apply(built)
    assert statistics.fires == 0 and [n.op_type for n in built.graph.node] == before


def _every_use(body: str) -> ast.EveryUse:
    text = f'dialect onnx\nrule r "d"\n  match %r = Reshape(data=%d, shape=%s)\n  where every use %u of %s: {body}\n' \
           '  rewrite %r -> %d\n'
    (rule,) = rewrite.language.parser.parse_rules(text, "t.rules").rules
    return rule.conditions[0].expr


def test_only_bodies_that_read_the_use_alone_are_kept():
    verdicts = UseVerdicts(OnnxAdapter(_model()))
    for body in ('op_type(%u) == "Reshape"', "rank(%u) == rank(%s) and dtype(%u) == fp32",
                 "forall axis in axes(%u): dim(%u, axis) == 1 or is_symbolic(dim(%u, axis))",
                 "%u is not %s"):
        assert verdicts.keeps(_every_use(body)), body
    for body in ("rank(%u) == rank(%d)",  # the anchor's binding
                 "one_use(%u)",  # a use count changes with the graph
                 "%u is Reshape(data=_, shape=%s)",  # a pattern reads the consumer's other operands
                 "elements(%u) == [1]",  # follows producers' operands
                 'every use %v of %u: op_type(%v) == "Neg"'):
        assert not verdicts.keeps(_every_use(body)), body

    class Plain:  # an adapter without USES_VERSION keeps nothing
        capabilities = frozenset()

    assert not UseVerdicts(Plain()).keeps(_every_use('op_type(%u) == "Reshape"'))


def test_the_onnx_uses_version_changes_with_every_edit_of_the_uses():
    adapter = OnnxAdapter(_model())
    operations = adapter.operations(adapter.top_blocks()[0])
    shape = adapter.outputs(operations[0])[0]
    reshape = next(op for op in operations if adapter.op_type(op) == "Reshape")
    data = adapter.operand(reshape, "data")
    seen = {id(value): adapter.uses_version(value) for value in (shape, data)}

    def changed(value) -> bool:
        version = adapter.uses_version(value)
        fresh = version != seen.get(id(value))
        seen[id(value)] = version
        return fresh

    new_shape = adapter.build("Shape", {"data": data}, reshape, "other")
    assert changed(data) and not changed(shape)
    adapter.replace_operand(reshape, shape, new_shape)
    assert changed(shape)
    adapter.replace_all_uses(new_shape, shape)
    assert changed(shape)
    assert changed(new_shape)
    adapter.remove_op(adapter.producer(new_shape))
    assert changed(data)
    version = adapter.uses_version(data)
    adapter.consumers(data)  # listing (and compacting) changes nothing
    assert adapter.uses_version(data) == version != 0


def test_the_mil_uses_version_changes_with_every_edit_of_the_uses():
    program = fan_out(3)
    adapter = MilAdapter(program)
    block = adapter.top_blocks()[0]
    tile = next(op for op in adapter.operations(block) if adapter.op_type(op) == "tile")
    mean = adapter.operand(tile, "x")
    mul = next(op for op in adapter.operations(block) if adapter.op_type(op) == "mul")
    start = adapter.uses_version(mean)
    other = adapter.build("tile", {"x": mean, "reps": np.array([1, 1], np.int32)}, tile, "probe")
    after_build = adapter.uses_version(mean)
    assert after_build != start
    adapter.replace_operand(mul, adapter.outputs(tile)[0], other)
    assert adapter.uses_version(other) != 0
    adapter.replace_all_uses(other, adapter.outputs(tile)[0])
    adapter.remove_op(adapter.producer(other))
    assert adapter.uses_version(mean) != after_build
    version = adapter.uses_version(mean)
    adapter.consumers(mean)
    assert adapter.uses_version(mean) == version


# ------------------------------------------------------------ bodies that read the anchor's bindings

SHIFTS = """
dialect onnx
rule negated_plus_is_minus
  "Neg(x) + q is q - x, where every use of x has q's rank."
  match %a = Add(A=%p, B=%q)
  where %p is Neg(X=%x)
  where every use %u of %x: rank(%u) == rank(%q)
  where CONDITION
  rewrite %a -> Sub(A=%q, B=%x)
"""
USES = 30


def _shifts() -> onnx.ModelProto:
    """USES layers of Add(Neg(x), q_i), q_i of rank 2 for even i and 1 for odd; all summed into out."""
    nodes, initializers, terms = [], [], []
    for i in range(USES):
        nodes += [helper.make_node("Neg", ["x"], [f"n{i}"]),
                  helper.make_node("Add", [f"n{i}", f"q{i}"], [f"a{i}"], name=f"add{i}")]
        shape = (1, 4) if i % 2 == 0 else (4,)
        initializers.append(onnx.numpy_helper.from_array(np.full(shape, i, np.float32), f"q{i}"))
        terms.append(f"a{i}")
    nodes.append(helper.make_node("Sum", terms, ["out"]))
    value = helper.make_tensor_value_info
    graph = helper.make_graph(nodes, "shifts", [value("x", TensorProto.FLOAT, ["batch", 4])],
                              [value("out", TensorProto.FLOAT, ["batch", 4])], initializers)
    built = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    onnx.checker.check_model(built, full_check=True)
    return built


def test_a_feature_of_each_use_against_the_anchor_is_counted_once_per_value(write_rules):
    # The last condition never holds and is no cheap one: every anchor asks the quantifier.
    rules = rewrite.load_rules(write_rules(SHIFTS.replace("CONDITION", "exists i in [1]: i == 2")))
    (rule,) = rules.rules
    adapter = Counting(_shifts())
    driver = Driver(rules.rules, adapter, registered_predicates())
    anchors = list(driver.candidates(rule))
    decided = [driver.decide(rule, anchor) for anchor in anchors]
    # x's uses (the USES Negs) listed once for all the anchors, not once each.
    assert adapter.listed == USES
    explained = {e.anchor: e for e in explain(rules.rules, OnnxAdapter(_shifts()), registered_predicates())}
    for anchor, decision in zip(anchors, decided):
        name = adapter.op_name(anchor)
        assert not decision.fires and explained[name].truth == str(decision.truth) == "no"
        # An even layer's q has rank 2, as every use of x: it fails on the last condition instead.
        failed = "every use" if int(name[3:]) % 2 else "exists"
        assert explained[name].condition.startswith(failed), explained[name]


def test_counted_uses_fire_as_the_walk_would(write_rules):
    built = _shifts()
    feeds = {"x": np.random.default_rng(1).normal(size=(3, 4)).astype(np.float32)}
    expected = _run(built, feeds)
    statistics = rewrite.load_rules(write_rules(SHIFTS.replace("CONDITION", "true"))).apply(built)
    onnx.checker.check_model(built, full_check=True)
    # Every use of x has rank 2; q of rank 2 only in the even layers: those become Subs.
    assert statistics.fires == USES // 2
    ops = [n.op_type for n in built.graph.node]
    assert (ops.count("Sub"), ops.count("Add"), ops.count("Neg")) == (USES // 2, USES // 2, USES // 2)
    np.testing.assert_array_equal(_run(built, feeds)[0], expected[0])


def test_a_walk_over_uses_waits_for_the_cheap_conditions_after_it(write_rules):
    # Not one feature (an `or`): walked; the rank test after it refuses first.
    text = SHIFTS.replace("rank(%u) == rank(%q)", "rank(%u) == rank(%q) or rank(%u) == 0")
    rules = rewrite.load_rules(write_rules(text.replace("CONDITION", "rank(%q) == 7")))
    (rule,) = rules.rules
    adapter = Counting(_shifts())
    driver = Driver(rules.rules, adapter, registered_predicates())
    for anchor in driver.candidates(rule):
        assert not driver.decide(rule, anchor).fires
    assert adapter.listed == 0
    explained = explain(rules.rules, OnnxAdapter(_shifts()), registered_predicates())
    assert {e.failed for e in explained} == {"rank(%q) == 7"}


# ------------------------------------------------------------ kept tallies follow the run's edits

GUARDED = """
dialect onnx
rule drop_double_neg_while_no_cast_reads_the_shape
  "-(-y) is y (the every use is a guard that an edit of another rule turns to no)."
  match %r = Reshape(data=%n, shape=%s)
  where %n is Neg(X=%m) and %m is Neg(X=%y)
  where every use %u of %s: op_type(%u) != "Cast"
  rewrite %n -> %y

rule drop_identity
  "An Identity is its input."
  match %t = Identity(input=%v)
  rewrite %t -> %v
"""


def _guarded() -> onnx.ModelProto:
    """Per layer Reshape(Neg(Neg(Neg(Neg(prev)))), s), s = Shape(x); last, Cast(Identity(s)) out.

    The rule drops two Negs a sweep per layer. At the end of sweep 1 the
    Identity goes and the Cast reads s: sweep 2 must see it."""
    nodes = [helper.make_node("Shape", ["x"], ["s"])]
    previous = "x"
    for layer in range(LAYERS):
        for step in range(4):
            nodes.append(helper.make_node("Neg", [previous], [f"n{layer}_{step}"]))
            previous = f"n{layer}_{step}"
        nodes.append(helper.make_node("Reshape", [previous, "s"], [f"r{layer}"], name=f"reshape{layer}"))
        previous = f"r{layer}"
    nodes += [helper.make_node("Identity", ["s"], ["t"]), helper.make_node("Cast", ["t"], ["c"], to=TensorProto.FLOAT)]
    value = helper.make_tensor_value_info
    graph = helper.make_graph(nodes, "guarded", [value("x", TensorProto.FLOAT, ["batch", 4])],
                              [value(previous, TensorProto.FLOAT, ["batch", 4]), value("c", TensorProto.FLOAT, [2])])
    built = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    onnx.checker.check_model(built, full_check=True)
    return built


def test_a_use_another_rule_adds_turns_a_kept_verdict(write_rules):
    built = _guarded()
    feeds = {"x": np.random.default_rng(2).normal(size=(3, 4)).astype(np.float32)}
    expected = _run(built, feeds)
    rules = rewrite.load_rules(write_rules(GUARDED))
    adapter = Counting(built)
    statistics = rules.apply_with(adapter)
    adapter.release()
    onnx.checker.check_model(built, full_check=True)
    for old, new in zip(expected, _run(built, feeds)):
        np.testing.assert_array_equal(old, new)
    kinds = [n.op_type for n in built.graph.node]
    # Sweep 1: two Negs of each layer go, then the Identity. Sweep 2: a Cast reads s, nothing more fires.
    assert statistics.fired("drop_double_neg_while_no_cast_reads_the_shape") == LAYERS
    assert statistics.fired("drop_identity") == 1 and statistics.sweeps == 2
    assert (kinds.count("Neg"), kinds.count("Identity"), kinds.count("Cast")) == (2 * LAYERS, 0, 1)
    # s's uses (the Reshapes and the Identity) listed once: the Cast joined the kept tally when it moved.
    assert adapter.of["s"] == LAYERS + 1
    explained = explain(rules.rules, OnnxAdapter(built), registered_predicates())
    assert {e.condition for e in explained if e.rule.startswith("drop_double")} == {
        'every use %u of %s: op_type(%u) != "Cast"'}


def test_a_use_the_run_removes_leaves_the_kept_tally_right(write_rules):
    """Each fire removes a use of s (the Reshape): the tally is told, never listed again."""
    text = """
    dialect onnx
    rule reshapes
      "A Reshape of y to Shape(x), y of x's shape, every use of which is a Reshape, is y."
      match %r = Reshape(data=%n, shape=%s)
      where %s is Shape(data=%x)
      where every use %u of %s: op_type(%u) == "Reshape"
      where shape(%n) == shape(%x)
      rewrite %r -> %n
    """
    built = _model(extra_use=False)
    feeds = {"x": np.random.default_rng(3).normal(size=(3, 4)).astype(np.float32)}
    expected = _run(built, feeds)
    adapter = Counting(built)
    statistics = rewrite.load_rules(write_rules(text)).apply_with(adapter)
    adapter.release()
    np.testing.assert_array_equal(_run(built, feeds)[0], expected[0])
    kinds = [n.op_type for n in built.graph.node]
    assert statistics.fires == LAYERS and (kinds.count("Reshape"), kinds.count("Shape")) == (0, 0)
    assert adapter.of["s"] == LAYERS


MIL_RULES = """
dialect mil
rule untile_while_every_use_of_the_mean_is_a_tile
  "mul broadcasts: it reads the mean itself, not its tile (while every use of the mean is a tile)."
  match %p = mul(x=%x, y=%t)
  where %t is tile(x=%m, reps=_)
  where every use %u of %m: op_type(%u) == "tile"
  where rank(%m) == rank(%x) and dim(%m, 1) == 1 and dim(%x, 0) == dim(%m, 0)
  rewrite %t -> %m in %p
"""


def test_mil_a_kept_tally_follows_the_uses_the_run_changes(write_rules):
    """The first fire makes a mul read the mean: no longer every use is a tile, and nothing more fires."""
    from tests.engine.test_scale_mil import CountingAdapter, _counts, _outputs

    program = fan_out(30)
    expected = _outputs(program)
    adapter = CountingAdapter(MilAdapter(program))
    statistics = rewrite.load_rules(write_rules(MIL_RULES)).apply_with(adapter)
    program.validate()
    for want, got in zip(expected, _outputs(program)):
        for name in want:
            np.testing.assert_array_equal(want[name], got[name])
    counts = _counts(program)
    assert statistics.fires == 1 and statistics.sweeps == 2
    assert (counts["tile"], counts["mul"]) == (29, 30)
    # The 30 uses listed once; the tally then learned of the mul (and the tile's removal).
    assert adapter.listed <= 30 + 30
