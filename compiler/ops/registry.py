"""The op registry: every piece of op knowledge lives in one ``OpDef``.

An ``OpDef`` names the op, its frozen attrs dataclass (defaults equal ONNX's),
its arity, shape and dtype inference, a numpy reference, purity and
determinism flags, layout behaviour, quantization policy and, for Kiln's own
ops, an expansion into standard ONNX ops.
"""

from __future__ import annotations

import dataclasses
import enum
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from compiler.ir.types import DType, TensorType

if TYPE_CHECKING:
    from compiler.ir.graph import Graph, Node, Value

__all__ = [
    "OpDef",
    "InferContext",
    "ShapeError",
    "UnknownOpError",
    "AttrError",
    "Layout",
    "QuantPolicy",
    "register",
    "get_op",
    "has_op",
    "all_ops",
    "NoAttrs",
    "NO_ATTRS",
    "ConstantAttrs",
    "make_constant_attrs",
    "infer_node_types",
    "KILN_ONLY",
]


KILN_ONLY: Mapping[str, bool] = types.MappingProxyType({"kiln_only": True})
"""Field metadata of an attrs field that is Kiln's own (e.g. ``captures``): printed, never exported."""


class ShapeError(ValueError):
    """Shape or dtype inference failed; the message names the node."""


class UnknownOpError(KeyError):
    """No OpDef is registered under that name."""


class AttrError(ValueError):
    """An attribute is unknown or has the wrong type."""


class Layout(enum.Enum):
    """How an op relates to data layout (used by layout passes)."""

    AGNOSTIC = "agnostic"  # elementwise: any layout works if all inputs agree
    SPATIAL = "spatial"  # interprets an NCHW-style channel axis (conv, pool, resize, ...)
    FIXED = "fixed"  # depends on the exact axis order (reshape, transpose, gather, ...)


class QuantPolicy(enum.Enum):
    """How post-training quantization treats an op."""

    NONE = "none"  # stays float
    WEIGHTED = "weighted"  # int8 weights per channel, quantized input activations (Conv, Gemm, MatMul)
    ACTIVATION = "activation"  # input activations quantized (pooling, add, concat...)
    PASSTHROUGH = "passthrough"  # reshapes data without changing values; shares its input's scale


@dataclass(frozen=True)
class QuantSpec:
    """How post-training quantization meets an op's inputs (by input port).

    ``activations`` are the ports quantized as activations (None: every input, e.g. Concat).
    For WEIGHTED ops, ``weight`` is the constant weight's port and ``weight_axis(attrs,
    weight_rank)`` its output-channel axis, the axis of per-channel scales; the bias at
    ``bias`` is quantized to int32 with s_x * s_w.

    ``shares_output_grid`` marks ops that only copy or clamp values (Concat, Relu, Clip):
    an input read by this op alone is quantized straight onto the op's output grid, so that
    the op's own requantization is exact (one rounding instead of two). For a clamp,
    q(x) on the grid of [0, b] already is relu(x) on that grid.

    ``weights`` are further constant weight ports quantized like ``weight`` (an RNN's R), and
    ``float_output`` marks ops that compute in float whatever their inputs (an RNN's recurrent
    state): their outputs are not put on an int8 grid; each quantized reader quantizes its input.
    """

    activations: tuple[int, ...] | None = (0,)
    weight: int | None = 1
    weight_axis: Callable[[Any, int], int] = lambda attrs, rank: 0
    bias: int | None = 2
    shares_output_grid: bool = False
    weights: tuple[int, ...] = ()
    float_output: bool = False


@dataclass(frozen=True)
class NoAttrs:
    """Attributes of an op without attributes."""


NO_ATTRS = NoAttrs()


@dataclass(frozen=True, eq=False)
class ConstantAttrs:
    """A constant's value: a read-only numpy array."""

    value: np.ndarray


def make_constant_attrs(array: np.ndarray) -> ConstantAttrs:
    """Attrs of a Constant node."""
    return ConstantAttrs(array)


@dataclass
class InferContext:
    """What an inference function sees: input types, constant inputs and attrs."""

    op: str
    where: str
    attrs: Any
    types: list[TensorType | None]
    consts: list[np.ndarray | None]
    num_outputs: int

    def fail(self, msg: str) -> ShapeError:
        """An error naming the node."""
        return ShapeError(f"{self.op} '{self.where}': {msg}")

    def has(self, i: int) -> bool:
        """True if optional input ``i`` is present."""
        return i < len(self.types) and self.types[i] is not None

    def type(self, i: int) -> TensorType:
        """The type of input ``i`` (which must be present)."""
        t = self.types[i] if i < len(self.types) else None
        if t is None:
            raise self.fail(f"input {i} is missing")
        return t

    def shape(self, i: int) -> tuple[int | str, ...]:
        """The shape of input ``i``; fails if the rank is unknown."""
        s = self.type(i).shape
        if s is None:
            raise self.fail(f"input {i} has unknown rank")
        return s

    def const(self, i: int) -> np.ndarray | None:
        """The value of input ``i`` if it is a constant."""
        return self.consts[i] if i < len(self.consts) else None

    def require_const(self, i: int, what: str) -> np.ndarray:
        """The constant value of input ``i``, failing with ``what`` if it is not constant."""
        c = self.const(i)
        if c is None:
            raise self.fail(f"{what} (input {i}) must be a constant for static shapes")
        return c


InferFn = Callable[[InferContext], list[TensorType]]
ReferenceFn = Callable[[list[np.ndarray | None], Any, int], list[np.ndarray]]
ExpandFn = Callable[["Graph", "Node"], list["Value"]]


@dataclass(frozen=True)
class OpDef:
    """Everything Kiln knows about one op."""

    name: str
    infer: InferFn
    reference: ReferenceFn
    attrs: type = NoAttrs
    domain: str = ""
    inputs: tuple[int, int] = (1, 1)  # (min, max); max -1 = variadic
    outputs: tuple[int, int] = (1, 1)
    pure: bool = True
    deterministic: bool = True
    layout: Layout = Layout.FIXED
    quant: QuantPolicy = QuantPolicy.NONE
    qspec: QuantSpec | None = None
    expand: ExpandFn | None = None
    min_opset: int = 0  # oldest default-domain opset with this op's form (export declares at least it)
    doc: str = ""

    @property
    def default_outputs(self) -> int:
        """Number of outputs a node gets when the caller does not say."""
        return self.outputs[0] if self.outputs[0] > 0 else 1

    @property
    def qualified(self) -> str:
        """``domain::name`` or ``name``."""
        return f"{self.domain}::{self.name}" if self.domain else self.name

    def accepts_inputs(self, n: int) -> bool:
        """True if ``n`` inputs fit the arity."""
        lo, hi = self.inputs
        return lo <= n and (hi < 0 or n <= hi)

    def accepts_outputs(self, n: int) -> bool:
        """True if ``n`` outputs fit the arity."""
        lo, hi = self.outputs
        return lo <= n and (hi < 0 or n <= hi)

    def make_attrs(self, attrs: Any, where: str = "") -> Any:
        """Build the attrs dataclass from a dict (or pass an instance through)."""
        if attrs is None:
            attrs = {}
        if isinstance(attrs, self.attrs):
            return attrs
        if not isinstance(attrs, dict):
            raise AttrError(f"{self.name} '{where}': attrs must be a dict or {self.attrs.__name__}")
        fields = {f.name: f for f in dataclasses.fields(self.attrs)}
        unknown = sorted(set(attrs) - set(fields))
        if unknown:
            raise AttrError(
                f"{self.name} '{where}': unknown attribute(s) {', '.join(unknown)} "
                f"(not supported by Kiln's {self.name})"
            )
        hints = typing.get_type_hints(self.attrs)
        kwargs = {k: _coerce(hints[k], v, f"{self.name} '{where}' attribute {k}") for k, v in attrs.items()}
        return self.attrs(**kwargs)

    def non_default_attrs(self, attrs: Any) -> dict[str, Any]:
        """Attributes whose values differ from the defaults, in field order."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(attrs):
            v = getattr(attrs, f.name)
            default = f.default if f.default is not dataclasses.MISSING else None
            if isinstance(v, np.ndarray) or v != default:
                out[f.name] = v
        return out


def _coerce(hint: Any, value: Any, where: str) -> Any:
    """Coerce an attribute value to its declared type (lists become tuples)."""
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return _coerce(inner[0], value, where) if len(inner) == 1 else value
    try:
        if hint is int:
            return int(value)
        if hint is float:
            return float(value)
        if hint is str:
            return value.decode() if isinstance(value, bytes) else str(value)
        if origin is tuple:
            elem = args[0] if args else Any
            return tuple(_coerce(elem, v, where) for v in value)
        if hint is np.ndarray:
            return np.asarray(value)
    except (TypeError, ValueError) as exc:
        raise AttrError(f"{where}: cannot use {value!r} ({exc})") from None
    return value


_REGISTRY: dict[tuple[str, str], OpDef] = {}


def register(opdef: OpDef) -> OpDef:
    """Add an OpDef; names are unique per domain."""
    key = (opdef.domain, opdef.name)
    if key in _REGISTRY:
        raise ValueError(f"op {opdef.qualified} registered twice")
    _REGISTRY[key] = opdef
    return opdef


def get_op(name: str, domain: str = "") -> OpDef:
    """The OpDef registered under ``domain::name``."""
    _ensure_loaded()
    try:
        return _REGISTRY[(domain, name)]
    except KeyError:
        q = f"{domain}::{name}" if domain else name
        raise UnknownOpError(f"unknown op {q}") from None


def has_op(name: str, domain: str = "") -> bool:
    """True if an op is registered."""
    _ensure_loaded()
    return (domain, name) in _REGISTRY


def all_ops() -> list[OpDef]:
    """Every registered OpDef, sorted by qualified name."""
    _ensure_loaded()
    return sorted(_REGISTRY.values(), key=lambda d: (d.domain, d.name))


def _ensure_loaded() -> None:
    import compiler.ops  # noqa: F401  (registers the op families)


def infer_node_types(
    opdef: OpDef, attrs: Any, inputs: Sequence[Value | None], num_outputs: int, where: str
) -> list[TensorType]:
    """Run ``opdef.infer`` for a node with the given inputs."""
    if not opdef.accepts_inputs(len(inputs)):
        extra = " (inputs past the last are unsupported)" if 0 <= opdef.inputs[1] < len(inputs) else ""
        raise ShapeError(
            f"{opdef.qualified} '{where}': {len(inputs)} inputs, expected {_arity(opdef.inputs)}{extra}"
        )
    if not opdef.accepts_outputs(num_outputs):
        raise ShapeError(
            f"{opdef.qualified} '{where}': {num_outputs} outputs, expected {_arity(opdef.outputs)}"
        )
    ctx = InferContext(
        op=opdef.qualified,
        where=where,
        attrs=attrs,
        types=[None if v is None else v.type for v in inputs],
        consts=[None if v is None else v.const for v in inputs],
        num_outputs=num_outputs,
    )
    out = opdef.infer(ctx)
    if len(out) != num_outputs:
        raise ShapeError(f"{opdef.qualified} '{where}': inferred {len(out)} outputs, node has {num_outputs}")
    return out


def _arity(a: tuple[int, int]) -> str:
    lo, hi = a
    if hi < 0:
        return f"at least {lo}"
    return str(lo) if lo == hi else f"{lo} to {hi}"


def same_as_input(i: int = 0) -> InferFn:
    """Inference for ops whose single output has the type of input ``i``."""

    def infer(ctx: InferContext) -> list[TensorType]:
        return [ctx.type(i)]

    return infer


def with_dtype(t: TensorType, dtype: DType) -> TensorType:
    """``t`` with another element type."""
    return TensorType(dtype, t.shape)
