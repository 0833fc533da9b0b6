"""The Kiln <-> GE IR op mapping, as data.

``SIMPLE_OPS`` lists the ops that map one to one: same inputs in the same order, and
attributes renamed (and converted) by :class:`AttrRule`. Both directions read this one
table: the backend (``lower.py``) writes ``ge`` ops with these attributes, the frontend
(``frontends/cann/lift.py``) turns them back. An attribute of the Kiln op that no rule
maps must keep its default; otherwise the backend refuses the node by name.

``ACTIVATIONS`` maps the activation fused into ``kiln::FusedConv`` to the GE op that
follows the Conv2D. Ops whose mapping needs code (Conv2D, Conv2DTranspose, Pooling, AvgPoolV2,
FullyConnection, BNInference, LayerNorm, Reshape, TransposeD, ConcatD, ClipByValue, GatherV2,
Expand, PadV3, SplitD/SplitVD, TensorMove + ScatterNd*, DynamicRNN and the int8 ops) live in
``lower_nn.py`` / ``lower_tensor.py`` / ``lower_rnn.py`` / ``lower_quant.py`` and in the
frontend's lift modules. ``DYNAMIC_RNN_*`` and :func:`lstm_gate_blocks` are the DynamicRNN
conventions both directions share, ``DYNAMIC_GRU_*`` and :func:`gru_gate_blocks` DynamicGRUV2's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from compiler.ir.types import DType
from schemas.cann.codes import CPP_DTYPE, dtype_from
from schemas.cann.om_graph import Attr

__all__ = [
    "AttrRule",
    "SimpleOp",
    "SIMPLE_OPS",
    "SIMPLE_BY_KILN",
    "SIMPLE_BY_GE",
    "ACTIVATIONS",
    "ActivationOp",
    "DYNAMIC_RNN_OUTPUTS",
    "DYNAMIC_RNN_DIRECTIONS",
    "DYNAMIC_RNN_ATTRS",
    "lstm_gate_blocks",
    "DYNAMIC_GRU_OUTPUTS",
    "DYNAMIC_GRU_ATTRS",
    "gru_gate_blocks",
]


def _same(v: Any) -> Any:
    return v


def _cpp_dtype(onnx_code: int) -> int:
    return CPP_DTYPE[DType(onnx_code)]


def _onnx_dtype(cpp_code: int) -> int:
    dt = dtype_from(CPP_DTYPE, int(cpp_code))
    if dt is None:
        raise ValueError(f"unknown ge::DataType {cpp_code}")
    return int(dt)


@dataclass(frozen=True)
class AttrRule:
    """Kiln attribute ``kiln`` <-> GE attribute ``ge`` of kind ``kind`` (see :class:`Attr`)."""

    kiln: str
    ge: str
    kind: str
    to_ge: Callable[[Any], Any] = _same
    to_kiln: Callable[[Any], Any] = _same

    def write(self, value: Any) -> Attr:
        """The GE attribute for a Kiln attribute value."""
        return Attr(self.kind, self.to_ge(value)) if self.kind not in ("f", "lf") else _float(self, value)

    def read(self, attr: Attr) -> Any:
        """The Kiln attribute value for a GE attribute."""
        return self.to_kiln(attr.value)


def _float(rule: AttrRule, value: Any) -> Attr:
    v = rule.to_ge(value)
    return Attr.f(v) if rule.kind == "f" else Attr.lf(v)


@dataclass(frozen=True)
class SimpleOp:
    """A one-to-one op: Kiln ``kiln`` (``domain::op`` outside ONNX) <-> GE ``ge``."""

    kiln: str
    ge: str
    attrs: tuple[AttrRule, ...] = ()
    fixed: tuple[tuple[str, Attr], ...] = ()  # GE attributes always written with these values

    @property
    def domain_op(self) -> tuple[str, str]:
        """(domain, op) of the Kiln side."""
        dom, _, op = self.kiln.rpartition("::")
        return dom, op


def _bool_rule(name: str, ge: str) -> AttrRule:
    return AttrRule(name, ge, "b", to_ge=bool, to_kiln=int)


_UNARY = (
    *("Relu", "Sigmoid", "Tanh", "Exp", "Log", "Sqrt", "Abs", "Neg", "Reciprocal", "Floor", "Ceil", "Erf"),
    *("Sign", "Sin", "Cos", "Round"),
)
_BINARY: tuple[tuple[str, str], ...] = (
    ("Add", "Add"),
    ("Sub", "Sub"),
    ("Mul", "Mul"),
    ("Div", "RealDiv"),
    ("Max", "Maximum"),
    ("Min", "Minimum"),
    ("Pow", "Pow"),
    ("PRelu", "PRelu"),
)
_COMPARE: tuple[tuple[str, str], ...] = (
    ("Less", "Less"),
    ("Greater", "Greater"),
    ("LessOrEqual", "LessEqual"),
    ("GreaterOrEqual", "GreaterEqual"),
    ("Not", "LogicalNot"),
    ("Or", "LogicalOr"),
    ("And", "LogicalAnd"),
)  # no Xor: GE has no LogicalXor (only the HiAI DDK set does); decompose writes xor-or-and
_REDUCE = ("ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin")
_RESIZE_ATTRS = (
    AttrRule("coordinate_transformation_mode", "coordinate_transformation_mode", "s"),
    AttrRule("cubic_coeff_a", "cubic_coeff_a", "f"),
    AttrRule("exclude_outside", "exclude_outside", "i"),
    AttrRule("extrapolation_value", "extrapolation_value", "f"),
    AttrRule("mode", "mode", "s"),
    AttrRule("nearest_mode", "nearest_mode", "s"),
)

SIMPLE_OPS: tuple[SimpleOp, ...] = (
    *(SimpleOp(op, op) for op in _UNARY),
    *(SimpleOp(k, g) for k, g in _BINARY),
    SimpleOp("HardSwish", "HardSwish"),
    SimpleOp("HardSigmoid", "HardSigmoid", (AttrRule("alpha", "alpha", "f"), AttrRule("beta", "beta", "f"))),
    SimpleOp("LeakyRelu", "LeakyRelu", (AttrRule("alpha", "negative_slope", "f"),)),
    SimpleOp("kiln::Relu6", "Relu6"),
    SimpleOp("Identity", "Identity"),
    SimpleOp("Equal", "Equal"),
    *(SimpleOp(k, g) for k, g in _COMPARE),
    SimpleOp("Where", "SelectV2"),
    SimpleOp("Elu", "Elu", (AttrRule("alpha", "alpha", "f"),)),
    SimpleOp("IsNaN", "IsNan"),
    SimpleOp("Tile", "Tile"),
    SimpleOp("GatherElements", "GatherElements", (AttrRule("axis", "dim", "i"),)),
    SimpleOp("GatherND", "GatherNd"),
    SimpleOp("CumSum", "Cumsum", (_bool_rule("exclusive", "exclusive"), _bool_rule("reverse", "reverse"))),
    SimpleOp("Clip", "ClipByValue"),
    SimpleOp(
        "Softmax",
        "SoftmaxV2",
        (AttrRule("axis", "axes", "li", to_ge=lambda a: (a,), to_kiln=lambda v: v[0]),),
    ),
    SimpleOp(
        "LogSoftmax",
        "LogSoftmaxV2",
        (AttrRule("axis", "axes", "li", to_ge=lambda a: (a,), to_kiln=lambda v: v[0]),),
    ),
    SimpleOp("Gelu", "GeluV2", (AttrRule("approximate", "approximate", "s"),)),
    SimpleOp("Concat", "ConcatD", (AttrRule("axis", "concat_dim", "i"),)),
    SimpleOp("Transpose", "TransposeD", (AttrRule("perm", "perm", "li"),)),
    SimpleOp("Slice", "StridedSliceV2"),
    SimpleOp("MatMul", "BatchMatMulV2", fixed=(("adj_x1", Attr.b(False)), ("adj_x2", Attr.b(False)))),
    SimpleOp("Cast", "Cast", (AttrRule("to", "dst_type", "i", to_ge=_cpp_dtype, to_kiln=_onnx_dtype),)),
    SimpleOp("Resize", "Resize", _RESIZE_ATTRS),
    *(
        SimpleOp(
            op,
            op,
            (_bool_rule("keepdims", "keep_dims"), _bool_rule("noop_with_empty_axes", "noop_with_empty_axes")),
        )
        for op in _REDUCE
    ),
)

SIMPLE_BY_KILN = MappingProxyType({s.kiln: s for s in SIMPLE_OPS})
SIMPLE_BY_GE = MappingProxyType({s.ge: s for s in SIMPLE_OPS})


@dataclass(frozen=True)
class ActivationOp:
    """The GE op an activation of kiln::FusedConv becomes, and its attributes from (alpha, beta).

    ``bounds`` marks ClipByValue, whose (alpha, beta) = (min, max) become constant inputs.
    """

    ge: str
    attrs: Callable[[float, float], dict[str, Attr]] = lambda a, b: {}
    bounds: bool = False


ACTIVATIONS = MappingProxyType(
    {
        "relu": ActivationOp("Relu"),
        "relu6": ActivationOp("Relu6"),
        "clip": ActivationOp("ClipByValue", bounds=True),
        "leaky_relu": ActivationOp("LeakyRelu", lambda a, b: {"negative_slope": Attr.f(a)}),
        "sigmoid": ActivationOp("Sigmoid"),
        "hard_sigmoid": ActivationOp("HardSigmoid", lambda a, b: {"alpha": Attr.f(a), "beta": Attr.f(b)}),
        "hard_swish": ActivationOp("HardSwish"),
        "tanh": ActivationOp("Tanh"),
    }
)


# ----------------------------------------------------------------- DynamicRNN (LSTM)
DYNAMIC_RNN_OUTPUTS = ("y", "output_h", "output_c", "i", "j", "f", "o", "tanhc")
"""DynamicRNN's outputs, each [T, B, H]: y, h and c at every step, then the gate activations."""

DYNAMIC_RNN_DIRECTIONS = MappingProxyType({"forward": "UNIDIRECTIONAL", "reverse": "REDIRECTIONAL"})

DYNAMIC_RNN_ATTRS = MappingProxyType(
    {
        "cell_type": Attr.s("LSTM"),
        "cell_depth": Attr.i(1),
        "use_peephole": Attr.b(False),
        "keep_prob": Attr.f(1.0),
        "cell_clip": Attr.f(-1.0),
        "num_proj": Attr.i(0),
        "time_major": Attr.b(True),
        "activation": Attr.s("tanh"),
        "forget_bias": Attr.f(0.0),
        "gate_order": Attr.s("ijfo"),
        "is_training": Attr.b(False),
    }
)
"""The attributes Kiln writes on every DynamicRNN besides ``direction`` (the plain ONNX LSTM cell)."""


def lstm_gate_blocks(gate_order: str) -> tuple[int, ...]:
    """For each ONNX gate block (i, o, f, c), its block index in a DynamicRNN weight of ``gate_order``.

    DynamicRNN's ``j`` is ONNX's cell gate ``c``; ATC's CommonLSTM fusion swaps blocks 1 and 3
    (ONNX iofc -> ijfo). Raises ValueError for an order that is not a permutation of "ijfo".
    """
    if sorted(gate_order) != sorted("ijfo"):
        raise ValueError(f"gate_order {gate_order!r} is not a permutation of 'ijfo'")
    return tuple(gate_order.index(g) for g in "iofj")


# ---------------------------------------------------------------- DynamicGRUV2 (GRU)
DYNAMIC_GRU_OUTPUTS = ("y", "output_h", "update", "reset", "new", "hidden_new")
"""DynamicGRUV2's outputs, each [T, B, H]: y and h at every step, then the gate activations."""

DYNAMIC_GRU_ATTRS = MappingProxyType(
    {
        "cell_depth": Attr.i(1),
        "keep_prob": Attr.f(1.0),
        "cell_clip": Attr.f(-1.0),
        "num_proj": Attr.i(0),
        "time_major": Attr.b(True),
        "activation": Attr.s("tanh"),
        "gate_order": Attr.s("zrh"),
        "reset_after": Attr.b(True),
        "is_training": Attr.b(False),
    }
)
"""The attributes Kiln writes on every DynamicGRUV2 besides ``direction`` (ONNX's GRU with
linear_before_reset=1; the op's kernel accepts no other ``reset_after``)."""


def gru_gate_blocks(gate_order: str) -> tuple[int, ...]:
    """For each ONNX gate block (z, r, h), its block index in a DynamicGRUV2 weight of ``gate_order``.

    GE's ``zrh`` is ONNX's own order; the kernel also reads ``rzh``. Raises ValueError otherwise.
    """
    if gate_order not in ("zrh", "rzh"):
        raise ValueError(f"gate_order {gate_order!r} is neither 'zrh' nor 'rzh'")
    return tuple(gate_order.index(g) for g in "zrh")
