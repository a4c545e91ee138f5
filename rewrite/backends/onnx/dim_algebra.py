"""Symbolic dim arithmetic for ONNX shape inference: dims as polynomials.

Solving Reshape's -1, Range's length and a Slice's extent needs a little
algebra on symbolic dims: products that cancel, differences that are
provably not negative, and the min(k, x) a slice of a buffer gives.
"""

from __future__ import annotations

import functools

from rewrite.engine import shapes as dims
from rewrite.language.logic import UNKNOWN, Arithmetic, Difference, Minimum, Sum, Term, canonical_key, is_literal

# A dim is read as a polynomial over atoms, with integer coefficients: the
# sums, differences and products `rewrite.engine.shapes` builds are taken
# apart; any other term (a named size, a min, a broadcast) is one atom.
# Nothing is assumed about an atom but what it is: two atoms are one number
# only when they are the same term. Every atom is a size (the dim of some
# tensor, or a min or broadcast of sizes), so never negative, except an
# arithmetic term kept whole because its polynomial grew too long.

_MAX_TERMS = 16


def polynomial(dim) -> dict | None:
    """`dim` as {monomial (its atoms, in canonical order): coefficient}; None for UNKNOWN or a non-integer."""
    if type(dim) is int or (is_literal(dim) and float(dim).is_integer()):
        return {(): int(dim)} if dim else {}
    if not isinstance(dim, Term):
        return None
    return _polynomial_of_term(dim)


@functools.lru_cache(maxsize=4096)
def _polynomial_of_term(term: Term) -> dict:
    if isinstance(term, Arithmetic):
        combined = _combined(term)
        if combined is not None:
            return combined
    return {(term,): 1}


def _combined(term: Arithmetic) -> dict | None:
    """The polynomial of `term`, its sums, differences and products taken apart; None if
    one grows past `_MAX_TERMS` on the way."""
    # Operands first, with a stack: a Concat of thousands of inputs along a
    # symbolic axis builds a sum that deep, past what recursion allows.
    done: dict[int, dict | None] = {}
    stack = [term]
    while stack:
        node = stack[-1]
        if id(node) in done:
            stack.pop()
            continue
        pending = [part for part in (node.left, node.right) if isinstance(part, Arithmetic) and id(part) not in done]
        if pending:
            stack.extend(pending)
            continue
        stack.pop()
        left, right = (done[id(part)] if isinstance(part, Arithmetic) else _atom(part)
                       for part in (node.left, node.right))
        if left is None or right is None:
            done[id(node)] = None
        elif type(node) is Sum:
            done[id(node)] = _poly_add(left, right)
        elif type(node) is Difference:
            done[id(node)] = _poly_add(left, _poly_scale(right, -1))
        else:
            done[id(node)] = _poly_multiply(left, right)
    return done[id(term)]


def _atom(dim) -> dict:
    """The polynomial of an int, or of a term that is not arithmetic: one atom."""
    if type(dim) is int:
        return {(): dim} if dim else {}
    return {(dim,): 1}


def _monomial(atoms) -> tuple:
    return tuple(sorted(atoms, key=canonical_key))


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
            result = _poly_add(result, {_monomial(a + b): x * y})
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
    return all(not isinstance(atom, Arithmetic) for monomial in poly for atom in monomial)


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
        atom = monomial[0]
        if type(atom) is not Minimum:
            continue
        rest = {m: c for m, c in poly.items() if m != monomial}
        for argument in (atom.left, atom.right):
            bound = polynomial(argument)
            if bound is not None and _provably_nonnegative(_poly_add(rest, _poly_scale(bound, coefficient)), depth - 1):
                return True
    return False


def _dim_of_poly(poly: dict | None):
    """The dim a polynomial names, canonically (one atom is that symbol itself)."""
    if poly is None:
        return UNKNOWN
    if not poly:
        return 0
    terms = []
    constant = 0
    for monomial in sorted(poly, key=lambda m: (len(m), [canonical_key(atom) for atom in m])):
        coefficient = poly[monomial]
        if not monomial:
            constant = coefficient
            continue
        term = monomial[0]
        for atom in monomial[1:]:
            term = dims.multiply(term, atom)
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
    return Minimum(*sorted((size, other), key=canonical_key))


def clamped_to(dim, others):
    """The dim of `others` that `dim` = min(k, x) broadcasts to, if `dim` is one with a literal k >= 1 and x
    among `others`; else `dim` itself.

    broadcast(min(k, x), x) is x wherever broadcasting succeeds, which the broadcast algebra assumes throughout:
    where x <= k the min is x; where x > k the min is k < x, and that broadcasts only if k == 1, giving x.
    (k >= 1 matters: min(0, x) is 0, and broadcast(0, 1) is 0, not 1.) BERT's position and token-type ids are a
    buffer sliced to min(max_positions, seq) that meets seq-long tensors this way.
    """
    if type(dim) is not Minimum:
        return dim
    for bound, argument in ((dim.left, dim.right), (dim.right, dim.left)):
        if type(bound) is not int or bound < 1:
            continue
        for other in others:
            if isinstance(other, Term) and other == argument:
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
            if type(d) is Minimum:
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
