"""Carrying out a rule's `rewrite` clause, and cleaning up after it."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from rewrite.engine.conditions import Evaluator
from rewrite.engine.interfaces import Adapter, Op
from rewrite.engine.matcher import Environment
from rewrite.language import ast


class Rewriter:
    """Applies actions through an adapter; names new ops after their rule."""

    def __init__(self, adapter: Adapter, evaluator: Evaluator):
        self.adapter = adapter
        self.evaluator = evaluator
        self._serial = itertools.count()

    def apply(self, rule: ast.Rule, env: Environment, anchor: Op) -> list[Op]:
        """Run every action of `rule`; return the ops that may now be dead."""
        env = dict(env)
        touched: list[Op] = [anchor]
        for action in rule.actions:
            if isinstance(action, ast.BuildAction):
                env[action.var] = self._build(rule, action.build, env, anchor)
                touched.append(self.adapter.producer(env[action.var]))
                continue
            old = env[action.target]
            replacement = action.replacement
            if action.within is not None:
                # Only one consumer's operands change; `old` keeps its other uses.
                consumer = self.adapter.producer(env[action.within])
                self.adapter.replace_operand(consumer, old, env[replacement.var])
                continue
            if isinstance(replacement, ast.ValueRef):
                new = env[replacement.var]
            elif isinstance(replacement, ast.OpBuild):
                new = self._build(rule, replacement, env, anchor)
            else:
                new = self._rebuild(rule, replacement, env, anchor)
            if new is not None and self.adapter.producer(new) is not None:
                touched.append(self.adapter.producer(new))
            producer = self.adapter.producer(old)
            self.adapter.replace_all_uses(old, new)
            if producer is not None:
                touched.append(producer)
        return touched

    def _name(self, rule: ast.Rule) -> str:
        return f"{rule.name}_{next(self._serial)}"

    def _arguments(self, arguments: Sequence[ast.Argument], env: Environment) -> dict:
        return {a.name: self.evaluator.value(a.value, env) for a in arguments}

    def _build(self, rule, build: ast.OpBuild, env, anchor):
        operands = self._arguments(build.arguments, env)
        return self.adapter.build(build.op, operands, anchor, self._name(rule))

    def _rebuild(self, rule, rebuild: ast.Rebuild, env, anchor):
        op = self.adapter.producer(env[rebuild.var])
        operands = {}
        for name in self.adapter.operand_names(op):
            operands[name] = self.adapter.operand(op, name)
        operands.update(self._arguments(rebuild.arguments, env))
        return self.adapter.build(self.adapter.op_type(op), operands, anchor, self._name(rule))


def remove_dead(adapter: Adapter, candidates: Sequence[Op]) -> int:
    """Remove each candidate no longer used, then its producers in turn.

    Only ops reachable backwards from what a rewrite touched are visited, so
    the cost is proportional to what the rewrite made dead, not to the graph.
    """
    removed = 0
    worklist = [op for op in candidates if op is not None]
    while worklist:
        op = worklist.pop()
        if not adapter.is_live(op) or adapter.has_side_effects(op):
            continue
        if any(adapter.consumers(v) or adapter.is_block_output(v) for v in adapter.outputs(op)):
            continue
        producers = [adapter.producer(v) for v in adapter.operands(op)]
        adapter.remove_op(op)
        removed += 1
        worklist.extend(p for p in producers if p is not None)
    return removed
