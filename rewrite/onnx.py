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
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import onnx

from rewrite.api import RuleSet, load_rules, paused_garbage_collection
from rewrite.backends.onnx import OnnxAdapter, count_nodes, validation
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
from rewrite.engine.steps import StepLimitReached, Steps, first_breaking_step

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
    # Whether initializers the main graph lists as inputs were taken as inputs
    # a user may override (else as constants), and how many it lists so.
    overridable_initializers: bool = True
    listed_initializers: int = 0
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
        into.kept = rule.kept  # places in the graph as it now is, not events: the latest run's
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

    The converter returns the main graph alone: model-local functions and
    `training_info` are converted here one by one, each as a model of its
    own, and put back. Raises `ModelError` naming the versions (and the
    function or training graph) where the converter cannot do it (an op it
    has no adapter for, say); the model is then left as it was.
    """
    current = default_opset(model)
    if current == opset:
        return
    from onnx import version_converter

    def converted(part: onnx.ModelProto, what: str) -> onnx.ModelProto:
        try:
            return version_converter.convert_version(part, opset)
        except Exception as error:  # the converter's own errors are RuntimeError and ValueError alike
            reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            raise ModelError(f"cannot convert {what} from opset {current} to {opset}: {reason}") from None

    main = onnx.ModelProto()
    main.CopyFrom(model)
    del main.functions[:]
    del main.training_info[:]
    result = converted(main, "the model")
    taken = _defined(result.graph)
    for function in model.functions:
        result.functions.append(_converted_function(function, model, opset, converted))
    for training in model.training_info:
        copy = onnx.TrainingInfoProto()
        copy.CopyFrom(training)
        for field_name in ("initialization", "algorithm"):
            if training.HasField(field_name):
                graph = _converted_graph(getattr(training, field_name), model, opset, taken,
                                         f"the training graph '{getattr(training, field_name).name}'", converted)
                getattr(copy, field_name).CopyFrom(graph)
        result.training_info.append(copy)
    model.CopyFrom(result)


def _converted_function(function: onnx.FunctionProto, model, opset: int, converted) -> onnx.FunctionProto:
    """`function` with its body converted to `opset` (of the default domain), as a graph of a model of its own."""
    if not any(entry.domain in ("", "ai.onnx") for entry in function.opset_import):
        return function  # nothing of the default domain in it: nothing to convert
    graph = onnx.helper.make_graph(
        list(function.node), function.name,
        [onnx.helper.make_value_info(name, onnx.TypeProto()) for name in function.input],
        [onnx.helper.make_value_info(name, onnx.TypeProto()) for name in function.output],
    )
    part = _part(graph, function.opset_import, model)
    try:
        body = converted(part, f"the function '{function.domain}:{function.name}'").graph
    except ModelError:
        if any(attribute.ref_attr_name for node in function.node for attribute in node.attribute):
            raise ModelError(f"cannot convert the function '{function.domain}:{function.name}' to opset {opset}: "
                             "its body refers to the function's attributes, which onnx's converter cannot "
                             "convert") from None
        raise
    result = onnx.FunctionProto()
    result.CopyFrom(function)
    del result.node[:]
    result.node.extend(body.node)
    for entry in result.opset_import:
        if entry.domain in ("", "ai.onnx"):
            entry.version = opset
    return result


def _converted_graph(graph: onnx.GraphProto, model, opset: int, taken: set[str], what: str, converted):
    """A training graph converted to `opset`: the names it reads from the main graph become inputs for the
    converter, and are taken back out; names the converter makes that the main graph has are renamed."""
    own = _defined(graph)
    outer = [name for name in _read(graph) if name not in own]
    wrapper = onnx.GraphProto()
    wrapper.CopyFrom(graph)
    for name in dict.fromkeys(outer):
        wrapper.input.append(onnx.helper.make_value_info(name, onnx.TypeProto()))
    result = converted(_part(wrapper, model.opset_import, model), what).graph
    del result.input[len(graph.input):]
    del result.value_info[:]
    made = _defined(result) - own
    clashes = {name: name for name in made if name in taken}
    for name in clashes:
        fresh, serial = name, 0
        while fresh in taken or fresh in made:
            serial += 1
            fresh = f"{name}_training_{serial}"
        clashes[name] = fresh
    if clashes:
        for node in result.node:
            node.input[:] = [clashes.get(name, name) for name in node.input]
            node.output[:] = [clashes.get(name, name) for name in node.output]
    return result


def _part(graph: onnx.GraphProto, opset_import, model) -> onnx.ModelProto:
    """A model around `graph`, importing what `opset_import` does, for the converter."""
    part = onnx.helper.make_model(graph, opset_imports=list(opset_import))
    part.ir_version = model.ir_version
    part.functions.extend(model.functions)  # a body may call another local function
    return part


def _defined(graph: onnx.GraphProto) -> set[str]:
    """Every name `graph` defines: inputs, initializers and node outputs, its subgraphs' included."""
    found = {info.name for info in graph.input} | {tensor.name for tensor in graph.initializer}
    for node in graph.node:
        found.update(node.output)
        for attribute in node.attribute:
            if attribute.type == onnx.AttributeProto.GRAPH:
                found |= _defined(attribute.g)
            for subgraph in attribute.graphs:
                found |= _defined(subgraph)
    found.discard("")
    return found


def _read(graph: onnx.GraphProto) -> list[str]:
    """Every name `graph`'s nodes read, its subgraphs' included, in order."""
    found = []
    for node in graph.node:
        found.extend(name for name in node.input if name)
        for attribute in node.attribute:
            if attribute.type == onnx.AttributeProto.GRAPH:
                found.extend(_read(attribute.g))
            for subgraph in attribute.graphs:
                found.extend(_read(subgraph))
    return found


def optimize(
    model,
    opset: int | None = None,
    *,
    rules: RuleSet | None = None,
    fold: bool = True,
    prune_dead: bool = True,
    fold_limit_bytes: int = DEFAULT_LIMIT_BYTES,
    max_rounds: int = DEFAULT_MAX_ROUNDS,
    constants_as_initializers: bool = True,
    overridable_initializers: bool | None = None,
    validate: bool = True,
    original: Callable[[], tuple[onnx.ModelProto, str | None]] | None = None,
    source: onnx_files.OnnxSource | None = None,
    **apply_options,
) -> OptimizeResult:
    """Clean up an `onnx.ModelProto` in place with folding, the rules and pruning; see the module docstring.

    External data stays where it is: a tensor too large to read is never
    folded. The model keeps its opset unless `opset` is given (then it is
    converted first, see the module docstring); rules that build newer ops
    check the opset themselves. `apply_options` go to each run of the rules
    (`max_sweeps`, `check_types`, `progress`; see `RuleSet.apply`). With
    `fold` and `prune_dead` false and `max_rounds` 1, only the rules run.

    An initializer the main graph also lists as an input is an input with a
    default from IR version 4 on, and a constant below (as onnxruntime takes
    them); `overridable_initializers` decides it either way.

    With `validate` (the default), the result must pass
    `onnx.checker.check_model(full_check=True)` if the model did: if it does
    not, the model is restored as it was and `InvalidOutputError` names the
    change (the rule, or the folding or pruning) that broke it. Finding it
    replays the run from a copy of the model, taken before it starts (or
    from `original()`, which returns the input again with the folder of its
    external data, if cheaper: the CLI reads its file again).

    A model `read_onnx` read with its external data left on disk reads its
    tensors from where `source` (what `read_onnx` returned) says.
    """
    base_dir = None if source is None else source.base_dir
    plan = _Plan(opset, rules if rules is not None else _shipped_rules(), fold, prune_dead, fold_limit_bytes,
                 max_rounds, constants_as_initializers, overridable_initializers, apply_options)
    if not validate:
        return plan.run(model, base_dir, None)
    if original is None:
        snapshot, snapshot_dir = _copy(model), base_dir

        def original() -> tuple[onnx.ModelProto, str | None]:
            return _copy(snapshot), snapshot_dir

    steps = Steps()
    result = plan.run(model, base_dir, steps)
    if not steps.taken:
        return result  # the model is the one given
    found = validation.problem(model)
    if found is None:
        return result
    source, base_dir = original()
    if validation.problem(source) is not None:
        return result  # it was not valid to begin with: no promise to keep
    quiet = replace(plan, apply_options={**apply_options, "progress": None})

    def replay(limit: Steps) -> onnx.ModelProto:
        copy = _copy(source)
        try:
            quiet.run(copy, base_dir, limit)
        except ModelError:
            pass  # a replay that fails as the run did not is no evidence either way
        return copy

    culprit = first_breaking_step(replay, len(steps.taken), validation.problem)
    model.CopyFrom(source)
    step, maker = culprit if culprit is not None else (None, None)
    raise validation.InvalidOutputError(found, maker, step)


def _copy(model: onnx.ModelProto) -> onnx.ModelProto:
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    return copy


@dataclass(frozen=True)
class _Plan:
    """What one run of `optimize` does, so that it can be run again the same way (a replay)."""

    opset: int | None
    rules: RuleSet
    fold: bool
    prune_dead: bool
    fold_limit_bytes: int
    max_rounds: int
    constants_as_initializers: bool
    overridable_initializers: bool | None
    apply_options: dict

    def run(self, model: onnx.ModelProto, base_dir: str | None, steps: Steps | None) -> OptimizeResult:
        """Optimize `model` in place, without validation; stop quietly at `steps.limit`."""
        result = OptimizeResult(nodes_before=count_nodes(model))
        try:
            if self.opset is not None and default_opset(model) != self.opset:
                _take(steps, f"the conversion to opset {self.opset}")
                convert_opset(model, self.opset)
            self._rounds(model, base_dir, steps, result)
            if self.prune_dead:
                _take(steps, "the pruning of unread initializers")
                result.pruned_initializers = prune_model(model, result.overridable_initializers)
                _made(steps, result.pruned_initializers)
            if self.constants_as_initializers:
                _take(steps, "the moving of Constants to initializers")
                result.constants_moved = constants_to_initializers(model)
                _made(steps, result.constants_moved)
        except StepLimitReached:
            pass
        result.nodes_after = count_nodes(model)
        result.statistics.ops_before, result.statistics.ops_after = result.nodes_before, result.nodes_after
        return result

    def _rounds(self, model, base_dir, steps: Steps | None, result: OptimizeResult) -> None:
        """Folding, the rules and pruning, round after round, over one index of the model."""
        with paused_garbage_collection():
            adapter = OnnxAdapter(model, base_dir, overridable_initializers=self.overridable_initializers)
            result.overridable_initializers = adapter.overridable_initializers
            listed = {info.name for info in model.graph.input}
            result.listed_initializers = sum(tensor.name in listed for tensor in model.graph.initializer)
            try:
                for _ in range(self.max_rounds):
                    result.rounds += 1
                    folded = fold_constants(adapter, self.fold_limit_bytes, steps) if self.fold else 0
                    result.folded += folded
                    statistics = self.rules.apply_with(adapter, steps=steps, **self.apply_options)
                    _add(result.statistics, statistics)
                    pruned = prune(adapter, steps) if self.prune_dead else 0
                    result.pruned_nodes += pruned
                    if not folded and not statistics.fires and not pruned:
                        break
            finally:
                # What changed so far is written back, at the limit too: a replay returns it.
                adapter.finish()
                adapter.release()


def _take(steps: Steps | None, maker: str) -> None:
    if steps is not None:
        steps.take(maker)


def _made(steps: Steps | None, changes: int) -> None:
    """A step taken changed nothing: it is no change to count (nor to blame)."""
    if steps is not None and not changes:
        steps.taken.pop()
