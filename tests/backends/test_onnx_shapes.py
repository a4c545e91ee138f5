"""Symbolic shape inference for ONNX (`rewrite.backends.onnx.shapes`, issue 14 part 1).

Each op family gets a small model with symbolic inputs: the inferred shape is
checked symbolically, then against onnxruntime at two concrete sizes (the
symbols substituted). The real exports under `tests/backends/onnx_models/`
are checked the same way for every value they hold.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import TensorProto, helper, numpy_helper

import rewrite
from rewrite.backends.onnx import OnnxAdapter, dim_algebra, onnx_inference, shape_rules
from rewrite.language.logic import UNKNOWN, Broadcast, Difference, Local, Minimum, Product, Sum, Symbol

FLOAT, INT64, BOOL = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL
MODELS = Path(__file__).parent / "onnx_models"
S = Symbol


# ---------------------------------------------------------------- helpers


def _model(nodes, inputs, outputs, initializers=(), opset=18):
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(initializers))
    # Outputs are declared without shapes (onnx's checker wants one): onnxruntime checks the model.
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _tensor(name, elem_type, shape):
    return helper.make_tensor_value_info(name, elem_type, shape)


def _ints(name, values):
    return numpy_helper.from_array(np.asarray(values, dtype=np.int64), name)


def _floats(name, shape, seed=0):
    return numpy_helper.from_array(np.random.default_rng(seed).standard_normal(shape).astype(np.float32), name)


_COMBINE = {Sum: lambda a, b: a + b, Difference: lambda a, b: a - b, Product: lambda a, b: a * b, Minimum: min}


def evaluate(dim, sizes):
    """A dim's number for the input sizes `sizes` (symbol name -> int); None if it names
    something else (a symbol local to a value, which only that value's run knows)."""
    if dim is UNKNOWN:
        return None
    if isinstance(dim, int):
        return dim
    if isinstance(dim, Symbol):
        return sizes.get(dim.name)
    if type(dim) in _COMBINE:
        left, right = evaluate(dim.left, sizes), evaluate(dim.right, sizes)
        return None if left is None or right is None else _COMBINE[type(dim)](left, right)
    if isinstance(dim, Broadcast):
        values = [evaluate(part, sizes) for part in dim.parts]
        return None if None in values else max(values)
    return None


def _feeds(model, sizes, seed=0):
    rng = np.random.default_rng(seed)
    feeds = {}
    for info in model.graph.input:
        tensor = info.type.tensor_type
        shape = [d.dim_value if d.HasField("dim_value") else sizes[d.dim_param] for d in tensor.shape.dim]
        dtype = helper.tensor_dtype_to_np_dtype(tensor.elem_type)
        if dtype == np.bool_:
            feeds[info.name] = rng.integers(0, 2, size=shape).astype(bool)
        elif np.issubdtype(dtype, np.integer):
            feeds[info.name] = rng.integers(0, 3, size=shape).astype(dtype)
        else:
            feeds[info.name] = rng.standard_normal(shape).astype(dtype)
    return feeds


def _all_shapes(model, feeds):
    """onnxruntime's shape of every node output (the graph made to output them all)."""
    model = onnx.ModelProto.FromString(model.SerializeToString())
    seen = {o.name for o in model.graph.output}
    for node in model.graph.node:
        for name in node.output:
            if name and name not in seen:
                model.graph.output.append(helper.ValueInfoProto(name=name))
                seen.add(name)
    del model.graph.value_info[:]
    options = onnxruntime.SessionOptions()
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = onnxruntime.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return {name: np.asarray(value).shape for name, value in zip(names, session.run(names, feeds))}


def _check_against_runtime(model, adapter, sizes, names=None):
    """Every inferred dim that evaluates for `sizes` is onnxruntime's; returns how many were checked."""
    real = _all_shapes(model, _feeds(model, sizes))
    checked = 0
    for name, shape in real.items():
        if names is not None and name not in names:
            continue
        value = adapter.main.values[name]
        if value.shape is None:
            continue
        assert len(value.shape) == len(shape), (name, value.shape, shape, sizes)
        for dim, size in zip(value.shape, shape):
            got = evaluate(dim, sizes)
            if got is not None:
                assert got == size, (name, [str(d) for d in value.shape], shape, sizes)
                checked += 1
    return checked


SIZES = ({"b": 2, "s": 5, "t": 3}, {"b": 3, "s": 7, "t": 9})


def _infer(model, expected):
    """Infer, compare `expected` (output name -> dims) symbolically, then at both SIZES."""
    adapter = OnnxAdapter(model)
    for name, dims in expected.items():
        assert adapter.main.values[name].shape == tuple(dims), (name, adapter.main.values[name].shape)
    for sizes in SIZES:
        _check_against_runtime(model, adapter, sizes)
    return adapter


# ---------------------------------------------------------------- Reshape


def test_reshape_solves_minus_one_symbolically():
    # Reshape(input_ids[b, s], [-1, s]) is [b, s], as the exporters' view(-1, seq) means.
    nodes = [
        helper.make_node("Shape", ["ids"], ["shape"], start=1, end=2),
        helper.make_node("Concat", ["minus_one", "shape"], ["target"], axis=0),
        helper.make_node("Reshape", ["ids", "target"], ["view"]),
        helper.make_node("Reshape", ["x", "flat"], ["rows"]),
        helper.make_node("Reshape", ["x", "copy"], ["copied"]),
    ]
    model = _model(
        nodes, [_tensor("ids", INT64, ["b", "s"]), _tensor("x", FLOAT, ["b", "s", 8])],
        [_tensor(n, t, None) for n, t in (("view", INT64), ("rows", FLOAT), ("copied", FLOAT))],
        [_ints("minus_one", [-1]), _ints("flat", [-1, 4]), _ints("copy", [0, -1])],
    )
    _infer(model, {
        "view": (S("b"), S("s")),
        "rows": (Product(Product(S("b"), S("s")), 2), 4),  # b * s * 8 / 4
        "copied": (S("b"), Product(8, S("s"))),
    })
    # b * s * 8 / 3 is not a product of known dims (it runs only where b or s is a multiple of 3).
    odd = _model([helper.make_node("Reshape", ["x", "by_3"], ["odd"])], [_tensor("x", FLOAT, ["b", "s", 8])],
                 [_tensor("odd", FLOAT, None)], [_ints("by_3", [-1, 3])])
    assert OnnxAdapter(odd).main.values["odd"].shape == (UNKNOWN, 3)


# ---------------------------------------------------------------- Slice


def test_slice_with_run_time_bounds_keeps_the_axes_it_does_not_cut():
    nodes = [
        helper.make_node("Shape", ["y"], ["t"]),  # [t], only known at run time
        helper.make_node("Slice", ["x", "zero", "t", "one"], ["to_t"]),  # x[:, :t]
        helper.make_node("Shape", ["x"], ["shape"], start=1, end=2),
        helper.make_node("Add", ["shape", "one"], ["s_plus_1"]),
        helper.make_node("Slice", ["x", "zero", "s_plus_1", "one"], ["all"]),  # x[:, :s+1] is x
        helper.make_node("Concat", ["x", "x0"], ["longer"], axis=1),  # [b, s + 1, 8]
        helper.make_node("Slice", ["longer", "one", "s_plus_1", "one"], ["tail"]),  # [1:s+1] is s long
        helper.make_node("Slice", ["x", "starts", "ends", "one"], ["unknown"]),  # bounds of the graph's inputs
    ]
    model = _model(
        nodes,
        [_tensor("x", FLOAT, ["b", "s", 8]), _tensor("y", FLOAT, ["t"]), _tensor("x0", FLOAT, ["b", 1, 8]),
         _tensor("starts", INT64, [1]), _tensor("ends", INT64, [1])],
        [_tensor(n, FLOAT, None) for n in ("to_t", "all", "tail", "unknown")],
        [_ints("zero", [0]), _ints("one", [1])],
    )
    adapter = OnnxAdapter(model)
    values = adapter.main.values
    assert values["to_t"].shape == (S("b"), Minimum(S("s"), S("t")), 8)
    assert values["all"].shape == (S("b"), S("s"), 8)
    assert values["longer"].shape == (S("b"), Sum(1, S("s")), 8)
    assert values["tail"].shape == (S("b"), S("s"), 8)
    assert values["unknown"].shape == (S("b"), UNKNOWN, 8)
    for sizes in SIZES:
        feeds = _feeds(model, sizes)
        feeds["starts"], feeds["ends"] = np.array([1]), np.array([3])
        real = _all_shapes(model, feeds)
        for name in ("to_t", "all", "tail", "unknown"):
            inferred = [evaluate(d, sizes) for d in values[name].shape]
            assert all(i is None or i == r for i, r in zip(inferred, real[name])), (name, inferred, real[name])


def test_slice_min_is_taken_only_where_provable():
    sliced = shape_rules._sliced_dim
    assert sliced(S("s"), 0, S("s"), 1) == S("s")
    assert sliced(S("s"), 0, Sum(1, S("s")), 1) == S("s")
    assert sliced(Sum(1, S("s")), 0, S("s"), 1) == S("s")
    assert sliced(S("s"), 0, 4, 1) == Minimum(4, S("s"))
    assert sliced(S("s"), 1, 2**63 - 1, 1) is UNKNOWN  # s - 1 is negative for s = 0
    assert sliced(S("s"), 0, -1, 1) is UNKNOWN  # s - 1, likewise
    assert sliced(S("s"), -1, -(2**63), -1) == S("s")  # the whole axis, reversed
    assert sliced(S("s"), 0, Difference(S("s"), 1), 1) is UNKNOWN  # not known to be a size
    assert sliced(S("s"), 0, S("s"), 2) is UNKNOWN
    assert sliced(7, 1, 100, 2) == 3


def test_a_slice_from_minus_the_dim_to_the_end_is_the_whole_axis():
    # T5's position_bias[:, :, -seq:, :]: the start is Neg(Gather(Shape(x), 1)), -seq at run time.
    nodes = [
        helper.make_node("Shape", ["x"], ["seq"], start=1, end=2),
        helper.make_node("Neg", ["seq"], ["minus_seq"]),
        helper.make_node("Slice", ["bias", "minus_seq", "far", "axis"], ["tail"]),  # bias[-s:] on axis 1
        helper.make_node("Slice", ["bias", "minus_three", "far", "axis"], ["last_3"]),  # bias[-3:] on axis 1
        helper.make_node("Slice", ["bias", "minus_seq", "far", "zero"], ["other"]),  # bias[-s:] on axis 0, t long
    ]
    model = _model(
        nodes, [_tensor("x", FLOAT, ["b", "s", 8]), _tensor("bias", FLOAT, ["t", "s"])],
        [_tensor(n, FLOAT, None) for n in ("tail", "last_3", "other")],
        [_ints("far", [2**63 - 1]), _ints("axis", [1]), _ints("zero", [0]), _ints("minus_three", [-3])],
    )
    adapter = _infer(model, {"tail": (S("t"), S("s")), "last_3": (S("t"), Minimum(3, S("s")))})
    assert adapter.main.values["minus_seq"].contents == [Difference(0, S("s"))]
    assert adapter.main.values["other"].shape == (UNKNOWN, S("s"))  # min(s, t): -s clamps to 0 only if s >= t
    sliced = shape_rules._sliced_dim
    assert sliced(S("s"), Difference(0, S("s")), 2**63 - 1, 1) == S("s")
    assert sliced(S("s"), Difference(0, S("t")), 2**63 - 1, 1) is UNKNOWN  # -t clamps to 0 only when t >= s
    assert sliced(S("s"), Difference(0, S("s")), S("s"), 1) is UNKNOWN  # only up to the end is taken
    assert sliced(S("s"), -3, 2**63 - 1, 1) == Minimum(3, S("s"))


def test_a_clamped_dim_broadcast_against_what_it_clamps_is_that_dim():
    # BERT's position and token-type ids: a [1, 64] buffer sliced to [1, min(64, s)] and expanded to
    # [b, s], or added to a [b, s, .] tensor. Where the broadcast runs at all, min(64, s) is s or 1.
    nodes = [
        helper.make_node("Shape", ["ids"], ["shape"]),
        helper.make_node("Shape", ["ids"], ["seq"], start=1, end=2),
        helper.make_node("Slice", ["buffer", "zero", "seq", "one"], ["positions"]),  # [1, min(64, s)]
        helper.make_node("Expand", ["positions", "shape"], ["expanded"]),
        helper.make_node("Gather", ["table", "positions"], ["embedded"]),  # [1, min(64, s), 4]
        helper.make_node("Add", ["x", "embedded"], ["summed"]),
    ]
    model = _model(
        nodes, [_tensor("ids", INT64, ["b", "s"]), _tensor("x", FLOAT, ["b", "s", 4])],
        [_tensor(n, t, None) for n, t in (("expanded", INT64), ("summed", FLOAT))],
        [_ints("buffer", [list(range(64))]), _ints("zero", [0]), _ints("one", [1]),
         _floats("table", [64, 4])],
    )
    adapter = OnnxAdapter(model)
    values = adapter.main.values
    assert values["positions"].shape == (1, Minimum(64, S("s")))
    assert values["expanded"].shape == (S("b"), S("s"))
    assert values["summed"].shape == (S("b"), S("s"), 4)
    for sizes in ({"b": 2, "s": 5}, {"b": 3, "s": 1}):
        _check_against_runtime(model, adapter, sizes, names={"expanded", "summed"})
    clamped = dim_algebra.clamped_to
    assert clamped(Minimum(64, S("s")), [S("s"), 1]) == S("s")
    assert clamped(Minimum(0, S("s")), [S("s")]) == Minimum(0, S("s"))  # min(0, s) is 0, and broadcast(0, 1) is 0
    assert clamped(Minimum(S("s"), S("t")), [S("s")]) == Minimum(S("s"), S("t"))  # t may be neither 1 nor s
    assert clamped(Minimum(64, S("s")), [S("t")]) == Minimum(64, S("s"))  # against another dim: nothing to say


# ---------------------------------------------------------------- Flatten, Trilu, Size


def test_flatten_trilu_and_size():
    nodes = [
        helper.make_node("Flatten", ["x"], ["f2"], axis=2),
        helper.make_node("Flatten", ["x"], ["f0"], axis=0),
        helper.make_node("Flatten", ["x"], ["f_last"], axis=-1),
        helper.make_node("Trilu", ["m"], ["lower"], upper=0),
        helper.make_node("Size", ["x"], ["size"]),
        helper.make_node("Unsqueeze", ["size", "zero"], ["size_1d"]),
        helper.make_node("Reshape", ["x", "size_1d"], ["flat"]),
    ]
    model = _model(
        nodes, [_tensor("x", FLOAT, ["b", "s", 8]), _tensor("m", FLOAT, ["b", "s", "s"])],
        [_tensor(n, FLOAT, None) for n in ("f2", "f0", "f_last", "lower", "flat")], [_ints("zero", [0])],
    )
    adapter = _infer(model, {
        "f2": (Product(S("b"), S("s")), 8),
        "f0": (1, Product(Product(S("b"), S("s")), 8)),
        "f_last": (Product(S("b"), S("s")), 8),
        "lower": (S("b"), S("s"), S("s")),
        "size": (),
        "flat": (Product(Product(S("b"), S("s")), 8),),
    })
    assert adapter.main.values["size"].contents == [Product(Product(S("b"), S("s")), 8)]


# ---------------------------------------------------------------- values used as shapes


def test_gather_where_constant_of_shape_range_and_shape_start_end():
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node("Gather", ["shape", "one"], ["s"], axis=0),  # scalar s
        helper.make_node("GatherElements", ["shape", "two_zero"], ["reordered"], axis=0),  # [8, b]
        helper.make_node("ConstantOfShape", ["reordered"], ["filled"]),
        helper.make_node("Range", ["zero_scalar", "s", "one_scalar"], ["positions"]),
        helper.make_node("Add", ["s", "three"], ["s_plus_3"]),
        helper.make_node("Range", ["three", "s_plus_3", "one_scalar"], ["shifted"]),
        helper.make_node("Shape", ["x"], ["middle"], start=1, end=-1),
        helper.make_node("ConstantOfShape", ["middle"], ["middle_filled"]),
        # expand(-1, s): Where(Equal(target, -1), ones, target) as the TorchScript exporter writes it
        helper.make_node("Concat", ["minus_one", "middle"], ["target"], axis=0),
        helper.make_node("Equal", ["target", "minus_one"], ["is_minus_one"]),
        helper.make_node("Where", ["is_minus_one", "ones", "target"], ["widened"]),
        helper.make_node("Expand", ["row", "widened"], ["expanded"]),
    ]
    inits = [
        _ints("one", 1), _ints("two_zero", [2, 0]), _ints("zero_scalar", 0), _ints("one_scalar", 1),
        _ints("three", 3), _ints("minus_one", [-1]), _ints("ones", [1, 1]),
    ]
    model = _model(
        nodes, [_tensor("x", FLOAT, ["b", "s", 8]), _tensor("row", FLOAT, ["b", 1])],
        [_tensor(n, t, None) for n, t in (("filled", FLOAT), ("positions", INT64), ("shifted", INT64),
                                           ("middle_filled", FLOAT), ("expanded", FLOAT))], inits,
    )
    adapter = _infer(model, {
        "s": (),
        "reordered": (2,),
        "filled": (8, S("b")),
        "positions": (S("s"),),
        "shifted": (S("s"),),
        "middle": (1,),
        "middle_filled": (S("s"),),
        "expanded": (S("b"), S("s")),
    })
    values = adapter.main.values
    assert values["s"].contents == [S("s")]
    assert values["middle"].contents == [S("s")]
    assert values["widened"].contents == [1, S("s")]


def test_range_length_is_known_only_when_not_negative():
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node("Gather", ["shape", "zero"], ["b"], axis=0),
        helper.make_node("Gather", ["shape", "one"], ["s"], axis=0),
        helper.make_node("Range", ["s", "b", "one"], ["b_minus_s"]),  # b - s may be negative: empty then
        helper.make_node("Range", ["b", "zero", "minus_one"], ["down"]),  # b, b - 1, ..., 1
    ]
    model = _model(nodes, [_tensor("x", FLOAT, ["b", "s"])],
                   [_tensor("b_minus_s", INT64, None), _tensor("down", INT64, None)],
                   [_ints("zero", 0), _ints("one", 1), _ints("minus_one", -1)])
    _infer(model, {"b_minus_s": (UNKNOWN,), "down": (S("b"),)})


# ---------------------------------------------------------------- onnx's own inference for the rest


FALLBACK_CASES = {
    "Gemm": ([helper.make_node("Gemm", ["a", "w"], ["out"], transB=1)],
             [_tensor("a", FLOAT, ["b", 16])], [_floats("w", [32, 16])], (S("b"), 32)),
    "Split": ([helper.make_node("Split", ["x", "parts"], ["out", "rest"], axis=-1)],
              [_tensor("x", FLOAT, ["b", "s", 8])], [_ints("parts", [3, 5])], (S("b"), S("s"), 3)),
    "GatherND": ([helper.make_node("GatherND", ["x", "i"], ["out"], batch_dims=1)],
                 [_tensor("x", FLOAT, ["b", "s", 8]), _tensor("i", INT64, ["b", 4, 1])], [], (S("b"), 4, 8)),
    "Conv": ([helper.make_node("Conv", ["img", "k"], ["out"], pads=[1, 1, 1, 1])],
             [_tensor("img", FLOAT, ["b", 3, 6, 6])], [_floats("k", [4, 3, 3, 3])], (S("b"), 4, 6, 6)),
    "Einsum": ([helper.make_node("Einsum", ["x", "y"], ["out"], equation="bsk,btk->bst")],
               [_tensor("x", FLOAT, ["b", "s", 8]), _tensor("y", FLOAT, ["b", "t", 8])], [], (S("b"), S("s"), S("t"))),
    "Pad": ([helper.make_node("Pad", ["x", "pads"], ["out"])],
            [_tensor("x", FLOAT, ["b", 4])], [_ints("pads", [0, 1, 0, 2])], (S("b"), 7)),
    "ArgMax": ([helper.make_node("ArgMax", ["x"], ["out"], axis=1, keepdims=0)],
               [_tensor("x", FLOAT, ["b", "s", 8])], [], (S("b"), 8)),
    "OneHot": ([helper.make_node("OneHot", ["i", "depth", "values"], ["out"])],
               [_tensor("i", INT64, ["b", "s"])],
               [_ints("depth", 5), numpy_helper.from_array(np.array([0, 1], np.float32), "values")],
               (S("b"), S("s"), 5)),
    "DepthToSpace": ([helper.make_node("DepthToSpace", ["img"], ["out"], blocksize=2)],
                     [_tensor("img", FLOAT, ["b", 8, 3, 3])], [], (S("b"), 2, 6, 6)),
    "BatchNormalization": ([helper.make_node("BatchNormalization", ["img", "g", "bb", "m", "v"], ["out"])],
                           [_tensor("img", FLOAT, ["b", 3, "s", 4])],
                           [_floats("g", [3]), _floats("bb", [3]), _floats("m", [3]), _floats("v", [3]) ],
                           (S("b"), 3, S("s"), 4)),
    "MaxPool": ([helper.make_node("MaxPool", ["img"], ["out"], kernel_shape=[2, 2], strides=[2, 2])],
                [_tensor("img", FLOAT, ["b", 3, 6, 8])], [], (S("b"), 3, 3, 4)),
    "ScatterND": ([helper.make_node("ScatterND", ["x", "i", "u"], ["out"])],
                  [_tensor("x", FLOAT, ["b", "s", 8]), _tensor("i", INT64, [2, 1]), _tensor("u", FLOAT, [2, "s", 8])],
                  [], (S("b"), S("s"), 8)),
    "TopK": ([helper.make_node("TopK", ["x", "k"], ["out", "indices"], axis=1)],
             [_tensor("x", FLOAT, ["b", "s", 8])], [_ints("k", [2])], (S("b"), 2, 8)),
    "GlobalAveragePool": ([helper.make_node("GlobalAveragePool", ["img"], ["out"])],
                          [_tensor("img", FLOAT, ["b", 3, "s", "t"])], [], (S("b"), 3, 1, 1)),
    "Hardmax-Softmax": ([helper.make_node("LogSoftmax", ["x"], ["out"], axis=-1)],
                        [_tensor("x", FLOAT, ["b", "s", 8])], [], (S("b"), S("s"), 8)),
    "MeanVarianceNormalization": ([helper.make_node("MeanVarianceNormalization", ["img"], ["out"])],
                                  [_tensor("img", FLOAT, ["b", 3, "s", 4])], [], (S("b"), 3, S("s"), 4)),
    "NonZero": ([helper.make_node("NonZero", ["x"], ["out"])],
                [_tensor("x", FLOAT, ["b", "s", 8])], [], (3, UNKNOWN)),
}


@pytest.mark.parametrize("case", sorted(FALLBACK_CASES))
def test_every_other_op_gets_onnxs_own_inference(case):
    nodes, inputs, inits, expected = FALLBACK_CASES[case]
    outputs = [_tensor(name, TensorProto.UNDEFINED, None) for name in nodes[0].output]
    graph = helper.make_graph(nodes, "g", inputs, [], initializer=list(inits))
    for name in nodes[0].output:
        graph.output.append(helper.ValueInfoProto(name=name))
    del outputs
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    adapter = OnnxAdapter(model)
    assert adapter.main.values["out"].shape == expected
    for sizes in SIZES:
        assert _check_against_runtime(model, adapter, sizes) > 0


def test_if_takes_the_dims_both_branches_agree_on():
    def branch(name, op):
        return helper.make_graph([helper.make_node(op, ["x"], [name])], name, [],
                                 [helper.make_tensor_value_info(name, FLOAT, None)])

    nodes = [
        helper.make_node("If", ["c"], ["out"], then_branch=branch("t", "Relu"), else_branch=branch("e", "Neg")),
        helper.make_node("Flatten", ["x"], ["f"], axis=2),
        helper.make_node("If", ["c"], ["mixed"], then_branch=helper.make_graph(
            [helper.make_node("Relu", ["x"], ["t2"])], "t2", [], [_tensor("t2", FLOAT, None)]),
            else_branch=helper.make_graph([helper.make_node("Transpose", ["x"], ["e2"], perm=[1, 0, 2])], "e2", [],
                                          [_tensor("e2", FLOAT, None)])),
    ]
    model = _model(nodes, [_tensor("c", BOOL, []), _tensor("x", FLOAT, ["b", "s", 8])],
                   [_tensor("out", FLOAT, None), _tensor("mixed", FLOAT, None)])
    adapter = OnnxAdapter(model)
    assert adapter.main.values["out"].shape == (S("b"), S("s"), 8)
    assert adapter.main.values["mixed"].shape == (UNKNOWN, UNKNOWN, 8)


def test_loop_keeps_the_literal_dims_its_carried_value_has_on_every_iteration():
    body = helper.make_graph(
        [helper.make_node("Add", ["y_in", "x"], ["y_out"]), helper.make_node("Identity", ["cond_in"], ["cond_out"]),
         helper.make_node("Identity", ["y_out"], ["scan"])],
        "body",
        [_tensor("i", INT64, []), _tensor("cond_in", BOOL, []), _tensor("y_in", FLOAT, [None, 8])],
        [_tensor("cond_out", BOOL, []), _tensor("y_out", FLOAT, None), _tensor("scan", FLOAT, None)],
    )
    nodes = [helper.make_node("Loop", ["n", "c", "y0"], ["y", "ys"], body=body)]
    model = _model(nodes, [_tensor("x", FLOAT, ["b", 8]), _tensor("y0", FLOAT, ["b", 8]), _tensor("n", INT64, []),
                           _tensor("c", BOOL, [])], [_tensor("y", FLOAT, None), _tensor("ys", FLOAT, None)])
    adapter = OnnxAdapter(model)
    values = adapter.main.values
    assert values["y"].shape == (UNKNOWN, 8) and values["y"].dtype == "fp32"
    assert values["ys"].shape == (UNKNOWN, UNKNOWN, 8) and values["ys"].dtype == "fp32"
    for sizes in SIZES:
        feeds = _feeds(model, sizes)
        feeds["n"], feeds["c"] = np.array(3), np.array(True)
        real = _all_shapes(model, feeds)
        assert real["y"] == (sizes["b"], 8) and real["ys"] == (3, sizes["b"], 8)


def test_onnx_keeps_a_symbol_only_where_it_proves_it():
    # Einsum of [b, 8] and [c, 8] needs b == c to run: onnx keeps one of them or leaves the dim
    # empty, either right wherever the op runs at all; never a dim of its own.
    nodes = [helper.make_node("Einsum", ["x", "y"], ["out"], equation="ij,ij->ij")]
    model = _model(nodes, [_tensor("x", FLOAT, ["b", 8]), _tensor("y", FLOAT, ["c", 8])], [_tensor("out", FLOAT, None)])
    shape = OnnxAdapter(model).main.values["out"].shape
    assert shape[1] == 8 and shape[0] in (UNKNOWN, S("b"), S("c"))  # either is right where the op runs at all


def test_symbols_onnx_makes_up_are_local_to_the_node(monkeypatch):
    made_up = helper.make_tensor_type_proto(FLOAT, ["fresh", "fresh", None, "__rewrite_dim_0", 4])
    monkeypatch.setattr(onnx_inference, "_FALLBACK_CACHE", {})
    monkeypatch.setattr(onnx.shape_inference, "infer_node_outputs", lambda *args, **kwargs: {"o0": made_up})
    model = _model([helper.make_node("Einsum", ["x"], ["out"], equation="ij->ij")], [_tensor("x", FLOAT, ["b", 8])],
                   [_tensor("out", FLOAT, None)])
    shape = OnnxAdapter(model).main.values["out"].shape
    assert shape == (Local("fresh", "out"), Local("fresh", "out"), UNKNOWN, S("b"), 4)


def test_onnx_is_asked_once_per_kind_of_node(monkeypatch):
    calls = []
    ask = onnx_inference._ask_onnx

    def counting(*args):
        calls.append(args[1].op_type)
        return ask(*args)

    monkeypatch.setattr(onnx_inference, "_ask_onnx", counting)
    monkeypatch.setattr(onnx_inference, "_FALLBACK_CACHE", {})
    nodes = [helper.make_node("Gemm", [f"h{i}", "w"], [f"h{i + 1}"], transB=1) for i in range(300)]
    model = _model(nodes, [_tensor("h0", FLOAT, ["b", 16])], [_tensor("h300", FLOAT, None)], [_floats("w", [16, 16])])
    adapter = OnnxAdapter(model)
    assert adapter.main.values["h300"].shape == (S("b"), 16)
    assert calls == ["Gemm"]
    # Other symbols, the same kind of node: still the cached answer, mapped to these symbols.
    other = _model(nodes[:1], [_tensor("h0", FLOAT, ["n", 16])], [_tensor("h1", FLOAT, None)],
                   [_floats("w", [16, 16])])
    assert OnnxAdapter(other).main.values["h1"].shape == (S("n"), 16)
    assert calls == ["Gemm"]


def test_ops_of_other_domains_are_left_alone():
    graph = helper.make_graph([helper.make_node("Gelu", ["x"], ["out"], domain="com.microsoft")], "g",
                              [_tensor("x", FLOAT, ["b", 8])], [_tensor("out", FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18),
                                                    helper.make_opsetid("com.microsoft", 1)])
    assert OnnxAdapter(model).main.values["out"].shape is None


# ---------------------------------------------------------------- the dim algebra


def test_terms_are_read_as_polynomials_and_a_models_names_as_atoms():
    poly = dim_algebra.polynomial
    batch, seq = S("batch"), S("seq")
    clamp = Minimum(1, seq)
    assert poly(Product(batch, seq)) == {(batch, seq): 1}
    assert poly(Sum(seq, -1)) == {(seq,): 1, (): -1}
    assert poly(Sum(clamp, seq)) == {(clamp,): 1, (seq,): 1}
    # A user's dim named with an operator in it is one atom, never split.
    for name in ("(2*seq + 1)", "past_sequence_length + 1", "(a-b+x)", "(batch*seq)", "min(1,seq)"):
        assert poly(S(name)) == {(S(name),): 1}
    assert dim_algebra.at_least(Sum(1, seq), Sum(clamp, seq))
    assert not dim_algebra.at_least(seq, Sum(clamp, seq))
    assert not dim_algebra.at_least(Difference(seq, 1), 0)


def test_a_sum_thousands_deep_is_read_as_a_polynomial():
    seq, total = S("seq"), 0
    for _ in range(5000):
        total = Sum(total, seq) if total else seq
    assert dim_algebra.polynomial(total) == {(seq,): 5000}
    assert dim_algebra.at_least(total, seq)


# ---------------------------------------------------------------- the exports


def _manifest():
    return json.loads((MODELS / "manifest.json").read_text())["files"]


# Dims onnxruntime knows but a sound inference cannot name, per export, with why:
# cat([x[:, :1], x], 1)[:, 1:seq + 1] is seq long, but only max(min(1, seq) + seq - 1, 0) is
# provable by the rules here (the case seq = 0 needs a case split); the exporter's own name
# for it is taken, local to each of the six values on that path (Slice, Sub, Equal, Not, Cast, CumSum).
UNRESOLVED = {"gpt2_dynamo.onnx": 6, "llama_dynamo.onnx": 6}


def _export_feeds(entry, test):
    rng = np.random.default_rng(0)
    feeds = {}
    for name, shape in test["inputs"].items():
        how = entry["input_generation"][name]
        if how["kind"] == "randint":
            feeds[name] = rng.integers(how["low"], how["high"], size=shape).astype(how["dtype"])
        else:
            feeds[name] = rng.standard_normal(shape).astype(how["dtype"])
    return feeds


@pytest.mark.parametrize("entry", _manifest(), ids=lambda entry: entry["file"])
def test_exports_have_every_dim_onnxruntime_has(entry):
    model = onnx.load(str(MODELS / entry["file"]))
    adapter = OnnxAdapter(model)
    runs = [(test["dims"], _all_shapes(model, _export_feeds(entry, test))) for test in entry["test_shapes"]]
    unresolved = checked = 0
    for node in adapter.main.nodes:
        for value in node.outputs:
            if value is None:
                continue
            shape = value.shape
            assert shape is not None, value.name
            for dims_, real in runs:
                assert len(shape) == len(real[value.name]), (value.name, shape, real[value.name])
                for dim, size in zip(shape, real[value.name]):
                    got = evaluate(dim, dims_)
                    if got is not None:
                        assert got == size, (value.name, [str(d) for d in shape], real[value.name], dims_)
                        checked += 1
            unresolved += sum(dim is UNKNOWN or evaluate(dim, runs[0][0]) is None for dim in shape)
    assert unresolved == UNRESOLVED.get(entry["file"], 0)
    assert checked > 0


def _no_op_expands(model, entry):
    """Expand/Tile nodes that change nothing at run time: the output has the input's
    shape at every tested size, or every consumer broadcasts to the same output anyway."""
    broadcasting = {"Add", "Sub", "Mul", "Div", "Pow", "Mod", "Equal", "Less", "LessOrEqual", "Greater",
                    "GreaterOrEqual", "And", "Or", "Xor", "Where", "Max", "Min", "Sum", "Mean"}
    runs = []
    for test in entry["test_shapes"]:
        feeds = _export_feeds(entry, test)
        real = _all_shapes(model, feeds)
        real.update({name: value.shape for name, value in feeds.items()})
        real.update({t.name: tuple(t.dims) for t in model.graph.initializer})
        runs.append(real)
    consumers = {}
    for node in model.graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    outputs = {o.name for o in model.graph.output}
    found = []
    for node in model.graph.node:
        if node.op_type not in ("Expand", "Tile"):
            continue
        source, result = node.input[0], node.output[0]
        if all(real[source] == real[result] for real in runs):
            found.append(node.name)
            continue
        uses = consumers.get(result, [])
        if result in outputs or not uses or any(u.op_type not in broadcasting for u in uses):
            continue
        try:
            absorbed = all(
                np.broadcast_shapes(real[source], *[real[i] for i in u.input if i and i != result]) == real[u.output[0]]
                for u in uses for real in runs
            )
        except ValueError:
            absorbed = False
        if absorbed:
            found.append(node.name)
    return found


@pytest.mark.parametrize("entry", [e for e in _manifest() if e["expand_tile_nodes"]], ids=lambda e: e["file"])
def test_the_shipped_rules_remove_every_expand_that_changes_nothing(entry):
    model = onnx.load(str(MODELS / entry["file"]))
    no_ops = _no_op_expands(model, entry)
    rewrite.load_rules(dialects=["onnx"]).apply(model)
    left = {node.name for node in model.graph.node if node.op_type in ("Expand", "Tile")}
    assert not left & set(no_ops), sorted(left & set(no_ops))


# ---------------------------------------------------------------- every op, every opset the exports use


def _simple_schemas(opset):
    """The default domain's ops at `opset` that take one or two tensors and need no attribute."""
    names = sorted({s.name for s in onnx.defs.get_all_schemas_with_history() if s.domain == ""})
    for name in names:
        try:
            schema = onnx.defs.get_schema(name, opset, "")
        except onnx.defs.SchemaError:
            continue
        if any(a.required for a in schema.attributes.values()) or schema.min_input not in (1, 2):
            continue
        yield name, schema.min_input


# Ops whose output rank or dims depend on run-time values even with every input's dims known.
DATA_DEPENDENT = {"Squeeze", "NonZero", "Unique", "Split"}


@pytest.mark.parametrize("opset", [13, 18, 20])
def test_no_op_leaves_its_outputs_unknown_when_its_inputs_are_known(opset):
    rng = np.random.default_rng(0)
    swept = 0
    for name, count in _simple_schemas(opset):
        node = helper.make_node(name, [f"x{i}" for i in range(count)], ["out"])
        graph = helper.make_graph([node], "g", [_tensor(f"x{i}", FLOAT, ["b", "s", 4]) for i in range(count)], [])
        graph.output.append(helper.ValueInfoProto(name="out"))
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
        try:
            session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
            real = [session.run(None, {f"x{i}": rng.random((sizes["b"], sizes["s"], 4), np.float32) + 0.5
                                       for i in range(count)})[0].shape for sizes in SIZES]
        except Exception:  # onnxruntime refuses the op so (a type it lacks, inputs it cannot take)
            continue
        shape = OnnxAdapter(model).main.values["out"].shape
        if name not in DATA_DEPENDENT:
            assert shape is not None and UNKNOWN not in shape, (name, shape)
        for sizes, dims in zip(SIZES, real):
            if shape is not None:
                assert len(shape) == len(dims), (name, shape, dims)
                assert all(evaluate(d, sizes) in (None, r) for d, r in zip(shape, dims)), (name, shape, dims)
        swept += 1
    assert swept > 80


def test_explain_names_a_slice_with_run_time_bounds():
    from rewrite.engine.explain import explain
    from rewrite.predicates import registered_predicates

    nodes = [
        helper.make_node("Expand", ["x", "shape"], ["e"]),
        helper.make_node("Slice", ["z", "starts", "ends", "zero"], ["y"]),
        helper.make_node("Add", ["e", "y"], ["out"]),
    ]
    model = _model(
        nodes, [_tensor("x", FLOAT, [1, 16]), _tensor("z", FLOAT, [4, 16]), _tensor("starts", INT64, [1]),
                _tensor("ends", INT64, [1])], [_tensor("out", FLOAT, None)],
        [_ints("shape", [4, 16]), _ints("zero", [0])],
    )
    adapter = OnnxAdapter(model)
    assert adapter.main.values["y"].shape == (UNKNOWN, 16)
    rules = rewrite.load_rules(dialects=["onnx"]).only("remove_broadcast_expand").rules
    (item,) = explain(rules, adapter, registered_predicates())
    assert not item.fired and item.truth == "unknown"
    assert item.origins == ("dim 0 of %y(?, 16) was lost by the shape inference of 'Slice(y)' (Slice)",)


def test_squeeze_with_an_empty_axes_list_squeezes_every_one_as_onnxruntime_does():
    # onnxruntime reads Squeeze(x, axes=[]) as no axes given: every 1 goes.
    # A dim that might be 1 then leaves the rank unknown.
    for dims, expected in (([1, 3, 1], (3,)), (["n", 3], None)):
        model = _model([helper.make_node("Squeeze", ["x", "axes"], ["y"])], [_tensor("x", FLOAT, dims)],
                       [_tensor("y", FLOAT, None)], [_ints("axes", [])], opset=13)
        adapter = OnnxAdapter(model)
        assert adapter.shape(adapter.main.values["y"]) == expected
        if expected is not None:
            session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
            (out,) = session.run(None, {"x": np.zeros(dims, np.float32)})
            assert out.shape == expected


# ---------------------------------------------------------------- Conv and pooling windows

WINDOWS = [
    # (op, attributes, kernel): stride 1 keeps a symbolic dim symbolic; stride 2 divides it (unknown then)
    ("Conv", {}, 3), ("Conv", {"pads": [1, 1, 1, 1]}, 3), ("Conv", {"pads": [0, 2, 1, 0], "dilations": [2, 1]}, 2),
    ("Conv", {"strides": [2, 2], "pads": [1, 1, 1, 1]}, 3), ("Conv", {"auto_pad": "SAME_UPPER"}, 3),
    ("Conv", {"auto_pad": "SAME_LOWER", "strides": [2, 2]}, 2), ("Conv", {"auto_pad": "VALID"}, 1),
    ("Conv", {"group": 2}, 1),
    ("MaxPool", {"kernel_shape": [2, 2]}, None), ("MaxPool", {"kernel_shape": [3, 3], "strides": [2, 2],
                                                          "ceil_mode": 1}, None),
    ("AveragePool", {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}, None),
    ("AveragePool", {"kernel_shape": [2, 2], "auto_pad": "SAME_UPPER"}, None),
]


@pytest.mark.parametrize("op, attributes, kernel", WINDOWS, ids=[f"{w[0]}-{i}" for i, w in enumerate(WINDOWS)])
def test_window_ops_infer_their_spatial_dims(op, attributes, kernel):
    initializers = []
    inputs = ["x"]
    if op == "Conv":
        groups = attributes.get("group", 1)
        initializers.append(_floats("w", [4, 4 // groups, kernel, kernel]))
        inputs.append("w")
    node = helper.make_node(op, inputs, ["y"], **attributes)
    symbolic = _model([node], [_tensor("x", FLOAT, ["b", 4, "s", "t"])], [_tensor("y", FLOAT, None)], initializers)
    adapter = OnnxAdapter(symbolic)
    shape = adapter.main.values["y"].shape
    assert shape[0] == S("b") and shape[1] == 4
    strided = any(s > 1 for s in attributes.get("strides", [1]))
    assert all((dim is UNKNOWN) == strided for dim in shape[2:]), shape
    checked = sum(_check_against_runtime(symbolic, adapter, sizes, {"y"}) for sizes in SIZES)
    assert checked >= 2 * (4 if not strided else 2)
    # Known sizes: what onnx's own inference says, stride or not.
    for sizes in SIZES:
        known = _model([node], [_tensor("x", FLOAT, [2, 4, sizes["s"], sizes["t"]])], [_tensor("y", FLOAT, None)],
                       initializers)
        theirs = onnx.shape_inference.infer_shapes(known).graph.output[0].type.tensor_type.shape
        ours = OnnxAdapter(known).main.values["y"].shape
        assert list(ours) == [d.dim_value for d in theirs.dim], (ours, theirs)
