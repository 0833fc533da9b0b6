"""Subtensor: numpy-style basic indexing, x[..., b:e:s, ..., i, ...].

The IndexDescMaskDump param lists one item per indexed axis with flags saying
which index tensors follow the data input, in the order begin, end, step, idx
for each item. Ranges become one Slice (Python slicing semantics, negative
indices and clamping included); single indices become Gathers that drop their
axis. MegEngine has no 0-d results: a fully indexed tensor has shape [1]. The
index tensors must be constants (they are, after folding, with static shapes).
"""

from __future__ import annotations

from frontends.megengine.converter import OprContext, Var, converter
from frontends.megengine.fbs_fields import required, vector_length
from schemas.megengine.generated import params_generated as P

__all__: list[str] = []


def _index(ctx: OprContext, k: int, what: str) -> int:
    arr = ctx.require_const(k, f"the {what} index")
    if arr.size != 1 or arr.dtype.kind not in "iu":
        raise ctx.fail(f"{what} index (input {k}) must be one integer, got {arr.dtype}{list(arr.shape)}")
    return int(arr.reshape(-1)[0])


@converter("Subtensor", requantize=False)
def subtensor(ctx: OprContext) -> list[Var | None]:
    """y = x[items] with ranges and single indices."""
    ctx.need_inputs(1)
    p = ctx.param(P.IndexDescMaskDump)
    x = ctx.value(0)
    shape = ctx.shape(x)
    rank = len(shape)
    starts: list[int] = []
    ends: list[int] = []
    axes: list[int] = []
    steps: list[int] = []
    picks: list[tuple[int, int]] = []
    k = 1
    for j in range(vector_length(p.ItemsLength(), 5, ctx.opr.params[0].buf, "Subtensor items")):
        item = required(p.Items(j), f"Subtensor item {j}")
        axis = int(item.Axis())
        if not 0 <= axis < rank or axis in axes or axis in [a for a, _ in picks]:
            raise ctx.fail(f"index item {j} names axis {axis} of a rank-{rank} tensor (or repeats it)")
        bounds = []
        for flag, what in ((item.Begin(), "begin"), (item.End(), "end"), (item.Step(), "step")):
            bounds.append(_index(ctx, k, what) if flag else None)
            k += int(bool(flag))
        if item.Idx():
            i = _index(ctx, k, "idx")
            k += 1
            if not -shape[axis] <= i < shape[axis]:
                raise ctx.fail(f"index {i} is out of range for axis {axis} of size {shape[axis]}")
            picks.append((axis, i % shape[axis]))
            continue
        if bounds[2] == 0:
            raise ctx.fail(f"step 0 on axis {axis}")
        start, stop, step = slice(*bounds).indices(shape[axis])
        if step < 0 and stop < 0:
            stop = -shape[axis] - 1  # "before index 0" in ONNX's negative-step convention
        starts.append(start)
        ends.append(stop)
        axes.append(axis)
        steps.append(step)
    if k != len(ctx.inputs):
        raise ctx.fail(f"the index items use {k - 1} index inputs, the operator has {len(ctx.inputs) - 1}")
    y = x
    if axes:
        y = ctx.emit1(
            "Slice",
            [
                y,
                ctx.ints(starts, "starts"),
                ctx.ints(ends, "ends"),
                ctx.ints(axes, "axes"),
                ctx.ints(steps, "steps"),
            ],
        )
    for axis, i in sorted(picks, reverse=True):
        y = ctx.emit1("Gather", [y, ctx.constant(i, "index", "int64")], {"axis": axis})
    if y.type.rank == 0:
        y = ctx.emit1("Reshape", [y, ctx.ints([1], "shape")])
    return [Var(y, ctx.dtype(0))]
