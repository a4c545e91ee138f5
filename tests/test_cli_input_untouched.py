"""Property: without --in-place, no run of `rewrite` changes a byte of its input.

Over random valid models (ONNX with and without external data, .mlpackage
with metadata) and random invocations of `apply` and `explain` (outputs that
are fresh, taken, the input itself, its data file, inside or around it, a
folder, a bad rules file, an unknown rule, a bad cap ...), the input's files
(the whole package tree, mtimes included) are identical before and after,
whatever the exit code. A run that fails also leaves the output as it was
and no staging folder behind.
"""

from __future__ import annotations

import contextlib
import io
import tempfile
from pathlib import Path

import coremltools as ct
import numpy as np
import onnx
import pytest
from coremltools.converters.mil import Builder as mb
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from rewrite import cli, output
from tests.model_files import folder_state, tree_state, write_onnx

RULES = Path(cli.__file__).resolve().parent.parent / "rules"


# ------------------------------------------------------------ random models


@st.composite
def onnx_models(draw):
    """A chain over x[b, w] of ops some of which the shipped rules remove."""
    width = draw(st.sampled_from([4, 16, 300]))  # 300: weights over the external-data threshold
    nodes, initializers, current = [], [], "x"
    for index in range(draw(st.integers(1, 5))):
        kind = draw(st.sampled_from(["relu", "scale", "expand", "tile", "identity"]))
        name = f"v{index}"
        if kind == "relu":
            nodes.append(helper.make_node("Relu", [current], [name], name=f"relu{index}"))
        elif kind == "scale":
            weight = numpy_helper.from_array(np.full((width,), 0.5, np.float32), f"w{index}")
            initializers.append(weight)
            nodes.append(helper.make_node("Mul", [current, weight.name], [name], name=f"mul{index}"))
        elif kind == "identity":
            nodes.append(helper.make_node("Identity", [current], [name], name=f"id{index}"))
        else:
            axes = numpy_helper.from_array(np.array([-1]), f"axes{index}")
            initializers.append(axes)
            nodes.append(helper.make_node("ReduceMean", [current, axes.name], [f"m{index}"], keepdims=1))
            if kind == "expand":
                nodes.append(helper.make_node("Shape", [current], [f"s{index}"]))
                nodes.append(helper.make_node("Expand", [f"m{index}", f"s{index}"], [f"e{index}"]))
            else:
                reps = numpy_helper.from_array(np.array([1, width]), f"reps{index}")
                initializers.append(reps)
                nodes.append(helper.make_node("Tile", [f"m{index}", reps.name], [f"e{index}"]))
            nodes.append(helper.make_node("Mul", [current, f"e{index}"], [name]))
        current = name
    graph = helper.make_graph(
        nodes, "random", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", width])],
        [helper.make_tensor_value_info(current, TensorProto.FLOAT, ["b", width])], initializer=initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    onnx.checker.check_model(model, full_check=True)
    return model, draw(st.booleans())


def _mil_model(variant: int) -> ct.models.MLModel:
    batch = ct.RangeDim(1, 64, default=2)

    @mb.program(input_specs=[mb.TensorSpec(shape=(2, 8))], opset_version=ct.target.iOS17)
    def program(x):
        mean = mb.reduce_mean(x=x, axes=[-1], keep_dims=True)
        wide = mb.tile(x=mean, reps=[1, 8])
        out = mb.mul(x=x, y=wide)
        for _ in range(variant):
            out = mb.relu(x=out)
        return out

    model = ct.convert(program, convert_to="mlprogram", pass_pipeline=ct.PassPipeline.EMPTY,
                       inputs=[ct.TensorType(name="x", shape=ct.Shape((batch, 8)))],
                       minimum_deployment_target=ct.target.iOS17, skip_model_load=True)
    model.author, model.license, model.short_description = "someone", "theirs", f"variant {variant}"
    model.user_defined_metadata["keep"] = "me"
    return model


@pytest.fixture(scope="module")
def mil_models(tmp_path_factory):
    folder = tmp_path_factory.mktemp("mil")
    paths = []
    for variant in range(3):
        path = folder / f"variant{variant}.mlpackage"
        _mil_model(variant).save(str(path))
        paths.append(path)
    return paths


# ------------------------------------------------------------ random invocations

OUTPUT_KINDS = ["fresh", "input", "taken", "folder", "data_file", "inside_input", "around_input",
                "missing_parent", "parent_is_file", "other_format", "symlink_to_input"]
OPTIONS = st.lists(st.sampled_from([
    ("--rules", "bad"), ("--rules", "mil"), ("--rules", "onnx"), ("--rule", "no_such_rule"),
    ("--rule", "remove_broadcast_expand"), ("--rule", "remove_broadcast_tiles"), ("--max-sweeps", "0"),
    ("--max-sweeps", "1"), ("--check-types",), ("--json",), ("--stats",),
]), max_size=3, unique=True)


def _place_output(kind: str, folder: Path, source: Path, suffix: str) -> Path:
    if kind == "input":
        return source
    if kind == "taken":
        taken = folder / f"taken{suffix}"
        if suffix == ".mlpackage":
            taken.mkdir()
            (taken / "Manifest.json").write_text("{}")
        else:
            taken.write_bytes(b"an earlier output")
        return taken
    if kind == "folder":
        box = folder / f"box{suffix}"
        box.mkdir()
        (box / "mine.txt").write_text("mine")
        return box
    if kind == "data_file":
        data = [p for p in folder.iterdir() if p.name.endswith(".data")]
        return data[0] if data else folder / f"out{suffix}"
    if kind == "inside_input":
        return (source / "Data" if source.is_dir() else folder) / f"inner{suffix}"
    if kind == "around_input":
        return folder
    if kind == "missing_parent":
        return folder / "no" / f"out{suffix}"
    if kind == "parent_is_file":
        (folder / "plain").write_text("x")
        return folder / "plain" / f"out{suffix}"
    if kind == "other_format":
        return folder / ("out.onnx" if suffix == ".mlpackage" else "out.mlpackage")
    if kind == "symlink_to_input":
        link = folder / f"alias{suffix}"
        link.symlink_to(source)
        return link
    return folder / f"out{suffix}"


def _arguments(options, folder: Path) -> list[str]:
    arguments = []
    for option in options:
        if option[0] == "--rules":
            if option[1] == "bad":
                bad = folder / "bad.rules"
                bad.write_text('dialect onnx\nrule r "d"\n  match %e = Expnad(input=%x)\n  rewrite %e -> %x\n')
                arguments += ["--rules", str(bad)]
            else:
                arguments += ["--rules", str(RULES / option[1])]
        else:
            arguments += list(option)
    return arguments


def _check_untouched(source: Path, folder: Path, command: list[str]) -> None:
    input_files = [source] + [p for p in folder.iterdir() if p.name.endswith(".data")]
    before = {str(p): tree_state(p) for p in input_files}
    others = folder_state(folder)
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        try:
            code = cli.main(command)
        except SystemExit as usage_error:  # argparse's own exit for a bad option value
            code = usage_error.code
    assert code in (0, 1, 2), (code, command)
    assert "Traceback" not in stderr.getvalue()
    after = {str(p): tree_state(p) for p in input_files}
    assert after == before, (command, stderr.getvalue())
    assert not any(p.name.startswith(output.STAGING_PREFIX) for p in folder.rglob("*")), command
    if code != 0:  # a failed run changes nothing at all
        assert folder_state(folder) == others, (command, stderr.getvalue())


SETTINGS = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow],
                    derandomize=True)


@SETTINGS
@given(model=onnx_models(), command=st.sampled_from(["apply", "explain"]),
       output_kind=st.sampled_from(OUTPUT_KINDS), options=OPTIONS)
def test_onnx_input_is_never_changed(model, command, output_kind, options):
    model, external = model
    with tempfile.TemporaryDirectory() as directory:
        folder = Path(directory)
        source = write_onnx(model, folder / "model.onnx", data_name="model.onnx.data" if external else None)
        if command == "explain":
            arguments = ["explain", str(RULES), str(source)]
        else:
            target = _place_output(output_kind, folder, source, ".onnx")
            arguments = ["apply", *_arguments(options, folder), str(source), "-o", str(target)]
        _check_untouched(source, folder, arguments)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow,
          HealthCheck.function_scoped_fixture], derandomize=True)
@given(variant=st.integers(0, 2), command=st.sampled_from(["apply", "apply", "explain"]),
       output_kind=st.sampled_from(OUTPUT_KINDS), options=OPTIONS)
def test_mlpackage_input_is_never_changed(mil_models, variant, command, output_kind, options):
    import shutil

    with tempfile.TemporaryDirectory() as directory:
        folder = Path(directory)
        source = folder / "model.mlpackage"
        shutil.copytree(mil_models[variant], source)
        if command == "explain":
            arguments = ["explain", str(RULES), str(source)]
        else:
            target = _place_output(output_kind, folder, source, ".mlpackage")
            arguments = ["apply", *_arguments(options, folder), str(source), "-o", str(target)]
        _check_untouched(source, folder, arguments)
