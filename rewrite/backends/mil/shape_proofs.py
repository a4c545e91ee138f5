"""What the MIL adapter proves of shapes beyond the types coremltools states.

coremltools types each var when its op is built and not again after a
rewrite, mints a fresh symbol (`is125`) for every dim it cannot name, and
gets a few types wrong. `ShapeProofs` follows the shape arithmetic of the
program instead (engine.shape_values): the dims of a tensor from its
operands' dims, the elements of a small int tensor used as a shape, and the
run-time bounds of both, so that a fill of concat(shape(x)[0:1], [8]) is
known to have x's first dim. Everything proved is a proof about run time,
cached for the whole run: rewrites replace values by equal ones.
"""

from __future__ import annotations

import numpy as np

from rewrite.backends.mil import shapes as mil_shapes
from rewrite.backends.mil.bounds import BoundsProver
from rewrite.backends.mil.pymil import Block, Operation, Program, Var
from rewrite.backends.mil.vars import input_of, shape_of_type, vars_in
from rewrite.engine import shape_values
from rewrite.engine.shapes import IncompatibleShapes, broadcast_shapes
from rewrite.engine.shapes import add as dims_add
from rewrite.engine.shapes import multiply as dims_multiply
from rewrite.engine.shapes import subtract as dims_subtract
from rewrite.language.logic import UNKNOWN, Local, Symbol, Term


class ShapeProofs:
    """The shapes, shape values and bounds of one program's vars, proved and remembered."""

    def __init__(self, program: Program, input_symbols: set[Symbol]):
        """`input_symbols`: the symbolic dims of the inputs of every function and block,
        as good as a proof gets (see `_settled`)."""
        self.program = program
        self._input_symbols = input_symbols
        # id(var) -> (var, result); the var is kept so its id is not reused.
        self._proven_shapes: dict[int, tuple] = {}
        self._shape_values: dict[int, tuple] = {}
        self._bounds = BoundsProver(self.dims_bounds)
        # ids of vars whose stated type may not hold (see _misstated_slice);
        # None until the first shape is asked for.
        self._mistyped: set[int] | None = None
        self._dim_sources: dict | None = None
        self._input_dim_bounds: dict | None = None
        # id(var) -> (var, its symbol), and each such symbol's bounds (`_value_symbol`).
        self._value_symbols: dict[int, tuple] = {}
        self._value_symbol_bounds: dict[Local, tuple] = {}

    def dim_source(self, dim) -> tuple[Var, int] | None:
        """(function input, axis) where the symbolic dim `dim` is the input's own, the
        first such in input order; None for a literal, a symbol no input has, or one
        the inputs of several functions have (which one a rule means is not known)."""
        sources = self._dim_sources
        if sources is None:
            sources, seen_in = {}, {}
            for function in self.program.functions.values():
                for var in function.inputs.values():
                    for axis, d in enumerate(shape_of_type(var.sym_type) or ()):
                        if isinstance(d, Term):
                            sources.setdefault(d, (var, axis))
                            seen_in.setdefault(d, set()).add(id(function))
            sources = {d: source for d, source in sources.items() if len(seen_in[d]) == 1}
            self._dim_sources = sources
        return sources.get(dim) if isinstance(dim, Term) else None

    def shape(self, value: Var):
        """`value`'s dims as coremltools states them, but None where that type is known
        not to hold (`_find_mistyped`) and widened where a select's cond broadcasts."""
        mistyped = self._mistyped if self._mistyped is not None else self._find_mistyped()
        if mistyped and id(value) in mistyped:
            return None
        inferred = shape_of_type(value.sym_type)
        op = value.op
        if op is not None and op.op_type == "select" and inferred is not None:
            # coremltools types a select by a and b alone, but at run time
            # cond broadcasts too: where it widens the type, it is the shape.
            cond = shape_of_type(input_of(op, "cond").sym_type)
            if cond is None:
                return None
            try:
                widened = broadcast_shapes(cond, inferred)
            except IncompatibleShapes:
                return None
            if widened != inferred:
                return widened
        return inferred

    def proven_shape(self, value: Var):
        """`shape`, with the dims the program's shape arithmetic proves put in for the symbols
        coremltools made up (`Adapter.proven_shape`)."""
        inferred = self.shape(value)
        op = value.op
        if op is None or op.op_type not in mil_shapes.SHAPE_FOLLOWS:
            return inferred
        if inferred is not None and self._settled(inferred):
            return inferred
        cached = self._proven_shapes.get(id(value))
        if cached is not None and cached[0] is value:
            return cached[1]
        return self._prove_shapes(value)

    def _settled(self, dims) -> bool:
        # Literals and the inputs' own symbols are as good as a proof gets;
        # only a symbol coremltools made up along the way is worth following.
        return all(isinstance(d, int) or d in self._input_symbols for d in dims)

    def _prove_shapes(self, root: Var):
        # Producers first, with an explicit stack: a chain of a million
        # elementwise ops must not recurse a million deep.
        stack = [root]
        while stack:
            value = stack[-1]
            key = id(value)
            cached = self._proven_shapes.get(key)
            if cached is not None and cached[0] is value:
                stack.pop()
                continue
            pending = [v for v in mil_shapes.shape_operands(value.op) if self._needs_proof(v)]
            if pending:
                stack.extend(pending)
                continue
            inferred = self.shape(value)
            proven = shape_values.refined(inferred, self._proven_shape(value.op, inferred))
            self._proven_shapes[key] = (value, proven)
            stack.pop()
        return self._proven_shapes[id(root)][1]

    def _needs_proof(self, value: Var) -> bool:
        op = value.op
        if op is None or op.op_type not in mil_shapes.SHAPE_FOLLOWS:
            return False
        inferred = self.shape(value)
        if inferred is not None and self._settled(inferred):
            return False
        cached = self._proven_shapes.get(id(value))
        return cached is None or cached[0] is not value

    # ---- values used as shapes
    #
    # coremltools infers a fresh symbol for a dim read from a runtime shape
    # once a `cast` drops its symbolic value, which converters put in every
    # shape computation. Following the shape arithmetic (engine.shape_values)
    # proves those dims: a fill of concat(shape(x)[0:1], [8]) has x's first dim.

    def _proven_shape(self, op: Operation, inferred):
        # Types are not re-inferred after every rewrite (coremltools' own
        # passes skip it too), so a dim may be a stale fresh symbol; the
        # operands' shapes say what it is.
        kind = op.op_type
        if kind in mil_shapes.UNARY_ELEMENTWISE:
            return self.proven_shape(op.inputs["x"])
        if kind in mil_shapes.BINARY_BROADCASTING or kind == "select":
            operands = mil_shapes.shape_operands(op)
            try:
                return broadcast_shapes(*(self.proven_shape(v) for v in operands))
            except IncompatibleShapes:
                return None
        if kind == "fill_like":
            return self.proven_shape(op.inputs["ref_tensor"])
        if kind in mil_shapes.LAYOUT:
            return self._layout_shape(op)
        if kind == "matmul":
            return self._matmul_shape(op)
        if kind in mil_shapes.SAME_SHAPE:
            return self.proven_shape(op.inputs["x"])
        if kind in mil_shapes.INDICES_SHAPE:
            return self.proven_shape(op.inputs["indices"])
        if kind in mil_shapes.FRONTEND_SHAPES:
            return self._frontend_shape(op, inferred)
        rank = None if inferred is None else len(inferred)
        shape = self.shape_value(op.inputs["shape"])
        if kind == "reshape" and shape is not None and sum(1 for d in shape if d == -1) == 1:
            return mil_shapes.reshaped(self.proven_shape(op.inputs["x"]), shape)
        return shape_values.as_dims(shape, rank)

    # Ops coremltools' torch frontend puts between a flexible input and the
    # values whose shapes the rules ask about (a linear layer, an embedding
    # lookup, a slice of a buffer by the sequence length, ...): each gets a
    # fresh symbol from coremltools' type inference where its operands' dims
    # say which dim it is.

    def _frontend_shape(self, op: Operation, inferred):
        kind = op.op_type
        inputs = op.inputs
        if kind == "linear":
            x = self.proven_shape(inputs["x"])
            if x is None or inferred is None or not inferred or not isinstance(inferred[-1], int):
                return None
            return (*x[:-1], inferred[-1])
        if kind == "scaled_dot_product_attention":
            query, value = self.proven_shape(inputs["query"]), self.proven_shape(inputs["value"])
            return None if query is None or value is None or not value else (*query[:-1], value[-1])
        if kind == "split":
            x, axis = self.proven_shape(inputs["x"]), inputs["axis"].val
            if x is None or inferred is None or axis is None or len(x) != len(inferred):
                return None
            axis = int(axis) % len(x)
            if not isinstance(inferred[axis], int):
                return None  # the split axis' own size is the split's business
            return tuple(inferred[axis] if position == axis else d for position, d in enumerate(x))
        if kind == "gather":
            x, indices = self.proven_shape(inputs["x"]), self.proven_shape(inputs["indices"])
            axis = inputs["axis"].val
            batch_dims = inputs.get("batch_dims")
            if x is None or indices is None or axis is None or (batch_dims is not None and batch_dims.val):
                return None
            axis = int(axis) % len(x) if x else 0
            return (*x[:axis], *indices, *x[axis + 1:])
        if kind == "concat":
            # Interleaving reorders the elements along the axis, not their count:
            # the shape is the same either way.
            parts = [self.proven_shape(v) for v in inputs["values"]]
            if any(part is None for part in parts) or not parts or len({len(part) for part in parts}) != 1:
                return None
            rank = len(parts[0])
            if rank == 0 or inputs["axis"].val is None:
                return None
            axis = int(inputs["axis"].val) % rank
            dims = []
            for position in range(rank):
                if position == axis:
                    total = 0
                    for part in parts:
                        total = dims_add(total, part[position])
                    dims.append(total)
                else:
                    # Every part has the same size there at run time: take the
                    # best-known spelling of it (a literal, an input's symbol).
                    candidates = [part[position] for part in parts]
                    dims.append(min(candidates, key=self._dim_rank))
            return tuple(dims)
        if kind == "stack":
            # The values have one shape at run time (stack requires it), with
            # the new axis of their count put in: take the best-known spelling.
            parts = [self.proven_shape(v) for v in inputs["values"]]
            if not parts or any(part is None for part in parts) or len({len(part) for part in parts}) != 1:
                return None
            axis = inputs["axis"].val
            if axis is None:
                return None
            dims = [min((part[position] for part in parts), key=self._dim_rank) for position in range(len(parts[0]))]
            axis = int(axis) % (len(dims) + 1)
            return (*dims[:axis], len(parts), *dims[axis:])
        if kind == "gather_nd":
            # batch_dims 0: each index vector (the indices' last axis) picks a
            # slice of x's remaining axes, in the indices' leading shape.
            batch_dims = inputs.get("batch_dims")
            x, indices = self.proven_shape(inputs["x"]), self.proven_shape(inputs["indices"])
            if (batch_dims is not None and batch_dims.val) or x is None or not indices:
                return None
            depth = indices[-1]
            if not isinstance(depth, int) or depth > len(x):
                return None
            return (*indices[:-1], *x[depth:])
        if kind == "range_1d":
            start, end, step = (self.shape_value(inputs[name]) for name in ("start", "end", "step"))
            if start is None or end is None or step is None or len(start) != 1 or len(end) != 1:
                return None
            if start == [0] and step == [1] and end[0] is not UNKNOWN:
                if isinstance(end[0], int):
                    return (max(end[0], 0),)
                return (end[0],) if mil_shapes.never_negative(end[0]) else None
            if all(isinstance(v, int) for v in (start[0], end[0], step[0])) and step[0]:
                return (len(range(start[0], end[0], step[0])),)
            return None
        if kind == "slice_by_index":
            return self._sliced_shape(op)
        return None

    def _dim_rank(self, dim) -> int:
        """How well a dim is known: a literal, an input's symbol, another symbol, unknown."""
        if isinstance(dim, int):
            return 0
        if dim in self._input_symbols:
            return 1
        return 2 if dim is not UNKNOWN else 3

    def dim_bounds(self, dim) -> tuple[int, int | None]:
        """(lowest, highest or None) a dim takes at run time: a literal's value, an input
        symbol's RangeDim bounds (the model accepts no other size), else (0, None)."""
        if isinstance(dim, int):
            return dim, dim
        bounds = self._input_dim_bounds
        if bounds is None:
            bounds = {}
            for function in self.program.functions.values():
                for input_type in getattr(function, "input_types", None) or ():
                    for d in getattr(getattr(input_type, "shape", None), "shape", None) or ():
                        symbol = getattr(d, "symbol", None)
                        if symbol is None or not hasattr(d, "lower_bound"):
                            continue
                        lower = max(int(d.lower_bound), 0)
                        upper = int(d.upper_bound) if int(d.upper_bound) >= 0 else None
                        key = Symbol(str(symbol))
                        if key in bounds:  # one symbol in two functions: what both allow
                            old_lower, old_upper = bounds[key]
                            lower = min(lower, old_lower)
                            upper = None if upper is None or old_upper is None else max(upper, old_upper)
                        bounds[key] = (lower, upper)
            self._input_dim_bounds = bounds
        if dim not in bounds and type(dim) is Local:
            return self._value_symbol_bounds.get(dim, (0, None))
        return bounds.get(dim, (0, None))

    def dims_bounds(self, value: Var) -> list | None:
        """(lowest, highest or None) of each of `value`'s dims; None if its rank is unknown."""
        dims = self.proven_shape(value)
        if dims is None or any(d is UNKNOWN for d in dims):
            return None
        return [self.dim_bounds(d) for d in dims]

    def _at_most(self, small, large) -> bool:
        """small <= large at run time, provably."""
        if small == large and small is not UNKNOWN:
            return True
        if any(dims_add(small, k) == large for k in (1, 2)):
            return True  # an expression made by adding to `small` (a length and one more)
        upper = self.dim_bounds(small)[1]
        return upper is not None and upper <= self.dim_bounds(large)[0]

    # ---- types coremltools states that do not hold
    #
    # coremltools types a slice_by_index whose begin or end is a runtime value
    # as keeping a size-1 axis whole, whatever it takes of it: x[1:] of a
    # (1, n) tensor is stated (1, n) though it is (0, n) at run time, and every
    # type inferred from it downstream is as wrong. Such a var, and everything
    # computed from it, has no shape here (rank unknown): no rule and no guard
    # proof may lean on it. Programs that converters emit slice from the start
    # (x[:n]), which is typed right, so the set is almost always empty.

    def _find_mistyped(self) -> set[int]:
        self._mistyped = found = set()
        for function in self.program.functions.values():
            pending = [iter(function.operations)]
            while pending:  # nested blocks in order, without recursion
                op = next(pending[-1], None)
                if op is None:
                    pending.pop()
                    continue
                if self._taints(op) or (op.op_type == "slice_by_index" and self._misstated_slice(op)):
                    found.update(id(v) for v in op.outputs)
                if op.blocks:
                    pending.extend(iter(b.operations) for b in reversed(op.blocks))
        if found:  # a control-flow op whose blocks computed from one: its outputs too
            for function in self.program.functions.values():
                self._taint_control_flow(function)
        return found

    def _taints(self, op: Operation) -> bool:
        found = self._mistyped
        return bool(found) and any(id(v) in found for v in vars_in(op.inputs.values()))

    def _taint_control_flow(self, block: Block) -> bool:
        found, tainted = self._mistyped, False
        for op in block.operations:
            inner = any(self._taint_control_flow(b) for b in op.blocks)
            if inner or any(id(v) in found for b in op.blocks for v in b.outputs):
                found.update(id(v) for v in op.outputs)
            tainted = tainted or any(id(v) in found for v in op.outputs)
        return tainted

    def _misstated_slice(self, op: Operation) -> bool:
        inputs = op.inputs
        if inputs["begin"].val is not None and inputs["end"].val is not None:
            return False  # coremltools computed it from the values
        source = shape_of_type(inputs["x"].sym_type)
        stated = shape_of_type(op.outputs[0].sym_type)
        if source is None or stated is None or 1 not in source:
            return False
        ours = self._sliced_shape(op)
        if ours is None or len(ours) != len(stated):
            return True
        return any(isinstance(s, int) and o != s for s, o in zip(stated, ours))

    def _sliced_shape(self, op: Operation):
        """slice_by_index's output dims, from x's and the values of begin and end (runtime ones too)."""
        inputs = op.inputs
        source = self.proven_shape(inputs["x"])
        if source is None:
            return None
        rank = len(source)

        def values(name, default):
            var = inputs.get(name)
            if var is None:
                return [default] * rank
            found = self.shape_value(var) if var.val is None else np.asarray(var.val).reshape(-1).tolist()
            return found if found is not None and len(found) == rank else None

        begin, end, stride = values("begin", 0), values("end", 0), values("stride", 1)
        begin_mask, end_mask, squeeze_mask = values("begin_mask", False), values("end_mask", False), \
            values("squeeze_mask", False)
        if any(v is None for v in (begin, end, stride, begin_mask, end_mask, squeeze_mask)):
            return None
        dims = []
        for d, b, e, step, whole_start, whole_end, squeeze in zip(
            source, begin, end, stride, begin_mask, end_mask, squeeze_mask
        ):
            if squeeze:
                continue
            start = 0 if whole_start else b
            stop = d if whole_end else e
            if all(isinstance(v, int) for v in (d, start, stop, step)) and step:
                dims.append(len(range(d)[slice(start, stop, step)]))
            elif step != 1 or start is UNKNOWN or stop is UNKNOWN:
                dims.append(UNKNOWN)
            elif start == 0 and stop == d:
                dims.append(d)
            elif start == 0 and mil_shapes.never_negative(stop) and self._at_most(stop, d):
                dims.append(stop)  # a prefix no longer than the axis
            elif start == 0 and d == 1 and self.dim_bounds(stop)[0] >= 1:
                dims.append(1)  # x[:n] of one element, n >= 1
            elif whole_end and isinstance(start, int) and start >= 0 and self.dim_bounds(d)[0] >= start:
                dims.append(dims_subtract(d, start))
            else:
                dims.append(UNKNOWN)
        return tuple(dims)

    def _matmul_shape(self, op: Operation):
        """A matmul's output dims: its operands' batch axes broadcast, then rows of x by columns of y."""
        x, y = self.proven_shape(op.inputs["x"]), self.proven_shape(op.inputs["y"])
        if x is None or y is None or len(x) < 2 or len(y) < 2:
            return None  # a vector operand: rare enough to leave to coremltools' own type
        transpose_x = op.inputs.get("transpose_x")
        transpose_y = op.inputs.get("transpose_y")
        rows = x[-1] if transpose_x is not None and transpose_x.val else x[-2]
        columns = y[-2] if transpose_y is not None and transpose_y.val else y[-1]
        try:
            return (*broadcast_shapes(x[:-2], y[:-2]), rows, columns)
        except IncompatibleShapes:
            return None

    def _layout_shape(self, op: Operation):
        """The output dims of a reduction, expand_dims, squeeze, tile or transpose from x's."""
        inputs = op.inputs
        source = self.proven_shape(inputs["x"])
        if source is None:
            return None
        kind = op.op_type
        rank = len(source)
        if kind == "tile":
            reps = inputs["reps"].val
            reps = self.shape_value(inputs["reps"]) if reps is None else [int(r) for r in reps]
            if reps is None or len(reps) != rank or any(r is UNKNOWN for r in reps):
                return None
            return tuple(dims_multiply(d, r) for d, r in zip(source, reps))
        if kind == "transpose":
            perm = inputs["perm"].val
            return None if perm is None or len(perm) != rank else tuple(source[int(p)] for p in perm)
        axes_var = inputs.get("axes")
        axes = None if axes_var is None else axes_var.val
        if kind == "expand_dims":
            if axes is None:
                return None
            out_rank = rank + len(axes)
            inserted = {int(a) % out_rank for a in axes}
            if len(inserted) != len(axes):
                return None  # an axis given twice: not followed
            rest = iter(source)
            return tuple(1 if position in inserted else next(rest) for position in range(out_rank))
        if axes is None:  # a reduction or squeeze over every axis (squeeze: every size-1 axis)
            if kind == "squeeze":
                return None
            axes = range(rank)
        positions = {int(a) % rank for a in axes} if rank else set()
        if kind == "squeeze" or not (inputs.get("keep_dims") is not None and inputs["keep_dims"].val):
            return tuple(d for position, d in enumerate(source) if position not in positions)
        return tuple(1 if position in positions else d for position, d in enumerate(source))

    def shape_value(self, value: Var) -> list | None:
        """The elements of a rank-0 or rank-1 int tensor as dims, or None."""
        key = id(value)
        cached = self._shape_values.get(key)
        if cached is not None and cached[0] is value:
            return cached[1]
        self._shape_values[key] = (value, None)  # a cycle, if any, stays unknown
        result = self._compute_shape_value(value)
        self._shape_values[key] = (value, result)
        return result

    def _compute_shape_value(self, value: Var) -> list | None:
        if value.dtype not in mil_shapes.SHAPE_DTYPES or value.rank > 1:
            return None
        if value.val is not None:
            return [int(v) for v in np.asarray(value.val).reshape(-1)]
        op = value.op
        if op is None:
            return None
        kind = op.op_type
        inputs = op.inputs
        if kind == "shape":
            return shape_values.shape_of(self.proven_shape(inputs["x"]))
        if kind in ("cast", "identity", "reshape", "expand_dims", "squeeze"):
            # A rank-0/1 int tensor keeps its elements in order through these.
            if kind == "cast" and inputs["dtype"].val not in mil_shapes.SHAPE_DTYPE_NAMES:
                return None
            return self.shape_value(inputs["x"])
        if kind == "concat":
            if inputs["axis"].val not in (0, -1):
                return None
            return shape_values.concatenated([self.shape_value(v) for v in inputs["values"]])
        if kind == "gather":
            indices = inputs["indices"].val
            if indices is None or inputs["axis"].val not in (0, -1):
                return None
            return shape_values.gathered(self.shape_value(inputs["x"]), np.asarray(indices).reshape(-1).tolist())
        if kind == "slice_by_index":
            return self._sliced(op)
        if kind in mil_shapes.SHAPE_ARITHMETIC:
            left, right = self.shape_value(inputs["x"]), self.shape_value(inputs["y"])
            if kind == "sub" and left is not None and right is not None and len(left) == len(right):
                # a dim less itself is 0 (HF's past length: the sequence read twice, subtracted)
                return [0 if a == b and a is not UNKNOWN else dims_subtract(a, b) for a, b in zip(left, right)]
            return shape_values.elementwise(mil_shapes.SHAPE_ARITHMETIC[kind], left, right)
        if kind == "real_div":
            return mil_shapes.divided(self.shape_value(inputs["x"]), self.shape_value(inputs["y"]))
        if kind == "select":
            # torch's expand(-1): where(equal(size, -1), shape(x), size)
            return shape_values.chosen(
                self._shape_condition(inputs["cond"]), self.shape_value(inputs["a"]), self.shape_value(inputs["b"])
            )
        return self._value_symbol(value)

    def _value_symbol(self, value: Var) -> list | None:
        """A scalar int that shape arithmetic does not follow (a minimum, say), proved
        non-negative, as a symbol of its own: [@n]. It stands for the value at run time,
        as a size symbol stands for a size, so that a range to n and a slice to n are
        proved to have one length; its bounds are the value's (`_dim_bounds`)."""
        if value.rank != 0 or value.dtype not in mil_shapes.SHAPE_DTYPES:
            return None
        low, high = self._bounds.bounds(value)
        if low is None or low < 0:
            return None
        symbols = self._value_symbols
        found = symbols.get(id(value))
        if found is None or found[0] is not value:
            # Named by a count of every symbol made, so that no two values share one
            # (an id reused by a new value gets a new name).
            bounds = self._value_symbol_bounds
            found = symbols[id(value)] = (value, Local("", str(len(bounds))))
            bounds[found[1]] = (low, high)
        return [found[1]]

    def _shape_condition(self, value: Var) -> list | None:
        """A bool vector compared out of shape values (equal / not_equal), elementwise."""
        if value.val is not None:
            return [bool(v) for v in np.asarray(value.val).reshape(-1)]
        op = value.op
        if op is None or op.op_type not in ("equal", "not_equal"):
            return None
        found = shape_values.equal(self.shape_value(op.inputs["x"]), self.shape_value(op.inputs["y"]))
        if found is None or op.op_type == "equal":
            return found
        return [UNKNOWN if v is UNKNOWN else not v for v in found]

    def _sliced(self, op: Operation) -> list | None:
        inputs = op.inputs
        source = self.shape_value(inputs["x"])
        if source is None or inputs["x"].rank != 1:
            return None

        unknown = object()

        def first(name, default):
            var = inputs.get(name)
            if var is None:
                return default
            return unknown if var.val is None else np.asarray(var.val).reshape(-1)[0].item()

        begin, end, stride = first("begin", 0), first("end", None), first("stride", 1)
        begin_mask, end_mask = first("begin_mask", False), first("end_mask", False)
        if unknown in (begin, end, stride, begin_mask, end_mask) or not stride:
            return None
        if first("squeeze_mask", False):
            # one element, at begin (end is not read): x[begin]
            if begin is unknown or begin_mask or not -len(source) <= begin < len(source):
                return None
            return [source[begin]]
        begin = None if begin_mask else begin
        end = None if end_mask else end
        return shape_values.sliced(source, begin, end, stride)


    def value_bounds(self, value: Var) -> tuple[int | None, int | None]:
        """The least and greatest element an integer or bool value can hold (see `bounds`)."""
        return self._bounds.bounds(value)

    def note_built(self, operands, results) -> None:
        """An op was built from `operands` with outputs `results`: computed from a var
        whose stated type does not hold, they inherit that."""
        if self._mistyped and any(id(v) in self._mistyped for v in vars_in(operands)):
            self._mistyped.update(id(v) for v in results)
