"""Small random ONNX models that are valid by construction: subgraphs, functions, optional inputs.

`random_model(seed)` builds one. Every value is float32 of rank 2, of one of
the shapes (B, 4), (B, 1), (1, 4) and (1, 1), where B is the symbolic batch
of the main graph's input, so that every op's output shape is known here
and broadcasting is exercised. The menu leans on what the shipped rules
look for (x * 1, x / 1, casts to the same type, reshapes and expands to a
value's own shape, identity transposes, inference Dropouts, Max of a value
with itself, zero pads, ...), next to ops no rule touches, and puts them
inside `If`, `Loop` and `Scan` bodies that read the enclosing scopes, and
inside model-local functions.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 18
B = "B"
SHAPES = ((B, 4), (B, 1), (1, 4), (1, 1))


@dataclass
class Scope:
    """Values visible while building one graph: name -> shape, with the enclosing scopes' beneath."""

    values: dict[str, tuple] = field(default_factory=dict)
    parent: Scope | None = None
    nodes: list = field(default_factory=list)
    initializers: list = field(default_factory=list)

    def visible(self) -> list[tuple[str, tuple]]:
        found, scope = [], self
        while scope is not None:
            found.extend(scope.values.items())
            scope = scope.parent
        return found


def _broadcast(a: tuple, b: tuple) -> tuple:
    return tuple(x if y == 1 else y for x, y in zip(a, b))


class Builder:
    """Builds one random model; `names` keeps every name unique across all graphs (ONNX forbids shadowing)."""

    def __init__(self, seed: int):
        self.random = random.Random(seed)
        self.serial = 0
        self.functions: list[onnx.FunctionProto] = []
        self.depth = 0

    def name(self, hint: str) -> str:
        self.serial += 1
        return f"{hint}{self.serial}"

    def pick(self, scope: Scope, shapes=None) -> tuple[str, tuple]:
        choices = [(n, s) for n, s in scope.visible() if shapes is None or s in shapes]
        return self.random.choice(choices)

    def constant(self, scope: Scope, array: np.ndarray) -> str:
        name = self.name("c")
        if self.random.random() < 0.5:
            scope.initializers.append(numpy_helper.from_array(array, name))
        else:
            scope.nodes.append(helper.make_node("Constant", [], [name], value=numpy_helper.from_array(array)))
        return name

    def emit(self, scope: Scope, op: str, inputs: list[str], shape: tuple, **attributes) -> str:
        output = self.name(op.lower()[:4])
        scope.nodes.append(helper.make_node(op, inputs, [output], name=self.name("n"), **attributes))
        scope.values[output] = shape
        return output

    # ---- one op

    def step(self, scope: Scope) -> None:
        kinds = ["unary", "binary", "by_one", "div_one", "cast", "reshape", "expand", "transpose", "dropout",
                 "max_self", "pad", "clip", "slice", "concat", "reduce", "softmax", "where", "function"]
        if self.depth < 2:
            kinds += ["if", "loop", "scan", "carried"]
        getattr(self, "_" + self.random.choice(kinds))(scope)

    def _unary(self, scope):
        x, shape = self.pick(scope)
        self.emit(scope, self.random.choice(["Relu", "Neg", "Tanh", "Sigmoid", "Abs", "Identity"]), [x], shape)

    def _binary(self, scope):
        (a, sa), (b, sb) = self.pick(scope), self.pick(scope)
        self.emit(scope, self.random.choice(["Add", "Sub", "Mul", "Max", "Min"]), [a, b], _broadcast(sa, sb))

    def _by_one(self, scope):
        x, shape = self.pick(scope)
        one = self.constant(scope, np.ones(self.random.choice([(), (1,), (1, 1)]), np.float32))
        operands = [x, one] if self.random.random() < 0.5 else [one, x]
        self.emit(scope, self.random.choice(["Mul", "Mul", "Add"]), operands, shape)

    def _div_one(self, scope):
        x, shape = self.pick(scope)
        self.emit(scope, "Div", [x, self.constant(scope, np.ones((1,), np.float32))], shape)

    def _cast(self, scope):
        x, shape = self.pick(scope)
        self.emit(scope, "Cast", [x], shape, to=TensorProto.FLOAT)

    def _reshape(self, scope):
        x, shape = self.pick(scope)
        source, _ = self.pick(scope, [shape])
        target = self.emit(scope, "Shape", [source], ("shape",))
        scope.values.pop(target)  # an int64 vector: not a value to pick for float ops
        self.emit(scope, "Reshape", [x, target], shape)

    def _expand(self, scope):
        x, shape = self.pick(scope)
        other, other_shape = self.pick(scope)
        target = self.emit(scope, "Shape", [other], ("shape",))
        scope.values.pop(target)
        self.emit(scope, "Expand", [x, target], _broadcast(shape, other_shape))

    def _transpose(self, scope):
        x, shape = self.pick(scope)
        if self.random.random() < 0.5:
            self.emit(scope, "Transpose", [x], shape, perm=[0, 1])
        else:  # there and back
            there = self.emit(scope, "Transpose", [x], shape[::-1], perm=[1, 0])
            scope.values.pop(there)  # not one of the shapes the menu works with
            self.emit(scope, "Transpose", [there], shape, perm=[1, 0])

    def _dropout(self, scope):
        x, shape = self.pick(scope)
        if self.random.random() < 0.5:
            self.emit(scope, "Dropout", [x], shape)
        else:  # the optional ratio given, training_mode left out
            self.emit(scope, "Dropout", [x, self.constant(scope, np.array(0.3, np.float32))], shape)

    def _max_self(self, scope):
        x, shape = self.pick(scope)
        self.emit(scope, self.random.choice(["Max", "Min"]), [x, x] if self.random.random() < 0.7 else [x], shape)

    def _pad(self, scope):
        x, shape = self.pick(scope)
        pads = self.constant(scope, np.zeros(4, np.int64))
        # The optional constant_value left out, or given as the empty name.
        self.emit(scope, "Pad", [x, pads] if self.random.random() < 0.5 else [x, pads, ""], shape)

    def _clip(self, scope):
        x, shape = self.pick(scope)
        low = self.constant(scope, np.array(-1.0, np.float32))
        self.emit(scope, "Clip", self.random.choice([[x], [x, low], [x, "", low]]), shape)

    def _slice(self, scope):
        x, shape = self.pick(scope)
        starts = self.constant(scope, np.array([0], np.int64))
        ends = self.constant(scope, np.array([np.iinfo(np.int64).max], np.int64))
        axes = self.constant(scope, np.array([self.random.choice([0, 1, -1])], np.int64))
        self.emit(scope, "Slice", [x, starts, ends, axes], shape)

    def _concat(self, scope):
        x, shape = self.pick(scope)
        if shape[1] != 1:
            self._unary(scope)
            return
        y, _ = self.pick(scope, [shape])
        joined = self.emit(scope, "Concat", [x, y], (shape[0], 2), axis=1)
        scope.values.pop(joined)
        self.emit(scope, "ReduceMax", [joined, self.constant(scope, np.array([1], np.int64))], shape)

    def _reduce(self, scope):
        x, shape = self.pick(scope)
        self.emit(scope, "ReduceMean", [x, self.constant(scope, np.array([1], np.int64))], (shape[0], 1))

    def _softmax(self, scope):
        x, shape = self.pick(scope)
        self.emit(scope, "Softmax", [x], shape, axis=-1)

    def _where(self, scope):
        (a, sa), (b, sb) = self.pick(scope), self.pick(scope)
        condition = self.emit(scope, "Greater", [a, b], _broadcast(sa, sb))
        scope.values.pop(condition)
        self.emit(scope, "Where", [condition, a, b], _broadcast(sa, sb))

    # ---- nesting

    def _body(self, scope: Scope, name: str, inputs=(), outputs: int = 1, extra=()) -> tuple[onnx.GraphProto, list]:
        """A body reading the enclosing scopes; its outputs' shapes."""
        body = Scope(parent=scope)
        for input_name, shape in inputs:
            if shape in SHAPES:
                body.values[input_name] = shape
        self.depth += 1
        for _ in range(self.random.randint(1, 4)):
            self.step(body)
        self.depth -= 1
        results = []
        for _ in range(outputs):
            # Often a value of the enclosing scopes itself, through a no-op: the case that broke bodies once.
            results.append(self.pick(body) if self.random.random() < 0.6 else self.pick(scope))
        bridged = []
        for value, shape in results:
            if value not in body.values:
                value = self.emit(body, self.random.choice(["Identity", "Relu"]), [value], shape)
            bridged.append((value, shape))
        graph = helper.make_graph(
            [*extra, *body.nodes], name, [helper.make_tensor_value_info(n, t, s) for n, t, s in self.typed(inputs)],
            [*(helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []) for _ in extra),
             *(helper.make_tensor_value_info(v, TensorProto.FLOAT, self.dims(s)) for v, s in bridged)],
            body.initializers,
        )
        return graph, [s for _, s in bridged]

    def typed(self, inputs):
        for name, shape in inputs:
            if shape == "iteration":
                yield name, TensorProto.INT64, []
            elif shape == "condition":
                yield name, TensorProto.BOOL, []
            else:
                yield name, TensorProto.FLOAT, self.dims(shape)

    @staticmethod
    def dims(shape) -> list:
        return [d if isinstance(d, int) else None for d in shape]

    def _if(self, scope):
        (a, sa), (b, sb) = self.pick(scope), self.pick(scope)
        difference = self.emit(scope, "Sub", [a, b], _broadcast(sa, sb))
        flag = self.emit(scope, "ReduceMax", [difference], (), keepdims=0)
        scope.values.pop(flag)
        flag = self.emit(scope, "Cast", [flag], (), to=TensorProto.BOOL)
        scope.values.pop(flag)
        then_branch, then_shapes = self._body(scope, self.name("then"))
        else_branch, else_shapes = self._body(scope, self.name("else"))
        if then_shapes != else_shapes:
            return  # an If's branches must agree on the output's shape
        self.emit(scope, "If", [flag], then_shapes[0], then_branch=then_branch, else_branch=else_branch)

    def _loop(self, scope):
        trips = self.constant(scope, np.array(2, np.int64))
        iteration, condition = self.name("i"), self.name("cond")
        extra = [helper.make_node("Identity", [condition], ["cond_out"])]
        body, shapes = self._body(scope, self.name("loop"), [(iteration, "iteration"), (condition, "condition")],
                                  extra=extra)
        self._rename_condition(body)
        stacked = self.emit(scope, "Loop", [trips, ""], (2, *shapes[0]), body=body)
        scope.values.pop(stacked)
        self.emit(scope, "ReduceSum", [stacked, self.constant(scope, np.array([0], np.int64))], shapes[0],
                  keepdims=0)

    def _carried(self, scope):
        """A Loop carrying one value, which the body may hand on through a no-op (its own input, returned)."""
        initial, shape = self.pick(scope)
        trips = self.constant(scope, np.array(2, np.int64))
        iteration, condition, carried = self.name("i"), self.name("cond"), self.name("carried")
        body = Scope(parent=scope)
        body.values[carried] = shape
        self.depth += 1
        for _ in range(self.random.randint(0, 3)):
            self.step(body)
        self.depth -= 1
        last, _ = self.pick(body, [shape]) if self.random.random() < 0.7 else (carried, shape)
        condition_out = self.name("cond_out")
        handed_on = self.emit(body, self.random.choice(["Identity", "Relu", "Abs"]), [last], shape)
        if self.random.random() < 0.5:  # a no-op a rule removes, leaving the body's input as its output
            handed_on = self.emit(body, "Mul", [carried, self.constant(body, np.ones((1,), np.float32))], shape)
        graph = helper.make_graph(
            [helper.make_node("Identity", [condition], [condition_out]), *body.nodes], self.name("carry"),
            [helper.make_tensor_value_info(iteration, TensorProto.INT64, []),
             helper.make_tensor_value_info(condition, TensorProto.BOOL, []),
             helper.make_tensor_value_info(carried, TensorProto.FLOAT, self.dims(shape))],
            [helper.make_tensor_value_info(condition_out, TensorProto.BOOL, []),
             helper.make_tensor_value_info(handed_on, TensorProto.FLOAT, self.dims(shape))],
            body.initializers,
        )
        self.emit(scope, "Loop", [trips, "", initial], shape, body=graph)

    def _rename_condition(self, body: onnx.GraphProto) -> None:
        fresh = self.name("cond_out")
        for node in body.node:
            node.output[:] = [fresh if n == "cond_out" else n for n in node.output]
        body.output[0].name = fresh

    def _scan(self, scope):
        steps = self.constant(scope, np.zeros((2, 1), np.float32))
        element = self.name("step")
        body, shapes = self._body(scope, self.name("scan"), [(element, (1,))])
        stacked = self.emit(scope, "Scan", [steps], (2, *shapes[0]), body=body, num_scan_inputs=1)
        scope.values.pop(stacked)
        self.emit(scope, "ReduceMean", [stacked, self.constant(scope, np.array([0], np.int64))], shapes[0],
                  keepdims=0)

    def _function(self, scope):
        x, shape = self.pick(scope)
        name = f"F{len(self.functions)}"
        body = [helper.make_node("Constant", [], ["one"], value=numpy_helper.from_array(np.ones((1,), np.float32))),
                helper.make_node("Mul", ["a", "one"], ["m"]),
                helper.make_node(self.random.choice(["Relu", "Tanh", "Identity"]), ["m"], ["r"]),
                helper.make_node("Cast", ["r"], ["b"], to=TensorProto.FLOAT)]
        self.functions.append(helper.make_function("local", name, ["a"], ["b"], body,
                                                   [helper.make_opsetid("", OPSET)]))
        self.emit(scope, name, [x], shape)
        scope.nodes[-1].domain = "local"


def random_model(seed: int) -> onnx.ModelProto:
    """A valid random model (see the module docstring); the same seed gives the same model."""
    builder = Builder(seed)
    main = Scope()
    main.values["x"] = (B, 4)
    main.values["y"] = (B, 1)
    for _ in range(builder.random.randint(3, 12)):
        builder.step(main)
    outputs = list(main.values.items())[-2:]
    graph = helper.make_graph(
        main.nodes, f"fuzz{seed}",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4]),
         helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 1])],
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, ["batch" if d == B else d for d in shape])
         for name, shape in outputs],
        main.initializers,
    )
    opsets = [helper.make_opsetid("", OPSET)] + ([helper.make_opsetid("local", 1)] if builder.functions else [])
    model = helper.make_model(graph, opset_imports=opsets, functions=builder.functions)
    return model


def feeds(batch: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"x": rng.standard_normal((batch, 4)).astype(np.float32),
            "y": rng.standard_normal((batch, 1)).astype(np.float32)}
