"""The shipped ONNX library as one call: `optimize(model)`.

    import onnx
    from rewrite.onnx import optimize

    model = onnx.load("model.onnx")
    result = optimize(model)          # in place; result.statistics says what fired
    onnx.save(model, "clean.onnx")

With `opset`, the model is first converted to that version of the default
domain by `onnx.version_converter` (as a user upgrades a model), so that the
fusions to ops of newer opsets (`LayerNormalization` 17, `Gelu` 20,
`RMSNormalization`, `RotaryEmbedding` and `Attention` 23) can fire; without
it the model keeps its opset, and each rule checks that opset itself.

Rounds of three steps, until a round changes nothing (at most `max_rounds`):

1. constant folding: nodes whose inputs are all constants, and shape
   computations whose every element the shape inference knows, become
   `Constant`s (`rewrite.backends.onnx.folding`);
2. the rules, every shipped ONNX rule unless `rules` is given, to a fixed point;
3. dead nodes pruned.

Then the initializers and value_info nothing reads any more are pruned, and
`Constant` nodes become initializers (as onnxscript's optimizer and onnxsim
leave them; `constants_as_initializers=False` keeps them nodes).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

from rewrite.api import RuleSet, load_rules, paused_garbage_collection
from rewrite.backends.onnx import OnnxAdapter, count_nodes
from rewrite.backends.onnx import files as onnx_files
from rewrite.backends.onnx.folding import (
    DEFAULT_LIMIT_BYTES,
    constants_to_initializers,
    fold_constants,
    prune,
    prune_model,
)
from rewrite.engine.driver import RuleStatistics, Statistics
from rewrite.engine.interfaces import ModelError

DEFAULT_MAX_ROUNDS = 8


@dataclass
class OptimizeResult:
    """What `optimize` did: nodes before and after (Constants counted as nodes only before),
    what folded, what the rules did over all rounds (`statistics`), and what was pruned."""

    nodes_before: int
    nodes_after: int = 0
    folded: int = 0
    pruned_nodes: int = 0
    pruned_initializers: int = 0
    constants_moved: int = 0
    rounds: int = 0
    statistics: Statistics = field(default_factory=Statistics)

    @property
    def fires(self) -> int:
        return self.statistics.fires


def _add(total: Statistics, run: Statistics) -> None:
    total.sweeps += run.sweeps
    total.removed_ops += run.removed_ops
    for name, rule in run.rules.items():
        into = total.rules.setdefault(name, RuleStatistics(name))
        into.attempts += rule.attempts
        into.fires += rule.fires
        into.refused += rule.refused
        into.unevaluable += rule.unevaluable
        into.exhausted += rule.exhausted
        into.seconds += rule.seconds


@functools.cache
def _shipped_rules() -> RuleSet:
    """The shipped ONNX rules, loaded once per process (a `RuleSet` is immutable)."""
    return load_rules(dialects=["onnx"])


def default_opset(model) -> int | None:
    """The version of the default ONNX domain the model imports; None if it imports none."""
    versions = [entry.version for entry in model.opset_import if entry.domain in ("", "ai.onnx")]
    return max(versions) if versions else None


def convert_opset(model, opset: int) -> None:
    """Convert `model` in place to `opset` of the default domain with `onnx.version_converter`.

    Raises `ModelError` naming the versions where the converter cannot do it
    (an op it has no adapter for, say); the model is then left as it was.
    """
    current = default_opset(model)
    if current == opset:
        return
    from onnx import version_converter

    try:
        converted = version_converter.convert_version(model, opset)
    except Exception as error:  # the converter's own errors are RuntimeError and ValueError alike
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise ModelError(f"cannot convert the model from opset {current} to {opset}: {reason}") from None
    model.CopyFrom(converted)


def optimize(
    model,
    opset: int | None = None,
    *,
    rules: RuleSet | None = None,
    fold: bool = True,
    fold_limit_bytes: int = DEFAULT_LIMIT_BYTES,
    max_rounds: int = DEFAULT_MAX_ROUNDS,
    constants_as_initializers: bool = True,
    **apply_options,
) -> OptimizeResult:
    """Clean up an `onnx.ModelProto` in place with folding, the rules and pruning; see the module docstring.

    External data stays where it is: a tensor too large to read is never
    folded. The model keeps its opset unless `opset` is given (then it is
    converted first, see the module docstring); rules that build newer ops
    check the opset themselves. `apply_options` go to each run of the rules
    (`max_sweeps`, `check_types`, `progress`; see `RuleSet.apply`).
    """
    if opset is not None:
        convert_opset(model, opset)
    rules = rules if rules is not None else _shipped_rules()
    with paused_garbage_collection():
        adapter = OnnxAdapter(model, onnx_files.base_dir_of(model))
        try:
            result = OptimizeResult(nodes_before=adapter.count_ops())
            for _ in range(max_rounds):
                result.rounds += 1
                folded = fold_constants(adapter, fold_limit_bytes) if fold else 0
                statistics = rules.apply_with(adapter, **apply_options)
                pruned = prune(adapter)
                result.folded += folded
                result.pruned_nodes += pruned
                _add(result.statistics, statistics)
                if not folded and not statistics.fires and not pruned:
                    break
            adapter.finish()
        finally:
            adapter.release()
        result.pruned_initializers = prune_model(model)
        if constants_as_initializers:
            result.constants_moved = constants_to_initializers(model)
        result.nodes_after = count_nodes(model)
        result.statistics.ops_before, result.statistics.ops_after = result.nodes_before, result.nodes_after
        return result
