"""Test helpers for the CANN backend: compiles through the CLI, the headless Netron check, file parsing."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest

from compiler.cli import main as kiln
from schemas.cann.codes import MODEL_DEF, WEIGHTS_DATA
from schemas.cann.generated import ge_ir_pb2 as ge
from schemas.cann.om_container import read_om
from tests.conftest import MODELS

__all__ = [
    "NETRON_SCRIPT",
    "INPUT_SHAPES",
    "compile_model_cli",
    "feeds_of",
    "netron_check",
    "assert_netron_shows",
    "ge_consts",
    "tiny_net",
    "compile_tiny",
]

NETRON_SCRIPT = Path(__file__).resolve().parent / "netron_check.mjs"
INPUT_SHAPES = {"ppocr_mobile_v2_cls": ["--input-shape", "x=1x3x48x192"]}


def compile_model_cli(
    stem: str, out: Path, precision: str, schema: str, *, verify: bool = True, pipeline: str = "default"
) -> Path:
    """``kiln compile`` of a shared model with ``--emit onnx,cann``; returns the output folder."""
    args = [str(MODELS / f"{stem}.onnx"), "-o", str(out), "--emit", "onnx,cann", "--cann-schema", schema]
    args += ["--pipeline", pipeline]
    args += INPUT_SHAPES.get(stem, [])
    args += ["--inputs", str(MODELS / "data" / f"{stem}.npz")]
    if precision == "int8":
        args += [
            "--quantize",
            "int8",
            "--calib",
            str(MODELS / "data" / f"{stem}.calib.npz"),
            "--no-sensitivity",
        ]
    if not verify:
        args.append("--no-verify")
    rc = kiln(["compile", *args])
    assert rc == 0, f"kiln compile {stem} ({precision}, {schema}) exited {rc}"
    return out


def feeds_of(stem: str) -> dict[str, np.ndarray]:
    """The real inputs of a shared model."""
    with np.load(MODELS / "data" / f"{stem}.npz") as z:
        return {k: z[k] for k in z.files}


def _netron_dir() -> Path:
    spec = importlib.util.find_spec("netron")
    if spec is None or not spec.submodule_search_locations:
        pytest.fail("the netron wheel is missing: install the test extra (pip install -e '.[test]')")
    return Path(next(iter(spec.submodule_search_locations)))


def netron_check(files: list[Path]) -> list[dict[str, Any]]:
    """Netron's verdict on each file (tests/helpers/netron_check.mjs under node); never skipped."""
    node = shutil.which("node")
    if node is None:
        pytest.fail("node is not on PATH: the Netron check needs Node.js >= 18 (make test checks for it)")
    cmd = [node, str(NETRON_SCRIPT), str(_netron_dir()), *map(str, files)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.stdout.strip(), f"netron_check.mjs printed nothing (rc {done.returncode}): {done.stderr}"
    results: list[dict[str, Any]] = json.loads(done.stdout)
    return results


def ge_consts(path: Path) -> tuple[ge.ModelDef, dict[str, str]]:
    """The file's ge ModelDef and, per Const op, the sha256 of the bytes Kiln wrote for it."""
    f = read_om(path.read_bytes(), str(path))
    model = ge.ModelDef.FromString(f.partitions[MODEL_DEF])
    blob = f.partitions[WEIGHTS_DATA]
    shas: dict[str, str] = {}
    for op in model.graph[0].op:
        if op.type == "Const":
            d = op.attr["value"].t.desc
            raw = blob[d.data_offset : d.data_offset + d.weight_size]
            assert len(raw) == d.weight_size
            shas[op.name] = hashlib.sha256(raw).hexdigest()
    return model, shas


def assert_netron_shows(path: Path, res: dict[str, Any]) -> None:
    """Netron accepted the ge ``.om`` at ``path`` (``res``: its verdict) and shows what Kiln wrote.

    Accepted as "DaVinci OM" without problems, one graph whose nodes are the file's non-Const ops
    (names and types, in order), and every Const an initializer whose sha256 equals Kiln's bytes.
    """
    where = str(path)
    assert res["accepted"], f"{where}: Netron rejected it: {res.get('error')}"
    assert res["format"] == "DaVinci OM" and not res["problems"], f"{where}: {res['format']} {res['problems']}"
    assert len(res["graphs"]) == 1, where
    model, shas = ge_consts(path)
    ops = [(op.name, op.type) for op in model.graph[0].op if op.type != "Const"]
    nodes = res["graphs"][0]["nodes"]
    assert [(n["name"], n["type"]) for n in nodes] == ops, f"{where}: Netron's nodes differ from the file's ops"
    seen: dict[str, str] = {}
    for node in nodes:
        for arg in node["inputs"]:
            for v in arg["values"]:
                if "initializer" in v:
                    seen[v["name"].rsplit(":", 1)[0]] = v["initializer"]["sha256"]
    assert seen == shas, f"{where}: Netron's weights differ from the bytes Kiln wrote"


TINY_NET = """
tiny (float[1, 3, 16, 16] x) => (float[1, 4] prob, float[1, 8, 8, 8] feat) {
    c1 = Conv <pads = [1, 1, 1, 1]> (x, w1, b1)
    n1 = BatchNormalization (c1, g1, be1, m1, v1)
    r1 = Relu (n1)
    d1 = Conv <pads = [1, 1, 1, 1], group = 8> (r1, wd, bd)
    s1 = Sigmoid (d1)
    a1 = Add (r1, s1)
    feat = MaxPool <kernel_shape = [2, 2], strides = [2, 2]> (a1)
    p = GlobalAveragePool (feat)
    f = Flatten (p)
    g = Gemm <transB = 1> (f, wg, bg)
    prob = Softmax (g)
}
"""


def tiny_net() -> onnx.ModelProto:
    """A small model with conv, BN, depthwise conv, residual add, pooling, gemm and softmax."""
    from tests.helpers.onnx_text import rand, text_model

    return text_model(
        TINY_NET,
        w1=rand(8, 3, 3, 3, seed=1, scale=0.5),
        b1=rand(8, seed=2),
        g1=rand(8, seed=3, positive=True),
        be1=rand(8, seed=4),
        m1=rand(8, seed=5),
        v1=rand(8, seed=6, positive=True),
        wd=rand(8, 1, 3, 3, seed=7, scale=0.5),
        bd=rand(8, seed=8),
        wg=rand(4, 8, seed=9),
        bg=rand(4, seed=10),
    )


def compile_tiny(
    model: onnx.ModelProto, out: Path, precision: str, schema: str, extra: tuple[str, ...] = ()
) -> Path:
    """Compile a small model with ``--emit onnx,cann`` (int8: calibrated on seeded random samples)."""
    src = out.parent / f"{out.name}-src"
    src.mkdir(parents=True, exist_ok=True)
    onnx.save(model, src / "model.onnx")
    args = [str(src / "model.onnx"), "-o", str(out), "--emit", "onnx,cann", "--cann-schema", schema]
    if precision == "int8":
        rng = np.random.default_rng(0)
        calib = {}
        for i in model.graph.input:
            dims = [d.dim_value for d in i.type.tensor_type.shape.dim]
            calib[i.name] = rng.standard_normal((8, *dims)).astype(np.float32)
        np.savez(src / "calib.npz", **calib)  # type: ignore[arg-type]
        args += ["--quantize", "int8", "--calib", str(src / "calib.npz"), "--no-sensitivity"]
    rc = kiln(["compile", *args, *extra])
    assert rc == 0, f"kiln compile of a small model ({precision}, {schema}) exited {rc}"
    return out
