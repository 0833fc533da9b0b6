"""Symbolic shapes in the Relax module: dims known only at run time, as ``tirx.Var``s.

A Kiln type's ``?`` dim becomes a symbolic dim of the Relax value. Relax's own shape inference
carries it through the ops that follow (``take(w, idx[n]) -> [n, 4]``); where it cannot (a length
the data decides, a shape read from a tensor, branches of different shapes), the value is cast
to a shape with fresh variables (``R.match_cast``), which the VM checks and binds at run time.

A length the data decides (NonZero's count, NonMaxSuppression's selected rows) comes out of a
kernel as a ``[1]`` int64 tensor; :func:`define_length` turns it into a dim ``n`` through
``tensor_to_shape`` and ``match_cast`` (both VM builtins: the exported library needs no Python).

FuseOps in TVM 0.27 does not see that a call using ``n`` depends on the ``match_cast`` defining it
and may move a fused group above it ("PrimExpr n has not been computed" in VMShapeLower).
:func:`split_at_shape_definitions` therefore ends the dataflow block at every ``match_cast`` (and
``If``), so no fusion group crosses one.
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from backends.tvm.lowering.table import LowerContext
    from compiler.ir.graph import Graph, Node
    from compiler.ir.types import TensorType

__all__ = [
    "is_dynamic",
    "graph_is_dynamic",
    "relax_type",
    "relax_shape",
    "conform",
    "define_length",
    "shape_from_tensor",
    "split_at_shape_definitions",
    "UNBOUNDED",
]

_names = itertools.count()

UNBOUNDED = 2**31 - 1
"""A constant bound this large ("to the end", "no limit") is no bound: ``min(c, d)`` is ``d``.
Relax's memory planner sizes a buffer by the upper bound of its shape, so ``min(INT64_MAX, n)``
would be planned as INT64_MAX elements."""


def is_dynamic(graph: Graph, node: Node) -> bool:
    """True when an input or output of ``node`` has a dim known only at run time."""
    types = [v.type for v in graph.inputs_of(node) if v is not None] + list(node.output_types)
    return not all(t.is_static for t in types)


def graph_is_dynamic(graph: Graph) -> bool:
    """True when some node (in a subgraph too) has a run-time dim."""
    from compiler.preflight import walk_nodes

    return any(is_dynamic(g, n) for g, n in walk_nodes(graph))


def fresh_dim(hint: str = "n") -> Any:
    """A new int64 symbolic dim."""
    from tvm import tirx

    return tirx.Var(f"{hint}{next(_names)}", "int64")


def relax_shape(expr: Any) -> list[Any] | None:
    """The dims (PrimExprs) of a Relax tensor value, or None when Relax does not know them."""
    from tvm import relax

    ty = expr.ty
    if not isinstance(ty, relax.TensorType) or ty.shape is None:
        return None
    shape = ty.shape
    values = shape.values if isinstance(shape, relax.ShapeExpr) else getattr(shape.ty, "values", None)
    return None if values is None else list(values)


def relax_type(t: TensorType, known: list[Any] | None = None) -> Any:
    """The Relax tensor type of a Kiln type: ints stay, each ``?`` takes ``known``'s dim when given
    (a PrimExpr Relax already has) or a fresh variable."""
    from tvm import relax

    assert t.shape is not None, "rank-unknown tensors are not lowered"
    dims = []
    for i, d in enumerate(t.shape):
        if isinstance(d, int):
            dims.append(int(d))
        elif known is not None and i < len(known):
            dims.append(known[i])
        else:
            dims.append(fresh_dim())
    return relax.TensorType(dims, t.dtype.numpy.name)


def _agrees(dims: list[Any], t: TensorType) -> bool:
    from tvm import tirx

    if t.shape is None or len(dims) != len(t.shape):
        return False
    for d, want in zip(dims, t.shape, strict=True):
        if isinstance(want, int) and not (isinstance(d, tirx.IntImm) and int(d) == want):
            return False
    return True


def conform(ctx: LowerContext, expr: Any, t: TensorType) -> Any:
    """``expr`` with a Relax shape of ``t``'s rank and its static dims: unchanged when Relax's own
    inference already gives that, else ``match_cast`` (fresh dims where Relax knows none)."""
    dims = relax_shape(expr)
    if dims is not None and _agrees(dims, t):
        return expr
    if dims is not None and t.shape is not None and len(dims) != len(t.shape):
        dims = None
    return ctx.bb.match_cast(expr, relax_type(t, dims))


def define_length(ctx: LowerContext, count: Any, hint: str = "n") -> Any:
    """The symbolic dim holding a run-time length (``count``: an int64 ``[1]`` tensor)."""
    from tvm import relax

    n = fresh_dim(hint)
    ctx.bb.match_cast(ctx.emit(relax.op.tensor_to_shape(count)), relax.ShapeType([n]))
    return n


def shape_from_tensor(ctx: LowerContext, tensor: Any, rank: int) -> list[Any]:
    """Dims read at run time from a 1-D int64 tensor of ``rank`` values."""
    from tvm import relax

    dims = [fresh_dim("d") for _ in range(rank)]
    vec = ctx.emit(relax.op.astype(tensor, "int64"))
    ctx.bb.match_cast(ctx.emit(relax.op.tensor_to_shape(vec)), relax.ShapeType(dims))
    return dims


def _defines_shape(binding: Any) -> bool:
    from tvm import relax

    return isinstance(binding, relax.MatchCast) or isinstance(binding.value, relax.If)


def split_at_shape_definitions(func: Any) -> Any:
    """``func`` (built without dataflow blocks) with its bindings in dataflow blocks, each ended by a
    ``match_cast`` or ``If`` binding, which stand in plain blocks of their own. The vars stay plain
    (CanonicalizeBindings afterwards makes those used inside one block dataflow vars)."""
    from tvm import relax

    body = func.body
    blocks: list[Any] = []
    run: list[Any] = []
    for block in body.blocks:
        for b in block.bindings:
            if _defines_shape(b):
                if run:
                    blocks.append(relax.DataflowBlock(run))
                    run = []
                blocks.append(relax.BindingBlock([b]))
            else:
                run.append(b)
    if run:
        blocks.append(relax.DataflowBlock(run))
    return relax.Function(
        func.params, relax.SeqExpr(blocks, body.body), func.ret_ty, func.is_pure, func.attrs
    )
