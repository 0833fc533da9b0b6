"""Import-time folding of small constant computations, so static shapes are known.

A node folds into constants when it is pure and deterministic and either

* it is ``Shape`` (or ``Size``) of a value whose shape is static, or
* every input is a constant and every output is static with at most
  :data:`FOLD_MAX_ELEMENTS` elements (shape arithmetic, scales, small tables).

Big float weight computations are left alone (a later pass folds those), and so
are QuantizeLinear / DequantizeLinear, whose structure the quantizer relies on.
The values come from the op registry's numpy reference, so a folded constant is
exactly what the interpreter would compute.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import numpy as np

from compiler.ir.graph import Value
from compiler.ir.types import TensorType
from compiler.ops.registry import OpDef

__all__ = ["FOLD_MAX_ELEMENTS", "NEVER_FOLD", "fold"]

logger = logging.getLogger(__name__)

FOLD_MAX_ELEMENTS = 4096
"""The largest output (in elements) folded at import time."""

NEVER_FOLD = frozenset({"QuantizeLinear", "DequantizeLinear"})
"""Ops kept as nodes even when all their inputs are constant."""


def _shape_fold(opdef: OpDef, attrs: Any, inputs: Sequence[Value | None]) -> list[np.ndarray] | None:
    x = inputs[0] if inputs else None
    if x is None or not x.type.is_static:
        return None
    shape = x.type.static_shape
    if opdef.name == "Size":
        return [np.asarray(int(np.prod(shape, dtype=np.int64)), dtype=np.int64)]
    start = int(getattr(attrs, "start", 0) or 0)
    end = getattr(attrs, "end", None)
    dims = shape[start:] if end is None else shape[start : int(end)]
    return [np.asarray(dims, dtype=np.int64)]


def fold(
    opdef: OpDef, attrs: Any, inputs: Sequence[Value | None], types: Sequence[TensorType], where: str
) -> list[np.ndarray] | None:
    """The output arrays if the node folds (see the module docstring), else None.

    Raises:
        ValueError: the reference returned arrays that contradict the inferred types.
    """
    if opdef.domain or not opdef.pure or not opdef.deterministic or opdef.name in NEVER_FOLD:
        return None
    if not all(t.is_static and t.numel <= FOLD_MAX_ELEMENTS for t in types):
        return None
    if opdef.name in ("Shape", "Size"):
        outs = _shape_fold(opdef, attrs, inputs)
    else:
        args = [None if v is None else v.const for v in inputs]
        if any(a is None for a, v in zip(args, inputs, strict=True) if v is not None):
            return None
        try:
            with np.errstate(all="ignore"):  # inf / nan results are IEEE's, as every runtime's
                outs = opdef.reference(args, attrs, len(types))
        except Exception as exc:  # noqa: BLE001 - an op that fails on constants stays a node
            logger.warning("%s: not folded, its reference failed on constant inputs: %s", where, exc)
            return None
    if outs is None:
        return None
    result = []
    for arr, t in zip(outs, types, strict=True):
        a = np.asarray(arr)
        if a.dtype != t.dtype.numpy:
            a = a.astype(t.dtype.numpy)
        if tuple(a.shape) != t.static_shape:
            raise ValueError(f"{where}: reference gave shape {a.shape}, inference said {t}")
        result.append(a)
    return result
