"""Decomposition of two-operand Einsum contractions into Transpose, Reshape and MatMul.

For y = Einsum(a, b) with static shapes, each label is one of: batch (in a, b and y), contracted
(in a and b, not in y), free-a (only in a and y), free-b (only in b and y); ``...`` stands for
right-aligned labels of its own. Then

    A = reshape(transpose(a, [batch, free-a, contracted]), [*batch, F_a, K])
    B = reshape(transpose(b, [batch, contracted, free-b]), [*batch, K, F_b])
    y = transpose(reshape(A @ B, [*batch, *free-a, *free-b]), to y's label order)

with F_a, F_b, K the products of those labels' sizes (identity transposes and reshapes are
skipped). This is the sum of products Einsum defines, regrouped: exact in real arithmetic,
with MatMul's summation order in floats. Refused: other operand counts, a label repeated in
one term (a diagonal), a label summed away in one operand only, a label whose sizes differ
(broadcast) and dynamic shapes.
"""

from __future__ import annotations

from math import prod

from compiler.ir.graph import Graph, Node, Value
from compiler.ops.einsum import parse_equation
from compiler.rewriter import Rewriter
from passes.decompositions import Decomposition, register_decomposition
from passes.decompositions._util import base_name, ints, replace_outputs, static_reason

__all__ = ["EINSUM_MATMUL"]

Label = str | tuple[str, int]
"""A letter, or ("...", i): the i-th axis of the ellipsis counted from the right."""


def _expand(term: list[str], rank: int) -> list[Label]:
    """A term's labels, one per axis, with ``...`` spelled out right-aligned."""
    if "..." not in term:
        return list(term)
    i = term.index("...")
    n = rank - (len(term) - 1)
    return [*term[:i], *(("...", n - 1 - j) for j in range(n)), *term[i + 1 :]]


def _plan(graph: Graph, node: Node) -> tuple[list[list[Label]], list[Label], dict[Label, int]] | str:
    ins = graph.inputs_of(node)
    if len(ins) != 2 or any(v is None for v in ins):
        return f"{len(ins)} operands, not 2"
    if any(not v.type.dtype.is_float for v in ins if v is not None):
        return "operands are not float"
    why = static_reason(graph, node)
    if why:
        return why
    shapes = [v.type.static_shape for v in ins if v is not None]
    terms, out = parse_equation(node.attrs.equation, 2)
    labels = [_expand(t, len(s)) for t, s in zip(terms, shapes, strict=True)]
    if any(len(lab) != len(s) for lab, s in zip(labels, shapes, strict=True)):
        return "a term's label count differs from its operand's rank"
    n_ell = max((sum(1 for x in lab if isinstance(x, tuple)) for lab in labels), default=0)
    y: list[Label] = _expand(out, len(out) - 1 + n_ell) if "..." in out else list(out)
    sizes: dict[Label, int] = {}
    for lab, s in zip(labels, shapes, strict=True):
        if len(set(lab)) != len(lab):
            return "a label repeats within one term (a diagonal)"
        for x, d in zip(lab, s, strict=True):
            if sizes.setdefault(x, d) != d:
                return f"label {x!r} has sizes {sizes[x]} and {d} (a broadcast)"
    for x in set(labels[0]) ^ set(labels[1]):
        if x not in y:
            return f"label {x!r} is summed in one operand only"
    return labels, y, sizes


def _check(graph: Graph, node: Node) -> str | None:
    plan = _plan(graph, node)
    return plan if isinstance(plan, str) else None


def _arrange(
    rw: Rewriter, v: Value, have: list[Label], order: list[Label], shape: list[int], name: str
) -> Value:
    perm = tuple(have.index(x) for x in order)
    if perm != tuple(range(len(perm))):
        v = rw.op("Transpose", [v], {"perm": perm}, name=f"{name}_t")
    if len(shape) != len(order):
        v = rw.op("Reshape", [v, ints(rw, shape, f"{name}_shape")], name=f"{name}_3d")
    return v


def _rewrite(rw: Rewriter, graph: Graph, node: Node) -> None:
    plan = _plan(graph, node)
    assert not isinstance(plan, str)
    (la, lb), y, sizes = plan
    a, b_in = graph.inputs_of(node)
    assert a is not None and b_in is not None
    nm = base_name(node)
    batch = [x for x in y if x in la and x in lb]
    free_a, free_b = [x for x in y if x in la and x not in lb], [x for x in y if x in lb and x not in la]
    contracted = [x for x in la if x in lb and x not in y]
    bd = [sizes[x] for x in batch]
    fa, fb, k = (prod(sizes[x] for x in g) for g in (free_a, free_b, contracted))
    sa = (
        [*bd, fa, k]
        if len(free_a) != 1 or len(contracted) != 1
        else [sizes[x] for x in (*batch, *free_a, *contracted)]
    )
    sb = (
        [*bd, k, fb]
        if len(free_b) != 1 or len(contracted) != 1
        else [sizes[x] for x in (*batch, *contracted, *free_b)]
    )
    am = _arrange(rw, a, la, [*batch, *free_a, *contracted], sa, f"{nm}_a")
    bm = _arrange(rw, b_in, lb, [*batch, *contracted, *free_b], sb, f"{nm}_b")
    v = rw.op("MatMul", [am, bm], name=f"{nm}_mm")
    full = [*batch, *free_a, *free_b]
    if len(free_a) != 1 or len(free_b) != 1:
        v = rw.op("Reshape", [v, ints(rw, [sizes[x] for x in full], f"{nm}_shape")], name=f"{nm}_split")
    perm = tuple(full.index(x) for x in y)
    if perm != tuple(range(len(perm))):
        v = rw.op("Transpose", [v], {"perm": perm}, name=f"{nm}_out")
    replace_outputs(rw, node, [v])


EINSUM_MATMUL = register_decomposition(
    Decomposition(
        "einsum-matmul",
        "Einsum",
        ("Transpose", "Reshape", "MatMul"),
        _check,
        _rewrite,
        "Einsum(a, b) = transpose(reshape(A @ B)), A, B the operands arranged [batch, free, contracted]",
    )
)
