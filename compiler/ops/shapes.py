"""Shape arithmetic shared by the op families: broadcasting, axes, conv windows."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from compiler.ir.types import Dim, Shape

__all__ = [
    "broadcast",
    "normalize_axis",
    "normalize_axes",
    "window_out",
    "product",
    "AUTO_PADS",
    "window_params",
    "same_pads",
    "resolve_pads",
    "window_dim",
    "ceil_div_dim",
    "scaled_dim",
    "conv_out_dims",
]


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


# --- helpers for data-movement ops (tensor_shape / tensor_data / logic) ---

UNKNOWN: str = "?"
"""The dim symbol for a size that is not known at compile time (each "?" is distinct)."""

__all__ += ["UNKNOWN", "broadcast_all", "merge_dim", "sum_dims", "slice_bounds", "dims_of_const"]


def broadcast_all(shapes: Sequence[Shape | None], where: str = "") -> Shape | None:
    """:func:`broadcast` of several shapes; None (unknown rank) if any rank is unknown."""
    if any(s is None for s in shapes):
        return None
    return broadcast([s for s in shapes if s is not None], where)


def merge_dim(a: Dim, b: Dim) -> Dim | None:
    """Two dims that must be equal, as one: an int beats a symbol; None if two ints differ."""
    if isinstance(a, int) and isinstance(b, int):
        return a if a == b else None
    if isinstance(a, int):
        return a
    if isinstance(b, int) or a == UNKNOWN:
        return b
    return a


def sum_dims(dims: Sequence[Dim]) -> Dim:
    """Sum of dims; :data:`UNKNOWN` if any dim is symbolic."""
    total = 0
    for d in dims:
        if not isinstance(d, int):
            return UNKNOWN
        total += d
    return total


def slice_bounds(size: int, start: int, end: int, step: int) -> tuple[int, int, int]:
    """ONNX Slice on one axis of length ``size``: the clamped ``(start, end, count)``.

    Negative ``start``/``end`` count from the back; then ``start`` is clamped to
    ``[0, size]`` (``[0, size-1]`` for a negative step) and ``end`` to
    ``[0, size]`` (``[-1, size-1]`` for a negative step, where -1 means "past
    index 0"). ``count = max(0, ceil((end - start) / step))``. As in ONNX
    Runtime (the spec is silent), an ``end`` of exactly INT32_MAX or INT64_MAX
    means "through the end in the step's direction", so with a negative step
    it runs through index 0. ``step`` must be non-zero.
    """
    if step == 0:
        raise ValueError("slice step must not be 0")
    if start < 0:
        start += size
    if end in (2**31 - 1, 2**63 - 1):
        end = size if step > 0 else -1
    elif end < 0:
        end += size
    if step > 0:
        start, end = min(max(start, 0), size), min(max(end, 0), size)
    else:
        start, end = min(max(start, 0), size - 1), min(max(end, -1), size - 1)
    count = max(0, -((start - end) // step))
    return start, end, count


def dims_of_const(value: object, where: str = "") -> list[int]:
    """A 0-d or 1-d integer constant (a shape, axes, repeats...) as a list of Python ints."""
    import numpy as np

    arr = np.asarray(value)
    if arr.ndim > 1 or (arr.size and arr.dtype.kind not in "iu"):
        raise ValueError(f"{where}: expected a 1-D integer tensor, got {arr.dtype}{list(arr.shape)}")
    return [int(v) for v in arr.reshape(-1)]


# ----------------------------------------------------------------- window helpers
# Shared by conv, pooling and (through ``scaled_dim``) resize. Pads follow the
# ONNX layout ``[b1, ..., bn, e1, ..., en]``.

AUTO_PADS = ("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID")


def window_params(
    nd: int,
    kernel: Sequence[int],
    strides: Sequence[int],
    dilations: Sequence[int],
    pads: Sequence[int],
) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    """Fill defaults (strides 1, dilations 1, pads 0) and check lengths and signs.

    Returns ``(strides, dilations, pads)``; raises ``ValueError`` on a bad attribute.
    """
    s = tuple(strides) or (1,) * nd
    d = tuple(dilations) or (1,) * nd
    p = tuple(pads) or (0,) * (2 * nd)
    if len(kernel) != nd or len(s) != nd or len(d) != nd or len(p) != 2 * nd:
        raise ValueError(
            f"{nd} spatial dims but kernel_shape={tuple(kernel)}, strides={s}, dilations={d}, pads={p}"
        )
    if min(kernel, default=1) < 1 or min(s, default=1) < 1 or min(d, default=1) < 1:
        raise ValueError(f"kernel_shape={tuple(kernel)}, strides={s} and dilations={d} must be >= 1")
    if min(p, default=0) < 0:
        raise ValueError(f"pads={p} must be >= 0")
    return s, d, p


def same_pads(size: int, kernel: int, stride: int, dilation: int, upper: bool) -> tuple[int, int]:
    """``(begin, end)`` pads of auto_pad SAME: output = ceil(size / stride); odd totals go
    to the end for SAME_UPPER and to the beginning for SAME_LOWER."""
    out = -(-size // stride)
    total = max(0, (out - 1) * stride + dilation * (kernel - 1) + 1 - size)
    small = total // 2
    return (small, total - small) if upper else (total - small, small)


def resolve_pads(
    auto_pad: str,
    sizes: Sequence[int],
    kernel: Sequence[int],
    strides: Sequence[int],
    dilations: Sequence[int],
    pads: Sequence[int],
) -> tuple[int, ...]:
    """Explicit pads ``[b..., e...]`` for static spatial ``sizes`` under ``auto_pad``."""
    nd = len(sizes)
    if auto_pad == "NOTSET":
        return tuple(pads)
    if auto_pad == "VALID":
        return (0,) * (2 * nd)
    if auto_pad not in AUTO_PADS:
        raise ValueError(f"unknown auto_pad {auto_pad!r}")
    pairs = [
        same_pads(sizes[i], kernel[i], strides[i], dilations[i], auto_pad == "SAME_UPPER") for i in range(nd)
    ]
    return tuple(b for b, _ in pairs) + tuple(e for _, e in pairs)


def _offset(sym: str, k: int) -> str:
    return sym if k == 0 else f"{sym}{k:+d}"


def window_dim(
    size: Dim, kernel: int, stride: int, dilation: int, pad_begin: int, pad_end: int, ceil: bool = False
) -> Dim:
    """:func:`window_out` that also maps a symbolic size to a derived symbol.

    A symbol is kept as is when the window maps it one to one (e.g. a 3x3
    stride-1 window with pads 1); otherwise the result is an expression string
    such as ``floor((H-1)/2)+1``. Raises ``ValueError`` when a static output is < 1.
    """
    if isinstance(size, int):
        out = window_out(size, kernel, stride, dilation, pad_begin, pad_end, ceil)
        if not isinstance(out, int) or out < 1:
            raise ValueError(
                f"window (kernel {kernel}, dilation {dilation}) does not fit size {size} "
                f"with pads ({pad_begin}, {pad_end})"
            )
        return out
    num = pad_begin + pad_end - (dilation * (kernel - 1) + 1)
    if stride == 1:
        return _offset(size, num + 1)
    return f"{'ceil' if ceil else 'floor'}(({_offset(size, num)})/{stride})+1"


def ceil_div_dim(size: Dim, stride: int) -> Dim:
    """ceil(size / stride) for an int or symbolic size (auto_pad SAME outputs)."""
    if isinstance(size, int):
        return -(-size // stride)
    return size if stride == 1 else f"ceil({size}/{stride})"


def scaled_dim(size: Dim, scale: float) -> Dim:
    """floor(size * scale) for an int or symbolic size (Resize outputs)."""
    if isinstance(size, int):
        return int(np.floor(np.float32(size) * np.float32(scale)))
    if scale == 1.0:
        return size
    return f"{int(scale)}*{size}" if float(scale).is_integer() else f"floor({scale:g}*{size})"


def conv_out_dims(
    auto_pad: str,
    sizes: Sequence[Dim],
    kernel: Sequence[int],
    strides: Sequence[int],
    dilations: Sequence[int],
    pads: Sequence[int],
    ceil: bool = False,
) -> list[Dim]:
    """Spatial output dims of a conv/pool window under ``auto_pad`` (sizes may be symbolic)."""
    nd = len(sizes)
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        return [ceil_div_dim(sizes[i], strides[i]) for i in range(nd)]
    if auto_pad == "VALID":
        pads = (0,) * (2 * nd)
    elif auto_pad != "NOTSET":
        raise ValueError(f"unknown auto_pad {auto_pad!r}")
    return [
        window_dim(sizes[i], kernel[i], strides[i], dilations[i], pads[i], pads[i + nd], ceil)
        for i in range(nd)
    ]
