"""Symbolic dim arithmetic for ONNX shape inference: dims as polynomials.

Solving Reshape's -1, Range's length and a Slice's extent needs a little
algebra on symbolic dims: products that cancel, differences that are
provably not negative, and the min(k, x) a slice of a buffer gives.
"""

from __future__ import annotations

import functools
import re

from rewrite.engine import shapes as dims
from rewrite.engine.logic import UNKNOWN, Symbol, is_literal

# A dim is read as a polynomial over atoms (integer
# coefficients) when its name is one `rewrite.engine.shapes` builds, such as
# "(batch*seq)" or "(past+seq)", and whose every leaf is a plain name or an
# integer; any other symbol is one atom, named by itself. Nothing is assumed
# about an atom but its name: two atoms are one number only when the names
# are equal. An atom whose name does not start with "(" is a size (the dim
# of some tensor, or an expression of sizes that is one), so never negative.

_MAX_TERMS = 16
_OPERATOR_CHARACTERS = frozenset("()+-*,")


def polynomial(dim) -> dict | None:
    """`dim` as {monomial (sorted atom names): coefficient}; None for UNKNOWN or a non-integer."""
    if type(dim) is int or (is_literal(dim) and float(dim).is_integer()):
        return {(): int(dim)} if dim else {}
    if type(dim) is not Symbol:
        return None
    return _poly_of_name(dim.name)


@functools.lru_cache(maxsize=4096)
def _poly_of_name(name: str) -> dict | None:
    if name.startswith("("):
        parsed = _parse_expression(name)
        if parsed is not None:
            return parsed
    return {(name,): 1}


def _parse_expression(name: str) -> dict | None:
    """"(L op R)" as built by `dims.add`/`subtract`/`multiply`; None if it is not one."""
    if not (name.startswith("(") and name.endswith(")")):
        return None
    inner, depth = name[1:-1], 0
    for position, character in enumerate(inner):
        if character == "(":
            depth += 1
        elif character == ")":
            depth -= 1
            if depth < 0:
                return None
        elif depth == 0 and character in "+-*" and position > 0:
            left, right = _parse_operand(inner[:position]), _parse_operand(inner[position + 1 :])
            if left is None or right is None:
                return None
            if character == "+":
                return _poly_add(left, right)
            if character == "-":
                return _poly_add(left, _poly_scale(right, -1))
            return _poly_multiply(left, right)
    return None


def _parse_operand(text: str) -> dict | None:
    if text.startswith("("):
        return _parse_expression(text)
    try:
        number = int(text)
    except ValueError:
        pass
    else:
        return {(): number} if number else {}
    if _CALL.fullmatch(text) and _balanced(text):
        return {(text,): 1}  # min(a,b), broadcast(a,b): one atom, its operators all inside
    if not text or _OPERATOR_CHARACTERS.intersection(text):
        return None  # a leaf that could be read more than one way
    return {(text,): 1}


_CALL = re.compile(r"[A-Za-z_]\w*\(.*\)")


def _balanced(text: str) -> bool:
    """Parentheses that open at the first one and close only at the end."""
    depth = 0
    for position, character in enumerate(text):
        if character == "(":
            depth += 1
        elif character == ")":
            depth -= 1
            if depth < 0 or (depth == 0 and position != len(text) - 1):
                return False
    return depth == 0


def _arguments(name: str) -> list[str] | None:
    """The arguments of a "min(a,b)" atom; None for any other name."""
    if not (name.startswith("min(") and _balanced(name)):
        return None
    parts, depth, start = [], 0, 4
    for position in range(4, len(name) - 1):
        character = name[position]
        if character == "(":
            depth += 1
        elif character == ")":
            depth -= 1
        elif character == "," and depth == 0:
            parts.append(name[start:position])
            start = position + 1
    parts.append(name[start:-1])
    return parts


def _poly_add(left: dict, right: dict) -> dict | None:
    result = dict(left)
    for monomial, coefficient in right.items():
        total = result.get(monomial, 0) + coefficient
        if total:
            result[monomial] = total
        else:
            result.pop(monomial, None)
    return result if len(result) <= _MAX_TERMS else None


def _poly_scale(poly: dict, factor: int) -> dict:
    return {monomial: coefficient * factor for monomial, coefficient in poly.items()} if factor else {}


def _poly_multiply(left: dict | None, right: dict | None) -> dict | None:
    if left is None or right is None or len(left) * len(right) > _MAX_TERMS * _MAX_TERMS:
        return None
    result: dict | None = {}
    for a, x in left.items():
        for b, y in right.items():
            result = _poly_add(result, {tuple(sorted(a + b)): x * y})
            if result is None:
                return None
    return result


def _poly_product(dims_list) -> dict | None:
    result: dict | None = {(): 1}
    for dim in dims_list:
        result = _poly_multiply(result, polynomial(dim))
        if result is None:
            return None
    return result


def _poly_quotient(total: dict | None, divisor: dict | None) -> dict | None:
    """total / divisor when the division is exact term by term; None otherwise."""
    if total is None or divisor is None or not divisor:
        return None
    if total == divisor:
        return {(): 1}
    if len(divisor) != 1:
        return None
    ((monomial, coefficient),) = divisor.items()
    result = {}
    for term, value in total.items():
        if value % coefficient:
            return None
        remaining = list(term)
        for atom in monomial:
            if atom not in remaining:
                return None
            remaining.remove(atom)
        result[tuple(remaining)] = value // coefficient
    return result


def _sizes_only(poly: dict) -> bool:
    """Whether every atom of `poly` is a size (never negative)."""
    return all(not atom.startswith("(") for monomial in poly for atom in monomial)


def _nonnegative(poly: dict | None) -> bool:
    """Provably >= 0: non-negative coefficients over atoms that are sizes."""
    return poly is not None and all(c >= 0 for c in poly.values()) and _sizes_only(poly)


def at_least(left, right) -> bool:
    """Provably left >= right."""
    if is_literal(left) and is_literal(right):
        return left >= right
    if left is UNKNOWN or right is UNKNOWN:
        return False
    if left == right:
        return True
    a, b = polynomial(left), polynomial(right)
    if a is None or b is None:
        return False
    return _provably_nonnegative(_poly_add(a, _poly_scale(b, -1)), 2)


def _provably_nonnegative(poly: dict | None, depth: int) -> bool:
    """`_nonnegative`, or so once a min(x, y) that is subtracted is replaced by x or by y
    (each at least the min, so the difference only shrinks)."""
    if poly is None:
        return False
    if _nonnegative(poly):
        return True
    if depth == 0:
        return False
    for monomial, coefficient in poly.items():
        if len(monomial) != 1 or coefficient >= 0:
            continue
        arguments = _arguments(monomial[0])
        if arguments is None:
            continue
        rest = {m: c for m, c in poly.items() if m != monomial}
        for argument in arguments:
            bound = polynomial(_dim_of_text(argument))
            if bound is not None and _provably_nonnegative(_poly_add(rest, _poly_scale(bound, coefficient)), depth - 1):
                return True
    return False


def _dim_of_text(text: str):
    try:
        return int(text)
    except ValueError:
        return Symbol(text)


def _dim_of_poly(poly: dict | None):
    """The dim a polynomial names, canonically (one atom is that symbol itself)."""
    if poly is None:
        return UNKNOWN
    if not poly:
        return 0
    terms = []
    constant = 0
    for monomial in sorted(poly, key=lambda m: (len(m), m)):
        coefficient = poly[monomial]
        if not monomial:
            constant = coefficient
            continue
        term = Symbol(monomial[0])
        for atom in monomial[1:]:
            term = dims.multiply(term, Symbol(atom))
        terms.append(dims.multiply(coefficient, term) if coefficient != 1 else term)
    result = terms[0] if terms else constant
    for term in terms[1:]:
        result = dims.add(result, term)
    if terms and constant:
        result = dims.add(result, constant)
    return result


def never_negative(dim) -> bool:
    """Whether `dim` is provably >= 0: a polynomial of sizes with no negative coefficient."""
    return _nonnegative(polynomial(dim))


def exact_quotient(numerator, denominator):
    """The product of the dims `numerator` over that of `denominator`, canonically, where
    the division is exact term by term; UNKNOWN otherwise."""
    return _dim_of_poly(_poly_quotient(_poly_product(numerator), _poly_product(denominator)))


def product(dims_list):
    """The product of some dims, canonically; UNKNOWN if one is unknown."""
    return _dim_of_poly(_poly_product(dims_list))


def difference(left, right):
    """left - right where that is provably not negative; UNKNOWN otherwise."""
    if is_literal(left) and is_literal(right):
        return left - right if left >= right else UNKNOWN
    a, b = polynomial(left), polynomial(right)
    if a is None or b is None:
        return UNKNOWN
    gap = _poly_add(a, _poly_scale(b, -1))
    return _dim_of_poly(gap) if _provably_nonnegative(gap, 2) else UNKNOWN


def minimum(size, other):
    """min(size, other) for a dim `size` and a value `other` proved not negative:
    one of them where that is provable, else a canonical min symbol."""
    if at_least(size, other):
        return other
    if at_least(other, size):
        return size
    if size is UNKNOWN or other is UNKNOWN:
        return UNKNOWN
    names = sorted((str(size), str(other)))
    return Symbol(f"min({names[0]},{names[1]})")


def clamped_to(dim, others):
    """The dim of `others` that `dim` = min(k, x) broadcasts to, if `dim` is one with a literal k >= 1 and x
    among `others`; else `dim` itself.

    broadcast(min(k, x), x) is x wherever broadcasting succeeds, which the broadcast algebra assumes throughout:
    where x <= k the min is x; where x > k the min is k < x, and that broadcasts only if k == 1, giving x.
    (k >= 1 matters: min(0, x) is 0, and broadcast(0, 1) is 0, not 1.) BERT's position and token-type ids are a
    buffer sliced to min(max_positions, seq) that meets seq-long tensors this way.
    """
    if type(dim) is not Symbol:
        return dim
    arguments = _arguments(dim.name)
    if arguments is None or len(arguments) != 2:
        return dim
    for bound, argument in (arguments, arguments[::-1]):
        try:
            if int(bound) < 1:
                continue
        except ValueError:
            continue
        for other in others:
            if type(other) is Symbol and other.name == argument:
                return other
    return dim


def broadcast_shapes(*shapes):
    """`dims.broadcast_shapes`, with a min(k, x) broadcast against x taken to be x (see `clamped_to`)."""
    # Plain loops: this runs for every elementwise node at load, and a
    # generator over every dim cost more than the broadcast itself.
    clamped = False
    for shape in shapes:
        if shape is None:
            return None
        for d in shape:
            if type(d) is Symbol and d.name.startswith("min("):
                clamped = True
    if not clamped:
        return dims.broadcast_shapes(*shapes)
    rank = max(len(shape) for shape in shapes)
    columns = [[shape[axis - rank + len(shape)] for shape in shapes if axis - rank + len(shape) >= 0]
               for axis in range(rank)]
    clamped = [
        tuple(clamped_to(d, columns[position + rank - len(shape)]) for position, d in enumerate(shape))
        for shape in shapes
    ]
    return dims.broadcast_shapes(*clamped)


def negated(dim):
    """-dim as a dim (an expression over sizes), or UNKNOWN."""
    terms = polynomial(dim)
    return UNKNOWN if terms is None else _dim_of_poly(_poly_scale(terms, -1))
