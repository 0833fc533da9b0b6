"""Lift an :class:`OmGraph` (GE IR ops) into a Kiln Graph.

Data ops become graph inputs (in ``index`` order), Const ops constants (added when first
used), NetOutput the graph outputs with their public names. One-to-one ops come back
through ``SIMPLE_OPS``; the rest through lifters registered with :func:`lifter`
(``lift_nn.py``, ``lift_tensor.py``, ``lift_rnn.py``, ``lift_quant.py``); a multi-output GE
op (SplitD, LayerNorm, DynamicRNN) returns one value per output, or None with a reason for an
output no ONNX op computes. Every op type is checked before any
is converted, and all unsupported ones are reported together. Each lifted value must match
the file's output descriptor (dtype and shape), and the finished graph must pass Kiln's
verifier: a file that parses but does not describe a valid graph is a ModelFileError, never
a wrong graph.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np

from compiler.errors import InputShapeError, ModelFileError, UnsupportedOpsError
from compiler.ir.graph import Graph, GraphError, Value
from compiler.ir.types import DType, TensorType
from compiler.ir.verifier import VerificationError, verify
from compiler.ops.registry import AttrError, ShapeError, UnknownOpError
from schemas.cann.om_graph import OmGraph, OmOp, split_ref
from schemas.cann.op_table import SIMPLE_BY_GE, SimpleOp

__all__ = ["Lifter", "lift_graph", "lifter", "LiftError"]

LiftFn = Callable[["Lifter", OmOp], "Value | Sequence[Value | None]"]
_LIFTERS: dict[str, LiftFn] = {}
_MULTI_OUTPUT: set[str] = set()  # GE types whose lifter returns one value (or None) per output
_STRUCTURAL = ("Data", "Const", "NetOutput")
# What building a node from a file's values may raise; each becomes one ModelFileError.
_BUILD_ERRORS: tuple[type[Exception], ...] = (ShapeError, AttrError, GraphError, UnknownOpError, ValueError)
_BUILD_ERRORS += (TypeError, IndexError, KeyError, ZeroDivisionError, OverflowError)


class LiftError(Exception):
    """Raised by a lifter: the op's content is invalid (becomes a ModelFileError)."""


def lifter(*ge_types: str, multi_output: bool = False) -> Callable[[LiftFn], LiftFn]:
    """Register a lifter for GE op types. A ``multi_output`` lifter returns one value per output
    descriptor, None for an output Kiln cannot compute (reading it is then an error naming
    the reason given to :meth:`Lifter.unavailable`)."""

    def deco(fn: LiftFn) -> LiftFn:
        for t in ge_types:
            _LIFTERS[t] = fn
            if multi_output:
                _MULTI_OUTPUT.add(t)
        return fn

    return deco


class Lifter:
    """State of one lift: the Kiln graph being built and the Kiln value of every reference."""

    def __init__(self, om: OmGraph, source: str) -> None:
        self.om = om
        self.source = source
        self.g = Graph(om.name)
        self.ops = om.op_map()
        self.users = om.users()
        self.values: dict[str, Value] = {}
        self.done: set[str] = set()  # ops consumed by another op's lifter (e.g. AscendDequant)
        self.int32_outputs: set[str] = set()  # int8 convs: int32 in the file, dequantized float in Kiln
        self.missing: dict[str, str] = {}  # reference -> why Kiln has no value for it

    # ------------------------------------------------------------------ helpers
    def value(self, r: str) -> Value | None:
        """The Kiln value of a reference (None for ""), adding constants on first use."""
        if not r:
            return None
        v = self.values.get(r)
        if v is not None:
            return v
        name, _ = split_ref(r)
        op = self.ops[name]
        if r in self.missing:
            raise LiftError(f"input {r!r} cannot be read: {self.missing[r]}")
        if op.type != "Const" or op.value is None:
            raise LiftError(f"input {r!r} is read before it is computed")
        v = self.g.add_constant(op.value, op.name)
        self.values[r] = v
        return v

    def inputs(self, op: OmOp) -> list[Value | None]:
        """The op's inputs as Kiln values, trailing absent ones dropped."""
        vals = [self.value(r) for r in op.inputs]
        while vals and vals[-1] is None:
            vals.pop()
        return vals

    def const(self, op: OmOp, port: int, what: str) -> np.ndarray:
        """The constant array at an input port."""
        r = op.inputs[port] if port < len(op.inputs) else ""
        src = self.ops.get(split_ref(r)[0]) if r else None
        if src is None or src.type != "Const" or src.value is None:
            raise LiftError(f"{what} (input {port}) must be a constant")
        return src.value

    def attr(self, op: OmOp, key: str, kind: str, default: object = None) -> object:
        """An attribute's value, checked for its kind; ``default`` when absent (None: required)."""
        a = op.attrs.get(key)
        if a is None:
            if default is None:
                raise LiftError(f"required attribute {key!r} is missing")
            return default
        if a.kind != kind:
            raise LiftError(f"attribute {key!r} is of kind {a.kind}, expected {kind}")
        return a.value

    def ints(
        self, op: OmOp, key: str, n: int | None, default: Sequence[int] | None = None
    ) -> tuple[int, ...]:
        """A list-of-ints attribute, optionally of exactly ``n`` elements."""
        v = self.attr(op, key, "li", None if default is None else tuple(default))
        assert isinstance(v, tuple)
        if n is not None and len(v) != n:
            raise LiftError(f"attribute {key!r} has {len(v)} values, expected {n}")
        return tuple(int(x) for x in v)

    def node(
        self, op_type: str, inputs: Sequence[Value | None], attrs: object, name: str, **kw: object
    ) -> Value:
        """Add a Kiln node (type inference runs) and return its output value."""
        n = self.g.add_node(op_type, list(inputs), attrs, name=name, output_names=[name], **kw)  # type: ignore[arg-type]
        return self.g.value(n)

    def multi(
        self, op_type: str, inputs: Sequence[Value | None], attrs: object, names: Sequence[str], **kw: object
    ) -> list[Value]:
        """Add a Kiln node with one output per name; returns its output values."""
        n = self.g.add_node(op_type, list(inputs), attrs, name=names[0], output_names=list(names), **kw)  # type: ignore[arg-type]
        return self.g.outputs_of(n)

    # --------------------------------------------------------------------- walk
    def run(self, input_shapes: Mapping[str, Sequence[int]]) -> Graph:
        """Lift every op; ModelFileError / UnsupportedOpsError on a bad file."""
        unsupported: dict[str, list[str]] = {}
        for op in self.om.ops:
            if op.type not in _STRUCTURAL and op.type not in _LIFTERS and op.type not in SIMPLE_BY_GE:
                unsupported.setdefault(op.type, []).append(op.name)
        if unsupported:
            raise UnsupportedOpsError(self.source, unsupported)
        self._inputs(input_shapes)
        nets = [op for op in self.om.ops if op.type == "NetOutput"]
        if len(nets) != 1:
            raise self._fail(None, f"{len(nets)} NetOutput ops (expected one)")
        for op in self.om.ops:
            if op.type in _STRUCTURAL or op.name in self.done:
                continue
            try:
                v = self._lift(op)
            except LiftError as exc:
                raise self._fail(op, str(exc)) from None
            except _BUILD_ERRORS as exc:
                raise self._fail(op, f"{type(exc).__name__}: {exc}") from None
            if isinstance(v, Value):
                v = [v]
            for port, pv in enumerate(v):
                if pv is not None:
                    self.check(op, pv, port)
                    self.values[f"{op.name}:{port}"] = pv
        self._outputs(nets[0])
        try:
            verify(self.g)
        except VerificationError as exc:
            raise ModelFileError(f"{self.source}: the model is not a valid graph: {exc}") from None
        return self.g

    def _lift(self, op: OmOp) -> Value | Sequence[Value | None]:
        if op.type in _MULTI_OUTPUT:
            if not op.outputs:
                raise LiftError("no output descriptors")
        elif len(op.outputs) != 1:
            raise LiftError(f"{len(op.outputs)} output descriptors (Kiln reads single-output ops)")
        fn = _LIFTERS.get(op.type)
        if fn is not None:
            return fn(self, op)
        return self.simple(op, SIMPLE_BY_GE[op.type])

    def simple(self, op: OmOp, spec: SimpleOp) -> Value:
        """Lift a one-to-one op through its table entry."""
        dom, kop = spec.domain_op
        for r in spec.attrs:
            if r.ge in op.attrs and op.attrs[r.ge].kind != r.kind:
                raise LiftError(f"attribute {r.ge!r} is of kind {op.attrs[r.ge].kind}, expected {r.kind}")
        attrs = {r.kiln: r.read(op.attrs[r.ge]) for r in spec.attrs if r.ge in op.attrs}
        return self.node(kop, self.inputs(op), attrs, op.name, domain=dom)

    def _fail(self, op: OmOp | None, why: str) -> ModelFileError:
        where = f"op {op.name!r} ({op.type}): " if op is not None else ""
        return ModelFileError(f"{self.source}: invalid .om model: {where}{why}")

    def unavailable(self, op: OmOp, port: int, why: str) -> None:
        """Record that output ``port`` of ``op`` has no Kiln value (reading it fails with ``why``)."""
        self.missing[f"{op.name}:{port}"] = why

    def check(self, op: OmOp, v: Value, port: int = 0) -> None:
        """The lifted value must match the op's output descriptor ``port`` (dtype and shape)."""
        d = op.outputs[port] if port < len(op.outputs) else None
        if d is None:
            raise self._fail(op, f"no output descriptor {port}")
        t = v.type
        dtype_ok = t.dtype is d.dtype or (op.name in self.int32_outputs and d.dtype is DType.INT32)
        if not _fits(t.shape, d.shape) or not dtype_ok:
            raise self._fail(
                op, f"its output descriptor says {d.dtype.short}{list(d.shape)}, the op computes {t}"
            )

    def _inputs(self, input_shapes: Mapping[str, Sequence[int]]) -> None:
        datas = [op for op in self.om.ops if op.type == "Data"]
        order: list[tuple[int, OmOp]] = []
        for i, op in enumerate(datas):
            idx = op.attrs.get("index")
            order.append((int(idx.value) if idx is not None and idx.kind == "i" else i, op))  # type: ignore[arg-type]
        if sorted(i for i, _ in order) != list(range(len(order))):
            raise self._fail(
                None, f"Data op indices {sorted(i for i, _ in order)} are not 0..{len(order) - 1}"
            )
        unknown = sorted(set(input_shapes) - {op.name for op in datas})
        if unknown:
            raise InputShapeError(f"{self.source}: --input-shape names unknown input(s) {', '.join(unknown)}")
        for _, op in sorted(order, key=lambda p: p[0]):
            if len(op.outputs) != 1 or op.inputs:
                raise self._fail(op, "a Data op has no inputs and one output")
            d = op.outputs[0]
            want = input_shapes.get(op.name)
            if want is not None and tuple(want) != d.shape:
                raise InputShapeError(
                    f"{self.source}: input {op.name!r} has the static shape {list(d.shape)} in the .om file, "
                    f"not {list(want)}"
                )
            self.values[f"{op.name}:0"] = self.g.add_input(op.name, TensorType(d.dtype, d.shape))

    def _outputs(self, net: OmOp) -> None:
        if not net.inputs or not all(net.inputs):
            raise self._fail(net, "NetOutput needs at least one input and no empty ones")
        try:
            values = [self.value(r) for r in net.inputs]
        except LiftError as exc:
            raise self._fail(net, str(exc)) from None
        names = list(self.om.output_names) + [""] * len(values)
        public = [names[i] or split_ref(r)[0] for i, r in enumerate(net.inputs)]
        if len(set(public)) != len(public):
            raise self._fail(net, f"output names {public} are not unique")
        self.g.set_outputs([v for v in values if v is not None], public)


def _fits(kiln: tuple[int | str, ...] | None, desc: tuple[int, ...]) -> bool:
    """Kiln's shape matches a descriptor's: equal dims, where a data-dependent (symbolic) Kiln dim
    is described by its static bound (NonMaxSuppressionV6's ``[max_boxes_size, 3]``)."""
    if kiln is None or len(kiln) != len(desc):
        return False
    return all(not isinstance(k, int) or k == d for k, d in zip(kiln, desc, strict=True))


def lift_graph(om: OmGraph, source: str, input_shapes: Mapping[str, Sequence[int]] | None = None) -> Graph:
    """The Kiln Graph of an OmGraph read from ``source``."""
    import frontends.cann.lift_detection  # noqa: F401  (registers the lifters that need code)
    import frontends.cann.lift_index  # noqa: F401
    import frontends.cann.lift_nn  # noqa: F401
    import frontends.cann.lift_quant  # noqa: F401
    import frontends.cann.lift_rnn  # noqa: F401
    import frontends.cann.lift_tensor  # noqa: F401

    return Lifter(om, source).run(input_shapes or {})
