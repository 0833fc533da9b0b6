"""Element-type conversion and inference-mode identity: Cast, CastLike and Dropout.

Cast follows ONNX: float to integer truncates toward zero, anything to bool is
``x != 0``, and float to bfloat16 rounds to nearest even. The IR keeps
bfloat16 as raw uint16 bit patterns, so a reference cannot tell a bfloat16
*input* from a uint16 one: casts *from* bfloat16 (and CastLike *to* it) run as
uint16 casts. Casts to or from strings are not supported (inference fails).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from compiler.ir.types import DType, TensorType
from compiler.ops.inputs import arg, first
from compiler.ops.registry import InferContext, Layout, OpDef, register

__all__ = ["CastAttrs", "CastLikeAttrs", "DropoutAttrs", "cast_array"]


@dataclass(frozen=True)
class CastAttrs:
    """Cast to the ONNX dtype code ``to`` (required); ``saturate`` only matters for float8 targets."""

    to: int
    saturate: int = 1


@dataclass(frozen=True)
class CastLikeAttrs:
    """CastLike: cast input 0 to the element type of input 1."""

    saturate: int = 1


def _to_bfloat16_bits(x: np.ndarray) -> np.ndarray:
    """float -> bfloat16 bit patterns (uint16), rounding to nearest even; NaN stays NaN."""
    f = np.ascontiguousarray(x, dtype=np.float32)
    bits = f.view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    return np.where(np.isnan(f), np.uint16(0x7FC0), rounded)


def cast_array(x: np.ndarray, to: DType) -> np.ndarray:
    """ONNX Cast of ``x`` to ``to`` (bfloat16 results are uint16 bit patterns)."""
    x = np.asarray(x)
    if to is DType.BFLOAT16:
        return _to_bfloat16_bits(x.astype(np.float32))
    with np.errstate(invalid="ignore", over="ignore"):
        if to is DType.BOOL:
            return x != 0
        if x.dtype.kind == "f" and to.is_integer:
            return np.trunc(x).astype(to.numpy)
        return x.astype(to.numpy)


def _target(ctx: InferContext, code: int) -> DType:
    try:
        to = DType(code)
    except ValueError:
        raise ctx.fail(f"unsupported target dtype code {code}") from None
    if DType.STRING in (to, ctx.type(0).dtype):
        raise ctx.fail("casts to or from string are not supported")
    return to


def _infer_cast(ctx: InferContext) -> list[TensorType]:
    return [TensorType(_target(ctx, ctx.attrs.to), ctx.type(0).shape)]


register(
    OpDef(
        "Cast",
        _infer_cast,
        lambda ins, a, n: [cast_array(first(ins), DType(a.to))],
        CastAttrs,
        layout=Layout.AGNOSTIC,
        doc="y = x converted to element type `to` (float->int truncates toward zero)",
    )
)


def _infer_cast_like(ctx: InferContext) -> list[TensorType]:
    return [TensorType(_target(ctx, int(ctx.type(1).dtype)), ctx.type(0).shape)]


register(
    OpDef(
        "CastLike",
        _infer_cast_like,
        lambda ins, a, n: [cast_array(first(ins), DType.from_numpy(np.asarray(arg(ins, 1)).dtype))],
        CastLikeAttrs,
        inputs=(2, 2),
        layout=Layout.AGNOSTIC,
        doc="y = Cast(x, to=dtype(target_type))",
    )
)


# ---------------------------------------------------------------- Dropout
@dataclass(frozen=True)
class DropoutAttrs:
    """Dropout's ``seed`` (unused: Kiln evaluates inference mode only)."""

    seed: int | None = None


def _infer_dropout(ctx: InferContext) -> list[TensorType]:
    t = ctx.type(0)
    if ctx.has(2):
        mode = ctx.type(2)
        if mode.dtype != DType.BOOL:
            raise ctx.fail(f"training_mode must be bool, got {mode.dtype.short}")
    if ctx.has(1) and not ctx.type(1).dtype.is_float:
        raise ctx.fail(f"ratio must be a float, got {ctx.type(1).dtype.short}")
    flag = ctx.const(2) if ctx.has(2) else None
    if flag is not None and bool(np.asarray(flag).reshape(-1)[0]):
        ratio = ctx.const(1) if ctx.has(1) else np.float32(0.5)
        if ratio is None or float(np.asarray(ratio).reshape(-1)[0]) != 0.0:
            raise ctx.fail("training-mode Dropout is random and is not supported")
    return [t, TensorType(DType.BOOL, t.shape)][: ctx.num_outputs]


def _ref_dropout(ins: list[np.ndarray | None], a: DropoutAttrs, n: int) -> list[np.ndarray]:
    x = first(ins)
    ratio, mode = arg(ins, 1), arg(ins, 2)
    if mode is not None and bool(np.asarray(mode)) and (ratio is None or float(np.asarray(ratio)) != 0.0):
        raise ValueError("training-mode Dropout is random and is not supported")
    return [x.copy(), np.ones(x.shape, dtype=bool)][:n]


register(
    OpDef(
        "Dropout",
        _infer_dropout,
        _ref_dropout,
        DropoutAttrs,
        inputs=(1, 3),
        outputs=(1, 2),
        layout=Layout.AGNOSTIC,
        doc=(
            "y = x, mask = all true (inference mode). Marked deterministic because Kiln only evaluates"
            " inference semantics; training_mode=true with a non-zero ratio is rejected."
        ),
    )
)
