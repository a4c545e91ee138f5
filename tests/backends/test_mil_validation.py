"""The MIL safeguard: `rewrite apply` hands back no program coremltools' own validation rejects.

The fault is planted in the adapter (a replaced value's consumer left on
its old list, which `Program.validate` counts), since a shipped rule that
breaks a program is a bug the other tests look for.
"""

from __future__ import annotations

import shutil

import numpy as np
import pytest

import rewrite
from rewrite.backends.mil import adapter as mil_adapter
from rewrite.backends.mil import count_ops, load_mlpackage, mb, types
from rewrite.backends.mil.reference import evaluate
from rewrite.backends.mil.validation import InvalidProgramError, problem
from rewrite.cli import main
from rewrite.mil import apply
from tests.model_files import MIL_EXAMPLE


@pytest.fixture
def stale_consumer(monkeypatch):
    original = mil_adapter.MilAdapter.replace_all_uses

    def replace_all_uses(self, old, new):
        consumers = list(self.consumers(old))
        original(self, old, new)
        if consumers:
            old._child_ops.append(consumers[0])  # validate counts it: a use that is not one

    monkeypatch.setattr(mil_adapter.MilAdapter, "replace_all_uses", replace_all_uses)


def _program():
    @mb.program(input_specs=[mb.TensorSpec(shape=(2, 8), dtype=types.fp32)])
    def program(x):
        statistic = mb.reduce_mean(x=x, axes=[-1], keep_dims=True)
        tiled = mb.tile(x=statistic, reps=[1, 8])
        return mb.mul(x=x, y=tiled)

    return program


def test_the_run_is_checked_and_a_sound_one_passes():
    program = _program()
    x = np.random.default_rng(0).standard_normal((2, 8)).astype(np.float32)
    before = evaluate(program, {"x": x})
    statistics = apply(program)
    assert statistics.fired("remove_broadcast_tiles") == 1 and count_ops(program, "tile") == 0
    assert problem(program) is None
    (name,) = before
    np.testing.assert_allclose(evaluate(program, {"x": x})[name], before[name], rtol=1e-6)


def test_a_rewrite_that_breaks_the_program_is_named(stale_consumer):
    with pytest.raises(InvalidProgramError) as raised:
        apply(_program(), original=_program)
    assert raised.value.maker == "remove_broadcast_tiles" and raised.value.step == 1
    assert "rule 'remove_broadcast_tiles' (change 1 of the run)" in str(raised.value)


def test_without_the_original_the_rules_that_fired_are_named(stale_consumer):
    with pytest.raises(InvalidProgramError, match="in which fired remove_broadcast_tiles"):
        apply(_program())


def test_the_cli_exits_non_zero_names_the_rule_and_writes_nothing(stale_consumer, tmp_path, capsys):
    source = tmp_path / "model.mlpackage"
    shutil.copytree(MIL_EXAMPLE, source)
    target = tmp_path / "out.mlpackage"
    assert main(["apply", str(source), "-o", str(target)]) == 1  # a finding about the rules: one made the model invalid
    error = capsys.readouterr().err
    assert "rule 'remove_broadcast_tiles'" in error and "nothing was written" in error
    assert "Traceback" not in error
    assert not target.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.mlpackage"]
    assert problem(load_mlpackage(source)[0]) is None


def test_the_graph_pass_says_whose_rewrite_broke_the_program(stale_consumer):
    from coremltools.converters.mil.mil.passes.pass_registry import PASS_REGISTRY

    from rewrite.backends.mil import register_graph_pass

    name = register_graph_pass(rewrite.load_rules(dialects=["mil"]).only("remove_broadcast_tiles"),
                               "rewrite_test::broken_tiles")
    program = _program()
    with pytest.raises(InvalidProgramError, match="graph pass 'rewrite_test::broken_tiles', in which fired"):
        PASS_REGISTRY[name](program)
