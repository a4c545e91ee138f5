"""State ops of a stateful program: `apply` and saving keep every read_state and
coreml_update_state, and the states the package declares; ordinary dead ops still go.

Core ML cannot run a model off macOS, and only it would show whether it
accepts a state that no op reads: so a read_state whose value a rewrite made
unused stays. Values are compared with the reference evaluator, states included.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from rewrite import cli
from rewrite.backends.mil import count_ops, ct, load_mlpackage, mb, save_mlpackage, types
from rewrite.backends.mil.adapter import MilAdapter
from rewrite.backends.mil.reference import evaluate_with_states
from tests.model_files import package_spec as _spec

SHAPE = (2, 3)

# Sound: the shape of a value whose dims are all known is those dims.
STATIC_SHAPE = """
dialect mil

rule static_shape
  "The shape of a value whose dims are all known is a constant."
  match %s = shape(x=%x)
  where forall a in axes(%x): is_known(dim(%x, a))
  rewrite %s -> const(val=as_dtype([dim(%x, a) for a in axes(%x)], int32))
"""

# Wrong on purpose: its replacement is fp16 where the anchor is fp32, so the
# guard refuses it, after the coreml_update_state is built.
WRONG_UPDATE = """
dialect mil

rule wrong_update
  "An engine test, not a sound rule: the guard refuses every rewrite it tries."
  match %c = cast(x=%r = read_state(input=%s), dtype=_)
  rewrite %c -> coreml_update_state(state=%s, value=%r)
"""


def _reads_only_the_length(x, cache):
    """The cache's length is read from its shape; its value is replaced, never read."""
    length = mb.gather(x=mb.shape(x=mb.read_state(input=cache)), indices=1, axis=0)
    y = mb.add(x=x, y=mb.cast(x=length, dtype="fp16"), name="y")
    mb.coreml_update_state(state=cache, value=mb.mul(x=y, y=np.float16(2)))
    return y


def _accumulates(x, cache):
    """The cache is read, added to, and written back; the length, as above, from a read of its own."""
    total = mb.add(x=mb.read_state(input=cache), y=x)
    mb.coreml_update_state(state=cache, value=total)
    length = mb.gather(x=mb.shape(x=mb.read_state(input=cache)), indices=1, axis=0)
    return mb.add(x=total, y=mb.cast(x=length, dtype="fp16"), name="y")


def _reads_back_only_the_length(x, cache):
    """Written first, then read back for its length alone: coremltools loads the
    write and the read as one coreml_update_state."""
    mb.coreml_update_state(state=cache, value=mb.mul(x=x, y=np.float16(2)))
    length = mb.gather(x=mb.shape(x=mb.read_state(input=cache)), indices=1, axis=0)
    return mb.add(x=x, y=mb.cast(x=length, dtype="fp16"), name="y")


def _reads_for_a_cast(x, cache):
    read = mb.cast(x=mb.read_state(input=cache), dtype="fp32")
    mb.coreml_update_state(state=cache, value=mb.add(x=x, y=np.float16(1)))
    return mb.add(x=mb.cast(x=x, dtype="fp32"), y=read, name="y")


def _stateful_package(path: Path, body) -> Path:
    program = mb.program(
        input_specs=[mb.TensorSpec(SHAPE, dtype=types.fp16), mb.StateTensorSpec(SHAPE, dtype=types.fp16)],
        opset_version=ct.target.iOS18,
    )(body)
    # coremltools' default pipeline would fold the shape and drop the read
    # itself: the package is what a converter without that pass writes.
    model = ct.convert(program, convert_to="mlprogram", minimum_deployment_target=ct.target.iOS18,
                       pass_pipeline=ct.PassPipeline.EMPTY, skip_model_load=True)
    model.save(str(path))
    return path


def _spec_op_types(package: Path) -> list[str]:
    """The op types of the package's main function, in order, each op's nested blocks right after it."""
    (block,) = _spec(package).mlProgram.functions["main"].block_specializations.values()
    found = []

    def walk(block) -> None:
        for op in block.operations:
            found.append(op.type)
            for nested in op.blocks:
                walk(nested)

    walk(block)
    return found


def _state_ops(package: Path) -> list[str]:
    """The package's reads and writes of states, in order."""
    return [kind for kind in _spec_op_types(package) if kind in ("read_state", "write_state")]


def _values(program) -> tuple[dict, dict]:
    x = np.random.default_rng(0).normal(size=SHAPE).astype(np.float16)
    cache = np.random.default_rng(1).normal(size=SHAPE).astype(np.float16)
    return evaluate_with_states(program, {"x": x, "cache": cache})


def _apply(rules: Path, source: Path, output: Path, capsys) -> str:
    assert cli.main(["apply", "--rules", str(rules), str(source), "-o", str(output)]) == 0
    return capsys.readouterr().out


def _assert_same_values(before, after) -> None:
    (outputs, states), (new_outputs, new_states) = _values(before), _values(after)
    assert outputs.keys() == new_outputs.keys() and states.keys() == new_states.keys() == {"cache"}
    for name in outputs:
        np.testing.assert_array_equal(new_outputs[name], outputs[name])
    np.testing.assert_array_equal(new_states["cache"], states["cache"])


@pytest.mark.parametrize("body", [_reads_only_the_length, _accumulates, _reads_back_only_the_length])
def test_a_read_state_whose_value_a_rewrite_leaves_unused_is_kept(tmp_path, write_rules, capsys, body):
    source = _stateful_package(tmp_path / "in.mlpackage", body)
    output = tmp_path / "out.mlpackage"
    assert "fired 1" in _apply(write_rules(STATIC_SHAPE), source, output, capsys)
    before, after = load_mlpackage(source)[0], load_mlpackage(output)[0]
    assert "read_state" in _state_ops(source)
    assert count_ops(after, "read_state") == count_ops(before, "read_state")
    assert count_ops(before, "coreml_update_state") == count_ops(after, "coreml_update_state") == 1
    # The shape went, and nothing else: the read it was made of stays.
    assert count_ops(before, "shape") == 1 and count_ops(after, "shape") == 0
    assert count_ops(after) == count_ops(before)  # the shape replaced by a const
    _assert_same_values(before, after)
    # What the package says: the same state declared, read and written.
    spec_before, spec_after = _spec(source), _spec(output)
    assert list(spec_after.description.state) == list(spec_before.description.state)
    assert [s.name for s in spec_after.description.state] == ["cache"]
    assert _state_ops(output) == _state_ops(source)


def _unused_read_first(x, cache):
    mb.read_state(input=cache)
    y = mb.add(x=x, y=np.float16(1), name="y")
    mb.coreml_update_state(state=cache, value=y)
    return y


def _unused_read_after_the_write(x, cache):
    y = mb.add(x=x, y=np.float16(1), name="y")
    mb.coreml_update_state(state=cache, value=y)
    mb.read_state(input=cache)
    return y


def _unused_read_after_a_write_in_a_branch(x, cache):
    def branch(value):
        def body():
            mb.coreml_update_state(state=cache, value=mb.fill(shape=list(SHAPE), value=value))
            mb.read_state(input=cache)
            return mb.identity(x=x)
        return body

    positive = mb.greater(x=mb.reduce_sum(x=x), y=np.float16(0))
    return mb.cond(pred=positive, _true_fn=branch(np.float16(1)), _false_fn=branch(np.float16(-1)), name="y")


def _write_only(x, cache):
    y = mb.add(x=x, y=np.float16(1), name="y")
    mb.coreml_update_state(state=cache, value=y)
    return y


@pytest.mark.parametrize("body, state_ops", [
    (_unused_read_first, ["read_state", "write_state"]),
    (_unused_read_after_the_write, ["write_state", "read_state"]),  # loaded as one coreml_update_state
    (_unused_read_after_a_write_in_a_branch, ["write_state", "read_state"] * 2),
    (_write_only, ["write_state"]),  # and no read is made up
])
def test_saving_keeps_the_reads_of_a_state_that_nothing_uses(tmp_path, body, state_ops):
    source = _stateful_package(tmp_path / "in.mlpackage", body)
    assert _state_ops(source) == state_ops
    program, origin = load_mlpackage(source)
    save_mlpackage(program, tmp_path / "out.mlpackage", origin)  # coremltools' save passes run here
    assert _state_ops(tmp_path / "out.mlpackage") == state_ops
    assert list(_spec(tmp_path / "out.mlpackage").description.state) == list(_spec(source).description.state)
    saved = load_mlpackage(tmp_path / "out.mlpackage")[0]
    before = load_mlpackage(source)[0]
    for kind in ("read_state", "coreml_update_state"):
        assert count_ops(saved, kind) == count_ops(before, kind)
    # Consts aside: a save adds two to a program with a cond, states or not (another matter).
    assert count_ops(saved) - count_ops(saved, "const") == count_ops(before) - count_ops(before, "const")
    _assert_same_values(before, saved)


def test_ops_that_only_compute_are_still_removed_as_dead(tmp_path, write_rules, capsys):
    @mb.program(input_specs=[mb.TensorSpec(SHAPE, dtype=types.fp16)], opset_version=ct.target.iOS18)
    def program(x):
        length = mb.gather(x=mb.shape(x=mb.relu(x=x)), indices=1, axis=0)
        return mb.add(x=x, y=mb.cast(x=length, dtype="fp16"), name="y")

    source = tmp_path / "in.mlpackage"
    ct.convert(program, convert_to="mlprogram", minimum_deployment_target=ct.target.iOS18,
               pass_pipeline=ct.PassPipeline.EMPTY, skip_model_load=True).save(str(source))
    output = tmp_path / "out.mlpackage"
    assert "fired 1" in _apply(write_rules(STATIC_SHAPE), source, output, capsys)
    before, after = load_mlpackage(source)[0], load_mlpackage(output)[0]
    assert count_ops(before, "relu") == 1 and count_ops(after, "relu") == 0  # dead once its shape was known
    assert count_ops(before, "shape") == 1 and count_ops(after, "shape") == 0
    assert count_ops(after) == count_ops(before) - 1
    x = {"x": np.random.default_rng(0).normal(size=SHAPE).astype(np.float16)}
    np.testing.assert_array_equal(evaluate_with_states(after, x)[0]["y"], evaluate_with_states(before, x)[0]["y"])


def test_the_adapter_keeps_state_ops_and_no_other(tmp_path):
    program = load_mlpackage(_stateful_package(tmp_path / "in.mlpackage", _reads_only_the_length))[0]
    adapter = MilAdapter(program)
    kept = {op.op_type for op in program.functions["main"].operations if adapter.has_side_effects(op)}
    assert kept == {"read_state", "coreml_update_state"}


def test_a_refused_rewrite_leaves_no_state_update_behind(tmp_path, write_rules, capsys):
    source = _stateful_package(tmp_path / "in.mlpackage", _reads_for_a_cast)
    output = tmp_path / "out.mlpackage"
    assert "no rule fired" in _apply(write_rules(WRONG_UPDATE), source, output, capsys)
    before, after = load_mlpackage(source)[0], load_mlpackage(output)[0]
    assert count_ops(before, "coreml_update_state") == count_ops(after, "coreml_update_state") == 1
    assert count_ops(after) == count_ops(before)
    assert _spec_op_types(output) == _spec_op_types(source)
    _assert_same_values(before, after)


# ------------------------------------------------------------ the reference evaluator's states


def test_the_evaluator_reads_a_state_as_updated_so_far(tmp_path):
    @mb.program(input_specs=[mb.TensorSpec(SHAPE, dtype=types.fp16), mb.StateTensorSpec(SHAPE, dtype=types.fp16)],
                opset_version=ct.target.iOS18)
    def program(x, cache):
        first = mb.read_state(input=cache)
        mb.coreml_update_state(state=cache, value=mb.add(x=first, y=x))
        second = mb.read_state(input=cache)
        return mb.sub(x=second, y=first, name="grown"), mb.identity(x=first, name="first")

    x = np.full(SHAPE, 2, np.float16)
    cache = np.arange(6, dtype=np.float16).reshape(SHAPE)
    outputs, states = evaluate_with_states(program, {"x": x, "cache": cache})
    np.testing.assert_array_equal(outputs["first"], cache)
    np.testing.assert_array_equal(outputs["grown"], x)
    np.testing.assert_array_equal(states["cache"], cache + x)
    # The evaluator works on a copy: a second run starts from the given value again.
    np.testing.assert_array_equal(evaluate_with_states(program, {"x": x, "cache": cache})[1]["cache"], cache + x)


def test_the_evaluator_does_not_update_a_state_in_the_branch_not_taken():
    @mb.program(input_specs=[mb.TensorSpec((1,), dtype=types.bool), mb.StateTensorSpec(SHAPE, dtype=types.fp16)],
                opset_version=ct.target.iOS18)
    def program(flag, cache):
        def write(value):
            def branch():
                return mb.coreml_update_state(state=cache, value=mb.fill(shape=list(SHAPE), value=value))
            return branch

        chosen = mb.cond(pred=mb.squeeze(x=flag), _true_fn=write(np.float16(1)), _false_fn=write(np.float16(7)))
        return mb.identity(x=chosen, name="y")

    cache = np.zeros(SHAPE, np.float16)
    for flag, expected in ((True, 1), (False, 7)):
        outputs, states = evaluate_with_states(program, {"flag": np.array([flag]), "cache": cache})
        np.testing.assert_array_equal(states["cache"], np.full(SHAPE, expected, np.float16))
        np.testing.assert_array_equal(outputs["y"], np.full(SHAPE, expected, np.float16))

