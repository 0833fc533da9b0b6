"""Kiln against onnxruntime on one ONNX model: import -> interpreter, and import -> export -> ORT.

``check_parity`` runs onnxruntime on the original model, then Kiln's two paths,
and asserts both agree with ORT's outputs under explicit tolerances (exact
for integer outputs). Models come from ``one_node_model`` (an ``onnx.helper``
one-node model, every input a graph input unless given as an initializer) or
from the onnx wheel's node test cases (``node_case``).
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from compiler.ir import run_graph
from compiler.onnx_export import export_onnx, model_bytes
from frontends.onnx import load_onnx
from tests.helpers.conformance import ort_session
from tests.helpers.numerics import assert_close

__all__ = ["Parity", "check_parity", "one_node_model", "node_case", "node_attrs"]


@dataclass(frozen=True)
class Parity:
    """The worst relative error of each Kiln path against ORT, the exported model and its opset."""

    interpreter_rel: float
    exported_rel: float
    exported_opset: int
    exported: onnx.ModelProto


def node_attrs(model: onnx.ModelProto, op: str) -> dict[str, Any]:
    """The attributes of the (first) ``op`` node of ``model``, as Python values."""
    node = next(n for n in model.graph.node if n.op_type == op)
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def one_node_model(
    op: str,
    inputs: Sequence[tuple[str, np.ndarray | None]],
    attrs: Mapping[str, Any] | None = None,
    *,
    opset: int = 21,
    num_outputs: int = 1,
    initializers: Sequence[str] = (),
) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """A one-node model and its feeds; an input named in ``initializers`` is a constant, None is omitted."""
    names = [n if x is not None else "" for n, x in inputs]
    while names and not names[-1]:
        names.pop()
    node = helper.make_node(op, names, [f"y{i}" for i in range(num_outputs)], **dict(attrs or {}))
    present = [(n, x) for n, x in inputs if x is not None]
    g_in = [
        helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(x.dtype), x.shape)
        for n, x in present
        if n not in initializers
    ]
    inits = [numpy_helper.from_array(x, n) for n, x in present if n in initializers]
    outs = [helper.make_empty_tensor_value_info(f"y{i}") for i in range(num_outputs)]
    graph = helper.make_graph([node], op.lower(), g_in, outs, initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10
    return model, {n: x for n, x in present if n not in initializers}


@functools.lru_cache(maxsize=1)
def _node_cases() -> dict[str, Any]:
    from onnx.backend.test.loader import load_model_tests

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return {c.name: c for c in load_model_tests(kind="node")}


def node_case(name: str) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """The onnx wheel's node test ``name`` (e.g. ``test_scatternd_add``): its model and first inputs."""
    case = _node_cases()[name]
    inputs, _ = case.data_sets[0]
    names = [vi.name for vi in case.model.graph.input]
    feeds = {
        n: numpy_helper.to_array(x) if isinstance(x, onnx.TensorProto) else np.asarray(x)
        for n, x in zip(names, inputs, strict=False)
    }
    return case.model, feeds


def _worst(
    got: Sequence[np.ndarray], want: Sequence[np.ndarray], rtol: float, atol: float, what: str
) -> float:
    assert len(got) == len(want), f"{what}: {len(got)} outputs, ORT has {len(want)}"
    worst = 0.0
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        g, w = np.asarray(g), np.asarray(w)
        assert g.dtype == w.dtype, f"{what} output {i}: dtype {g.dtype} != ORT's {w.dtype}"
        exact = w.dtype.kind in "biu"
        m = assert_close(
            g, w, rtol=0 if exact else rtol, atol=0 if exact else atol, what=f"{what} output {i}"
        )
        worst = max(worst, 0.0 if exact or np.isnan(m.max_rel) else float(m.max_rel))
    return worst


def check_parity(
    model: onnx.ModelProto, feeds: Mapping[str, np.ndarray], *, rtol: float, atol: float
) -> Parity:
    """Assert Kiln's interpreter and exported model match ORT on ``model`` (integers exactly)."""
    want = [np.asarray(a) for a in ort_session(model).run(None, dict(feeds))]
    graph = load_onnx(model)
    got = run_graph(graph, {v.name: feeds[v.name] for v in graph.inputs})
    interp = _worst([got[v.name] for v in graph.outputs], want, rtol, atol, "interpreter")
    exported = export_onnx(graph)
    onnx.checker.check_model(exported, full_check=True)
    run = ort_session(model_bytes(exported)).run(None, {v.name: feeds[v.name] for v in graph.inputs})
    rel = _worst(list(run), want, rtol, atol, "exported")
    opset = next(o.version for o in exported.opset_import if o.domain == "")
    return Parity(interp, rel, opset, exported)
