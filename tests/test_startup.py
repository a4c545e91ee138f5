"""A process that handles one dialect imports only that dialect's backend.

Checked in fresh interpreters: loading the whole shipped library and
rewriting an ONNX model must not import coremltools (which imports torch:
seconds), and loading it for MIL must not import onnx. The schema snapshot
that makes this possible must agree with the libraries installed.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from rewrite import backends


def _run(code: str) -> dict:
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=300, check=True
    )
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_onnx_only_process_never_imports_coremltools():
    found = _run("""
        import json, sys
        import numpy as np
        from onnx import TensorProto, helper, numpy_helper
        import rewrite

        rules = rewrite.load_rules()
        nodes = [
            helper.make_node("ReduceMean", ["x", "axes"], ["m"], keepdims=1),
            helper.make_node("Shape", ["x"], ["s"]),
            helper.make_node("Expand", ["m", "s"], ["e"]),
            helper.make_node("Mul", ["x", "e"], ["y"]),
        ]
        graph = helper.make_graph(
            nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 4])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", 4])],
            [numpy_helper.from_array(np.array([-1], np.int64), "axes")],
        )
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
        statistics = rules.apply(model)
        print(json.dumps({
            "fires": statistics.fires,
            "mil_rules": len(rules.for_dialect("mil")),
            "coremltools": "coremltools" in sys.modules,
            "torch": "torch" in sys.modules,
            "mil_backend": "rewrite.backends.mil" in sys.modules,
        }))
    """)
    assert found["fires"] == 1
    assert found["mil_rules"] > 0  # the MIL rules were loaded and checked all the same
    assert not found["coremltools"] and not found["torch"] and not found["mil_backend"]


def test_mil_rules_load_without_onnx():
    found = _run("""
        import json, sys
        import rewrite

        rules = rewrite.load_rules()
        print(json.dumps({"onnx_rules": len(rules.for_dialect("onnx")), "onnx": "onnx" in sys.modules,
                          "coremltools": "coremltools" in sys.modules}))
    """)
    assert found["onnx_rules"] > 0
    assert not found["onnx"] and not found["coremltools"]


def test_a_rule_error_is_still_found_without_the_library(tmp_path):
    rules = tmp_path / "bad.rules"
    rules.write_text('dialect mil\nrule r "d"\n  match %t = tile(x=%x, reps=%r, nope=%n)\n  rewrite %t -> %x\n')
    found = _run(f"""
        import json, sys
        import rewrite
        try:
            rewrite.load_rules({str(rules)!r})
            message = ""
        except rewrite.RuleError as error:
            message = str(error.diagnostics[0].message)
        print(json.dumps({{"message": message, "coremltools": "coremltools" in sys.modules}}))
    """)
    assert "has no operand 'nope'" in found["message"]
    assert not found["coremltools"]


@pytest.mark.parametrize("dialect", backends.dialects())
def test_the_snapshot_matches_the_installed_library(dialect):
    deferred = backends.schema_for(dialect)
    if not deferred.from_snapshot:
        pytest.skip(f"the snapshot was taken with another version of {backends._LIBRARIES[dialect]}")
    live = backends.backend_module(dialect).SCHEMA
    assert list(deferred.op_types()) == list(live.op_types())
    for op_type in live.op_types():
        assert deferred.signature(op_type) == live.signature(op_type), op_type


def test_another_library_version_falls_back_to_the_backend(monkeypatch):
    monkeypatch.setattr(backends, "_installed", lambda distribution: "0.0.0-not-the-snapshot")
    schema = backends.DeferredSchema("onnx")
    assert not schema.from_snapshot
    assert schema.signature("Expand") == backends.backend_module("onnx").SCHEMA.signature("Expand")
