"""The real models of ../shared/models: import, verify, export, and compare with onnxruntime.

A missing ../shared folder, model or input file fails these tests; nothing is skipped.
"""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import onnx
import pytest

from compiler.ir import Graph, run_graph, verify
from compiler.onnx_export import export_onnx, model_bytes
from frontends.onnx import load_onnx
from tests.conftest import MODEL_STEMS, MODELS
from tests.helpers.conformance import ort_session
from tests.helpers.numerics import agreement

# Fixed shapes for models whose declared inputs are dynamic (the values the pipelines use).
INPUT_SHAPES: dict[str, dict[str, tuple[int, ...]]] = {"ppocr_mobile_v2_cls": {"x": (1, 3, 48, 192)}}
EXPORT_REL = 1e-5  # exported model in ORT vs the original in ORT: max|diff| <= tol * max(1, max|ref|)
INTERP_REL = 1e-4  # Kiln's numpy interpreter vs ORT


def _model_path(stem: str) -> Path:
    path = MODELS / f"{stem}.onnx"
    assert path.is_file(), f"{path} is missing; ../shared/models must be provided"
    return path


@functools.cache
def _feeds(stem: str) -> dict[str, np.ndarray]:
    path = MODELS / "data" / f"{stem}.npz"
    assert path.is_file(), f"{path} is missing"
    with np.load(path) as z:
        return {k: np.asarray(z[k]) for k in z.files}


@functools.cache
def _reference(stem: str) -> tuple[np.ndarray, ...]:
    return tuple(ort_session(onnx.load(str(_model_path(stem)))).run(None, _feeds(stem)))


def _import(stem: str) -> Graph:
    return load_onnx(_model_path(stem), input_shapes=INPUT_SHAPES.get(stem))


def _check(
    got: list[np.ndarray], ref: tuple[np.ndarray, ...], names: list[str], tol: float, what: str
) -> None:
    assert len(got) == len(ref)
    for name, g, r in zip(names, got, ref, strict=True):
        m = agreement(g, r)
        assert m.shape_ok, f"{what} {name}: shape {np.shape(g)} != {r.shape}"
        assert m.max_rel <= tol, f"{what} {name}: max|diff| / max(1, max|ref|) = {m.max_rel:.3g} > {tol}"


def test_every_shared_model_is_covered(shared_dir: Path) -> None:
    found = sorted(p.stem for p in (shared_dir / "models").glob("*.onnx"))
    assert found == sorted(MODEL_STEMS), f"models in ../shared/models: {found}"


@pytest.mark.parametrize("stem", MODEL_STEMS)
def test_import_verifies_with_static_shapes(stem: str) -> None:
    graph = _import(stem)
    verify(graph)
    dynamic = [(n.describe(), str(t)) for n in graph.nodes() for t in n.output_types if not t.is_static]
    assert not dynamic, f"values with dynamic shapes: {dynamic[:5]}"
    source = onnx.load(str(_model_path(stem)), load_external_data=False)
    assert [v.name for v in graph.outputs] == [o.name for o in source.graph.output]
    inits = {t.name for t in source.graph.initializer}
    assert [v.name for v in graph.inputs] == [i.name for i in source.graph.input if i.name not in inits]


@pytest.mark.parametrize("stem", MODEL_STEMS)
def test_export_matches_onnxruntime(stem: str) -> None:
    graph = _import(stem)
    model = export_onnx(graph)
    onnx.checker.check_model(model, full_check=True)
    data = model_bytes(model)
    assert data == model_bytes(export_onnx(_import(stem))), "export is not byte-identical across runs"
    got = ort_session(data).run(None, _feeds(stem))
    _check(list(got), _reference(stem), [o.name for o in model.graph.output], EXPORT_REL, "exported")


@pytest.mark.parametrize("stem", MODEL_STEMS)
def test_interpreter_matches_onnxruntime(stem: str) -> None:
    graph = _import(stem)
    res = run_graph(graph, _feeds(stem))
    names = [v.name for v in graph.outputs]
    _check([res[n] for n in names], _reference(stem), names, INTERP_REL, "interpreter")
