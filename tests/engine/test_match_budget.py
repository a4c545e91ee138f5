"""The match budget, and the pruned search over orders of `in any order`.

A rule of three plain sub-patterns in any order over a Max of 32 distinct
operands matches structurally in 29,760 orders, none of which its condition
accepts: the anchor spends its budget and the rule is skipped there, which
the statistics, the CLI and explain say, naming the rule. The same rule on
other anchors, where an early order holds, still fires, and onnxruntime
gives the same outputs before and after. Dropping a duplicate operand is
exact for Max, whatever the values (NaN included).
"""

from __future__ import annotations

import json
from itertools import permutations

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import TensorProto, helper

import rewrite
from rewrite import cli
from rewrite.backends.onnx import OnnxAdapter
from rewrite.engine.driver import Driver
from rewrite.engine.explain import BUDGET, explain, format_text
from rewrite.engine.matcher import MATCH_BUDGET, Budget, MatchBudgetExceeded, Matcher
from rewrite.predicates import registered_predicates

WIDE = 32
DEDUPE = """
dialect onnx
rule dedupe
  "A Max that reads one value twice reads it once."
  match %m = Max(%a, %b, %c, %rest...) in any order
  where %a is %b
  rewrite %m -> %m with data_0=(%a if i == 0 else (%c if i == 1 else %rest[i - 2]) for i in range(len(%rest) + 2))
"""
NEVER = """
dialect onnx
rule never
  "A Max of an Exp and two others: no operand is an Exp, so the first sub-pattern ends the search."
  match %m = Max(%e = Exp(input=%x), %b, %c, %rest...) in any order
  where %b is %c
  rewrite %m -> %m with data_0=(%e if i == 0 else (%c if i == 1 else %rest[i - 2]) for i in range(len(%rest) + 2))
"""


def _model() -> onnx.ModelProto:
    """Three Maxes of Negs of x: `distinct` (32 operands, none twice), `early` (32, its
    first two the same) and `narrow` (x, x, y)."""
    nodes = [helper.make_node("Neg", ["x"], [f"n{i}"]) for i in range(WIDE)]
    nodes += [helper.make_node("Abs", [f"n{i}"], [f"p{i}"]) for i in range(WIDE - 1)]
    nodes.append(helper.make_node("Max", [f"n{i}" for i in range(WIDE)], ["distinct"], name="distinct"))
    nodes.append(helper.make_node("Max", ["n0"] + [f"p{i}" for i in range(WIDE - 1)], ["early"], name="early"))
    nodes[-1].input[1] = "n0"  # operands 0 and 1 are the same value
    nodes.append(helper.make_node("Max", ["x", "x", "y"], ["narrow"], name="narrow"))
    value = lambda name: helper.make_tensor_value_info(name, TensorProto.FLOAT, ["batch", 3])  # noqa: E731
    graph = helper.make_graph(nodes, "budget", [value("x"), value("y")],
                              [value("distinct"), value("early"), value("narrow")])
    built = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    onnx.checker.check_model(built, full_check=True)
    return built


def _feeds(seed: int) -> dict:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(4, 3)).astype(np.float32)
    x[0, 0] = np.nan
    return {"x": x, "y": rng.normal(size=(4, 3)).astype(np.float32)}


def _run(built: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    session = onnxruntime.InferenceSession(built.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def _widths(built: onnx.ModelProto) -> dict[str, int]:
    """Inputs of each Max, by its output (a rebuilt node has a name of its own; the output keeps its)."""
    return {n.output[0]: len(n.input) for n in built.graph.node if n.op_type == "Max"}


def test_the_budget_skips_one_anchor_and_the_rule_still_fires_elsewhere(write_rules):
    built = _model()
    expected = [_run(built, _feeds(seed)) for seed in (0, 1)]
    rules = rewrite.load_rules(write_rules(DEDUPE))
    statistics = rules.apply(built)
    onnx.checker.check_model(built, full_check=True)
    for seed, outputs in zip((0, 1), expected):
        for old, new in zip(outputs, _run(built, _feeds(seed))):
            np.testing.assert_array_equal(old, new)
    # `early` and `narrow` lose their duplicate; `distinct` is never decided.
    assert _widths(built) == {"distinct": WIDE, "early": WIDE - 1, "narrow": 2}
    assert sum(n.op_type == "Max" for n in built.graph.node) == 3
    found = statistics.rules["dedupe"]
    assert found.fires == 2
    # Sweep 1 skips `distinct`; sweep 2 skips it again, and `early`, now 31
    # distinct operands; nothing fires in sweep 2, so the run ends.
    assert (found.exhausted, statistics.exhausted, statistics.sweeps) == (3, 3, 2)
    assert statistics.as_dict()["rules"]["dedupe"]["exhausted"] == 3


def test_a_first_sub_pattern_that_matches_no_operand_ends_the_search(write_rules):
    built = _model()
    rules = rewrite.load_rules(write_rules(NEVER))
    adapter = OnnxAdapter(built)
    driver = Driver(rules.rules, adapter, registered_predicates())
    distinct = next(op for op in driver.candidates(rules.rules[0]) if adapter.op_name(op) == "distinct")
    decision = driver.decide(rules.rules[0], distinct)
    assert not decision.exhausted and not decision.matched
    # One try per operand for the Exp, and nothing after.
    assert driver.budget.spent == WIDE
    statistics = driver.run()
    assert (statistics.rules["never"].fires, statistics.rules["never"].exhausted) == (0, 0)


def test_a_budget_of_a_few_attempts_skips_what_a_full_one_fires(write_rules):
    rules = rewrite.load_rules(write_rules(DEDUPE))
    built = _model()
    adapter = OnnxAdapter(built)
    driver = Driver(rules.rules, adapter, registered_predicates(), match_budget=3)
    rule = rules.rules[0]
    narrow = next(op for op in driver.candidates(rule) if adapter.op_name(op) == "narrow")
    # Max(x, x, y): positions 0, 1, 2 are 3 tries, and the first bindings a 4th attempt.
    assert driver.decide(rule, narrow).exhausted
    assert Driver(rules.rules, adapter, registered_predicates(), match_budget=4).decide(rule, narrow).fires
    with pytest.raises(ValueError):
        Budget(0)


def test_explain_names_the_rule_the_budget_skipped(write_rules):
    rules = rewrite.load_rules(write_rules(DEDUPE))
    explanations = explain(rules.rules, OnnxAdapter(_model()), registered_predicates())
    by_anchor = {e.anchor: e for e in explanations}
    assert by_anchor["distinct"].reason == BUDGET and not by_anchor["distinct"].fired
    assert f"rule 'dedupe' took more than {MATCH_BUDGET} structural attempts" in by_anchor["distinct"].note
    assert by_anchor["early"].fired and by_anchor["narrow"].fired
    text = format_text(explanations)
    assert "dedupe @ distinct  NOT FIRED" in text
    assert "not decided: rule 'dedupe' took more than" in text


def test_the_cli_reports_the_skipped_rule(write_rules, tmp_path, capsys):
    rules_path = write_rules(DEDUPE)
    source = tmp_path / "in.onnx"
    onnx.save(_model(), source)
    assert cli.main(["apply", str(source), "-o", str(tmp_path / "out.onnx"), "--rules", str(rules_path),
                     "--stats"]) == cli.EXIT_OK
    captured = capsys.readouterr()
    assert "dedupe  fired 2  tried " in captured.out and "skipped 3 (match budget)" in captured.out
    assert captured.err.splitlines() == [
        "note: rule 'dedupe' was skipped at 3 anchors: matching it there took more than its budget of "
        "structural attempts (see 'rewrite explain')"
    ]
    assert cli.main(["apply", str(source), "-o", str(tmp_path / "out2.onnx"), "--rules", str(rules_path),
                     "--json"]) == cli.EXIT_OK
    captured = capsys.readouterr()
    assert json.loads(captured.out)["rules"]["dedupe"]["exhausted"] == 3
    assert "rule 'dedupe' was skipped at 3 anchors" in captured.err


def test_a_run_within_the_budget_says_nothing(write_rules, tmp_path, capsys):
    source = tmp_path / "in.onnx"
    onnx.save(_model(), source)
    assert cli.main(["apply", str(source), "-o", str(tmp_path / "out.onnx"), "--rules",
                     str(write_rules(NEVER))]) == cli.EXIT_OK
    assert capsys.readouterr().err == ""


ORDERS = """
dialect onnx
rule orders
  "Every way three sub-patterns take distinct operands."
  match %m = Max(%a = Neg(X=%x), %b, %a2 = Neg(X=%x), %rest...) in any order
  rewrite %m -> %b
"""


def test_the_search_yields_what_every_permutation_would_in_the_same_order(write_rules):
    """Against the definition: each permutation of positions, in order, the sub-patterns tested in sequence."""
    x = "x"
    nodes = [helper.make_node("Neg", [x], ["n0"]), helper.make_node("Neg", [x], ["n1"]),
             helper.make_node("Neg", ["y"], ["n2"])]
    operands = ["n0", "y", "n1", "n2", "n0"]
    nodes.append(helper.make_node("Max", operands, ["m"], name="m"))
    value = lambda name: helper.make_tensor_value_info(name, TensorProto.FLOAT, [3])  # noqa: E731
    graph = helper.make_graph(nodes, "orders", [value("x"), value("y")], [value("m")])
    adapter = OnnxAdapter(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]))
    (rule,) = rewrite.load_rules(write_rules(ORDERS)).rules
    matcher = Matcher(adapter)
    anchor = next(op for op in adapter.operations(adapter.top_blocks()[0]) if adapter.op_type(op) == "Max")
    values = list(adapter.operands(anchor))
    patterns = [operand.pattern for operand in rule.anchor.pattern.operands[:3]]
    expected = []
    for order in permutations(range(len(values)), 3):
        environments = [{"%m": adapter.outputs(anchor)[0]}]
        for pattern, position in zip(patterns, order):
            environments = [e for env in environments for e in matcher.match_value(pattern, values[position], env)]
        rest = tuple(v for i, v in enumerate(values) if i not in order)
        expected += [{**env, "%rest": rest} for env in environments]
    found = list(matcher.match_rule(rule, anchor))
    assert found == expected
    # n0, n1 and the second n0 are Negs of x: 3 * 2 orders of them, each with any of the 3 others as %b.
    assert len(found) == 18
    budget = Budget(len(values))
    with pytest.raises(MatchBudgetExceeded):
        budget.start()
        list(Matcher(adapter, budget=budget).match_rule(rule, anchor))
