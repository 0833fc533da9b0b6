"""Reading op inputs: optional inputs of references, constant int inputs in inference.

Shared by the data-movement families (tensor_shape, tensor_data, tensor_index,
cast, logic), whose shapes often come from the *value* of an input.
"""

from __future__ import annotations

import numpy as np

from compiler.ops.registry import InferContext
from compiler.ops.shapes import dims_of_const

__all__ = ["arg", "first", "int_const", "const_len"]


def arg(ins: list[np.ndarray | None], i: int) -> np.ndarray | None:
    """Optional input ``i`` of a reference call; None when absent."""
    return ins[i] if i < len(ins) else None


def first(ins: list[np.ndarray | None]) -> np.ndarray:
    """Required input 0 of a reference call."""
    x = ins[0] if ins else None
    if x is None:
        raise ValueError("input 0 is missing")
    return np.asarray(x)


def int_const(ctx: InferContext, i: int, what: str) -> list[int] | None:
    """Input ``i`` as a list of ints if it is a constant (0-d or 1-d integer), else None."""
    c = ctx.const(i) if ctx.has(i) else None
    if c is None:
        return None
    try:
        return dims_of_const(c, what)
    except ValueError as exc:
        raise ctx.fail(str(exc)) from None


def const_len(ctx: InferContext, i: int) -> int | None:
    """The static length of 1-D input ``i`` (for a non-constant shape/axes input), else None."""
    s = ctx.type(i).shape if ctx.has(i) else None
    return s[0] if s is not None and len(s) == 1 and isinstance(s[0], int) else None
