"""Carrying out a rule's `rewrite` clause, and cleaning up after it."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from rewrite.engine.conditions import Evaluator
from rewrite.engine.guard import Refusal, ShapeGuard
from rewrite.engine.interfaces import Adapter, Op, Value
from rewrite.engine.matcher import Environment
from rewrite.language import ast


class RewriteRefused(Exception):
    """The shape guard could not prove a rewrite keeps its consumers' types; nothing was replaced.

    `built` are the ops the rewrite had already built; no value uses them yet.
    """

    def __init__(self, refusal: Refusal, built: list[Op]):
        super().__init__(str(refusal))
        self.refusal = refusal
        self.built = built


class Rewriter:
    """Applies actions through an adapter; names new ops after their rule.

    A rule's actions are carried out in three steps: build every new op,
    let the shape guard check every replacement against the graph as it was
    matched, then replace. A refusal therefore leaves no use changed.
    """

    def __init__(self, adapter: Adapter, evaluator: Evaluator):
        self.adapter = adapter
        self.evaluator = evaluator
        self.guard = ShapeGuard(adapter)
        self._serial = itertools.count()

    def apply(self, rule: ast.Rule, env: Environment, anchor: Op) -> list[Op]:
        """Run every action of `rule`; return the ops that may now be dead.

        Raises `RewriteRefused` if the guard cannot prove every replacement.
        """
        adapter = self.adapter
        env = dict(env)
        built: list[Op] = []
        replacements: list[tuple[Value, Value, Op | None]] = []
        for action in rule.actions:
            if isinstance(action, ast.BuildAction):
                env[action.var] = self._build(rule, action.build, env, anchor)
                built.append(adapter.producer(env[action.var]))
                continue
            old = env[action.target]
            replacement = action.replacement
            if action.within is not None:
                # Only one consumer's operands change; `old` keeps its other uses.
                replacements.append((old, env[replacement.var], adapter.producer(env[action.within])))
                continue
            if isinstance(replacement, ast.ValueRef):
                new = env[replacement.var]
            else:
                if isinstance(replacement, ast.OpBuild):
                    new = self._build(rule, replacement, env, anchor)
                else:
                    new = self._rebuild(rule, replacement, env, anchor)
                if new is not None and adapter.producer(new) is not None:
                    built.append(adapter.producer(new))
            replacements.append((old, new, None))
        for old, new, within in replacements:
            refusal = self.guard.check(old, new, None if within is None else [within])
            if refusal is not None:
                raise RewriteRefused(refusal, built)
        touched: list[Op] = [anchor, *built]
        for old, new, within in replacements:
            if within is not None:
                adapter.replace_operand(within, old, new)
                continue
            producer = adapter.producer(old)
            adapter.replace_all_uses(old, new)
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
