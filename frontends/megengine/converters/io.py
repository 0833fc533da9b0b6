"""Graph inputs, constants and dtype conversion.

* Host2DeviceCopy: a graph input named after its tensor (shape overridable by
  ``input_shapes``; a quantized input is fed as integers and dequantized).
* ImmutableTensor and the device-tensor holders: constants (quantized ones as
  integer storage + DequantizeLinear).
* TypeCvt: Cast between plain types; to a quantized type the float value is
  rounded onto the target grid (by the importer's requantize step); from a
  quantized type the value is already float.
"""

from __future__ import annotations

from compiler.errors import InputShapeError
from compiler.ir.graph import GraphError
from compiler.ir.types import DType, TensorType
from frontends.megengine.converter import OprContext, Var, converter
from frontends.megengine.dtypes import MgeDType, dtype_from_code
from frontends.megengine.fbs_fields import read_dtype
from frontends.megengine.model import MgeTensor
from frontends.megengine.quant import constant_of, dequantize
from schemas.megengine.generated import dtype_generated as fb_dtype
from schemas.megengine.generated import params_generated as P

__all__: list[str] = []


def _input_shape(ctx: OprContext, name: str, declared: tuple[int, ...]) -> tuple[int, ...]:
    want = ctx.input_shapes.get(name)
    if want is None:
        return declared
    shape = tuple(int(d) for d in want)
    if len(shape) != len(declared):
        given, dumped = "x".join(map(str, shape)), "x".join(map(str, declared))
        raise InputShapeError(
            f"{ctx.source}: input {name!r}: --input-shape {given} has rank {len(shape)}, the model "
            f"declares {dumped} (rank {len(declared)})"
        )
    return shape


@converter("Host2DeviceCopy", requantize=False)
def host_to_device(ctx: OprContext) -> list[Var | None]:
    """A graph input."""
    ctx.need_inputs(0, 0)
    if not ctx.opr.tensors:
        raise ctx.fail("declares no input tensor (name, shape and dtype)")
    t = ctx.opr.tensors[0]
    name = t.name or ctx.opr.name or f"input{ctx.opr.index}"
    storage = t.dtype.storage
    if storage is None:
        raise ctx.fail(f"input dtype {t.dtype.name} is not supported")
    shape = _input_shape(ctx, name, t.shape)
    try:
        v = ctx.graph.add_input(name, TensorType(DType.from_numpy(storage), shape))
    except GraphError as exc:
        raise ctx.fail(str(exc)) from None
    if t.dtype.is_quantized:
        v = dequantize(ctx, v, t.dtype)
    return [Var(v, t.dtype)]


def _constant(ctx: OprContext, k: int, t: MgeTensor) -> Var:
    if t.dtype.storage is None:
        raise ctx.fail(f"constant {k} has dtype {t.dtype.name}, which Kiln does not support")
    if t.value is None:
        raise ctx.fail(f"constant {k} has no value")
    return Var(constant_of(ctx, t.value, t.dtype, f"value{k}"), t.dtype)


@converter(
    "ImmutableTensor",
    "SharedDeviceTensor",
    "SharedDeviceTensorWithFormat",
    "VolatileSharedDeviceTensor",
    "MultipleDeviceTensorHolder",
    "MultipleDeviceTensorWithFormatHolder",
    requantize=False,
)
def constants(ctx: OprContext) -> list[Var | None]:
    """One constant per stored tensor."""
    ctx.need_inputs(0, 0)
    if not ctx.opr.tensors:
        raise ctx.fail("stores no tensor")
    return [_constant(ctx, k, t) for k, t in enumerate(ctx.opr.tensors)]


def _target(ctx: OprContext) -> MgeDType:
    """The TypeCvt target: the dtype table (with quantization params) or the plain param.DType."""
    for p in ctx.opr.params:
        if p.member == "DType":
            dt = read_dtype(p.read(fb_dtype.DType))
            assert dt is not None
            return dt
        if p.member == "param_DType":
            return dtype_from_code(int(p.read(P.DType).Dtype()))
    raise ctx.fail("carries no target dtype")


@converter("TypeCvt")
def type_cvt(ctx: OprContext) -> list[Var | None]:
    """y = x converted to the target dtype."""
    ctx.need_inputs(1, 1)
    target = _target(ctx)
    x = ctx.value(0)
    want = target.kiln
    if want is None:
        raise ctx.fail(f"target dtype {target.name} is not supported")
    if x.type.dtype != want:
        x = ctx.emit1("Cast", [x], {"to": int(want)}, final=True)
    return [Var(x, target)]
