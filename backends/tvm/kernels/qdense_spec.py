"""The int8 dense kernel spec (kiln::QGemm on a constant weight) and its compile-time constant packing.

Math (exact integers; the epilogue of :mod:`compiler.ops.qgemm`). The kernel multiplies the
activation shifted by ``s`` (``spec.shift``) so that it has the dot instruction's signedness (u8 for
VNNI/pmaddwd/NEON widening: ``s = 0`` for uint8 x, ``128`` for int8 x; s8 for SDOT: ``s = -128`` for
uint8 x, ``0`` for int8 x)::

    acc[m, n] = sum_k (x[m, k] - x_zero) * W[k, n] + bias_q[n]
              = sum_k (x[m, k] + s) * W[k, n] + fbias[n]
    fbias[n]  = bias_q[n] - (x_zero + s) * sum_k W[k, n]

``fbias`` (:func:`pack_qdense_bias`) is computed here, once, from the constant weight. int32 sums
wrap, so the result is exact whenever the true ``acc`` fits int32 (the reference's own condition).
Then ``y = float32(acc) * m[n]`` (float out) or ``clip(rint(float64(acc) * M[n]) + y_zero, qmin, qmax)``.

Layouts (``B = spec.block`` output columns per chunk, ``Kp = ceil(K/4)*4``, ``Mp`` = M rounded up to
the row tile):

* activation ``[M, K]`` (leading batch dims flattened by the caller); the kernel copies it into a
  ``[Mp, Kp]`` stage ``pad`` (shifted, zero padded) only when ``s != 0``, ``Kp != K`` or ``Mp != M``;
* weight ``[ceil(N/B), Kp/4, B, 4]`` int8 (int16 on AVX2), ``Wp[c, g, j, p] = W[4g + p, c*B + j]``
  (zero padded): the ``4 * B`` values one dot step reads are contiguous (the VNNI/SDOT operand layout of
  :mod:`backends.tvm.kernels.x86_int8_dot` and :mod:`backends.tvm.kernels.arm_int8_dot`);
* fbias int32 and multiplier (float64 ``M`` for an integer out, float32 ``m`` for float out)
  ``[ceil(N/B) * B]``; output ``[M, N]``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from backends.tvm.kernels.kernel import spec_key
from compiler.ops.qconv import qconv_multiplier, qconv_requant_multiplier

__all__ = ["QDenseSpec", "pack_qdense_weight", "pack_qdense_bias", "pack_qdense_multiplier", "DOT_SIGNED"]

# dot kind -> whether the instruction's activation operand is signed (then s maps x to int8)
DOT_SIGNED = {"vnni": False, "avx2": False, "neon": False, "plain": False, "sdot": True}
QUANT_RANGES = {"uint8": (0, 255), "int8": (-128, 127)}


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class QDenseSpec:
    """One int8 dense layer ``[M, K] x [K, N] -> requantize -> [M, N]`` (see the module docstring)."""

    m: int
    k: int
    n: int
    kind: str = "vnni"  # vnni | avx2 | sdot | neon | plain
    block: int = 16
    row_tile: int = 4
    in_dtype: str = "uint8"  # uint8 | int8
    x_zero: int = 0
    out_dtype: str = "uint8"  # uint8 | int8 | float32
    y_zero: int = 0

    @property
    def shift(self) -> int:
        """``s``: what the kernel adds to the activation (module docstring)."""
        if DOT_SIGNED[self.kind]:
            return -128 if self.in_dtype == "uint8" else 0
        return 128 if self.in_dtype == "int8" else 0

    @property
    def dot_dtype(self) -> str:
        """The dtype of the activation operand the dot instruction reads."""
        return "int8" if DOT_SIGNED[self.kind] else "uint8"

    @property
    def weight_dtype(self) -> str:
        """int8, or int16 for ``avx2``: its ``pmaddwd`` multiplies int16, and widening the constant
        weight once here saves a ``vpmovsxbw`` per weight vector in the inner loop."""
        return "int16" if self.kind == "avx2" else "int8"

    @property
    def chunks(self) -> int:
        """``ceil(N / B)``."""
        return _ceil_div(self.n, self.block)

    @property
    def k_groups(self) -> int:
        """``Kp / 4``."""
        return _ceil_div(self.k, 4)

    @property
    def rows(self) -> int:
        """``Mp``: M rounded up to the row tile."""
        return _ceil_div(self.m, self.row_tile) * self.row_tile

    @property
    def needs_pad(self) -> bool:
        """Whether the kernel copies x into the shifted, padded ``[Mp, Kp]`` stage."""
        return self.shift != 0 or self.k % 4 != 0 or self.rows != self.m

    @property
    def weight_shape(self) -> tuple[int, int, int, int]:
        """``[ceil(N/B), Kp/4, B, 4]``."""
        return (self.chunks, self.k_groups, self.block, 4)

    @property
    def column_shape(self) -> tuple[int]:
        """The packed per-column operands (fbias, multiplier): ``[ceil(N/B) * B]``."""
        return (self.chunks * self.block,)

    @property
    def mult_dtype(self) -> str:
        """float64 ``M`` for an integer output, float32 ``m`` for float out."""
        return "float32" if self.out_dtype == "float32" else "float64"

    @property
    def out_shape(self) -> tuple[int, int]:
        """``[M, N]``."""
        return (self.m, self.n)

    def key(self) -> str:
        """A short deterministic hash of all spec fields."""
        return spec_key(self)

    def validate(self) -> None:
        """Raise ValueError for specs the kernel does not build."""
        if self.kind not in DOT_SIGNED:
            raise ValueError(f"unknown int8 dot kind {self.kind!r}")
        if min(self.m, self.k, self.n, self.block, self.row_tile) < 1:
            raise ValueError(f"int8 dense sizes must be positive: {self}")
        if self.kind != "plain" and self.block % 4:
            raise ValueError(f"{self.kind}: block {self.block} must be a multiple of 4")
        if self.in_dtype not in QUANT_RANGES or self.out_dtype not in (*QUANT_RANGES, "float32"):
            raise ValueError(
                f"in {self.in_dtype} / out {self.out_dtype}: expected uint8/int8 in, uint8/int8/float32 out"
            )
        lo, hi = QUANT_RANGES[self.in_dtype]
        if not lo <= self.x_zero <= hi:
            raise ValueError(f"x_zero {self.x_zero} outside {self.in_dtype}")


def pack_qdense_weight(w_kn: np.ndarray, spec: QDenseSpec) -> np.ndarray:
    """int8 ``W [K, N]`` -> ``Wp [ceil(N/B), Kp/4, B, 4]``, ``Wp[c, g, j, p] = W[4g + p, c*B + j]``
    (``spec.weight_dtype``: the AVX2 path stores the int8 values widened to int16)."""
    w = np.asarray(w_kn)
    if w.dtype != np.int8 or w.shape != (spec.k, spec.n):
        raise ValueError(f"int8 dense weight must be int8 {(spec.k, spec.n)}, got {w.dtype} {w.shape}")
    full = np.zeros((spec.k_groups * 4, spec.chunks * spec.block), np.int8)
    full[: spec.k, : spec.n] = w
    packed = full.reshape(spec.k_groups, 4, spec.chunks, spec.block)  # g, p, c, j
    return np.ascontiguousarray(packed.transpose(2, 0, 3, 1)).astype(spec.weight_dtype)


def pack_qdense_bias(bias_q: np.ndarray | None, w_kn: np.ndarray, spec: QDenseSpec) -> np.ndarray:
    """``fbias[n] = bias_q[n] - (x_zero + s) * sum_k W[k, n]`` as int32 ``[ceil(N/B) * B]`` (zero padded)."""
    colsum = np.asarray(w_kn).astype(np.int64).sum(axis=0)
    folded = -(int(spec.x_zero) + spec.shift) * colsum
    if bias_q is not None:
        folded = folded + np.asarray(bias_q).astype(np.int64).reshape(-1)
    info = np.iinfo(np.int32)
    if folded.min(initial=0) < info.min or folded.max(initial=0) > info.max:
        raise ValueError("folded int8 dense bias overflows int32")
    full = np.zeros(spec.column_shape, np.int32)
    full[: spec.n] = folded
    return full


def pack_qdense_multiplier(
    x_scale: float, w_scales: tuple[float, ...], y_scale: float, spec: QDenseSpec
) -> np.ndarray:
    """Per column (zero padded): float64 ``M`` (integer out) or float32 ``m`` (float out), as the op."""
    if spec.out_dtype == "float32":
        mult = qconv_multiplier(x_scale, w_scales).astype(np.float64)
    else:
        mult = qconv_requant_multiplier(x_scale, w_scales, y_scale)
    full = np.zeros(spec.column_shape, spec.mult_dtype)
    full[: spec.n] = np.broadcast_to(mult.reshape(-1), (spec.n,))
    return full
