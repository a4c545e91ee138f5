"""One instance, before against after: does the rule fire, and does anything change?

Each instance is evaluated at several sizes of its symbolic dims, with four
kinds of inputs:

- plain: random normal values;
- edges: salted with ±0 and subnormals (a zero divisor among them);
- specials: salted with NaN and ±inf;
- large: salted with ±(largest finite) and ±1e30.

The comparison is NaN-aware: where the original computes NaN the rewrite
must too, and every number and infinity must stay (floats within the
dtype's precision). Two allowances, each for what a fused op may do:

- with NaN or ±inf in the inputs, the rewrite may compute NaN where the
  original computed something else (a fused softmax spreads a row's inf - inf
  over the row), never a number where it computed NaN: NaN still says the
  input was bad, where a number would hide it;
- with the largest finite values in the inputs, an element either side
  computes as inf or NaN, or past sqrt(largest finite) in magnitude, is in
  the overflow regime, and is not compared (exp(x)/sum(exp(x)) at x = 1e30 is
  NaN, and the fused softmax is right where it is not; a mask of -3.4e38
  masks nothing against scores of that size).

A constant of the graph enters the computation as an input does: an
instance with a NaN or infinite constant has the specials round's allowance
on every round. (A finite constant, however large, has none: the largest
finite value is a mask's fill, and a rule must say where a large one breaks it.)

So a rule that turns inf - inf into 0 is caught on the specials round, and
x/x into 1 on the edges round. A zero keeps its sign (x + 0.0 is +0.0 at
x = -0.0, so the rewrite to x is caught on the edges round), but for an
instance with a contraction (a dot product of -0.0 terms is -0.0 summed
from the first term and +0.0 from a zeroed accumulator, and kernels
differ) and for a rewrite that builds an op of a type the original does
not have (a fused op, which its spec defines as a formula, leaving the
sign of a zero result open).

A rule's `assume` clauses widen these as they say
(`rewrite.language.assumptions`): `no_nans`, any value where the original
computes NaN; `no_signed_zeros`, a zero of either sign for a zero;
`no_fully_masked_rows`, any value where the original computes NaN and a
zero where the rewrite gives one (a fused attention's row masked whole).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np

from rewrite import backends
from rewrite.api import RuleSet
from rewrite.engine.driver import UnsoundRewriteError
from rewrite.language import ast
from rewrite.verify.generator import BINDINGS, Instance

PLAIN, EDGES, SPECIALS, LARGE = "plain", "edges", "specials", "large"
ROUNDS = (
    tuple((binding, PLAIN) for binding in BINDINGS)
    + tuple((binding, EDGES) for binding in BINDINGS[:2])
    + tuple((binding, SPECIALS) for binding in BINDINGS[:2])
    + ((BINDINGS[0], LARGE),)
)
_SALT = {
    # -0.0 twice: a zero's sign is what an identity-looking rule most often loses.
    EDGES: {np.dtype(np.float32): [0.0, -0.0, -0.0, 1e-45, -1e-45, 1e-40],
            np.dtype(np.float16): [0.0, -0.0, -0.0, 6e-8, -6e-8, 3e-5]},
    SPECIALS: {np.dtype(np.float32): [np.nan, np.inf, -np.inf], np.dtype(np.float16): [np.nan, np.inf, -np.inf]},
    LARGE: {np.dtype(np.float32): [3.4028235e38, -3.4028235e38, 1e30, -1e30],
            np.dtype(np.float16): [65504.0, -65504.0, 3e4, -3e4]},
}


# The share of elements salted: edges most, as tensors of two or three elements are common.
_SALTED = {EDGES: 0.5}


@dataclass(frozen=True)
class Outcome:
    """What one instance showed.

    `fired`: the rule rewrote it and at least one round was compared.
    `problem`: what broke, if anything. `kinds`: the kinds of round that were
    compared (a round the original cannot evaluate is skipped, and counted
    in `skipped`). `refused`: the backend's reason the graph is no instance.
    """

    fired: bool
    problem: str | None = None
    kinds: frozenset[str] = frozenset()
    skipped: int = 0
    refused: str | None = None
    float_inputs: bool = False

    @property
    def complete(self) -> bool:
        """Compared on every kind of input its dtypes have (specials and large only for floats)."""
        wanted = {PLAIN, EDGES, SPECIALS, LARGE} if self.float_inputs else {PLAIN}
        return wanted <= self.kinds


def check(rule: ast.Rule, instance: Instance) -> Outcome:
    """Whether `rule` fires on `instance`, and what broke if it did."""
    backend = backends.backend_module(rule.dialect)
    try:
        program = backend.build_example(instance.inputs, instance.ops, instance.outputs,
                                        nested_by="flag" if instance.nested else None, opset=instance.opset)
        validate = getattr(backend, "validate_example", None)
        if validate is not None:
            validate(program)  # what the IR's own checker rejects is no instance either
    except Exception as error:
        return Outcome(False, refused=_first_line(error))  # not a valid graph of this IR: not an instance
    original = backend.copy_program(program)
    objecting = getattr(backend, "semantic_problems", lambda program: [])
    before = Counter(problem.key for problem in objecting(program))
    try:
        # Checked: a rewrite the engine's shape guard refuses is the rule's
        # own soundness failing, hidden in a normal run by the guard.
        statistics = RuleSet((rule,)).apply(program, check_types=True, assume=rule.assumption_names)
    except UnsoundRewriteError as error:
        if not runs_somewhere(backend, original, instance):
            return Outcome(False)  # not a valid graph to begin with: not an instance
        return Outcome(True, f"the rule fired where its consumers' types are not proved to stay: {error}")
    except Exception as error:  # the IR refused what the rule built: a counterexample
        return Outcome(True, f"the rewrite fails: {type(error).__name__}: {_first_line(error)}")
    if not statistics.fires:
        return Outcome(False)
    # Only what the rewrite introduced is its fault.
    after = Counter(problem.key for problem in objecting(program))
    objections = [problem for problem in objecting(program) if after[problem.key] > before[problem.key]]
    if objections:
        return Outcome(True, objections[0].message)
    rng = np.random.default_rng(0)
    floats = any(dtype in ("fp16", "fp32") for name, dtype, _ in instance.inputs if name != "flag")
    kinds: set[str] = set()
    skipped = 0
    contracting = any(op_type in backend.EXAMPLE_FACTS.contractions for _, op_type, _ in instance.ops)
    extremes = constant_regimes(instance)
    fused = _built_types(rule) - {op_type for _, op_type, _ in instance.ops}
    unsigned = {"no_signed_zeros"} if contracting or fused else set()
    for binding, kind in ROUNDS:
        if kind in (SPECIALS, LARGE) and not floats:
            continue
        if kind == LARGE and contracting:
            # A dot product of the largest values overflows in any order of
            # summation, and no two kernels promise the same one: nothing to compare.
            kinds.add(kind)
            continue
        feeds = feeds_for(rng, instance, binding, kind)
        evaluated = _evaluate_both(backend, original, program, feeds)
        if evaluated is None:
            skipped += 1
            continue  # these sizes do not broadcast in the original either
        expected, got = evaluated
        if isinstance(got, Exception):
            if any(0 in array.shape for array in feeds.values()):
                # The reference evaluators' kernels are not all written for
                # empty tensors (coremltools' l2_norm reshapes to (0, -1)):
                # a failure there is the evaluator's, not the rule's.
                skipped += 1
                continue
            return Outcome(True, f"the rewritten graph fails where the original runs ({binding}): {got}")
        kinds.add(kind)
        for name, value in expected.items():
            problem = compare(name, value, got.get(name), kind,
                              rule.assumption_names | unsigned, extremes)
            if problem:
                return Outcome(True, f"{problem} at {binding}{_ROUND_NOTES[kind]}", frozenset(kinds), skipped,
                               float_inputs=floats)
    return Outcome(bool(kinds), None, frozenset(kinds), skipped, float_inputs=floats)


def _built_types(rule: ast.Rule) -> set[str]:
    """The op types the rule's rewrite builds."""
    found = set()
    for action in rule.actions:
        build = action.build if isinstance(action, ast.BuildAction) else action.replacement
        if isinstance(build, ast.OpBuild):
            found.add(build.op)
    return found


def _evaluate_both(backend, original, program, feeds):
    """(expected, got) from one evaluator: the first of the backend's that runs the original.

    Where it cannot run the rewrite, the next evaluators decide: one that runs
    both gives the pair, and one that cannot run the original either says the
    original is no graph to run at these sizes (onnxruntime's optimizer runs
    some Reshapes the spec refuses), so None. Where every one that runs the
    original refuses the rewrite, got is the first error. None where none
    runs the original.
    """
    found = None
    for engine in backend.EXAMPLE_FACTS.engines:
        try:
            expected = backend.evaluate_example(original, feeds, engine=engine)
        except Exception:
            if found is not None:
                return None  # a stricter evaluator refuses the original too
            continue
        try:
            return expected, backend.evaluate_example(program, feeds, engine=engine)
        except Exception as error:
            found = found or (expected, error)
    return found


_ROUND_NOTES = {PLAIN: "", EDGES: " with ±0 and subnormals in the inputs", SPECIALS: " with NaN and ±inf in the inputs",
                LARGE: " with the largest finite values in the inputs"}


def _first_line(error: Exception) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def constant_regimes(instance: Instance) -> frozenset[str]:
    """The rounds whose allowances the instance's float constants call for (see the module)."""
    from rewrite.engine.interfaces import NamedValue

    found = set()
    for _, _, operands in instance.ops:
        for value in operands.values():
            if isinstance(value, (NamedValue, str, bool)) or value is None:
                continue
            try:
                array = np.asarray(value)
            except (TypeError, ValueError):
                continue
            if array.dtype.kind != "f" or array.size == 0:
                continue
            with np.errstate(invalid="ignore"):
                if not np.all(np.isfinite(array)):
                    found.add(SPECIALS)
    return frozenset(found)


def compare(name: str, expected: np.ndarray, got, kind: str = PLAIN,
            assumed: frozenset[str] = frozenset(), extremes: frozenset[str] = frozenset()) -> str | None:
    """What differs between an output before and after, if anything.

    Shapes and dtypes exactly; ints and bools exactly; floats within the
    dtype's own precision, NaN where NaN, each infinity where it was, a
    zero's sign, but for the allowances of the specials and large rounds
    and of what the rule assumes (see the module).
    """
    if got is None or got.shape != expected.shape:
        return f"output '{name}' has shape {None if got is None else got.shape} instead of {expected.shape}"
    if got.dtype != expected.dtype:
        return f"output '{name}' has dtype {got.dtype} instead of {expected.dtype}"
    if expected.dtype.kind != "f":
        return None if np.array_equal(expected, got) else f"output '{name}' changed value"
    tolerance = 1e-3 if expected.dtype == np.float16 else 1e-5
    close = np.isclose(expected, got, rtol=tolerance, atol=tolerance, equal_nan=True)
    if "no_signed_zeros" not in assumed:
        close &= ~((expected == 0) & (got == 0) & (np.signbit(expected) != np.signbit(got)))
    if "no_nans" in assumed:
        close |= np.isnan(expected)
    if "no_fully_masked_rows" in assumed:
        # A row masked whole by -inf is NaN in the original, and by the lowest finite value
        # an average where the fused op gives zeros.
        close |= np.isnan(expected) | (got == 0)
    kinds = extremes | {kind}
    if SPECIALS in kinds:
        close |= np.isnan(got)
    if LARGE in kinds:
        # The overflow regime: past sqrt(largest finite) a product of two
        # such values overflows, so either form's intermediates may have.
        regime = np.sqrt(np.finfo(expected.dtype).max)
        with np.errstate(invalid="ignore"):
            close |= ~(np.abs(expected) < regime) | ~(np.abs(got) < regime)
    if np.all(close):
        return None
    where = tuple(int(i) for i in np.argwhere(~close)[0])
    return (f"output '{name}' changed value (at {list(where)}: {expected[where]!r} before, "
            f"{np.asarray(got)[where]!r} after)")


def runs_somewhere(backend, program, instance: Instance) -> bool:
    """Whether `program` evaluates at any of the bindings tried."""
    rng = np.random.default_rng(0)
    for binding, kind in ROUNDS:
        try:
            backend.evaluate_example(program, feeds_for(rng, instance, binding, kind))
        except Exception:
            continue
        return True
    return False


def feeds_for(rng, instance: Instance, binding: dict, kind: str = PLAIN) -> dict:
    """Random inputs for `instance` with its symbolic dims bound by `binding`, salted as `kind` says."""
    feeds = {}
    for name, dtype, dims in instance.inputs:
        shape = tuple(binding[d] if isinstance(d, str) else d for d in dims)
        array = _random_array(rng, dtype, shape)
        salt = _SALT.get(kind, {}).get(array.dtype)
        if salt is not None and name != "flag":
            values = np.asarray(salt, dtype=array.dtype)
            salted = rng.random(shape) < _SALTED.get(kind, 0.3)
            array = np.where(salted, values[rng.integers(0, len(values), size=shape)], array).astype(array.dtype)
        feeds[name] = array
    return feeds


def _random_array(rng, dtype: str, shape) -> np.ndarray:
    if dtype == "bool":
        return rng.random(shape) > 0.5
    if dtype.startswith("int"):
        return rng.integers(-3, 4, size=shape).astype(dtype)
    return rng.standard_normal(shape).astype(np.float16 if dtype == "fp16" else np.float32)


def shrink(rule: ast.Rule, instance: Instance, problem: str) -> tuple[Instance, str]:
    """Smaller variants that still fail: fewer ops and outputs, smaller dims."""
    improved = True
    while improved:
        improved = False
        for candidate in _smaller(instance):
            outcome = check(rule, candidate)
            if outcome.fired and outcome.problem:
                instance, problem, improved = candidate, outcome.problem, True
                break
    return instance, problem


def _smaller(instance: Instance):
    used = lambda graph: {v.name for _, _, o in graph.ops for v in _values(o)}  # noqa: E731
    if instance.nested:  # a flat graph is what an example can say
        candidate = instance.copy()
        candidate.nested = False
        candidate.inputs = [i for i in candidate.inputs if i[0] != "flag"]
        yield candidate
    if instance.opset is not None:
        candidate = instance.copy()
        candidate.opset = None
        yield candidate
    for output in instance.outputs:
        if len(instance.outputs) > 1:
            candidate = instance.copy()
            candidate.outputs.remove(output)
            # The output's op goes only if nothing left reads it (an op of the pattern stays).
            candidate.ops = [op for op in candidate.ops
                             if op[0] != output or op[0] == "anchor" or output in used(candidate)]
            # The flag of a nested instance is read by the conditional, not by an op.
            kept = used(candidate)
            candidate.inputs = [i for i in candidate.inputs if i[0] in kept or (i[0] == "flag" and instance.nested)]
            yield candidate
    for position, (name, dtype, dims) in enumerate(instance.inputs):
        for axis, dim in enumerate(dims):
            for smaller in ((1, 2) if isinstance(dim, str) or dim > 2 else ()):
                candidate = instance.copy()
                new_dims = list(dims)
                new_dims[axis] = smaller
                candidate.inputs[position] = (name, dtype, new_dims)
                yield candidate


def _values(operands: dict):
    from rewrite.engine.interfaces import NamedValue

    for value in operands.values():
        for item in value if isinstance(value, tuple) else (value,):
            if isinstance(item, NamedValue):
                yield item
