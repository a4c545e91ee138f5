"""`explain` says what `apply` does: one semantics, compiled once, traced for explanations.

Every condition of every shipped rule is decided traced and untraced, at
every anchor of every program the shipped examples build, and the two must
agree on the verdict and the bindings; where a rule holds but its rewrite
cannot be built (an op the target lacks), explain says so and apply does
not fire, counting it; and a tracer that reports less than it should fails
the explanation tests.
"""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import TensorProto, helper

import rewrite
from rewrite import backends
from rewrite.engine import conditions as conditions_module
from rewrite.engine.driver import Driver
from rewrite.engine.explain import UNAVAILABLE, explain, format_text
from rewrite.examples import example_ops
from rewrite.predicates import registered_predicates
from tests.engine.toy_ir import Graph, ToyAdapter, load_toy_rules

SHIPPED = rewrite.load_rules()


def _example_programs(rule):
    """The programs `rule`'s examples build (what they start from)."""
    backend = backends.backend_module(rule.dialect)
    for example in rule.examples:
        inputs = [(s.var.lstrip("%"), s.dtype, s.dims) for s in example.inputs]
        outputs = [var.lstrip("%") for var in example.outputs]
        # Every shipped example builds (`rewrite check` says so): one that does not fails here too.
        yield backend.build_example(inputs, example_ops(example.statements), outputs, opset=example.opset)


def _generated_programs(rule, count: int = 8):
    """Programs `rewrite verify`'s generator builds for `rule` (its examples stripped): the whole
    pattern, with the conditions' own constants and those beside them."""
    from dataclasses import replace

    from rewrite.verify.choices import plans
    from rewrite.verify.generator import Generator

    backend = backends.backend_module(rule.dialect)
    built = 0
    for instance in plans(Generator(replace(rule, examples=())).instance, 4 * count):
        if instance is None:
            continue
        try:
            program = backend.build_example(instance.inputs, instance.ops, instance.outputs,
                                            nested_by="flag" if instance.nested else None, opset=instance.opset)
        except Exception:
            continue  # a graph the IR refuses is no instance
        yield program
        built += 1
        if built == count:
            return


def _decide_both_ways(rule, program) -> int:
    driver = Driver([rule], backends.adapter_for(program), registered_predicates())
    decided = 0
    for anchor in driver.candidates(rule):
        untraced = driver.decide(rule, anchor)
        traced = driver.decide(rule, anchor, traced=True)
        assert (traced.matched, traced.truth, traced.env, traced.exhausted) == (
            untraced.matched, untraced.truth, untraced.env, untraced.exhausted), rule.name
        if traced.matched and not traced.fires and not traced.exhausted:
            assert traced.failure is not None, rule.name  # a traced decision that did not hold says why
        decided += traced.matched
    return decided


@pytest.mark.parametrize("dialect", ["onnx", "mil"])
def test_every_shipped_condition_decides_the_same_on_generated_instances(dialect):
    """The same, on the verify generator's instances of each rule, which reach conditions its examples do not."""
    rules = SHIPPED.for_dialect(dialect)
    decided = fired = 0
    with np.errstate(all="ignore"):
        for rule in rules:
            for program in _generated_programs(rule):
                decided += _decide_both_ways(rule, program)
                fired += 1
    assert decided > 100 and fired > 100


@pytest.mark.parametrize("dialect", ["onnx", "mil"])
def test_every_shipped_condition_decides_the_same_traced_and_untraced(dialect):
    """Each rule at every anchor of its own examples' programs (those that fire and those that must not:
    they are written to reach each condition), and of the next rule's, for what it was not written for."""
    rules = SHIPPED.for_dialect(dialect)
    decided = 0
    for index, rule in enumerate(rules):
        neighbour = rules[(index + 1) % len(rules)]
        for program in [*_example_programs(rule), *_example_programs(neighbour)]:
            driver = Driver([rule], backends.adapter_for(program), registered_predicates())
            for anchor in driver.candidates(rule):
                untraced = driver.decide(rule, anchor)
                traced = driver.decide(rule, anchor, traced=True)
                assert (traced.matched, traced.truth, traced.env, traced.exhausted) == (
                    untraced.matched, untraced.truth, untraced.env, untraced.exhausted), rule.name
                if traced.matched and not traced.fires and not traced.exhausted:
                    # A traced decision that did not hold always says why.
                    assert traced.failure is not None, rule.name
                decided += traced.matched
    assert decided > 200  # the examples reach most rules' conditions


# ---------------------------------------------------------------- an op the target lacks

HARD_SWISH = """
dialect onnx
rule fuse_hard_swish_without_asking "x * HardSigmoid(x) (alpha 1/6, beta 1/2) is HardSwish(x)"
  match %m = Mul(%x, %h) in any order
  where %h is HardSigmoid(X=%x)
  where close(attribute(%h, "alpha"), 1.0 / 6, rel=1e-6) and close(attribute(%h, "beta"), 0.5, rel=1e-6)
  rewrite %m -> HardSwish(X=%x)
"""


def _hard_swish_model(opset: int) -> onnx.ModelProto:
    graph = helper.make_graph(
        [helper.make_node("HardSigmoid", ["x"], ["h"], alpha=1.0 / 6, beta=0.5),
         helper.make_node("Mul", ["x", "h"], ["y"])],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def test_explain_says_an_op_the_opset_lacks_is_why_apply_does_not_fire(write_rules, tmp_path, capsys):
    rules = rewrite.load_rules(write_rules(HARD_SWISH))
    old = _hard_swish_model(13)  # HardSwish is opset 14
    (item,) = explain(rules.rules, backends.adapter_for(old), registered_predicates())
    assert not item.fired and item.reason == UNAVAILABLE and item.failed == "HardSwish"
    assert "available(\"HardSwish\")" in format_text([item])
    statistics = rules.apply(old)
    assert statistics.fired("fuse_hard_swish_without_asking") == 0
    assert statistics.rules["fuse_hard_swish_without_asking"].unevaluable == 1
    assert [node.op_type for node in old.graph.node] == ["HardSigmoid", "Mul"]
    # --stats says it beside fired and refused.
    source = tmp_path / "old.onnx"
    onnx.save(_hard_swish_model(13), source)
    from rewrite.cli import main

    assert main(["apply", str(source), "-o", str(tmp_path / "out.onnx"), "--rules", str(write_rules(HARD_SWISH)),
                 "--stats"]) == 0
    assert "fired 0  tried 1  not built 1" in capsys.readouterr().out
    # At opset 14 explain says it fires, and it does, with the same values.
    new = _hard_swish_model(14)
    (item,) = explain(rules.rules, backends.adapter_for(new), registered_predicates())
    assert item.fired
    before = onnx.ModelProto()
    before.CopyFrom(new)
    assert rules.apply(new).fired("fuse_hard_swish_without_asking") == 1
    assert [node.op_type for node in new.graph.node] == ["HardSwish"]
    x = np.linspace(-4, 4, 6, dtype=np.float32).reshape(2, 3)
    run = lambda model: onnxruntime.InferenceSession(  # noqa: E731
        model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(run(new), run(before), rtol=1e-6, atol=1e-6)
    json.dumps(item.as_dict())


# ---------------------------------------------------------------- the tracer is what explain reads

EVERY_USE = """
dialect toy
rule remove_tile "a tile whose every use is an add of a full-size operand"
  match %t = tile(x=%x, reps=%reps)
  where every use %u of %t: %u is add(%t, %other) in any order and dim(%other, 0) == 4
  rewrite %t -> %x
"""


def _tile_into_adds() -> Graph:
    graph = Graph()
    s = graph.input("s", (1, 8))
    wide = graph.input("wide", (4, 8))
    narrow = graph.input("narrow", ("b", 8))
    tile = graph.op("tile", x=s, reps=graph.const(np.array([4, 1])), shape=(4, 8))
    graph.main.outputs = [graph.op("add", x=tile, y=wide, shape=(4, 8)),
                          graph.op("add", x=narrow, y=tile, shape=(4, 8))]
    return graph


def test_the_explanation_names_the_use_and_the_values_seen(write_rules):
    (item,) = explain(load_toy_rules(write_rules(EVERY_USE)).rules, ToyAdapter(_tile_into_adds()), {})
    assert not item.fired and item.truth == "unknown"
    assert item.failed == "dim(%other, 0) == 4"
    assert any(step.startswith("%u = ") for step in item.path)  # the use being examined
    assert len(item.values) == 2
    assert item.values[0].startswith("dim(%other, 0) = b") and item.values[1] == "4 = 4"


@pytest.mark.parametrize("mutant", ["drops the bindings", "drops the sides", "reports the outermost"])
def test_a_tracer_that_reports_less_fails_the_explanation(write_rules, monkeypatch, mutant):
    original = conditions_module.Tracer.fail

    def fail(self, expr, truth, env, extra=(), sides=None):
        original(self, expr, truth, env, extra, sides)
        failure = self.failure
        if failure is not None:
            kept = {"drops the bindings": dict(bindings=()), "drops the sides": dict(sides=None)}.get(mutant, {})
            self.failure = conditions_module.Failure(
                failure.expr, failure.truth, kept.get("bindings", failure.bindings), failure.env,
                kept.get("sides", failure.sides))

    if mutant == "reports the outermost":
        def fail(self, expr, truth, env, extra=(), sides=None):  # noqa: F811 - the last report wins, not the first
            self.failure = None
            original(self, expr, truth, env, extra, sides)

    monkeypatch.setattr(conditions_module.Tracer, "fail", fail)
    with pytest.raises(AssertionError):
        test_the_explanation_names_the_use_and_the_values_seen(write_rules)
