"""RandomUniformLike / RandomNormalLike: Kiln's counter-based generator as one elementwise TE stage.

Element i (row-major index of the output) gets bits(i, s) = mix(mix(2 i + s + k0) ^ k1), 24-bit
uniforms v = (bits >> 8) · 2^-24, and y = low + (high - low) v(i, 0), or Box-Muller
y = mean + scale · sqrt(-2 ln(1 - v(i, 0))) · cos(2π v(i, 1)), all in float32 and cast to the output
type; the hash, the keys of the seed and the default seed are :mod:`compiler.ops.random`'s, so the
library and Kiln's interpreter give the same values. The stage is injective (no reduction): the CPU
gets the generic schedule, CUDA dlight's thread binding.
"""

from __future__ import annotations

from typing import Any

from backends.tvm.lowering.table import LowerContext, lowers
from compiler.ir.graph import Node
from compiler.ops.random import MIX_MULTIPLIERS, seed_keys

__all__ = ["random_te"]


def _mix(x: Any) -> Any:
    """mix(x) on a uint64 PrimExpr holding a 32-bit value, each product reduced mod 2^32 by a mask:
    no operation overflows, so TVM's simplifier (which folds wrapping uint32 arithmetic wrongly,
    e.g. mix(2 i + 0xe2584d73) to a constant) reasons about exact integers."""
    from tvm import tirx

    def u(v: int) -> Any:
        return tirx.const(v, "uint64")

    mask = u(0xFFFFFFFF)
    x = ((x ^ (x >> u(16))) * u(MIX_MULTIPLIERS[0])) & mask
    x = ((x ^ (x >> u(15))) * u(MIX_MULTIPLIERS[1])) & mask
    return x ^ (x >> u(16))


def random_te(shape: tuple[int, ...], dtype: str, normal: bool, a: Any) -> Any:
    """The TE output of a random op of ``shape`` / ``dtype`` with attributes ``a``."""
    import math

    from tvm import te, tirx

    k0, k1 = seed_keys(a.seed)

    def uniform(i: Any, stream: int) -> Any:
        c = (i * tirx.const(2, "uint64") + tirx.const(stream + k0, "uint64")) & tirx.const(
            0xFFFFFFFF, "uint64"
        )
        bits = _mix(_mix(c) ^ tirx.const(k1, "uint64"))
        return tirx.Cast("float32", bits >> tirx.const(8, "uint64")) * tirx.const(2.0**-24, "float32")

    def f32(v: float) -> Any:
        return tirx.const(v, "float32")

    def body(*idx: Any) -> Any:
        flat: Any = tirx.const(0, "int64")
        for d, j in zip(shape, idx, strict=True):
            flat = flat * tirx.const(d, "int64") + tirx.Cast("int64", j)
        i = tirx.Cast("uint64", flat) & tirx.const(0xFFFFFFFF, "uint64")
        v0 = uniform(i, 0)
        if normal:
            r = tirx.sqrt(f32(-2.0) * tirx.log(f32(1.0) - v0))
            y = f32(a.mean) + f32(a.scale) * (r * tirx.cos(f32(2.0 * math.pi) * uniform(i, 1)))
        else:
            y = f32(a.low) + (f32(a.high) - f32(a.low)) * v0
        return y if dtype == "float32" else tirx.Cast(dtype, y)

    return te.compute(shape, body, name="kiln_random")


@lowers("RandomUniformLike", "RandomNormalLike")
def _random(ctx: LowerContext, node: Node, ins: list[Any]) -> list[Any]:
    shape, dtype = ctx.out_shape(node), ctx.out_type(node).dtype.numpy.name
    normal = node.op == "RandomNormalLike"
    name = "kiln_random_normal" if normal else "kiln_random_uniform"
    return [ctx.bb.emit_te(lambda: random_te(shape, dtype, normal, node.attrs), primfunc_name_hint=name)]
