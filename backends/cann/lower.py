"""Lower a Kiln Graph to an :class:`OmGraph` of GE IR ops.

The walk is one pass over the graph in Kiln's deterministic topological order:

* graph inputs become ``Data`` ops (attr ``index``), graph outputs one ``NetOutput``;
* constants become ``Const`` ops when first used (so constants that an int8 pattern
  absorbs, such as QDQ scales, are never written);
* every other op goes through one :class:`CapabilityTable` (:func:`capabilities`): ops in
  ``SIMPLE_OPS`` map one to one through a generic lowering built from their entry; ops
  registered with :func:`lowering` (``lower_nn.py``, ``lower_tensor.py``, ``lower_rnn.py``,
  ``lower_quant.py``) need code. Each entry's ``check`` refuses, before anything is written,
  what can be known from the graph (several outputs, unless the lowering is registered
  ``multi_output`` and binds every port itself; a dtype without a CANN code; an attribute
  the GE mapping lacks);
* the op that produces a Kiln value is named after that value, so the names survive the
  round trip; helper ops of an expansion get derived names (``<value>/Conv2D``).

Every Kiln value must have a static shape. Anything the backend cannot express is one
:class:`ConversionError` naming the node.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from compiler.backend import CapabilityTable, Check, OpSupport, all_of
from compiler.errors import ConversionError
from compiler.ir.graph import CONSTANT_OP, INPUT_OP, Graph, Node, Value
from compiler.ir.types import DType, TensorType
from compiler.ops.registry import get_op
from schemas.cann.codes import PROTO_DTYPE, format_for
from schemas.cann.om_graph import Attr, NameAllocator, OmGraph, OmOp, TensorDesc, ref
from schemas.cann.op_table import SIMPLE_BY_KILN, SIMPLE_OPS, SimpleOp

__all__ = [
    "Lowerer",
    "LowerFn",
    "lower_graph",
    "lowering",
    "Step",
    "capabilities",
    "simple_reason",
]

log = logging.getLogger(__name__)

LowerFn = Callable[["Lowerer", Node], None]
_LOWERINGS: dict[str, OpSupport[LowerFn]] = {}  # ops whose lowering needs code
_MULTI_OUTPUT: set[str] = set()  # ops whose lowering writes every output (Split, LSTM, ...)


def lowering(
    *ops: str, check: Check | None = None, multi_output: bool = False, dynamic_outputs: bool = False
) -> Callable[[LowerFn], LowerFn]:
    """Register a lowering, and the check that refuses what it cannot write, for Kiln ops
    (``"Conv"``, ``"kiln::FusedConv"``). ``multi_output`` lowerings bind every output of the
    node (:meth:`Lowerer.bind`); the others map single-output nodes only. ``dynamic_outputs``
    lowerings describe a data-dependent output dim by its static bound (NonMaxSuppressionV6)."""

    def deco(fn: LowerFn) -> LowerFn:
        for q in ops:
            _LOWERINGS[q] = OpSupport(fn, check, dynamic_outputs=dynamic_outputs)
            if multi_output:
                _MULTI_OUTPUT.add(q)
        return fn

    return deco


def _single_output(graph: Graph, node: Node) -> str | None:
    if node.num_outputs != 1:
        return f"{node.num_outputs} outputs (the CANN backend maps single-output ops)"
    return None


def _output_dtypes(graph: Graph, node: Node) -> str | None:
    for t in node.output_types:
        if t.dtype not in PROTO_DTYPE:
            return f"dtype {t.dtype.name} has no CANN code"
    return None


def simple_reason(spec: SimpleOp, node: Node) -> str | None:
    """Why ``node`` cannot be written as the one-to-one op ``spec`` (an attribute the GE op lacks)."""
    mapped = {r.kiln for r in spec.attrs}
    for name, value in get_op(node.op, node.domain).non_default_attrs(node.attrs).items():
        if name not in mapped:
            return f"attribute {name}={value!r} has no CANN equivalent"
    try:
        for r in spec.attrs:
            r.write(getattr(node.attrs, r.kiln))
    except (KeyError, ValueError, TypeError) as exc:
        return f"an attribute has no CANN encoding ({exc})"
    return None


def _simple_check(spec: SimpleOp) -> Check:
    return lambda graph, node: simple_reason(spec, node)


def _simple_lower(spec: SimpleOp) -> LowerFn:
    def lower(low: Lowerer, node: Node) -> None:
        low.simple(node, spec)

    return lower


@functools.cache
def capabilities() -> CapabilityTable[LowerFn]:
    """The CANN op table: every ``SIMPLE_OPS`` entry and every :func:`lowering`, one shape.

    An op with both (Concat, Transpose, Clip) takes the coded lowering and keeps the
    one-to-one entry's attribute check.
    """
    import backends.cann.lower_detection  # noqa: F401  (registers the lowerings that need code)
    import backends.cann.lower_index  # noqa: F401
    import backends.cann.lower_nn  # noqa: F401
    import backends.cann.lower_quant  # noqa: F401
    import backends.cann.lower_rnn  # noqa: F401
    import backends.cann.lower_tensor  # noqa: F401
    import backends.cann.lower_weight_only  # noqa: F401

    entries: dict[str, OpSupport[LowerFn]] = {}
    for spec in SIMPLE_OPS:
        entries[spec.kiln] = OpSupport(_simple_lower(spec), _simple_check(spec))
    for op, coded in _LOWERINGS.items():
        simple = SIMPLE_BY_KILN.get(op)
        attrs = _simple_check(simple) if simple is not None else None
        entries[op] = OpSupport(
            coded.lower, all_of(attrs, coded.check), dynamic_outputs=coded.dynamic_outputs
        )

    def common(op: str) -> tuple[Check, ...]:
        return (_output_dtypes,) if op in _MULTI_OUTPUT else (_single_output, _output_dtypes)

    return CapabilityTable(
        "cann",
        {
            op: OpSupport(e.lower, all_of(*common(op), e.check), dynamic_outputs=e.dynamic_outputs)
            for op, e in entries.items()
        },
    )


@dataclass
class Step:
    """One GE op of an expansion: its type, inputs beyond the chained one, attrs, output dtype.

    In :meth:`Lowerer.chain`, step k > 0 reads step k-1's output as its input 0.
    """

    type: str
    inputs: Sequence[str]
    attrs: dict[str, Attr]
    dtype: DType | None = None  # None: the node's output dtype


class Lowerer:
    """State of one lowering: the OmGraph being built and the reference of every Kiln value."""

    def __init__(self, graph: Graph, table: CapabilityTable[LowerFn] | None = None) -> None:
        self.g = graph
        self.table = table if table is not None else capabilities()
        self.om = OmGraph(graph.name)
        names = [nm for n in graph.nodes() for nm in n.output_names]
        self.names = NameAllocator(names)
        self.refs: dict[tuple[int, int], str] = {}
        self.descs: dict[str, TensorDesc] = {}
        self.deferred: dict[int, Callable[[Value], str]] = {}  # node id -> emits its value on demand

    # ------------------------------------------------------------------ helpers
    def fail(self, node: Node, why: str) -> ConversionError:
        """An error naming the node."""
        return ConversionError(f"CANN backend: {node.describe()}: {why}")

    def desc(self, t: TensorType, where: Node | None = None, dtype: DType | None = None) -> TensorDesc:
        """The descriptor of a Kiln type (static shapes only)."""
        if not t.is_static:
            what = where.describe() if where is not None else "a value"
            raise ConversionError(
                f"CANN backend: {what} has dynamic shape {t}; .om files need static shapes "
                "(fix the inputs with --input-shape)"
            )
        dt = dtype or t.dtype
        if dt not in PROTO_DTYPE:
            what = where.describe() if where is not None else "a value"
            raise ConversionError(f"CANN backend: {what}: dtype {dt.name} has no CANN code")
        return TensorDesc(dt, t.static_shape, format_for(len(t.static_shape)))

    def emit(
        self,
        name: str,
        type_: str,
        inputs: Sequence[str],
        outputs: Sequence[TensorDesc],
        attrs: dict[str, Attr] | None = None,
        value: np.ndarray | None = None,
    ) -> str:
        """Append an op; returns the reference to its output 0."""
        op = OmOp(name, type_, list(inputs), list(outputs), dict(attrs or {}), value)
        self.om.ops.append(op)
        for i, d in enumerate(outputs):
            self.descs[ref(name, i)] = d
        return ref(name)

    def const(self, array: np.ndarray, base: str) -> str:
        """A new Const op holding ``array`` (derived name from ``base``)."""
        arr = np.ascontiguousarray(array)
        t = TensorType.of(arr)
        return self.emit(self.names.fresh(base), "Const", [], [self.desc(t)], value=arr)

    def ref_of(self, v: Value | None) -> str:
        """The GE reference of a Kiln value ("" for an absent input), emitting it on first use."""
        if v is None:
            return ""
        key = (v.node, v.port)
        r = self.refs.get(key)
        if r is not None:
            return r
        node = v.producer
        if node.op == CONSTANT_OP and not node.domain:
            arr = np.ascontiguousarray(node.attrs.value)
            r = self.emit(v.name, "Const", [], [self.desc(v.type, node)], value=arr)
        elif node.id in self.deferred:
            r = self.deferred[node.id](v)
        else:
            raise self.fail(node, f"value {v.name!r} is used before it is lowered")
        self.refs[key] = r
        return r

    def bind(self, node: Node, r: str, port: int = 0) -> None:
        """Record ``r`` as the reference of the node's output ``port``."""
        self.refs[(node.id, port)] = r

    def used(self, node: Node, port: int) -> bool:
        """Whether output ``port`` of ``node`` is read (by a node or as a graph output)."""
        v = self.g.value(node, port)
        return bool(self.g.users(v)) or any((o.node, o.port) == (v.node, v.port) for o in self.g.outputs)

    def int_const(self, values: Sequence[int], base: str, dtype: type = np.int64) -> str:
        """A 1-D integer Const (shapes, slice bounds, axes)."""
        return self.const(np.array(list(values), dtype), base)

    def slice(self, x: str, t: TensorType, begin: int, end: int, axis: int, name: str) -> str:
        """``StridedSliceV2`` op ``name`` of ``x`` (type ``t`` after it) along one axis, ``[begin, end)``."""
        consts = [self.int_const([v], f"{name}/{k}") for k, v in (("begin", begin), ("end", end))]
        consts += [self.int_const([axis], f"{name}/axes"), self.int_const([1], f"{name}/strides")]
        return self.emit(name, "StridedSliceV2", [x, *consts], [self.desc(t)])

    def chain(self, node: Node, first_inputs: Sequence[str], steps: Sequence[Step]) -> str:
        """Emit ``steps`` as a chain; the last op takes the node's value name."""
        out = self.g.value(node)
        prev = ""
        for k, step in enumerate(steps):
            last = k == len(steps) - 1
            name = out.name if last else self.names.fresh(f"{out.name}/{step.type}")
            inputs = list(first_inputs if k == 0 else [prev]) + list(step.inputs)
            prev = self.emit(name, step.type, inputs, [self.desc(out.type, node, step.dtype)], step.attrs)
        self.bind(node, prev)
        return prev

    # --------------------------------------------------------------------- walk
    def run(self) -> OmGraph:
        """Lower the whole graph."""
        for i, v in enumerate(self.g.inputs):
            d = self.desc(v.type, v.producer)
            self.refs[(v.node, 0)] = self.emit(v.name, "Data", [], [d], {"index": Attr.i(i)})
        for node in self.g.nodes():
            if node.op in (INPUT_OP, CONSTANT_OP) and not node.domain:
                continue
            why = self.table.reason(self.g, node)
            if why is not None:
                if node.qualified_op not in self.table:
                    why = f"op {node.qualified_op} has no CANN mapping"
                raise self.fail(node, why)
            self.table.lower_for(node.qualified_op)(self, node)
        outs = [self.ref_of(v) for v in self.g.outputs]
        self.emit(self.names.fresh("NetOutput"), "NetOutput", outs, [])
        self.om.output_names = self.g.output_names
        return self.om

    def simple(self, node: Node, spec: SimpleOp, extra: dict[str, Attr] | None = None) -> str:
        """Lower a one-to-one op through its ``SIMPLE_OPS`` entry (checked by :func:`simple_reason`)."""
        attrs = {r.ge: r.write(getattr(node.attrs, r.kiln)) for r in spec.attrs}
        attrs.update(dict(spec.fixed))
        attrs.update(extra or {})
        inputs = [self.ref_of(v) for v in self.g.inputs_of(node)]
        return self.chain(node, inputs, [Step(spec.ge, [], attrs)])


def lower_graph(graph: Graph) -> OmGraph:
    """Lower ``graph`` (after Kiln's pipeline, fp32 or int8 QDQ) to an OmGraph."""
    return Lowerer(graph).run()
