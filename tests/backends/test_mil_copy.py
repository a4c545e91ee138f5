"""`copy_program` and the reference evaluator at any program length, nested blocks included.

`copy.deepcopy` of a pymil Program recurses along the use-def chain and
fails past ~70-300 ops in a row; these tests hold the copy (and what uses
it: the evaluator, `save_mlpackage`) to Python's default recursion limit,
which no test may raise.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import numpy as np

from rewrite.backends.mil import build_example, copy_program, count_ops, ct, mb, types
from rewrite.backends.mil.reference import evaluate
from rewrite.engine.interfaces import NamedValue

# Run in a fresh interpreter, so that nothing another test module did to the
# recursion limit can make the check pass; it asserts the default is in force.
_CHAIN_SCRIPT = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    from rewrite.backends.mil import copy_program, count_ops, ct, load_mlpackage, mb, save_mlpackage
    from rewrite.backends.mil.reference import evaluate

    assert sys.getrecursionlimit() == 1000, sys.getrecursionlimit()
    length, path = int(sys.argv[1]), sys.argv[2]

    @mb.program(input_specs=[mb.TensorSpec(shape=(2, 3))], opset_version=ct.target.iOS18)
    def chain(x):
        for index in range(length):
            x = mb.relu(x=x) if index % 2 else mb.add(x=x, y=np.float32(-0.25))
        return x

    before = count_ops(chain)
    copied = copy_program(chain)
    feed = np.linspace(-1, 4, 6, dtype=np.float32).reshape(2, 3)
    (value,) = evaluate(copied, {"x": feed}).values()
    save_mlpackage(copied, path)
    loaded, _ = load_mlpackage(path)
    (reloaded,) = evaluate(loaded, {"x": feed}).values()
    print(json.dumps({
        "before": before, "copied": count_ops(copied), "original_after": count_ops(chain),
        "loaded": count_ops(loaded, "relu") + count_ops(loaded, "add"),
        "value": value.tolist(), "reloaded": reloaded.tolist(),
        "same_text": str(copied) == str(chain),
    }))
    """
)


def test_a_3000_op_chain_copies_evaluates_and_saves_at_the_default_recursion_limit(tmp_path):
    length = 3000
    done = subprocess.run(
        [sys.executable, "-c", _CHAIN_SCRIPT, str(length), str(tmp_path / "chain.mlpackage")],
        capture_output=True, text=True, timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    # 3000 ops and a const for each add's -0.25.
    assert result["before"] == result["copied"] == result["original_after"] == length + length // 2
    assert result["same_text"]
    assert result["loaded"] == length  # the consts became attributes of the saved adds
    # relu(x - 0.25) 1500 times: positive entries lose 0.25 a step until they reach 0.
    expected = np.linspace(-1, 4, 6, dtype=np.float32).reshape(2, 3)
    for index in range(length):
        expected = np.maximum(expected, 0) if index % 2 else expected - np.float32(0.25)
    np.testing.assert_array_equal(result["value"], expected)
    np.testing.assert_array_equal(result["reloaded"], expected)


def _ops(block):
    return list(block.operations)


def test_copy_is_independent_of_the_original():
    @mb.program(input_specs=[mb.TensorSpec(shape=(2, 3))], opset_version=ct.target.iOS18)
    def program(x):
        return mb.relu(x=mb.add(x=x, y=np.float32(1.0), name="shifted"), name="out")

    copied = copy_program(program)
    original, twin = program.functions["main"], copied.functions["main"]
    assert str(copied) == str(program)
    for op, op_twin in zip(_ops(original), _ops(twin)):
        assert op is not op_twin and op.name == op_twin.name
        assert op_twin.enclosing_block is twin
        assert all(v.op is op_twin for v in op_twin.outputs)
    add, relu = [op for op in _ops(twin) if op.op_type != "const"]
    assert relu.inputs["x"] is add.outputs[0] and add.outputs[0].child_ops == [relu]
    assert twin.inputs["x"].child_ops == [add] and twin.outputs == [relu.outputs[0]]

    # Rewiring and removing in the copy leaves the original as it was.
    with twin:
        twin.replace_uses_of_var_after_op(anchor_op=relu, old_var=relu.outputs[0], new_var=add.outputs[0])
        twin.remove_ops([relu])
    assert count_ops(copied) == 2 and count_ops(program) == 3
    feed = {"x": np.array([[-3, -1, 0], [1, 2, 3]], np.float32)}
    np.testing.assert_array_equal(evaluate(program, feed)["out"], np.maximum(feed["x"] + 1, 0))
    np.testing.assert_array_equal(next(iter(evaluate(copied, feed).values())), feed["x"] + 1)


def test_copy_keeps_symbolic_dims_input_types_and_opset():
    inputs = [("x", "fp32", ("batch", 8)), ("y", "fp32", ("batch", 1))]
    ops = [
        ("wide", "tile", {"x": NamedValue("y"), "reps": [1, 8]}),
        ("product", "mul", {"x": NamedValue("x"), "y": NamedValue("wide")}),
    ]
    program = build_example(inputs, ops, ["product"])
    copied = copy_program(program)
    original, twin = program.functions["main"], copied.functions["main"]
    assert twin.opset_version == original.opset_version == ct.target.iOS18
    for name in ("x", "y"):
        assert twin.inputs[name] is not original.inputs[name]
        assert twin.inputs[name].sym_type == original.inputs[name].sym_type
    # One symbol for one dim, in the copy as in the original.
    assert twin.inputs["x"].shape[0] == twin.inputs["y"].shape[0] == original.inputs["x"].shape[0]
    assert types.is_tensor(twin.inputs["x"].sym_type) and twin.inputs["x"].dtype == types.fp32
    feed = {"x": np.arange(24, dtype=np.float32).reshape(3, 8), "y": np.array([[1], [2], [3]], np.float32)}
    np.testing.assert_array_equal(evaluate(copied, feed)["product"], feed["x"] * feed["y"])


def test_copy_keeps_nested_blocks():
    inputs = [("x", "fp32", (2, 8)), ("flag", "fp32", (1,))]
    ops = [("scaled", "mul", {"x": NamedValue("x"), "y": 2.0}), ("out", "relu", {"x": NamedValue("scaled")})]
    program = build_example(inputs, ops, ["out"], nested_by="flag")
    copied = copy_program(program)
    assert str(copied) == str(program) and count_ops(copied) == count_ops(program)
    (cond,) = [op for op in _ops(copied.functions["main"]) if op.op_type == "cond"]
    (original_cond,) = [op for op in _ops(program.functions["main"]) if op.op_type == "cond"]
    for block, original_block in zip(cond.blocks, original_cond.blocks):
        assert block is not original_block and block.outer_op is cond
        assert all(op.enclosing_block is block for op in _ops(block))
    feed = {"x": np.linspace(-2, 2, 16, dtype=np.float32).reshape(2, 8), "flag": np.ones(1, np.float32)}
    (value,) = evaluate(copied, feed).values()
    np.testing.assert_array_equal(value, np.maximum(feed["x"] * 2, 0))


def test_copy_keeps_a_while_loop():
    @mb.program(input_specs=[mb.TensorSpec(shape=(1,))], opset_version=ct.target.iOS18)
    def program(x):
        def condition(value):
            return mb.less(x=mb.squeeze(x=value), y=np.float32(100))

        def body(value):
            return (mb.mul(x=value, y=np.float32(3)),)

        result = mb.while_loop(_cond=condition, _body=body, loop_vars=(x,))
        return result[0] if isinstance(result, (list, tuple)) else result  # one loop var: a bare Var

    copied = copy_program(program)
    assert str(copied) == str(program)
    (loop,) = [op for op in _ops(copied.functions["main"]) if op.op_type == "while_loop"]
    condition_block, body_block = loop.blocks
    assert body_block.outer_op is loop and all(op.enclosing_block is body_block for op in _ops(body_block))
    assert body_block.inputs[0] in [v for op in _ops(body_block) for v in op.get_flattened_inputs()]
    (value,) = evaluate(copied, {"x": np.array([2.0], np.float32)}).values()
    np.testing.assert_array_equal(value, [162.0])  # 2, 6, 18, 54, 162
