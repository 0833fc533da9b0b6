"""Preflight (issue 14): every gap of every requested backend in one message, before calibration.

* A model with ops that MNN, CANN and TVM all lack fails once, exit 2, with one line that names
  every (backend, op, nodes, reason); nothing is written and calibration never starts.
* Ops a backend lacks but the decomposition library rewrites exactly (LayerNormalization, Gelu,
  multi-output Split for CANN) are not gaps: the same compile writes verified .mnn and .om files.
* Repeated --emit/--target values accumulate; a value given twice is refused.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

import compiler.quant.quantize as quantize
from compiler.cli import main
from compiler.errors import OptionError
from compiler.preflight import CapabilityError, find_gaps
from tests.helpers.onnx_text import rand, text_model


def kiln(*args: str | Path) -> int:
    return main([str(a) for a in args])


def _gapped_model() -> onnx.ModelProto:
    """Det and RandomUniformLike: refused by mnn and cann; a Loop whose trip count is an input: refused by
    mnn, cann and tvm; LayerNormalization: decomposed where missing."""
    return text_model(
        """
        g (float[1,8,6,6] x, int64 trips) => (float[1,8,6,6] y, float[1,8] d, float[1,8,6,6] z) {
            n = RandomUniformLike (x)
            m = Add (x, n)
            y = LayerNormalization <axis = -1> (m, scale, bias)
            d = Det (y)
            z = Loop (trips, keep, y) <body = step (int64 i, bool c, float[1,8,6,6] s) => (bool c2, float[1,8,6,6] s2) {
                c2 = Identity (c)
                s2 = Add (s, s)
            }>
        }
        """,
        opset=17,
        scale=rand(6, seed=1),
        bias=rand(6, seed=2),
        keep=np.asarray(True),
    )


def _decomposable_model() -> onnx.ModelProto:
    """LayerNormalization, Gelu (Erf form) and a two-way Split: writable by MNN and CANN."""
    return text_model(
        """
        g (float[1,16,8] x) => (float[1,8,8] a, float[1,8,8] b) {
            n = LayerNormalization <axis = -1> (x, scale, bias)
            t = Div (n, sqrt2)
            e = Erf (t)
            e1 = Add (e, one)
            h = Mul (n, e1)
            g2 = Mul (h, half)
            a, b = Split <axis = 1> (g2, sizes)
        }
        """,
        opset=17,
        scale=rand(8, seed=3),
        bias=rand(8, seed=4),
        sqrt2=np.array(np.sqrt(2.0), dtype=np.float32),
        one=np.array(1.0, dtype=np.float32),
        half=np.array(0.5, dtype=np.float32),
        sizes=np.array([8, 8], dtype=np.int64),
    )


def test_gaps_of_three_backends_in_one_message(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    model = tmp_path / "gapped.onnx"
    onnx.save(_gapped_model(), model)
    calib = tmp_path / "calib.npz"
    np.savez(calib, x=rand(4, 1, 8, 6, 6, seed=5))

    def no_calibration(*a: object, **k: object) -> None:
        raise AssertionError("calibration ran before the preflight")

    monkeypatch.setattr(quantize, "calibrate_int8", no_calibration)
    out = tmp_path / "out"
    code = kiln(
        "compile", model, "-o", out, "--emit", "mnn,cann", "--target", "cpu",
        "--quantize", "int8", "--calib", calib,
    )  # fmt: skip
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert len(err.splitlines()) == 1 and err.startswith("kiln: error: gapped.onnx:")
    for backend in ("mnn", "cann", "tvm cpu"):
        for op in ("Det", "RandomUniformLike", "Loop") if backend != "tvm cpu" else ("Loop",):
            assert f"{backend}: {op} (node" in err, (backend, op, err)
    assert "no mnn lowering" in err and "no cann lowering" in err and "no tvm lowering" in err
    assert "LayerNormalization" not in err  # decomposed for MNN and CANN, native in TVM
    assert not out.exists()


def test_find_gaps_groups_nodes_by_op_and_reason() -> None:
    from compiler.backend import get_backend
    from compiler.ir.graph import Graph
    from compiler.ir.types import DType, TensorType

    g = Graph("g")
    x = g.add_input("x", TensorType(DType.FLOAT32, (1, 4, 5, 5)))
    a = g.value(g.add_node("LRN", [x], {"size": 3}, name="lrn_a"))
    b = g.value(g.add_node("LRN", [a], {"size": 3}, name="lrn_b"))
    g.set_outputs([b], ["y"])
    gaps = find_gaps(g, get_backend("cann").capabilities("cann"), "cann")
    assert [(gap.op, gap.nodes, gap.reason) for gap in gaps] == [("LRN", ("lrn_a", "lrn_b"), "no cann lowering")]
    err = CapabilityError("m.onnx", gaps)
    assert str(err) == "m.onnx: 1 unsupported op(s) for cann: cann: LRN (nodes 'lrn_a', 'lrn_b'): no cann lowering"


def test_decomposable_ops_are_not_gaps(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = tmp_path / "decomposable.onnx"
    onnx.save(_decomposable_model(), model)
    out = tmp_path / "out"
    assert kiln("compile", model, "-o", out, "--emit", "onnx", "--emit", "mnn,cann") == 0
    assert sorted(p.name for p in out.iterdir()) == ["manifest.json", "model.mnn", "model.om", "model.onnx"]
    table = capsys.readouterr().out
    for name in ("model.mnn", "model.om"):
        assert any(line.startswith(name) and line.rstrip().endswith("yes") for line in table.splitlines()), table


@pytest.mark.parametrize("flags", [("--target", "cpu", "--target", "cpu"), ("--emit", "onnx,mnn", "--emit", "mnn")])
def test_a_value_given_twice_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: tuple[str, ...]
) -> None:
    model = tmp_path / "m.onnx"
    onnx.save(_decomposable_model(), model)
    assert kiln("compile", model, "-o", tmp_path / "out", *flags) == 2
    err = capsys.readouterr().err
    assert "is given twice" in err and err.count("\n") == 1


def test_requests_resolve_through_the_backends() -> None:
    from compiler.backend import resolve_emit, resolve_target

    assert [r.label for r in resolve_emit(["onnx", "mnn", "cann"])] == ["onnx", "mnn", "cann"]
    assert [r.label for r in resolve_target(["arm", "cuda:sm_80"])] == ["tvm arm", "tvm cuda:sm_80"]
    with pytest.raises(OptionError, match="--emit 'tflite'"):
        resolve_emit(["tflite"])
    with pytest.raises(OptionError, match="--target 'riscv'"):
        resolve_target(["riscv"])
