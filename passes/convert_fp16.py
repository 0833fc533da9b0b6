"""convert-fp16: store float32 weights as float16 and run ops in float16 where onnxruntime's CPU can.

With h(v) = Cast(v, to=f16), w(v) = Cast(v, to=f32) and q(c) = fp16(clamp(c, -65504, 65504)) (round to
nearest even; values below 2^-25 in magnitude underflow to 0, which is accepted), each op f of G becomes

* f in FP16_SAFE_OPS:  f(x1, ..., xn) -> f(h'(x1), ..., h'(xn)) computed in fp16, where h'(c) = q(c) for a
  constant, h'(v) = v for a value that is already fp16, and h'(v) = h(v) otherwise;
* any other f:         f(x1, ..., xn) -> f(w'(x1), ..., w'(xn)) computed in fp32, where w'(v) = w(v) for a
  value this pass lowered to fp16, w'(c) = w(q(c)) for a constant at a data port (the weight is *stored*
  in fp16 and widened), and w'(v) = v otherwise;
* Cast(Cast(x, to=f32), to=f16) = x for x in fp16 (exact: fp16 is a subset of fp32), and no value that
  flows between two fp32 ops is ever rounded through fp16 (no f32 -> f16 -> f32 round trip is created);
* the interface keeps float32: G'(x) = w(G16(h(x))), with h only where an fp16 op reads a graph input and
  w only where an fp16 op yields a graph output (that Cast takes the output's public name).

A constant c is converted only if ||q(c) - c||_2 <= max_const_error * ||c||_2, so tensors that mostly
underflow or overflow (an epsilon of 1e-12, -inf masks, tiny BatchNorm variances) keep float32, and an
fp16-safe op that reads such a constant stays fp32. Integer and bool values are never touched; nor are
constant subexpressions (nodes whose inputs are all constants) or ports in FP32_PORTS.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import numpy as np

from compiler.ir.graph import CONSTANT_OP, INPUT_OP, Graph, Node, Value
from compiler.ir.types import DType
from compiler.pass_infra import Pass, PassContext, register_pass
from compiler.pattern import NearMiss
from compiler.rewriter import PassResult, Rewriter

__all__ = [
    "ConvertFp16",
    "FP16_SAFE_OPS",
    "ORT_CPU_FP16_KERNELS",
    "FP32_BY_CHOICE",
    "FP32_PORTS",
    "fp32_reason",
    "to_fp16",
    "fp16_representable",
]

log = logging.getLogger(__name__)

F16_MAX = 65504.0
NO_FLOAT_OUTPUT = "no float output"

# Ops that onnxruntime 1.32.0's CPU provider (x86-64 wheel) runs with a native float16 kernel, at
# graph-optimization levels off and all. Derived empirically: a one-node fp16 model per registry op,
# saved through SessionOptions.optimized_model_filepath; an op is listed when onnxruntime inserted no
# Cast around it (where it has no fp16 kernel it silently wraps the op in Casts to float32, so "it runs"
# proves nothing). tests/test_pass_convert_fp16.py::test_allow_list_has_native_ort_fp16_kernels
# re-probes every entry. Kiln ops are judged by their export expansion: kiln::Relu6 -> Clip (native),
# kiln::FusedConv -> Conv (+ activation), and Conv has no fp16 CPU kernel on x86-64, so it stays fp32.
# Wrapped in Casts (not listed) were, among others: Conv, ConvTranspose, Gemm, MatMul, Add, Sub, Mul,
# Div, Relu, LeakyRelu, Sigmoid, HardSigmoid, HardSwish, Tanh, Exp, MaxPool, AveragePool,
# GlobalAveragePool, Resize, Softmax, Reduce*, BatchNormalization, Pad, Tile, Where.
ORT_CPU_FP16_KERNELS: frozenset[str] = frozenset(
    {
        "CastLike",
        "Clip",
        "Concat",
        "Expand",
        "Flatten",
        "Gather",
        "GatherElements",
        "Identity",
        "LayerNormalization",
        "Max",
        "Min",
        "Reshape",
        "Shape",
        "Slice",
        "Split",
        "Squeeze",
        "Transpose",
        "Unsqueeze",
        "kiln::Relu6",
    }
)

# Ops with an fp16 kernel that still stay fp32, and why ("safe" means accuracy, not just that it runs).
FP32_BY_CHOICE: dict[str, str] = {
    "LayerNormalization": "normalization statistics (mean, variance) are kept in float32",
    "CastLike": "a type conversion; its target decides the result type",
}

# What runs in fp16: the remaining ops are exact in fp16 (data movement; Clip/Max/Min select one of
# their inputs), so the only error is the rounding of their inputs.
FP16_SAFE_OPS: frozenset[str] = ORT_CPU_FP16_KERNELS - FP32_BY_CHOICE.keys()

# Input ports of fp32 ops whose float constants keep float32 (None = every port): their type is not the
# op's data type, or the value sets a shape, a result type or a quantization grid.
FP32_PORTS: dict[str, frozenset[int] | None] = {
    "BatchNormalization": frozenset({3, 4}),  # running mean and variance (statistics)
    "CastLike": frozenset({1}),  # the target type
    "Dropout": frozenset({1}),  # ratio
    "Pow": frozenset({1}),  # x^(e+d) = x^e * x^d: exponent rounding is amplified by log x
    "Resize": frozenset({1, 2}),  # roi, and scales that set the output shape
    "Range": None,
    "QuantizeLinear": None,
    "DequantizeLinear": None,
    "RandomNormalLike": None,  # the input only gives a shape and the result type
    "RandomUniformLike": None,
}

_F32, _F16 = DType.FLOAT32, DType.FLOAT16
_Key = tuple[int, int]


def to_fp16(array: np.ndarray) -> np.ndarray:
    """float -> float16 clamped to the finite range +-65504 (NaN stays NaN; tiny values may flush to 0)."""
    return np.clip(np.asarray(array), -F16_MAX, F16_MAX).astype(np.float16)


def fp16_representable(array: np.ndarray, max_error: float) -> bool:
    """True if ``||to_fp16(a) - a||_2 <= max_error * ||a||_2`` (NaN or inf entries: False)."""
    a = np.asarray(array, dtype=np.float64)
    err = float(np.linalg.norm(to_fp16(a).astype(np.float64) - a))
    return bool(np.isfinite(err) and err <= max_error * float(np.linalg.norm(a)))


def _is_leaf(node: Node) -> bool:
    return node.op in (INPUT_OP, CONSTANT_OP) and not node.domain


def fp32_reason(graph: Graph, node: Node, max_const_error: float = 1e-3) -> str | None:
    """None if ``node`` should run in fp16, else why it stays fp32."""
    op = node.qualified_op
    if op not in FP16_SAFE_OPS:
        why = FP32_BY_CHOICE.get(op, "no float16 kernel in onnxruntime's CPU provider")
        return f"{op}: {why}"
    if not any(t.dtype in (_F32, _F16) for t in node.output_types):
        return NO_FLOAT_OUTPUT
    ins = [v for v in graph.inputs_of(node) if v is not None]
    floats = [v for v in ins if v.type.dtype.is_float]
    if any(v.type.dtype not in (_F32, _F16) for v in floats):
        return "a float input is neither float32 nor float16"
    if all(v.const is not None for v in ins):
        return "every input is a constant (a constant subexpression)"
    for v in floats:
        c = v.const
        if c is not None and v.type.dtype is _F32 and not fp16_representable(c, max_const_error):
            return f"constant {v.name!r} is not representable in float16 within {max_const_error:g}"
    return None


@dataclass
class _Converter:
    """One run of the conversion over a graph, through one rewriter."""

    rw: Rewriter
    tol: float
    misses: list[NearMiss]
    was: dict[_Key, DType] = field(default_factory=dict)  # each value's dtype before the pass
    half: dict[_Key, Value] = field(default_factory=dict)  # fp32 value -> its fp16 twin
    full: dict[_Key, Value] = field(default_factory=dict)  # fp16 value -> its fp32 twin
    renames: list[tuple[str, Value]] = field(default_factory=list)  # (f32 constant's name, its f16 twin)
    bypassed: list[int] = field(default_factory=list)  # producers of inputs that were rewired away

    @property
    def g(self) -> Graph:
        return self.rw.graph

    def run(self) -> None:
        order = self.g.nodes()
        self.was = {(n.id, p): t.dtype for n in order for p, t in enumerate(n.output_types)}
        for node in order:
            if not _is_leaf(node):
                self._visit(node)
        self._widen_outputs()
        for node_id in self.bypassed:
            if self.g.has_node(node_id):
                self.rw.erase_dead(self.g.node(node_id))
        for name, h in self.renames:
            if not self.g.has_name(name):
                self.g.rename(h, name)

    def _lowered(self, v: Value) -> bool:
        """True if this pass turned ``v`` from fp32 into fp16."""
        return v.type.dtype is _F16 and self.was.get((v.node, v.port)) is _F32

    def _visit(self, node: Node) -> None:
        ins = self.g.inputs_of(node)
        reason = fp32_reason(self.g, node, self.tol)
        if reason is None:
            new = [self._half(v) if v is not None and v.type.dtype is _F32 else v for v in ins]
        elif reason == NO_FLOAT_OUTPUT:
            new = ins  # e.g. Shape: reads fp16 natively and yields integers
        else:
            miss = NearMiss(ConvertFp16.name, node.name or node.output_names[0], reason)
            if node.qualified_op in FP16_SAFE_OPS and miss not in self.misses:
                self.misses.append(miss)
            stores = any(v is not None and v.const is None for v in ins)
            fixed = FP32_PORTS.get(node.qualified_op, frozenset())
            new = [self._widen(v, stores and fixed is not None and p not in fixed) for p, v in enumerate(ins)]
        for port, (old, nv) in enumerate(zip(ins, new, strict=True)):
            if nv != old:
                self.g.set_input(node, port, nv)
                if old is not None:
                    self.bypassed.append(old.node)
        before = list(node.output_types)
        self.g.reinfer(node)
        if node.output_types != before:
            self.rw.applied("fp16-op")

    def _widen(self, v: Value | None, store: bool) -> Value | None:
        """What an fp32 op reads for input ``v``; ``store`` allows an fp16-stored constant."""
        if v is None:
            return None
        if self._lowered(v):
            return self._full(v)
        c = v.const
        if store and c is not None and v.type.dtype is _F32 and fp16_representable(c, self.tol):
            return self._full(self._half(v), base=v.name)
        return v

    def _half(self, v: Value) -> Value:
        """The fp16 twin of fp32 ``v``: a converted constant, the source of a widening Cast, or a Cast."""
        key = (v.node, v.port)
        if key not in self.half:
            src = v.producer
            c = v.const
            if c is not None:
                h = self.rw.const(to_fp16(c), name=f"{v.name}_fp16")
                self.renames.append((v.name, h))
                self.rw.applied("fp16-const")
            elif (
                src.op == "Cast"
                and not src.domain
                and (u := self.g.inputs_of(src)[0]) is not None
                and u.type.dtype is _F16
            ):
                h = u
            else:
                h = self.rw.op("Cast", [v], {"to": int(_F16)}, name=f"{v.name}_fp16")
            self.half[key] = h
        return self.half[key]

    def _full(self, v: Value, base: str = "") -> Value:
        """The fp32 twin of fp16 value ``v`` (one Cast, shared by every fp32 reader)."""
        key = (v.node, v.port)
        if key not in self.full:
            self.full[key] = self.rw.op("Cast", [v], {"to": int(_F32)}, name=f"{base or v.name}_fp32")
        return self.full[key]

    def _widen_outputs(self) -> None:
        """Cast lowered graph outputs back to fp32; the Cast takes the output's public name."""
        outs, names = self.g.outputs, self.g.output_names
        for v, public in zip(outs, names, strict=True):
            key = (v.node, v.port)
            if not self._lowered(v) or v.name != public:
                continue
            self.g.rename(v, self.g.unique_name(f"{public}_fp16"))
            if key in self.full:  # an fp32 op already reads it through a Cast: that Cast takes the name
                self.g.rename(self.full[key], public)
            else:
                self.full[key] = self.rw.op("Cast", [v], {"to": int(_F32)}, name=public)
        new = [self._full(v) if self._lowered(v) else v for v in outs]
        if new != outs:
            self.g.set_outputs(new, names)


@register_pass
@dataclass(frozen=True)
class ConvertFp16(Pass):
    """Convert float32 weights and activations to float16 where onnxruntime's CPU runs them safely."""

    name = "convert-fp16"
    max_const_error: float = 1e-3

    def run(self, graph: Graph, ctx: PassContext) -> PassResult:
        with Rewriter(graph) as rw:
            _Converter(rw, self.max_const_error, ctx.near_misses).run()
        log.info("convert-fp16: %s", rw.result.summary())
        return rw.result
