"""Channel-blocked data layouts: ``NCHW`` and ``NCHW{b}c``.

``NCHW{b}c`` stores an [N, C, H, W] tensor as [N, ceil(C/b), H, W, b]: channel c
lives at [c // b, ..., c % b]. Packing pads the last block with zeros; unpacking
drops the padded lanes. Every pass, op and backend asks this module about layout
strings instead of comparing them inline.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from compiler.ir.types import Dim, Shape

__all__ = [
    "NCHW",
    "OIHW",
    "block_of",
    "is_blocked",
    "blocked",
    "blocks",
    "ceil_div",
    "layout_shape",
    "nchw_shape",
    "pack",
    "unpack",
    "relayout",
    "pack_broadcast_const",
    "weight_layout",
    "group_chunk_start",
    "grouped_chunks",
    "LayoutError",
]

NCHW = "NCHW"
OIHW = "OIHW"
_BLOCKED = re.compile(r"NCHW([1-9][0-9]*)c")


class LayoutError(ValueError):
    """A malformed layout string or a tensor that does not fit its layout."""


def block_of(layout: str) -> int:
    """The channel block of a layout: 0 for ``NCHW``, b for ``NCHW{b}c``."""
    if layout == NCHW:
        return 0
    m = _BLOCKED.fullmatch(layout)
    if m is None:
        raise LayoutError(f"unknown data layout {layout!r} (expected 'NCHW' or 'NCHW<b>c')")
    return int(m.group(1))


def is_blocked(layout: str) -> bool:
    """True for ``NCHW{b}c``."""
    return block_of(layout) > 0


def blocked(block: int) -> str:
    """The layout string of block ``block`` (0 gives ``NCHW``)."""
    if block < 0:
        raise LayoutError(f"block must be >= 0, got {block}")
    return f"NCHW{block}c" if block else NCHW


def blocks(channels: int, block: int) -> int:
    """Number of channel blocks: ceil(C / b)."""
    return ceil_div(channels, block)


def ceil_div(a: int, b: int) -> int:
    """ceil(a / b) for positive b."""
    return -(-a // b)


def layout_shape(nchw: Shape, layout: str) -> Shape:
    """The shape of an [N, C, H, W] tensor stored in ``layout`` (C must be static when blocked)."""
    b = block_of(layout)
    if len(nchw) != 4:
        raise LayoutError(f"expected a rank-4 NCHW shape, got {list(nchw)}")
    if not b:
        return tuple(nchw)
    c = nchw[1]
    if not isinstance(c, int):
        raise LayoutError(f"a blocked layout needs a static channel count, got {c!r}")
    n, _, h, w = nchw
    return (n, blocks(c, b), h, w, b)


def nchw_shape(shape: Shape, layout: str, channels: int) -> tuple[Dim, ...]:
    """Inverse of :func:`layout_shape`: the logical [N, C, H, W] shape; checks ``shape`` fits."""
    b = block_of(layout)
    if not b:
        if len(shape) != 4 or (isinstance(shape[1], int) and shape[1] != channels):
            raise LayoutError(f"shape {list(shape)} is not NCHW with {channels} channels")
        return tuple(shape)
    if len(shape) != 5 or shape[4] != b or (isinstance(shape[1], int) and shape[1] != blocks(channels, b)):
        raise LayoutError(f"shape {list(shape)} is not {layout} with {channels} channels")
    return (shape[0], channels, shape[2], shape[3])


def pack(x: np.ndarray, block: int, fill: float = 0.0) -> np.ndarray:
    """[N, C, H, W] -> [N, ceil(C/b), H, W, b]; padded lanes hold ``fill``."""
    n, c, h, w = x.shape
    cb = blocks(c, block)
    padded = np.full((n, cb * block, h, w), fill, dtype=x.dtype)
    padded[:, :c] = x
    return np.ascontiguousarray(padded.reshape(n, cb, block, h, w).transpose(0, 1, 3, 4, 2))


def unpack(x: np.ndarray, channels: int) -> np.ndarray:
    """[N, Cb, H, W, b] -> [N, C, H, W]; drops the padded lanes."""
    n, cb, h, w, b = x.shape
    return np.ascontiguousarray(x.transpose(0, 1, 4, 2, 3).reshape(n, cb * b, h, w)[:, :channels])


def relayout(x: np.ndarray, src: str, dst: str, channels: int) -> np.ndarray:
    """Convert ``x`` from layout ``src`` to ``dst`` (padded lanes of the result are zero)."""
    sb, db = block_of(src), block_of(dst)
    nchw = unpack(x, channels) if sb else x
    return pack(nchw, db) if db else np.ascontiguousarray(nchw)


def pack_broadcast_const(c: np.ndarray, channels: int, block: int, fill: float = 0.0) -> np.ndarray | None:
    """Re-lay a constant operand of a rank-4 NCHW elementwise op for a ``NCHW{b}c`` partner.

    The operand is right-aligned to rank 4 (numpy broadcasting). Its channel dim must be
    ``channels`` (packed, padded lanes = ``fill``) or 1 (a lane axis of 1 is appended).
    None if it broadcasts in another way.
    """
    if c.ndim > 4:
        return None
    full = c.reshape((1,) * (4 - c.ndim) + c.shape)
    if full.shape[1] == 1:
        return full.reshape(*full.shape, 1)
    if full.shape[1] != channels:
        return None
    return pack(full, block, fill)


def weight_layout(in_block: int, out_block: int, depthwise: bool) -> str:
    """The packed weight layout a blocked conv records: ``OIHW{bi}i{bo}o`` (``OIHW1i{b}o`` depthwise)."""
    return f"OIHW{1 if depthwise else in_block}i{out_block}o"


def group_chunk_start(o: Any, c_in: int, c_out: int, groups: int, in_block: int, out_block: int) -> Any:
    """The first input chunk output chunk ``o`` of a blocked grouped conv reads: the chunk of its
    first group's first input channel, ``((o*bo) // go) * gi // bi`` (``o`` an int or a TIR expr)."""
    gi, go = c_in // groups, c_out // groups
    return (o * out_block) // go * gi // in_block


def grouped_chunks(c_in: int, c_out: int, groups: int, in_block: int, out_block: int) -> int | None:
    """How many input chunks each output chunk of a grouped conv (1 < groups, not depthwise) reads in
    ``NCHW{bi}c -> NCHW{bo}c``, or None when some output chunk's groups do not read whole input
    chunks (then the conv cannot run blocked). A chunk holds whole groups (``bo % go == 0`` and
    their ``(bo/go) * gi`` inputs a multiple of ``bi``) or a group spans whole chunks (``go % bo ==
    0``, ``gi % bi == 0``); padded output chunks must still read existing input chunks."""
    if groups <= 1 or c_in % groups or c_out % groups:
        return None
    gi, go = c_in // groups, c_out // groups
    if go <= out_block:
        fits = out_block % go == 0 and (out_block // go) * gi % in_block == 0
        count = (out_block // go) * gi // in_block
    else:
        fits = go % out_block == 0 and gi % in_block == 0
        count = gi // in_block
    if not fits or count < 1:
        return None
    last = int(group_chunk_start(blocks(c_out, out_block) - 1, c_in, c_out, groups, in_block, out_block))
    return count if last + count <= blocks(c_in, in_block) else None
