"""Checked decoding shared by the ge and domi readers: descriptors, constants, names.

Everything read from a file is untrusted: shapes must be static and non-negative, codes
known, references resolvable, and every constant's bytes must lie inside its inline data or
inside WEIGHTS_DATA with exactly the size its dtype and shape require (ceil(n / 2) bytes for an
``int4`` descriptor, unpacked to int8 values). Each violation is
one :class:`ModelFileError` naming the file, the op and the fault.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from compiler.errors import ModelFileError
from compiler.ir.types import DType
from schemas.cann.int4 import unpack_int4
from schemas.cann.om_graph import OmOp, TensorDesc, split_ref

__all__ = ["Decoder", "MAX_RANK"]

MAX_RANK = 16


class Decoder:
    """Decoding context of one file: its name (for errors) and its WEIGHTS_DATA partition."""

    def __init__(self, source: str, weights: bytes | None) -> None:
        self.source = source
        self.weights = weights
        self.outputs: dict[str, list[TensorDesc]] = {}  # op name -> output descriptors so far

    def fail(self, why: str) -> ModelFileError:
        """A ModelFileError naming the file."""
        return ModelFileError(f"{self.source}: corrupt .om model: {why}")

    def shape(self, dims: Sequence[int], where: str) -> tuple[int, ...]:
        """A static shape; negative (dynamic) or absurd dims are errors."""
        if len(dims) > MAX_RANK:
            raise self.fail(f"{where}: rank {len(dims)} exceeds {MAX_RANK}")
        out = tuple(int(d) for d in dims)
        if any(d < 0 for d in out):
            raise self.fail(f"{where}: shape {list(out)} has a dynamic or negative dimension")
        if any(d >= 2**40 for d in out):
            raise self.fail(f"{where}: shape {list(out)} is implausibly large")
        return out

    def desc(self, dtype: DType | None, code: int, dims: Sequence[int], fmt: str, where: str) -> TensorDesc:
        """A descriptor from a decoded dtype (None: the code is unknown), dims and format name."""
        if dtype is None:
            raise self.fail(f"{where}: unknown data type code {code}")
        return TensorDesc(dtype, self.shape(dims, where), fmt or "ND")

    def array(self, d: TensorDesc, inline: bytes, offset: int, size: int | None, where: str) -> np.ndarray:
        """A constant's array: inline bytes if any, else ``size`` bytes at ``offset`` of WEIGHTS_DATA."""
        need = d.nbytes if d.int4 else math.prod(d.shape) * d.dtype.itemsize
        what = f"int4{list(d.shape)}" if d.int4 else f"{d.dtype.short}{list(d.shape)}"
        if d.dtype is DType.STRING:
            raise self.fail(f"{where}: string constants are not supported")
        if inline:
            if len(inline) != need:
                raise self.fail(f"{where}: {len(inline)} inline bytes for {what} ({need} bytes)")
            raw = inline
        elif need == 0:
            raw = b""
        else:
            if size is not None and size != need:
                raise self.fail(f"{where}: weight_size {size} != {need} bytes of {what}")
            blob = self.weights
            if blob is None:
                raise self.fail(
                    f"{where}: its weights are in WEIGHTS_DATA, but the file has no such partition"
                )
            if offset < 0 or offset + need > len(blob):
                raise self.fail(
                    f"{where}: weights at offset {offset} (+{need} bytes) lie outside "
                    f"WEIGHTS_DATA ({len(blob)} bytes)"
                )
            raw = blob[offset : offset + need]
        if d.int4:
            return unpack_int4(bytes(raw), d.shape)
        little = d.dtype.numpy.newbyteorder("<")  # bf16 is stored as its uint16 bit pattern
        return np.frombuffer(raw, dtype=little).reshape(d.shape).astype(d.dtype.numpy)

    def name(self, name: str, kind: str) -> str:
        """A new op name: non-empty and unique."""
        if not name:
            raise self.fail(f"a {kind or 'typeless'} op has no name")
        if name in self.outputs:
            raise self.fail(f"op name {name!r} is used twice")
        return name

    def input(self, r: str, where: str) -> str:
        """A data input reference that names an earlier op's existing output ("" stays "")."""
        if not r:
            return ""
        try:
            src, idx = split_ref(r)
        except ValueError:
            raise self.fail(f"{where}: malformed input reference {r!r}") from None
        outs = self.outputs.get(src)
        if outs is None:
            raise self.fail(f"{where}: input {r!r} names no earlier op")
        if not 0 <= idx < len(outs):
            raise self.fail(f"{where}: input {r!r}: op {src!r} has {len(outs)} output(s)")
        return r

    def add(self, op: OmOp) -> OmOp:
        """Record an op's outputs so that later ops may reference them."""
        self.outputs[op.name] = list(op.outputs)
        return op
