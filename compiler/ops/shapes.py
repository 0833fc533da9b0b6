"""Shape arithmetic shared by the op families: broadcasting, axes, conv windows."""

from __future__ import annotations

from collections.abc import Sequence

from compiler.ir.types import Dim, Shape

__all__ = ["broadcast", "normalize_axis", "normalize_axes", "window_out", "product"]


def broadcast(shapes: Sequence[Shape], where: str = "") -> Shape:
    """Numpy-style multidirectional broadcast of (possibly symbolic) shapes."""
    rank = max((len(s) for s in shapes), default=0)
    out: list[Dim] = []
    for i in range(rank):
        dims = [s[len(s) - rank + i] for s in shapes if len(s) - rank + i >= 0]
        known = {d for d in dims if isinstance(d, int) and d != 1}
        if len(known) > 1:
            raise ValueError(f"{where}: shapes {[tuple(s) for s in shapes]} do not broadcast")
        if known:
            out.append(known.pop())
        else:
            syms = [d for d in dims if isinstance(d, str)]
            out.append(syms[0] if syms else 1)
    return tuple(out)


def normalize_axis(axis: int, rank: int, where: str = "") -> int:
    """Map a possibly negative axis into ``[0, rank)``."""
    if not -rank <= axis < rank:
        raise ValueError(f"{where}: axis {axis} out of range for rank {rank}")
    return axis + rank if axis < 0 else axis


def normalize_axes(axes: Sequence[int], rank: int, where: str = "") -> list[int]:
    """Normalize several axes."""
    return [normalize_axis(int(a), rank, where) for a in axes]


def window_out(
    size: Dim, kernel: int, stride: int, dilation: int, pad_begin: int, pad_end: int, ceil: bool = False
) -> Dim:
    """Output length of a sliding window: floor((size + pads - dil*(k-1) - 1) / stride) + 1.

    With ``ceil`` the division rounds up, but the last window must start inside
    the input or the leading pad (the ONNX Runtime / PyTorch rule).
    """
    if not isinstance(size, int):
        return size
    num = size + pad_begin + pad_end - (dilation * (kernel - 1) + 1)
    if not ceil:
        return num // stride + 1
    out = -(-num // stride) + 1
    if (out - 1) * stride >= size + pad_begin:
        out -= 1
    return out


def product(dims: Sequence[Dim]) -> Dim:
    """Product of dims; a symbol if any dim is symbolic."""
    p = 1
    for d in dims:
        if not isinstance(d, int):
            return "?"
        p *= d
    return p
