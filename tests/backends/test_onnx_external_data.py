"""External data stays on disk: read only when a rule needs a small tensor, copied file to file on save."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import TensorProto, helper, numpy_helper

import rewrite
from rewrite.backends.onnx import OnnxAdapter
from rewrite.backends.onnx import files as onnx_files
from rewrite.backends.onnx import tensors as onnx_tensors


def model_with_weights(width: int = 64, shape_constant: bool = False) -> onnx.ModelProto:
    """y = (x @ W) * expand(mean(x @ W), s) (the Expand goes); s from Shape, or a constant when asked."""
    weight = np.random.default_rng(7).normal(size=(width, width)).astype(np.float32)
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["h"]),
        helper.make_node("ReduceMean", ["h", "axes"], ["m"], keepdims=1),
        helper.make_node("Expand", ["m", "shape" if shape_constant else "s"], ["e"]),
        helper.make_node("Mul", ["h", "e"], ["y"]),
    ]
    initializers = [numpy_helper.from_array(weight, "w"), numpy_helper.from_array(np.array([-1], np.int64), "axes")]
    if shape_constant:
        initializers.append(numpy_helper.from_array(np.array([1, width], np.int64), "shape"))
    else:
        nodes.insert(2, helper.make_node("Shape", ["h"], ["s"]))
    graph = helper.make_graph(
        nodes, "weights", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, width])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, width])], initializer=initializers,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def save_external(model: onnx.ModelProto, path: Path, location: str = "weights.bin", threshold: int = 0) -> Path:
    """Save with every tensor of at least `threshold` bytes in `location` (0: all of them, small ones too)."""
    copy = onnx.ModelProto.FromString(model.SerializeToString())
    onnx.save_model(copy, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                    location=location, size_threshold=threshold)
    return path


def outputs(path: Path, width: int = 64) -> np.ndarray:
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    x = np.random.default_rng(1).normal(size=(1, width)).astype(np.float32)
    return session.run(None, {"x": x})[0]


def digest(path: Path) -> tuple[str, int]:
    return hashlib.sha256(path.read_bytes()).hexdigest(), path.stat().st_mtime_ns


@pytest.fixture
def recorded_reads(monkeypatch):
    """The names of the tensors the adapter reads."""
    names: list[str] = []
    read = onnx_tensors.read_tensor

    def recording(tensor, base_dir):
        names.append(tensor.name)
        return read(tensor, base_dir)

    monkeypatch.setattr(onnx_tensors, "read_tensor", recording)
    return names


def test_read_leaves_every_external_tensor_on_disk(tmp_path):
    source = save_external(model_with_weights(), tmp_path / "m.onnx")
    model, origin = onnx_files.read_onnx(source)
    assert origin.lazy and origin.data_files == (tmp_path / "weights.bin",)
    assert origin.base_dir == str(tmp_path)
    for tensor in model.graph.initializer:
        assert tensor.data_location == TensorProto.EXTERNAL and not tensor.raw_data
    eager, origin = onnx_files.read_onnx(source, lazy=False)
    assert not origin.lazy and origin.base_dir is None
    assert all(tensor.data_location == TensorProto.DEFAULT for tensor in eager.graph.initializer)


def test_a_rule_reads_only_the_small_tensors_it_needs(tmp_path, recorded_reads):
    source = save_external(model_with_weights(160, shape_constant=True), tmp_path / "m.onnx")
    model, origin = onnx_files.read_onnx(source)
    statistics = rewrite.load_rules(dialects=["onnx"]).apply(model, source=origin)
    assert statistics.fires == 1
    assert "w" not in recorded_reads  # the weight is never read
    assert "shape" in recorded_reads  # the Expand's shape is: it is small


def test_a_large_external_tensor_reads_as_no_constant(tmp_path, recorded_reads, monkeypatch):
    source = save_external(model_with_weights(160, shape_constant=True), tmp_path / "m.onnx")  # w: 100 KB
    model, origin = onnx_files.read_onnx(source)
    adapter = OnnxAdapter(model, origin.base_dir)
    weight, shape = adapter.main.values["w"], adapter.main.values["shape"]
    assert adapter.constant(weight) is None and "w" not in recorded_reads
    assert adapter.constant(shape).tolist() == [1, 160]
    monkeypatch.setattr(onnx_files, "EXTERNAL_READ_LIMIT", 8)
    fresh = OnnxAdapter(model, origin.base_dir)
    assert fresh.constant(fresh.main.values["shape"]) is None  # 16 bytes: over the limit now


def test_an_external_tensor_is_never_read_from_the_working_directory(tmp_path, monkeypatch):
    source = save_external(model_with_weights(shape_constant=True), tmp_path / "m.onnx")
    model = onnx.load(str(source), load_external_data=False)
    monkeypatch.chdir(tmp_path)  # where the data file is, by accident
    adapter = OnnxAdapter(model)  # no folder given
    assert adapter.constant(adapter.main.values["shape"]) is None


def test_apply_writes_a_data_file_of_its_own_and_leaves_the_inputs_alone(tmp_path):
    source = save_external(model_with_weights(), tmp_path / "m.onnx", threshold=1024)
    data = tmp_path / "weights.bin"
    before, expected = digest(data), outputs(source)
    from rewrite import cli

    assert cli.main(["apply", str(source), "-o", str(tmp_path / "o.onnx")]) == 0
    assert digest(data) == before
    written = onnx.load(str(tmp_path / "o.onnx"), load_external_data=False)
    assert [n.op_type for n in written.graph.node] == ["MatMul", "ReduceMean", "Mul"]
    locations = {e.value for t in written.graph.initializer for e in t.external_data if e.key == "location"}
    assert locations == {"o.onnx.data"}
    np.testing.assert_allclose(outputs(tmp_path / "o.onnx"), expected, rtol=1e-6)
    onnx.checker.check_model(str(tmp_path / "o.onnx"), full_check=True)


def test_in_place_keeps_working(tmp_path):
    source = save_external(model_with_weights(), tmp_path / "m.onnx", location="m.onnx.data", threshold=1024)
    expected = outputs(source)
    from rewrite import cli

    assert cli.main(["apply", str(source), "--in-place"]) == 0
    assert cli.main(["apply", str(source), "--in-place"]) == 0
    np.testing.assert_allclose(outputs(source), expected, rtol=1e-6)
    assert len(list(tmp_path.iterdir())) == 2


def test_writing_leaves_the_model_in_memory_as_it_was(tmp_path):
    source = save_external(model_with_weights(), tmp_path / "m.onnx")
    model, origin = onnx_files.read_onnx(source)
    big = numpy_helper.from_array(np.arange(1024, dtype=np.float32), "added")  # inline, 4 KB
    model.graph.initializer.append(big)
    before = model.SerializeToString()
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    onnx_files.write_onnx(model, tmp_path / "a" / "out.onnx", "out.data", origin)
    assert model.SerializeToString() == before
    onnx_files.write_onnx(model, tmp_path / "b" / "out.onnx", "out.data", origin)
    for folder in ("a", "b"):
        written = onnx.load(str(tmp_path / folder / "out.onnx"))
        arrays = {t.name: numpy_helper.to_array(t) for t in written.graph.initializer}
        np.testing.assert_array_equal(arrays["added"], np.arange(1024, dtype=np.float32))
        np.testing.assert_array_equal(arrays["w"], numpy_helper.to_array(model_with_weights().graph.initializer[0]))
        added = next(t for t in onnx.load(str(tmp_path / folder / "out.onnx"), load_external_data=False)
                     .graph.initializer if t.name == "added")
        assert added.data_location == TensorProto.EXTERNAL
        offsets = [int(e.value) for t in written.graph.initializer for e in t.external_data if e.key == "offset"]
        assert all(offset % onnx_files.ALIGNMENT == 0 for offset in offsets)


def test_tensors_from_several_data_files_are_joined(tmp_path):
    base = model_with_weights()
    copy = onnx.ModelProto.FromString(base.SerializeToString())
    arrays = {t.name: numpy_helper.to_array(t) for t in copy.graph.initializer}
    for index, tensor in enumerate(copy.graph.initializer):
        raw = tensor.raw_data
        location = f"part{index}.bin"
        (tmp_path / location).write_bytes(b"\0" * 24 + raw)  # at an offset, to be kept
        onnx.external_data_helper.set_external_data(tensor, location, offset=24, length=len(raw))
        tensor.ClearField("raw_data")
    onnx.save_model(copy, str(tmp_path / "m.onnx"))
    model, origin = onnx_files.read_onnx(tmp_path / "m.onnx")
    assert len(origin.data_files) == len(arrays)
    (tmp_path / "out").mkdir()
    onnx_files.write_onnx(model, tmp_path / "out" / "o.onnx", "o.data", origin)
    written = onnx.load(str(tmp_path / "out" / "o.onnx"))
    for tensor in written.graph.initializer:
        np.testing.assert_array_equal(numpy_helper.to_array(tensor), arrays[tensor.name])


def test_one_file_asked_for_reads_the_weights_in(tmp_path):
    source = save_external(model_with_weights(), tmp_path / "m.onnx")
    model, origin = onnx_files.read_onnx(source)
    onnx_files.write_onnx(model, tmp_path / "single.onnx", source=origin)
    assert all(t.data_location == TensorProto.DEFAULT for t in model.graph.initializer)  # read in
    written = onnx.load(str(tmp_path / "single.onnx"), load_external_data=False)
    assert all(t.data_location == TensorProto.DEFAULT for t in written.graph.initializer)


@pytest.mark.parametrize("problem", ["outside", "truncated", "missing"])
def test_bad_external_data_is_refused_when_read(tmp_path, problem):
    folder = tmp_path / "model"
    folder.mkdir()
    source = save_external(model_with_weights(), folder / "m.onnx")
    data = folder / "weights.bin"
    if problem == "truncated":
        data.write_bytes(data.read_bytes()[:100])
    elif problem == "missing":
        data.unlink()
    else:
        (tmp_path / "weights.bin").write_bytes(data.read_bytes())
        model = onnx.load(str(source), load_external_data=False)
        for tensor in model.graph.initializer:
            for entry in tensor.external_data:
                if entry.key == "location":
                    entry.value = "../weights.bin"
        onnx.save_model(model, str(source))
    with pytest.raises(onnx_files.OnnxFileError, match="external data"):
        onnx_files.read_onnx(source)


def test_the_weights_never_enter_the_process(tmp_path):
    """`rewrite apply` on a model with 64 MB of weights peaks far below 64 MB over its start-up."""
    width = 4096
    weight = np.ones((width, width), np.float32)  # 64 MB
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["h"]),
        helper.make_node("ReduceMean", ["h", "axes"], ["m"], keepdims=1),
        helper.make_node("Shape", ["h"], ["s"]),
        helper.make_node("Expand", ["m", "s"], ["e"]),
        helper.make_node("Mul", ["h", "e"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes, "big", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, width])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, width])],
        initializer=[numpy_helper.from_array(weight, "w"), numpy_helper.from_array(np.array([-1], np.int64), "axes")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    source = save_external(model, tmp_path / "big.onnx", threshold=1024)
    del model, graph, weight
    script = textwrap.dedent("""
        import json, resource, sys
        from rewrite import cli
        code = cli.main(sys.argv[1:])
        print(json.dumps({"code": code, "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
    """)

    def peak(*arguments):
        result = subprocess.run([sys.executable, "-c", script, *arguments], capture_output=True, text=True,
                                timeout=300, env={**os.environ, "PYTHONPATH": str(Path(rewrite.__file__).parents[1])})
        found = json.loads(result.stdout.strip().splitlines()[-1])
        assert found["code"] == 0, result.stderr
        return found["peak_mb"]

    small = save_external(model_with_weights(), tmp_path / "small.onnx", threshold=1024)
    baseline = peak("apply", str(small), "-o", str(tmp_path / "small_out.onnx"))
    big = peak("apply", str(source), "-o", str(tmp_path / "out.onnx"))
    assert big - baseline < 32, (baseline, big)
    assert (tmp_path / "out.onnx.data").stat().st_size >= 64 * 1024 * 1024
    assert [n.op_type for n in onnx.load(str(tmp_path / "out.onnx"), load_external_data=False).graph.node] == [
        "MatMul", "ReduceMean", "Mul"]


def test_many_lazily_read_models_each_keep_their_own_data(tmp_path):
    """No table of models, no cap: the 17th (or the 100th) model reads its own tensors, none is evicted."""
    models = []
    for index in range(40):
        folder = tmp_path / f"m{index}"
        folder.mkdir()
        weights = model_with_weights(shape_constant=True)
        shape = next(t for t in weights.graph.initializer if t.name == "shape")
        shape.CopyFrom(numpy_helper.from_array(np.array([index + 1, 64], np.int64), "shape"))
        models.append(onnx_files.read_onnx(save_external(weights, folder / "m.onnx", threshold=0)))
    for index, (model, origin) in enumerate(models):
        assert all(t.data_location == TensorProto.EXTERNAL for t in model.graph.initializer)  # none read in
        adapter = OnnxAdapter(model, origin.base_dir)
        assert adapter.constant(adapter.main.values["shape"]).tolist() == [index + 1, 64]
