"""The MegEngine converter table and the context a converter works in.

Converters are registered per operator family (the class name without version
and ``Forward`` suffixes, see :mod:`frontends.megengine.type_ids`)::

    @converter("Pooling")
    def pooling(ctx: OprContext) -> list[Var | None]: ...

A converter returns one :class:`Var` per MegEngine output (None for outputs
Kiln does not produce). A Var is a Kiln value plus the MegEngine dtype it
stands for; quantized vars hold dequantized float values. When ``requantize``
is set (the default) the importer rounds every 8/16-bit quantized output onto
its grid with a QuantizeLinear/DequantizeLinear pair, so converters of compute
ops only describe the float math. ``check`` may name an unsupported variant of
a supported operator (e.g. ``Elemwise SIN``) before anything is converted.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np

from compiler.errors import ConversionError
from compiler.ir.graph import Graph, Value
from compiler.ops.registry import get_op, infer_node_types
from frontends.megengine.dtypes import MgeDType
from frontends.megengine.model import MgeOpr
from frontends.onnx.folding import fold
from schemas.megengine.generated import dtype_generated as fb_dtype

__all__ = ["Var", "OprContext", "ConverterFn", "CheckFn", "ConverterEntry", "converter", "find_converter"]

logger = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass(frozen=True)
class Var:
    """A MegEngine variable in the Kiln graph: its value and the MegEngine dtype it holds."""

    value: Value
    dtype: MgeDType


@dataclass
class OprContext:
    """One MegEngine operator being converted: its inputs, params and a way to emit Kiln nodes."""

    graph: Graph
    opr: MgeOpr
    inputs: list[Var]
    source: str
    input_shapes: Mapping[str, Sequence[int]] = field(default_factory=dict)
    node_names: set[str] = field(default_factory=set)
    created: set[int] = field(default_factory=set)

    @property
    def where(self) -> str:
        """The operator in messages: file, name and class."""
        return f"{self.source}: opr {self.opr.label!r} ({self.opr.type})"

    @property
    def base(self) -> str:
        """The stem of names derived from this operator."""
        return self.opr.name or self.opr.type.lower()

    def fail(self, msg: str) -> ConversionError:
        """An error that names the operator."""
        return ConversionError(f"{self.where}: {msg}")

    # ------------------------------------------------------------- inputs
    def need_inputs(self, lo: int, hi: int | None = None) -> None:
        """Fail unless the operator has between ``lo`` and ``hi`` inputs."""
        n = len(self.inputs)
        if n < lo or (hi is not None and n > hi):
            want = str(lo) if hi == lo else f"{lo} to {hi}" if hi is not None else f"at least {lo}"
            raise self.fail(f"expects {want} inputs, the file gives {n}")

    def var(self, i: int) -> Var:
        """Input ``i``."""
        if not 0 <= i < len(self.inputs):
            raise self.fail(f"input {i} is missing (the operator has {len(self.inputs)})")
        return self.inputs[i]

    def value(self, i: int) -> Value:
        """The Kiln value of input ``i``."""
        return self.var(i).value

    def dtype(self, i: int) -> MgeDType:
        """The MegEngine dtype of input ``i``."""
        return self.var(i).dtype

    def const(self, i: int) -> np.ndarray | None:
        """The constant value of input ``i``, or None."""
        return self.value(i).const

    def require_const(self, i: int, what: str) -> np.ndarray:
        """The constant value of input ``i``; fails (naming ``what``) when it is computed at run time."""
        c = self.const(i)
        if c is None:
            raise self.fail(f"{what} (input {i}) must be known at import time (give static input shapes)")
        return c

    def shape(self, v: Value) -> tuple[int, ...]:
        """The static shape of ``v``."""
        if not v.type.is_static:
            raise self.fail(f"needs a static shape, {v.name!r} has {v.type}")
        return v.type.static_shape

    def param(self, cls: type[T]) -> T:
        """The operator's param table of generated class ``cls`` (main or additional)."""
        want = "DType" if cls is fb_dtype.DType else f"param_{cls.__name__}"
        for p in self.opr.params:
            if p.member == want:
                return p.read(cls)
        have = ", ".join(p.table for p in self.opr.params if p.member) or "none"
        raise self.fail(f"expects a {want.removeprefix('param_')} param, the file has {have}")

    def out_dtype(self, default: MgeDType) -> MgeDType:
        """The dtype the file declares for the output, else ``default``."""
        return self.opr.output_dtype or default

    # ------------------------------------------------------------- emitting
    def constant(self, array: Any, suffix: str = "const", dtype: Any = None) -> Value:
        """Add a constant derived from this operator."""
        v = self.graph.add_constant(np.asarray(array, dtype=dtype), name=f"{self.base}__{suffix}")
        self.created.add(v.node)
        return v

    def ints(self, values: Iterable[int], suffix: str = "ints") -> Value:
        """A 1-D int64 constant (shapes, axes, pads...)."""
        return self.constant(np.asarray(list(values), dtype=np.int64).reshape(-1), suffix)

    def scalar_like(self, x: Value, v: float, suffix: str = "scalar") -> Value:
        """A 0-d constant of ``x``'s element type."""
        return self.constant(np.asarray(v, dtype=x.type.dtype.numpy), suffix)

    def _node_name(self, op: str, final: bool) -> str:
        """A graph-unique node name: the operator's own name for its main node, else ``name/op``."""
        base = self.opr.name or self.opr.type
        name = base if final else f"{base}/{op}"
        k = 1
        while name in self.node_names:
            name = f"{base}/{op}_{k}"
            k += 1
        self.node_names.add(name)
        return name

    def emit(
        self,
        op: str,
        inputs: Sequence[Value | None],
        attrs: Any = None,
        *,
        domain: str = "",
        num_outputs: int = 1,
        final: bool = False,
    ) -> list[Value]:
        """Add Kiln op ``op`` (folded into constants when small and constant) and return its outputs.

        The operator's main node (``final``) takes its MegEngine name; helper nodes get ``name/op``.
        """
        ins = list(inputs)
        while ins and ins[-1] is None:
            ins.pop()
        names = [
            self.graph.unique_name(f"{self.base}__{op.lower()}" + (f"_{i}" if num_outputs > 1 else ""))
            for i in range(num_outputs)
        ]
        try:
            opdef = get_op(op, domain)
            attrs_obj = opdef.make_attrs(attrs, where=self.base)
            types = infer_node_types(opdef, attrs_obj, ins, num_outputs, where=self.base)
            folded = fold(opdef, attrs_obj, ins, types, self.where)
        except Exception as exc:  # noqa: BLE001 - shape/attr errors and registry bugs all name the opr
            raise self.fail(f"{op} conversion failed: {exc}") from exc
        if folded is not None:
            return [
                self.constant(a, nm.removeprefix(f"{self.base}__"))
                for a, nm in zip(folded, names, strict=True)
            ]
        node = self.graph.add_node(
            op,
            ins,
            attrs_obj,
            domain=domain,
            name=self._node_name(op, final),
            output_names=names,
            output_types=types,
        )
        self.created.add(node.id)
        return self.graph.outputs_of(node)

    def emit1(
        self,
        op: str,
        inputs: Sequence[Value | None],
        attrs: Any = None,
        *,
        domain: str = "",
        final: bool = False,
    ) -> Value:
        """:meth:`emit` for a single-output op."""
        return self.emit(op, inputs, attrs, domain=domain, final=final)[0]


ConverterFn = Callable[[OprContext], Sequence[Var | None]]
CheckFn = Callable[[MgeOpr], str | None]


@dataclass(frozen=True)
class ConverterEntry:
    """One row of the converter table."""

    family: str
    fn: ConverterFn
    requantize: bool
    check: CheckFn | None


_TABLE: dict[str, ConverterEntry] = {}


def converter(
    *families: str, requantize: bool = True, check: CheckFn | None = None
) -> Callable[[ConverterFn], ConverterFn]:
    """Register ``fn`` as the converter of the operator ``families``."""

    def deco(fn: ConverterFn) -> ConverterFn:
        for fam in families:
            if fam in _TABLE:
                raise ValueError(f"MegEngine converter {fam} registered twice")
            _TABLE[fam] = ConverterEntry(fam, fn, requantize, check)
        return fn

    return deco


def find_converter(family: str | None) -> ConverterEntry | None:
    """The converter of an operator family, or None."""
    import frontends.megengine.converters  # noqa: F401  (registers the families)

    return _TABLE.get(family) if family else None
