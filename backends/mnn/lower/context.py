"""The state of one Graph -> MNN lowering: tensors per layout, constants, emitted ops.

Lowering functions (one module per op family) read Kiln values through
:meth:`LowerContext.tensor`, which hands out the MNN tensor of a value in the layout the
consumer needs (emitting the Const op of a constant, or a ConvertTensor, on first use),
declare their outputs with :meth:`LowerContext.define` and append ops with
:meth:`LowerContext.emit`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from backends.mnn.layout import Format
from backends.mnn.model import MnnNet, MnnOp, Table
from backends.mnn.options import MnnOptions
from backends.mnn.tensors import TensorTable, UniqueNames
from backends.mnn.weights import WeightStorage
from compiler.ir.graph import Graph, Node, Value, array_digest
from compiler.ir.types import DType
from schemas.mnn.external import ExternalData
from schemas.mnn.schema import fb

__all__ = ["LowerContext", "blob_table", "mnn_dtype", "EXTERNAL_BLOB_MIN"]

EXTERNAL_BLOB_MIN = 1024  # constants with more elements go to the side file (as MNN's converter does)

_MNN_DTYPES = {
    DType.FLOAT32: fb.DataType.DT_FLOAT,
    DType.FLOAT64: fb.DataType.DT_FLOAT,
    DType.FLOAT16: fb.DataType.DT_FLOAT,
    DType.INT32: fb.DataType.DT_INT32,
    DType.INT64: fb.DataType.DT_INT32,
    DType.INT16: fb.DataType.DT_INT32,
    DType.UINT16: fb.DataType.DT_INT32,
    DType.BOOL: fb.DataType.DT_INT32,
    DType.INT8: fb.DataType.DT_INT8,
    DType.UINT8: fb.DataType.DT_UINT8,
}


def mnn_dtype(dtype: DType) -> int | None:
    """MNN's DataType for a Kiln element type (MNN has no 64-bit or fp16 tensors), or None."""
    return _MNN_DTYPES.get(dtype)


def blob_table(array: np.ndarray, external: ExternalData | None = None) -> Table:
    """The ``Blob`` of a constant (int64/bool stored as int32, floats as float32)."""
    a = np.asarray(array)
    dtype = mnn_dtype(DType.from_numpy(a.dtype)) if a.dtype != object else None
    if dtype is None:
        raise ValueError(f"MNN has no constant of type {a.dtype}")
    fields: dict[str, object] = {"dims": np.asarray(a.shape, np.int32)} if a.ndim else {}
    fields["dataFormat"] = Format.NCHW
    fields["dataType"] = dtype
    if dtype == fb.DataType.DT_FLOAT:
        data, key = a.astype(np.float32), "float32s"
    elif dtype == fb.DataType.DT_INT32:
        wide = a.astype(np.int64)
        if wide.size and (wide.min() < -(2**31) or wide.max() > 2**31 - 1):
            raise ValueError("an int64 constant does not fit MNN's int32 tensors")
        data, key = wide.astype(np.int32), "int32s"
    elif dtype == fb.DataType.DT_INT8:
        data, key = a.astype(np.int8), "int8s"
    else:
        data, key = a.astype(np.uint8), "uint8s"
    if external is not None and key == "float32s" and data.size > EXTERNAL_BLOB_MIN:
        fields["external"] = np.asarray(external.append(data), np.int64)
    else:
        fields[key] = data.reshape(-1)
    return Table("Blob", fields, force=frozenset({"dataFormat", "dataType"}))


class LowerContext:
    """Everything a lowering function needs; see the module docstring."""

    def __init__(
        self, graph: Graph, options: MnnOptions, plan: Mapping[int, WeightStorage] | None = None
    ) -> None:
        self.graph = graph
        self.options = options
        self.plan = dict(plan or {})
        self.int8_form = False  # QDQ pairs as tensor quantInfo only (backends.mnn.lower.quant)
        self.external = ExternalData() if options.external else None
        self.net = MnnNet(biz_code=options.biz_code)
        reserved = [nm for n in graph.nodes() for nm in n.output_names] + list(graph.output_names)
        self._names = TensorTable(reserved)
        self._op_names = UniqueNames()
        self._tensors: dict[tuple[int, int], dict[Format, int]] = {}
        self._native: dict[tuple[int, int], Format] = {}
        self._anon_consts: dict[str, int] = {}
        self._rows: dict[tuple[int, int], int] = {}

    # ----------------------------------------------------------------- values
    def const(self, value: Value | None) -> np.ndarray | None:
        """The array of a constant value, else None."""
        return None if value is None else value.const

    def shape(self, value: Value) -> tuple[int, ...]:
        """The static shape of a value."""
        return value.type.static_shape

    def format_of(self, value: Value) -> Format:
        """The layout a value is produced in (constants: NCHW)."""
        key = (value.node, value.port)
        if key not in self._native:
            self.tensor(value)
        return self._native[key]

    def tensor(self, value: Value, fmt: Format | None = None) -> int:
        """The tensor of ``value`` in layout ``fmt`` (default: as produced)."""
        key = (value.node, value.port)
        if key not in self._native:
            array = value.const
            if array is None:
                raise KeyError(f"value {value.name!r} is used before it is produced")
            idx = self._names.add(value.name, exact=True)
            self.emit("Const", value.name, [], [idx], blob_table(array, self.external))
            self._tensors[key] = {Format.NCHW: idx}
            self._native[key] = Format.NCHW
        have = self._tensors[key]
        want = self._native[key] if fmt is None else fmt
        if want not in have:
            src_fmt = self._native[key]
            have[want] = self.convert(have[src_fmt], src_fmt, want, value.name + want.suffix)
        return have[want]

    def define(self, value: Value, fmt: Format) -> int:
        """The output tensor of ``value`` (named as the Kiln value), produced in ``fmt``."""
        key = (value.node, value.port)
        if key in self._native:
            raise KeyError(f"value {value.name!r} is defined twice")
        idx = self._names.add(value.name, exact=True)
        self._tensors[key] = {fmt: idx}
        self._native[key] = fmt
        return idx

    def alias(self, value: Value, source: Value) -> None:
        """Let ``value`` share the tensors of ``source`` (Identity-like ops)."""
        skey = (source.node, source.port)
        self.format_of(source)
        key = (value.node, value.port)
        self._tensors[key] = self._tensors[skey]
        self._native[key] = self._native[skey]

    def rows_view(self, value: Value) -> int | None:
        """The [P, N, 1, 1] NC4HW4 tensor holding the same data as ``value`` ([..., N], P the
        product of the leading dims), if one was made: a fully connected conv's output, or its
        packed input."""
        return self._rows.get((value.node, value.port))

    def set_rows_view(self, value: Value, index: int) -> None:
        """Record ``index`` as the [P, N, 1, 1] NC4HW4 form of ``value`` (see :meth:`rows_view`)."""
        self._rows[(value.node, value.port)] = index

    def define_rows(self, value: Value, packed: int, name: str) -> None:
        """Define ``value`` from its [P, N, 1, 1] NC4HW4 form ``packed``: recorded as its rows view,
        and its NCHW tensor a ConvertTensor + Reshape of it (dropped from the net when unread)."""
        self.set_rows_view(value, packed)
        plain = self.convert(packed, Format.NC4HW4, Format.NCHW, f"{value.name}__rows{Format.NCHW.suffix}")
        dims = np.asarray(self.shape(value), np.int32)
        param = Table("Reshape", {"dims": dims, "dimType": Format.NCHW}, force=frozenset({"dimType"}))
        self.emit("Reshape", name, [plain], [self.define(value, Format.NCHW)], param)

    def temp(self, base: str) -> int:
        """A fresh intermediate tensor named after ``base``."""
        return self._names.add(base)

    def const_tensor(self, array: np.ndarray, base: str) -> int:
        """An NCHW constant not in the Kiln graph (shared between identical arrays)."""
        a = np.asarray(array)
        digest = array_digest(a)
        if digest not in self._anon_consts:
            idx = self._names.add(base)
            self.emit("Const", self.tensor_name(idx), [], [idx], blob_table(a, self.external))
            self._anon_consts[digest] = idx
        return self._anon_consts[digest]

    def tensor_name(self, index: int) -> str:
        """The name of a tensor."""
        return self._names.name(index)

    def rename(self, index: int, want: str, *, exact: bool = False) -> str:
        """Rename a tensor (graph outputs take their public names at the end)."""
        return self._names.rename(index, want, exact=exact)

    def storage(self, node: Node) -> WeightStorage:
        """How ``node``'s weights are stored: the plan's choice, else the options'."""
        return self.plan.get(node.id, WeightStorage.of(self.options))

    # --------------------------------------------------------------------- ops
    def emit(
        self, type_: str, name: str, inputs: Sequence[int], outputs: Sequence[int], param: Table | None
    ) -> None:
        """Append an op (its name is made unique)."""
        op = MnnOp(type_, self._op_names.take(name), list(inputs), list(outputs), param)
        self.net.ops.append(op)

    def convert(self, src: int, src_fmt: Format, dst_fmt: Format, name: str) -> int:
        """A ConvertTensor copy of tensor ``src`` in another layout."""
        out = self._names.add(name)
        info = Table(
            "TensorConvertInfo", {"source": src_fmt, "dest": dst_fmt}, force=frozenset({"source", "dest"})
        )
        self.emit("ConvertTensor", self.tensor_name(out), [src], [out], info)
        return out

    def op_name(self, node: Node) -> str:
        """The base name of the MNN ops lowered from ``node``."""
        return node.name or node.output_names[0]

    def finish(self) -> MnnNet:
        """The net with its tensor names filled in."""
        self.net.tensor_names = self._names.names()
        return self.net
