"""Einsum: y = a sum of products over the labels an equation such as ``bij,bjk->bik`` names.

Each input's term gives one label per axis; ``...`` stands for the leading axes
not named (right-aligned and broadcast across inputs). Labels missing from the
output term are summed over. Without ``->`` the output is ``...`` followed by the
labels used exactly once, in alphabetical order. The reference sums in float64
(integers in int64) and casts back to the input dtype.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np

from compiler.ir.types import Dim, TensorType
from compiler.ops.registry import InferContext, OpDef, register
from compiler.ops.shapes import broadcast, merge_dim

__all__ = ["EinsumAttrs", "parse_equation"]

_ELLIPSIS = "..."


@dataclass(frozen=True)
class EinsumAttrs:
    """Einsum: the equation, e.g. ``ij,jk->ik`` (spaces are ignored)."""

    equation: str = ""


def _labels(term: str, where: str) -> list[str]:
    """A term as a list of one-letter labels, with ``...`` kept as one item."""
    out: list[str] = []
    rest = term
    while rest:
        if rest.startswith(_ELLIPSIS):
            if _ELLIPSIS in out:
                raise ValueError(f"{where}: '...' appears twice in term {term!r}")
            out.append(_ELLIPSIS)
            rest = rest[3:]
            continue
        ch, rest = rest[0], rest[1:]
        if not ch.isalpha():
            raise ValueError(f"{where}: bad label {ch!r} in term {term!r}")
        out.append(ch)
    return out


def parse_equation(equation: str, num_inputs: int) -> tuple[list[list[str]], list[str]]:
    """The equation's input terms and output term, as label lists (``...`` one item).

    Raises ``ValueError`` for a malformed equation or one whose term count differs from ``num_inputs``.
    """
    eq = equation.replace(" ", "")
    lhs, arrow, rhs = eq.partition("->")
    terms = [_labels(t, equation) for t in lhs.split(",")]
    if len(terms) != num_inputs:
        raise ValueError(f"equation {equation!r} has {len(terms)} input terms for {num_inputs} inputs")
    if arrow:
        out = _labels(rhs, equation)
    else:
        counts = Counter(lab for t in terms for lab in t if lab != _ELLIPSIS)
        ell = [_ELLIPSIS] if any(_ELLIPSIS in t for t in terms) else []
        out = ell + sorted(lab for lab, c in counts.items() if c == 1)
    known = {lab for t in terms for lab in t}
    missing = [lab for lab in out if lab not in known]
    if missing or len(set(out)) != len(out):
        raise ValueError(f"equation {equation!r}: output labels {''.join(out)} are repeated or unknown")
    return terms, out


def _infer(ctx: InferContext) -> list[TensorType]:
    a: EinsumAttrs = ctx.attrs
    n = len(ctx.types)
    try:
        terms, out = parse_equation(a.equation, n)
    except ValueError as exc:
        raise ctx.fail(str(exc)) from None
    t0 = ctx.type(0)
    for i in range(n):
        if ctx.type(i).dtype != t0.dtype:
            raise ctx.fail(f"input {i} has dtype {ctx.type(i).dtype.short}, input 0 {t0.dtype.short}")
    if any(ctx.type(i).shape is None for i in range(n)):
        return [t0.with_shape(None)]
    dims: dict[str, Dim] = {}
    ell_shapes = []
    for i, term in enumerate(terms):
        shape = ctx.shape(i)
        named = [lab for lab in term if lab != _ELLIPSIS]
        n_ell = len(shape) - len(named)
        if n_ell < 0 or (n_ell > 0 and _ELLIPSIS not in term):
            raise ctx.fail(f"term {''.join(term)!r} does not match input {i} of rank {len(shape)}")
        pos = 0
        for lab in term:
            if lab == _ELLIPSIS:
                ell_shapes.append(shape[pos : pos + n_ell])
                pos += n_ell
                continue
            d = shape[pos]
            pos += 1
            prev = dims.get(lab)
            if prev is not None and not (prev == 1 or d == 1):
                merged = merge_dim(prev, d)
                if merged is None:
                    raise ctx.fail(f"label {lab!r} has sizes {prev} and {d}")
                d = merged
            elif prev is not None and d == 1:
                d = prev
            dims[lab] = d
    try:
        ell = broadcast(ell_shapes, ctx.where) if ell_shapes else ()
    except ValueError as exc:
        raise ctx.fail(str(exc)) from None
    shape_out: list[Dim] = []
    for lab in out:
        shape_out.extend(ell if lab == _ELLIPSIS else (dims[lab],))
    return [t0.with_shape(tuple(shape_out))]


def _ref(ins: list[np.ndarray | None], a: EinsumAttrs, n: int) -> list[np.ndarray]:
    xs = [np.asarray(x) for x in ins if x is not None]
    wide = np.int64 if xs[0].dtype.kind in "iu" else np.float64
    y = np.einsum(a.equation.replace(" ", ""), *(x.astype(wide) for x in xs))
    return [np.asarray(y).astype(xs[0].dtype)]


register(
    OpDef(
        "Einsum",
        _infer,
        _ref,
        EinsumAttrs,
        inputs=(1, -1),
        doc="y = sum over labels not in the output of the product of the inputs (numpy.einsum semantics)",
    )
)
