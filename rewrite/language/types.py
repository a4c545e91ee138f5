"""The types of condition expressions, and the signatures of functions.

Conditions are a closed language: every function a rule may call is either
listed in `BUILTINS` or registered by an embedder (`rewrite.predicates`).
The checker uses these signatures; the engine implements the builtins.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Type(enum.Enum):
    BOOL = "bool"
    NUMBER = "number"  # an int, a float, or a dim (possibly symbolic or unknown)
    LIST = "list"
    VALUE = "value"  # a value of the graph
    STRING = "string"
    ANY = "any"

    def accepts(self, other: Type) -> bool:
        return self is Type.ANY or other is Type.ANY or self is other

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class Parameter:
    name: str
    type: Type
    keyword_only: bool = False
    optional: bool = False


@dataclass(frozen=True)
class Signature:
    """A function's parameters, its result type, and a one-line doc."""

    name: str
    parameters: tuple[Parameter, ...]
    result: Type
    doc: str = ""

    @property
    def positional(self) -> tuple[Parameter, ...]:
        return tuple(p for p in self.parameters if not p.keyword_only)

    @property
    def keywords(self) -> dict[str, Parameter]:
        return {p.name: p for p in self.parameters if p.keyword_only}


def _signature(name: str, parameters: str, result: Type, doc: str) -> Signature:
    """`parameters` reads like "value, axis:number, *of:value, *?rel:number"
    (`*` keyword-only, `?` optional)."""
    parsed = []
    for part in filter(None, (p.strip() for p in parameters.split(","))):
        keyword_only = part.startswith("*")
        part = part.lstrip("*")
        optional = part.startswith("?")
        part = part.lstrip("?")
        pname, _, ptype = part.partition(":")
        parsed.append(Parameter(pname, Type(ptype or pname), keyword_only, optional))
    return Signature(name, tuple(parsed), result, doc)


BUILTINS: dict[str, Signature] = {
    s.name: s
    for s in [
        _signature("rank", "value", Type.NUMBER, "The rank of a value; unknown if its rank is."),
        _signature("dim", "value, axis:number", Type.NUMBER,
                   "The dim of a value at an axis (negative axes count from the end)."),
        _signature("shape", "value", Type.LIST, "The dims of a value."),
        _signature("axes", "value", Type.LIST, "[0, 1, ..., rank-1] of a value."),
        _signature("aligned_dim", "value, axis:number, *of:value", Type.NUMBER,
                   "The dim of a value at `axis` of `of`, both right-aligned as numpy "
                   "broadcasting aligns them; 1 where the value has no such axis."),
        _signature("is_const", "value", Type.BOOL, "The value is a compile-time constant."),
        _signature("absent", "value", Type.BOOL,
                   "The optional operand bound by `name=%v?` is not there."),
        _signature("const", "value", Type.ANY,
                   "The value's constant, as a number or a (nested) list."),
        _signature("is_symbolic", "dim:number", Type.BOOL, "The dim is a symbol."),
        _signature("is_known", "dim:number", Type.BOOL, "The dim is a literal int."),
        _signature("dtype", "value", Type.STRING, 'The dtype name, such as "fp32".'),
        _signature("use_count", "value", Type.NUMBER,
                   "How many distinct ops use the value (block outputs not counted)."),
        _signature("one_use", "value", Type.BOOL,
                   "Exactly one op uses the value, and it is no block output."),
        _signature("block_output", "value", Type.BOOL,
                   "The value is an output of a block (a function output included)."),
        _signature("is_input", "value", Type.BOOL,
                   "No op makes the value: an input of a function or block (in ONNX, an initializer too)."),
        _signature("same_block", "value, other:value", Type.BOOL,
                   "The two values are defined in the same block."),
        _signature("broadcasts", "value", Type.BOOL,
                   "The op producing the value broadcasts all its operands numpy's way, at the "
                   "version the model's opset gives it; unknown if the backend cannot tell."),
        _signature("op_type", "value", Type.STRING,
                   "The type of the op producing the value; unknown for inputs."),
        _signature("attribute", "value, name:string, *?default:any", Type.ANY,
                   "An attribute of the op producing the value (MIL: a constant operand); where the "
                   "op does not set it, the default its schema gives it at the model's opset (ONNX), "
                   "else `default`, else unknown."),
        _signature("len", "items:any", Type.NUMBER,
                   "The length of a list, or of the operands a rest operand `%v...` bound."),
        _signature("range", "stop:number", Type.LIST, "[0, 1, ..., stop-1]; unknown past 2**20 elements."),
        _signature("contains", "items:any, item:any", Type.BOOL, "The list has the item."),
        _signature("gather", "items:list, indices:list", Type.LIST,
                   "[items[i] for i in indices]; e.g. two perms composed."),
        _signature("normalized_axes", "axes:any, rank:number", Type.LIST,
                   "The axes as sorted, distinct, non-negative positions in a value of `rank` axes."),
        _signature("represents", "wide:string, narrow:string", Type.BOOL,
                   "Every value of dtype `narrow` is exactly a value of dtype `wide` "
                   "(fp16 in fp32, int32 in fp64, bool in anything, ...)."),
        _signature("zero_of", "dtype:string", Type.ANY,
                   "A zero of that dtype (false for bool), typed, for building constants."),
        _signature("lowest", "dtype:string", Type.NUMBER,
                   "The lowest value of a dtype: -inf for floats, the minimum for ints."),
        _signature("max_finite", "dtype:string", Type.NUMBER,
                   "The largest finite value of a dtype (65504 for fp16), to guard folded constants "
                   "against overflow."),
        _signature("lowest_finite", "dtype:string", Type.NUMBER,
                   "The most negative finite value of a dtype (-65504 for fp16; the minimum for ints)."),
        _signature("max_of", "items:any", Type.NUMBER, "The largest element of a (nested) list or number."),
        _signature("max_abs", "items:any", Type.NUMBER,
                   "The largest absolute value among the elements of a value's constant (read as one "
                   "array, however large), a (nested) list or a number; unknown with a NaN."),
        _signature("is_nan", "items:any", Type.BOOL, "The number, or every element of the list, is NaN."),
        _signature("is_inf", "items:any", Type.BOOL,
                   "The number, or every element of the list, is +inf or -inf."),
        _signature("is_finite", "items:any", Type.BOOL,
                   "The number, or every element of the list, is neither NaN nor infinite."),
        _signature("close", "x:number, y:number, *?abs:number, *?rel:number, *?ulps:number, *?dtype:string",
                   Type.BOOL,
                   "|x - y| is within the largest tolerance given: `abs`, `rel` (times |y|), or "
                   "`ulps` units in the last place of y in `dtype`. NaN is close to nothing."),
        _signature("as_dtype", "items:any, dtype:string", Type.ANY,
                   "A number or list as a typed constant of that dtype, for building ops "
                   "whose operands must match another value's dtype."),
        _signature("uniform", "value", Type.NUMBER,
                   "The one number every element of the value holds: a constant whose elements "
                   "are all equal, or a fill (MIL `fill`, ONNX `ConstantOfShape`); unknown otherwise."),
        _signature("unscaled", "value", Type.VALUE,
                   "The value below a chain of constant scalings (`mul`/`real_div` by a constant "
                   "scalar) ending at this value; each step below the top has no other use."),
        _signature("scale_of", "value", Type.NUMBER,
                   "The product of the factors of that chain: value == scale_of(value) * unscaled(value)."),
        _signature("internal", "value", Type.BOOL,
                   "Every use of the value is by an op the rule has bound to a name (the anchor or a "
                   "matched producer), and it is no block output: the rewrite leaves it dead."),
        _signature("available", "op_type:string", Type.BOOL,
                   "The program's opset has the op (MIL: the deployment target of every function); "
                   "for rules that build an op newer than some targets."),
        _signature("lower_bound", "value", Type.NUMBER,
                   "The least number any element of an integer or bool value can hold, as its "
                   "producers prove it (a constant's minimum; a range from a start; a slice, gather "
                   "or reshape of such; sums, ...); unknown if nothing proves one, and for floats."),
        _signature("upper_bound", "value", Type.NUMBER,
                   "The greatest number any element of an integer or bool value can hold, proved as "
                   "for lower_bound; unknown otherwise."),
        _signature("elements", "value", Type.LIST,
                   "The elements of an integer value, flattened, as the backend proves them for run "
                   "time: a constant's, or, where the value is computed from shapes (a `shape`, "
                   "sliced, gathered, concatenated, added), numbers and symbolic dims; unknown otherwise."),
        _signature("input_of_dim", "dim:number", Type.VALUE,
                   "The function input that has the symbolic dim on one of its axes (the first, in "
                   "input order); unknown for a literal or a symbol no input has. With axis_of_dim, "
                   "where to read a runtime size from: gather(shape(input_of_dim(d)), axis_of_dim(d))."),
        _signature("axis_of_dim", "dim:number", Type.NUMBER,
                   "The axis of input_of_dim(dim) that has the dim."),
        _signature("every_row_any", "items:any", Type.BOOL,
                   "Every row (along the last axis) of a nested list holds a true (non-zero) element."),
        _signature("abs", "x:number", Type.NUMBER, "The absolute value."),
        _signature("sqrt", "x:number", Type.NUMBER, "The square root of a non-negative number."),
        _signature("mod", "x:number, y:number", Type.NUMBER, "x modulo y."),
    ]
}

# Bare names a rule may use in an expression, with their types.
NAMED_CONSTANTS: dict[str, tuple[Type, object]] = {
    **{
        name: (Type.STRING, name)
        for name in (
            "bool", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64",
            "fp16", "fp32", "fp64", "bf16",
        )
    },
    "inf": (Type.NUMBER, float("inf")),
    "nan": (Type.NUMBER, float("nan")),
}


# Builtins that read nothing of the graph: what an example operand, evaluated
# before there is a graph, may call. `available` asks the program's opset.
GRAPH_FREE_BUILTINS: frozenset[str] = frozenset(
    name for name, signature in BUILTINS.items()
    if name != "available" and all(p.type is not Type.VALUE for p in signature.parameters)
)
