"""Acceptance of the CANN backend on every shared model, fp32 and int8, in both schemas.

Each configuration is compiled twice with ``kiln compile --emit onnx,cann`` (int8:
``--quantize int8 --calib data/<stem>.calib.npz``). The ``.om`` must read back through
Kiln's reader into a graph whose ONNX export, run in onnxruntime on the model's real
inputs, matches:

* fp32: the original model within max rel 1e-5 (pan: 1e-4, see ``FP32_VS_ORIGINAL``), and
  Kiln's own ONNX artifact of the same compile exactly;
* int8: Kiln's QDQ model (the ``--emit onnx`` artifact of the same compile) exactly.

The two runs must give identical bytes. The ge files must also pass Netron's own ``.om``
reader (headless, ``tests/helpers/netron_check.mjs``): every op shown, every weight an
initializer whose sha256 equals the bytes Kiln wrote.
"""

from __future__ import annotations

import collections
from pathlib import Path

import numpy as np
import onnx
import pytest

from compiler.api import load_model
from compiler.metrics import agreement
from compiler.onnx_export import export_onnx, model_bytes
from compiler.runners import run_onnxruntime
from frontends.cann.loader import read_om_graph
from tests.conftest import MODEL_STEMS, MODELS
from tests.helpers.cann import assert_netron_shows, compile_model_cli, feeds_of, ge_consts, netron_check

# Max rel of the read-back .om against the original model with the default pipeline. Its canonicalize
# pass rewrites pan's x*clip(x+3,0,6)/6 into HardSwish, which moves pan's sigmoid outputs by 5e-5; the
# .om itself adds nothing (it equals Kiln's ONNX artifact bit for bit, checked below), and with the
# "exact" pipeline every model meets 1e-5 (test_exact_pipeline_meets_1e5).
FP32_VS_ORIGINAL = {stem: 1e-5 for stem in MODEL_STEMS} | {"pan_mnv3s_skin_clothes_hair": 1e-4}

CONFIGS = [(s, p, c) for s in MODEL_STEMS for p in ("fp32", "int8") for c in ("ge", "domi")]


class Builds:
    """Compiles each configuration on first use (twice: the second run checks determinism)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.done: dict[tuple[str, str, str], tuple[Path, Path]] = {}

    def get(self, stem: str, precision: str, schema: str) -> tuple[Path, Path]:
        key = (stem, precision, schema)
        if key not in self.done:
            base = self.root / f"{stem}-{precision}-{schema}"
            first = compile_model_cli(stem, base / "run1", precision, schema)
            second = compile_model_cli(stem, base / "run2", precision, schema, verify=False)
            self.done[key] = (first, second)
        return self.done[key]


@pytest.fixture(scope="module")
def builds(tmp_path_factory: pytest.TempPathFactory) -> Builds:
    return Builds(tmp_path_factory.mktemp("cann-models"))


@pytest.fixture(scope="module")
def originals() -> dict[str, dict[str, np.ndarray]]:
    return {s: run_onnxruntime(MODELS / f"{s}.onnx", feeds_of(s)) for s in MODEL_STEMS}


def _readback(path: Path, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    graph = load_model(path)
    return run_onnxruntime(model_bytes(export_onnx(graph)), feeds)


@pytest.mark.parametrize(("stem", "precision", "schema"), CONFIGS, ids=["-".join(c) for c in CONFIGS])
def test_round_trip(
    builds: Builds, originals: dict[str, dict[str, np.ndarray]], stem: str, precision: str, schema: str
) -> None:
    out, _ = builds.get(stem, precision, schema)
    feeds = feeds_of(stem)
    got = _readback(out / "model.om", feeds)
    kiln_onnx = run_onnxruntime(out / "model.onnx", feeds)
    assert sorted(got) == sorted(kiln_onnx) == sorted(originals[stem])
    for name, ref in kiln_onnx.items():
        assert got[name].dtype == ref.dtype and got[name].shape == ref.shape, name
        assert np.array_equal(got[name], ref), (
            f"{name}: the .om differs from Kiln's ONNX artifact (max abs {agreement(got[name], ref).max_abs:.3g})"
        )
        if precision == "fp32":
            rel = agreement(got[name], originals[stem][name]).max_rel
            assert rel <= FP32_VS_ORIGINAL[stem], f"{name}: max rel {rel:.3g} against the original"


@pytest.mark.parametrize(("stem", "precision", "schema"), CONFIGS, ids=["-".join(c) for c in CONFIGS])
def test_bytes_repeat_and_structure(builds: Builds, stem: str, precision: str, schema: str) -> None:
    first, second = builds.get(stem, precision, schema)
    data = (first / "model.om").read_bytes()
    assert data == (second / "model.om").read_bytes(), "two compiles gave different .om bytes"
    detected, om = read_om_graph(data, "model.om")
    assert detected == schema
    types = collections.Counter(op.type for op in om.ops)
    assert types["Data"] == 1 and types["NetOutput"] == 1
    qdq = onnx.load(str(first / "model.onnx"))
    convs = sum(n.op_type in ("Conv", "Gemm") for n in qdq.graph.node)
    if precision == "int8":
        # Every quantized Conv/Gemm became AscendQuant -> Conv2D/FullyConnection(int8) -> AscendDequant.
        weighted = [op for op in om.ops if op.type in ("Conv2D", "FullyConnection")]
        assert all("_kiln_weight_scale" in op.attrs for op in weighted)
        assert types["AscendDequant"] == len(weighted) == convs
        assert types["AscendQuant"] == sum(n.op_type == "QuantizeLinear" for n in qdq.graph.node)
        assert not {"QuantizeLinear", "DequantizeLinear"} & set(types)
    else:
        assert types["Conv2D"] + types["FullyConnection"] == convs
        assert not {"AscendQuant", "AscendDequant", "AscendAntiQuant"} & set(types)


def test_netron_reads_every_ge_file(builds: Builds) -> None:
    files = [builds.get(s, p, "ge")[0] / "model.om" for s in MODEL_STEMS for p in ("fp32", "int8")]
    results = netron_check(files)
    assert [Path(r["file"]) for r in results] == files
    for path, res in zip(files, results, strict=True):
        where = f"{path.parent.parent.name}"
        assert_netron_shows(path, res)
        model, _ = ge_consts(path)
        ops = [op for op in model.graph[0].op if op.type != "Const"]
        nodes = res["graphs"][0]["nodes"]
        relu_flags = sum(1 for op in ops if op.type == "AscendDequant" and op.attr["relu_flag"].b)
        assert sum(n["chain"] == ["ReLU"] for n in nodes) == relu_flags, where


@pytest.mark.parametrize("schema", ["ge", "domi"])
@pytest.mark.parametrize("stem", MODEL_STEMS)
def test_exact_pipeline_meets_1e5(
    tmp_path: Path, originals: dict[str, dict[str, np.ndarray]], stem: str, schema: str
) -> None:
    out = compile_model_cli(stem, tmp_path / "o", "fp32", schema, verify=False, pipeline="exact")
    got = _readback(out / "model.om", feeds_of(stem))
    for name, ref in originals[stem].items():
        rel = agreement(got[name], ref).max_rel
        assert rel <= 1e-5, f"{stem}:{name}: max rel {rel:.3g} against the original"
