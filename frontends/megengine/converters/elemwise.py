"""Elemwise, ElemwiseMultiType and PowC.

Elemwise modes come from :data:`elemwise_modes.MODES`. The quantized
ElemwiseMultiType modes (``QADD``, ``QFUSE_ADD_RELU``, ``QH_SWISH``...) are the
float mode without the ``Q``, computed on dequantized values and rounded to the
declared output dtype by the importer. PowC: y = x ** exp.
"""

from __future__ import annotations

from compiler.ir.graph import Value
from frontends.megengine.converter import OprContext, Var, converter
from frontends.megengine.converters.elemwise_modes import BOOL_MODES, MODES
from frontends.megengine.dtypes import FLOAT32, MgeDType
from frontends.megengine.enums import enum_name
from frontends.megengine.model import MgeOpr
from schemas.megengine.generated import params_generated as P

__all__ = ["multi_type_mode"]


def _mode(opr: MgeOpr) -> str:
    for prm in opr.params:
        if prm.member == "param_Elemwise":
            return enum_name(P.ElemwiseMode, prm.read(P.Elemwise).Mode())
    return "RELU"  # the param's default; a missing param is reported when converting


def multi_type_mode(opr: MgeOpr) -> str | None:
    """The Elemwise mode an ElemwiseMultiType mode computes, or None when it has no float form."""
    for prm in opr.params:
        if prm.member == "param_ElemwiseMultiType":
            name = enum_name(P.ElemwiseMultiTypeMode, prm.read(P.ElemwiseMultiType).Mode())
            if name in BOOL_MODES:
                return name
            base = name[1:] if name.startswith("Q") else ""
            return base if base in MODES else None
    return None


def _apply(ctx: OprContext, mode: str) -> Value:
    arity, build = MODES[mode]
    ctx.need_inputs(arity, arity)
    return build(ctx, [ctx.value(i) for i in range(arity)])


def _default_dtype(ctx: OprContext, mode: str, y: Value) -> MgeDType:
    if mode in BOOL_MODES:
        return MgeDType("Bool")
    x = ctx.dtype(0)
    if not x.is_quantized and y.type.dtype.is_float and not (x.kiln and x.kiln.is_float):
        return FLOAT32  # TRUE_DIV of integers
    return x


@converter("Elemwise", check=lambda opr: None if _mode(opr) in MODES else f"Elemwise {_mode(opr)}")
def elemwise(ctx: OprContext) -> list[Var | None]:
    """y = mode(inputs) with numpy broadcasting."""
    mode = enum_name(P.ElemwiseMode, ctx.param(P.Elemwise).Mode())
    y = _apply(ctx, mode)
    return [Var(y, ctx.out_dtype(_default_dtype(ctx, mode, y)))]


def _multi_check(opr: MgeOpr) -> str | None:
    if multi_type_mode(opr) is not None:
        return None
    for prm in opr.params:
        if prm.member == "param_ElemwiseMultiType":
            mode = enum_name(P.ElemwiseMultiTypeMode, prm.read(P.ElemwiseMultiType).Mode())
            return f"ElemwiseMultiType {mode}"
    return "ElemwiseMultiType"


@converter("ElemwiseMultiType", check=_multi_check)
def elemwise_multi_type(ctx: OprContext) -> list[Var | None]:
    """A quantized elementwise op: the float mode, rounded to the output dtype."""
    mode = multi_type_mode(ctx.opr)
    if mode is None:
        raise ctx.fail("has no ElemwiseMultiType param with a supported mode")
    y = _apply(ctx, mode)
    if mode in BOOL_MODES:
        return [Var(y, MgeDType("Bool"))]
    if ctx.opr.output_dtype is None:
        raise ctx.fail(f"quantized mode Q{mode} needs an output dtype")
    return [Var(y, ctx.opr.output_dtype)]


@converter("PowC")
def pow_c(ctx: OprContext) -> list[Var | None]:
    """y = x ** exp for a constant exponent."""
    ctx.need_inputs(1, 1)
    x = ctx.value(0)
    if not x.type.dtype.is_float:
        raise ctx.fail(f"PowC of {x.type.dtype.short} values is not supported")
    e = float(ctx.param(P.PowC).Exp())
    y = ctx.emit1("Pow", [x, ctx.scalar_like(x, e, "exp")])
    return [Var(y, ctx.out_dtype(ctx.dtype(0)))]
