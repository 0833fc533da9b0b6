"""ONNX's node conformance cases, run through Kiln's importer, interpreter and exporter.

Cases come from ``onnx.backend.test.loader.load_model_tests(kind="node")``
(generated from the onnx wheel's case code). A case is selected when it is not
a function expansion (``*_expanded*``) and its single node is one of
:data:`CONFORMANCE_OPS`. A case onnxruntime itself cannot run (session or run
fails on the original model) is excluded and recorded with ORT's reason.
Each remaining case is checked on two paths: import -> interpreter, and
import -> export -> onnxruntime, both against the expected outputs.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
from onnx import numpy_helper

from compiler.ir import run_graph
from compiler.ir.types import DType
from compiler.onnx_export import export_onnx, model_bytes
from frontends.onnx import load_onnx
from tests.helpers.numerics import assert_close

__all__ = ["CONFORMANCE_OPS", "RTOL", "ATOL", "CaseResult", "selected_cases", "run_case", "ort_session"]

logger = logging.getLogger(__name__)

CONFORMANCE_OPS = frozenset(
    {
        "Conv",
        "ConvTranspose",
        "BatchNormalization",
        "Relu",
        "LeakyRelu",
        "PRelu",
        "Clip",
        "Sigmoid",
        "HardSigmoid",
        "HardSwish",
        "Tanh",
        "Exp",
        "Sqrt",
        "Add",
        "Sub",
        "Mul",
        "Div",
        "Pow",
        "MatMul",
        "Gemm",
        "MaxPool",
        "AveragePool",
        "GlobalAveragePool",
        "Concat",
        "Split",
        "Slice",
        "Reshape",
        "Flatten",
        "Transpose",
        "Squeeze",
        "Unsqueeze",
        "Gather",
        "Shape",
        "Resize",
        "Softmax",
        "ReduceMean",
        "Cast",
        "Pad",
        "Identity",
        "Constant",
        "QuantizeLinear",
        "DequantizeLinear",
    }
)
RTOL = 1e-3
ATOL = 1e-5


@dataclass(frozen=True)
class CaseResult:
    """The outcome of one case: ``excluded`` (ORT's reason) or one failure reason per path (None = pass).

    ``ort_differs`` says how onnxruntime on the *original* model misses the expected
    outputs, when it does (a hint that a failure is ORT's disagreement, not Kiln's).
    """

    name: str
    op: str
    excluded: str | None = None
    interpreter: str | None = None
    exported: str | None = None
    ort_differs: str | None = None


def ort_session(model: onnx.ModelProto | bytes) -> ort.InferenceSession:
    """A CPU session with every graph optimization disabled."""
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.log_severity_level = 3
    data = model if isinstance(model, bytes) else model.SerializeToString()
    return ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])


@functools.lru_cache(maxsize=1)
def selected_cases() -> tuple[Any, ...]:
    """The selected conformance cases (see the module docstring), in the loader's order."""
    import warnings

    from onnx.backend.test.loader import load_model_tests

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cases = load_model_tests(kind="node")
    return tuple(c for c in cases if _selected(c.name, c.model))


def _selected(name: str, model: onnx.ModelProto | None) -> bool:
    if model is None or "_expanded" in name or len(model.graph.node) != 1:
        return False
    node = model.graph.node[0]
    return node.op_type in CONFORMANCE_OPS and node.domain in ("", "ai.onnx")


def _array(x: Any) -> Any:
    if isinstance(x, onnx.TensorProto):
        return numpy_helper.to_array(x)
    return np.asarray(x) if isinstance(x, np.ndarray | np.generic) else x


def _comparable(a: np.ndarray) -> np.ndarray:
    """ml_dtypes arrays (bfloat16, float8...) as float32 for comparison."""
    if a.dtype.kind == "V" or a.dtype.name in ("bfloat16",) or a.dtype.name.startswith("float8"):
        return a.astype(np.float32)
    return a


def _kiln_feed(a: np.ndarray, dtype: DType) -> np.ndarray:
    if dtype is DType.BFLOAT16:
        return np.asarray(a, order="C").view(np.uint16)
    return a


def _kiln_output(a: np.ndarray, dtype: DType) -> np.ndarray:
    if dtype is DType.BFLOAT16:
        return (np.asarray(a, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)
    return a


def _compare(got: list[np.ndarray], want: list[np.ndarray]) -> str | None:
    if len(got) != len(want):
        return f"{len(got)} outputs, expected {len(want)}"
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        g, w = _comparable(np.asarray(g)), _comparable(np.asarray(w))
        if g.dtype != w.dtype:
            return f"output {i}: dtype {g.dtype} != expected {w.dtype}"
        if w.dtype == object:
            if g.shape != w.shape or not np.array_equal(g, w):
                return f"output {i}: strings differ"
            continue
        try:
            assert_close(g, w, rtol=RTOL, atol=ATOL, what=f"output {i}")
        except AssertionError as exc:
            return str(exc).splitlines()[0]
    return None


def _reason(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:300]


def run_case(case: Any) -> CaseResult:
    """Run one conformance case on both Kiln paths."""
    model: onnx.ModelProto = case.model
    op = model.graph.node[0].op_type
    inputs, outputs = case.data_sets[0]
    names = [vi.name for vi in model.graph.input]
    feeds = {n: _array(x) for n, x in zip(names, inputs, strict=False)}
    want = [_array(x) for x in outputs]
    try:
        ort_out = ort_session(model).run(None, feeds)
    except Exception as exc:  # noqa: BLE001 - ORT cannot run it: excluded, with its reason
        return CaseResult(case.name, op, excluded=_reason(exc))
    ort_differs = _compare(list(ort_out), want)
    try:
        graph = load_onnx(model)
    except Exception as exc:  # noqa: BLE001 - recorded as a failure of both paths
        reason = f"import: {_reason(exc)}"
        return CaseResult(case.name, op, interpreter=reason, exported=reason, ort_differs=ort_differs)
    interp: str | None
    try:
        types = {v.name: v.type.dtype for v in graph.inputs}
        res = run_graph(graph, {n: _kiln_feed(a, types[n]) for n, a in feeds.items() if n in types})
        got = [_kiln_output(res[v.name], v.type.dtype) for v in graph.outputs]
        interp = _compare(got, want)
    except Exception as exc:  # noqa: BLE001
        interp = f"interpreter: {_reason(exc)}"
    exported: str | None
    try:
        sess = ort_session(model_bytes(export_onnx(graph)))
        exported = _compare(sess.run(None, {k: v for k, v in feeds.items() if k in types}), want)
    except Exception as exc:  # noqa: BLE001
        exported = f"export/ORT: {_reason(exc)}"
    return CaseResult(case.name, op, interpreter=interp, exported=exported, ort_differs=ort_differs)
