"""The MNN ``.mnn`` reader core: the FlatBuffer walk, tensors, and the table of op lifters."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from compiler.errors import InputShapeError, ModelFileError, UnsupportedOpsError
from compiler.ir.graph import Graph, Value
from compiler.ir.verifier import verify
from schemas.mnn.external import side_file
from schemas.mnn.generated import MNN_generated as M

__all__ = [
    "Reader",
    "MnnReadError",
    "Lift",
    "LIFTERS",
    "lifter",
    "param",
    "op_name",
    "ints",
    "DTYPES",
    "OP_NAMES",
]

logger = logging.getLogger(__name__)

OP_NAMES = {v: k for k, v in vars(M.OpType).items() if not k.startswith("_") and isinstance(v, int)}


class MnnReadError(Exception):
    """The file's content is invalid (becomes a ModelFileError naming the file)."""


def param(op: Any, cls: type) -> Any:
    tab = op.Main()
    if tab is None:
        raise MnnReadError(f"op {op_name(op)!r} has no parameter")
    p = cls()
    p.Init(tab.Bytes, tab.Pos)
    return p


def op_name(op: Any) -> str:
    n = op.Name()
    return n.decode() if n else ""


def ints(arr: Any) -> list[int]:
    return [int(x) for x in np.asarray(arr).reshape(-1)] if not isinstance(arr, int) else []


class Reader:
    def __init__(self, path: Path, data: bytes, input_shapes: Mapping[str, Sequence[int]] | None) -> None:
        self.path = path
        self.data = data
        self.input_shapes = dict(input_shapes or {})
        self.net = M.Net.GetRootAs(data, 0)
        self.g = Graph(path.stem)
        self.names = [(self.net.TensorName(i) or b"").decode() for i in range(self.net.TensorNameLength())]
        self.values: dict[int, Value] = {}
        self.consts: dict[int, np.ndarray] = {}
        self._side: dict[Path, bytes] = {}

    # ----------------------------------------------------------------- helpers
    def side_bytes(self, op: Any) -> bytes:
        ext = op.ExternalPath()
        p = Path(ext.decode()) if ext else side_file(self.path)
        if ext and not p.is_absolute():
            p = self.path.parent / p
        if p not in self._side:
            try:
                self._side[p] = p.read_bytes()
            except OSError as exc:
                raise ModelFileError(
                    f"{self.path}: its weights live in {p.name}, which cannot be read ({exc})"
                ) from None
        return self._side[p]

    def external(self, op: Any, ext: np.ndarray, dtypes: Sequence[Any]) -> list[np.ndarray]:
        side = self.side_bytes(op)
        pos = int(ext[0])
        out = []
        for size, dt in zip(ext[1:], dtypes, strict=False):
            size = int(size)
            if pos + size > len(side):
                raise MnnReadError(f"external data of op {op_name(op)!r} runs past the end of the side file")
            out.append(np.frombuffer(side[pos : pos + size], dt).copy())
            pos += size
        return out

    def value(self, idx: int) -> Value:
        v = self.values.get(idx)
        if v is not None:
            return v
        if idx in self.consts:
            v = self.g.add_constant(self.consts[idx], self.tname(idx))
            self.values[idx] = v
            return v
        raise MnnReadError(f"tensor {self.tname(idx)!r} is read before it is written")

    def tname(self, idx: int) -> str:
        if not 0 <= idx < len(self.names):
            raise MnnReadError(f"tensor index {idx} out of range (the file has {len(self.names)} tensors)")
        return self.names[idx] or f"t{idx}"

    def const(self, idx: int) -> np.ndarray:
        if idx not in self.consts:
            c = self.g.const_value(self.value(idx))
            if c is None:
                raise MnnReadError(f"tensor {self.tname(idx)!r} must be a constant")
            return c
        return self.consts[idx]

    def set(self, idx: int, v: Value) -> None:
        self.values[idx] = v

    def node(
        self, op_type: str, inputs: Sequence[Value | None], attrs: Any, op: Any, out: int, domain: str = ""
    ) -> None:
        n = self.g.add_node(
            op_type, inputs, attrs, domain=domain, name=op_name(op), output_names=[self.tname(out)]
        )
        self.set(out, self.g.value(n))

    # -------------------------------------------------------------------- read
    def read(self) -> Graph:
        ops = [self.net.Oplists(i) for i in range(self.net.OplistsLength())]
        if not ops or not self.names:
            raise MnnReadError("the net has no ops or no tensor names")
        unknown: dict[str, list[str]] = {}
        for op in ops:
            t = OP_NAMES.get(op.Type(), f"OpType {op.Type()}")
            if t not in LIFTERS:
                unknown.setdefault(t, []).append(op_name(op))
        if unknown:
            raise UnsupportedOpsError(str(self.path), unknown)
        produced: list[int] = []
        consumed: set[int] = set()
        for op in ops:
            ins = ints(op.InputIndexesAsNumpy()) if op.InputIndexesLength() else []
            outs = ints(op.OutputIndexesAsNumpy()) if op.OutputIndexesLength() else []
            if not outs:
                raise MnnReadError(f"op {op_name(op)!r} has no outputs")
            for i in ins + outs:
                self.tname(i)
            LIFTERS[OP_NAMES[op.Type()]](self, op, ins, outs)
            consumed.update(ins)
            produced.extend(outs)
        if self.net.OutputNameLength():
            index = {n: i for i, n in enumerate(self.names)}
            out_idx = []
            for k in range(self.net.OutputNameLength()):
                n = (self.net.OutputName(k) or b"").decode()
                if n not in index:
                    raise MnnReadError(f"output {n!r} names no tensor")
                out_idx.append(index[n])
        else:
            out_idx = [i for i in produced if i not in consumed and i not in self.consts]
        outs_v = [self.value(i) for i in out_idx]
        self.g.set_outputs(outs_v, [self.tname(i) for i in out_idx])
        unused = set(self.input_shapes) - {v.name for v in self.g.inputs}
        if unused:
            raise InputShapeError(
                f"{self.path}: --input-shape names unknown inputs: {', '.join(sorted(unused))}"
            )
        verify(self.g)
        return self.g


# ------------------------------------------------------------------------ lifters
Lift = Callable[[Reader, Any, list[int], list[int]], None]
LIFTERS: dict[str, Lift] = {}


def lifter(*names: str) -> Callable[[Lift], Lift]:
    def deco(fn: Lift) -> Lift:
        for n in names:
            LIFTERS[n] = fn
        return fn

    return deco


DTYPES = {
    M.DataType.DT_FLOAT: np.float32,
    M.DataType.DT_INT32: np.int32,
    M.DataType.DT_INT64: np.int64,
    M.DataType.DT_INT8: np.int8,
    M.DataType.DT_UINT8: np.uint8,
}
