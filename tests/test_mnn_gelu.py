"""The erf GELU in MNN files: mnn-fuse-gelu finds x/2 (1 + erf(x/sqrt(2))), the MNN writer computes
it as x * sigmoid(x * h(x^2)) on the fully connected layer's packed output, checked in MNN 3.6.1's
runtime against onnxruntime (the original graph), with the must-not-fire cases."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as oh

from backends.mnn.backend import BACKEND
from backends.mnn.fuse_gelu import MnnFuseGelu
from backends.mnn.lower.gelu import gelu_partial_fractions
from backends.mnn.options import MnnOptions
from backends.mnn.runtime import run_mnn
from backends.mnn.writer import write_mnn
from compiler.api import PassManager, load_model
from compiler.errors import OptionError
from compiler.ir.graph import Graph
from compiler.metrics import agreement
from compiler.pass_infra import PassContext
from compiler.pipelines import pipeline
from compiler.runners import run_onnxruntime
from schemas.mnn.generated import MNN_generated as M
from schemas.mnn.schema import fb
from tests.helpers.mnn_convert import mnn_op_types


def types_count(path: Path, kind: str) -> int:
    """How many ops of type ``kind`` an .mnn file holds."""
    return mnn_op_types(path).count(kind)


MAX_REL = 1e-5  # max|mnn - ort| / max(1, max|ort|), Kiln's fp32 rule is 1e-4
_RNG = np.random.default_rng(18)
_X = (_RNG.standard_normal((1, 16, 32)) * 2).astype(np.float32)
_W1 = (_RNG.standard_normal((32, 64)) * 0.4).astype(np.float32)
_B1 = (_RNG.standard_normal(64) * 0.5).astype(np.float32)
_W2 = (_RNG.standard_normal((64, 24)) * 0.2).astype(np.float32)


def _inits(half: float = 0.5, c: float = math.sqrt(2.0)) -> list[onnx.TensorProto]:
    arrays = {"w1": _W1, "b1": _B1, "w2": _W2, "w3": _W1[:, :24].copy()}
    scalars = {"c": c, "rc": 1.0 / c, "one": 1.0, "half": half}
    return [onnx.numpy_helper.from_array(a, k) for k, a in arrays.items()] + [
        onnx.numpy_helper.from_array(np.array(v, np.float32), k) for k, v in scalars.items()
    ]


def _mlp(shape: str = "xp-half", arg: str = "div", half: float = 0.5, extra_out: str = "") -> onnx.ModelProto:
    """y = (GELU(x W1 + b1)) W2 and z = x W3 (x read by two fully connected layers)."""
    nodes = [
        oh.make_node("MatMul", ["x", "w1"], ["mm"]),
        oh.make_node("Add", ["mm", "b1"], ["h"]),
        oh.make_node("Div", ["h", "c"], ["a"]) if arg == "div" else oh.make_node("Mul", ["rc", "h"], ["a"]),
        oh.make_node("Erf", ["a"], ["e"]),
        oh.make_node("Add", ["one", "e"], ["p"]),
    ]
    if shape == "xp-half":
        nodes += [oh.make_node("Mul", ["h", "p"], ["m"]), oh.make_node("Mul", ["m", "half"], ["g"])]
    elif shape == "xhalf-p":
        nodes += [oh.make_node("Mul", ["half", "h"], ["m"]), oh.make_node("Mul", ["p", "m"], ["g"])]
    elif shape == "xp":  # the 1/2 folded into the next layer
        nodes += [oh.make_node("Mul", ["h", "p"], ["g"])]
    else:
        nodes += [oh.make_node("Mul", ["p", "half"], ["m"]), oh.make_node("Mul", ["h", "m"], ["g"])]
    nodes += [oh.make_node("MatMul", ["g", "w2"], ["y"]), oh.make_node("MatMul", ["x", "w3"], ["z"])]
    outs = ["y", "z", *([extra_out] if extra_out else [])]
    graph = oh.make_graph(
        nodes,
        "mlp",
        [oh.make_tensor_value_info("x", T.FLOAT, list(_X.shape))],
        [oh.make_tensor_value_info(o, T.FLOAT, None) for o in outs],
        _inits(half),
    )
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)])


def _legalized(model: onnx.ModelProto, tmp_path: Path) -> tuple[Graph, Path]:
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    graph = load_model(path)
    PassManager(pipeline("default")).run(graph)
    PassManager(BACKEND.legalization("mnn", None)).run(graph)
    return graph, path


def _unary_kinds(path: Path) -> list[int]:
    net = M.Net.GetRootAs(path.read_bytes(), 0)
    kinds = []
    for i in range(net.OplistsLength()):
        op = net.Oplists(i)
        if op.MainType() == M.OpParameter.UnaryOp:
            u = M.UnaryOp()
            main = op.Main()
            u.Init(main.Bytes, main.Pos)
            kinds.append(u.OpType())
    return kinds


def _run(
    model: onnx.ModelProto, tmp_path: Path, options: MnnOptions | None = None
) -> tuple[Graph, Path, float]:
    graph, path = _legalized(model, tmp_path)
    mnn = write_mnn(graph, tmp_path / "m.mnn", options or MnnOptions(gelu="exact"))[-1]
    got, ref = run_mnn(mnn, {"x": _X}), run_onnxruntime(path, {"x": _X})
    worst = max(agreement(got[k].reshape(ref[k].shape), ref[k]).max_rel for k in ref)
    return graph, mnn, worst


@pytest.mark.parametrize(
    ("shape", "arg"),
    [("xp-half", "div"), ("xhalf-p", "mul"), ("x-phalf", "div"), ("x-phalf", "mul"), ("xp", "div")],
)
def test_erf_gelu_fuses_and_runs_packed(tmp_path: Path, shape: str, arg: str) -> None:
    graph, mnn, worst = _run(_mlp(shape, arg), tmp_path)
    ops = [n.op for n in graph.ops()]
    assert ops.count("Gelu") == 1 and "Erf" not in ops
    assert ops.count("Mul") == 0  # x * p = Gelu(x) * 2, the 2 folded into W2
    assert _unary_kinds(mnn) == [fb.UnaryOpOperation.EXP]
    assert types_count(mnn, "BinaryOp") == 10
    types = mnn_op_types(mnn)
    # x is packed once for both of its fully connected layers; the Gelu runs on the first one's
    # packed output and the second reads it directly: the only copies are x's and the outputs'
    assert types.count("Convolution") == 3
    assert types.count("ConvertTensor") == 3
    assert worst <= MAX_REL


def test_erf_gelu_must_not_fire_on_another_constant(tmp_path: Path) -> None:
    """x * 0.6 * (1 + erf(x/sqrt(2))) is no Gelu: the Erf stays."""
    graph, mnn, worst = _run(_mlp(half=0.6), tmp_path)
    assert "Gelu" not in [n.op for n in graph.ops()]
    assert fb.UnaryOpOperation.ERF in _unary_kinds(mnn)
    assert worst <= MAX_REL


def test_erf_gelu_must_not_fire_when_an_interior_value_is_used(tmp_path: Path) -> None:
    graph, mnn, worst = _run(_mlp(extra_out="e"), tmp_path)
    assert "Gelu" not in [n.op for n in graph.ops()]
    assert fb.UnaryOpOperation.ERF in _unary_kinds(mnn)
    assert worst <= MAX_REL


def test_fuse_gelu_near_miss_names_the_constant(tmp_path: Path) -> None:
    path = tmp_path / "m.onnx"
    onnx.save(_mlp(half=0.6), path)
    graph = load_model(path)
    ctx = PassContext()
    assert not MnnFuseGelu().run(graph, ctx).changed
    assert any("half is 0.6" in m.reason for m in ctx.near_misses)


def test_gelu_rational_is_exact_to_float32_rounding() -> None:
    """h(s) = C + A/(s + d1) + B/(s + d2) in float32: |x / (1 + exp(-x h)) - Gelu(x)| <= 1.8e-6 on [-20, 20]."""
    from scipy.special import erf

    c, a, b = (np.float32(v) for v in gelu_partial_fractions())
    d1, d2 = (np.float32(v) for v in (58.19091200492282, 6.623629960572501))
    x = np.linspace(-20, 20, 400001, dtype=np.float32)
    s = x * x
    v = x * ((-a / (s + d1) + -b / (s + d2)) + -c)
    with np.errstate(over="ignore"):
        y = x / (np.exp(v) + np.float32(1))
    exact = 0.5 * x.astype(np.float64) * (1 + erf(x.astype(np.float64) / math.sqrt(2)))
    assert np.abs(y - exact).max() <= 1.8e-6


def _erf_gelu_of_input(n: int) -> onnx.ModelProto:
    """y = x * 1/2 * (1 + erf(x / sqrt(2))) of a graph input x [1, n]."""
    nodes = [
        oh.make_node("Div", ["x", "c"], ["a"]),
        oh.make_node("Erf", ["a"], ["e"]),
        oh.make_node("Add", ["one", "e"], ["p"]),
        oh.make_node("Mul", ["x", "p"], ["m"]),
        oh.make_node("Mul", ["m", "half"], ["y"]),
    ]
    graph = oh.make_graph(
        nodes,
        "gelu",
        [oh.make_tensor_value_info("x", T.FLOAT, [1, n])],
        [oh.make_tensor_value_info("y", T.FLOAT, [1, n])],
        [i for i in _inits() if i.name in ("c", "one", "half")],
    )
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)])


def test_gelu_in_mnn_is_exact_on_a_fine_grid(tmp_path: Path) -> None:
    """MNN's own kernels on x in [-20, 20] (steps of 1e-4) and the tails: within 1.8e-6 of Gelu(x)."""
    from scipy.special import erf

    grid = np.linspace(-20, 20, 400001, dtype=np.float32)
    tails = np.array([-1e20, -3e38, -60, -30, 30, 60, 1e20, 3e38, 0.0], np.float32)
    x = np.concatenate([grid, tails])[None]
    graph, _ = _legalized(_erf_gelu_of_input(x.shape[1]), tmp_path)
    assert [n.op for n in graph.ops()] == ["Gelu"]
    mnn = write_mnn(graph, tmp_path / "m.mnn", MnnOptions(gelu="exact"))[-1]
    assert _unary_kinds(mnn) == [fb.UnaryOpOperation.EXP]
    y = run_mnn(mnn, {"x": x})["y"].reshape(-1).astype(np.float64)
    x64 = x.reshape(-1).astype(np.float64)
    exact = 0.5 * x64 * (1 + erf(x64 / math.sqrt(2)))
    assert np.abs(y[: grid.size] - exact[: grid.size]).max() <= 1.8e-6
    # MNN's EXP stops at about 6.1e37 (observed), so for x < -20, y = x * 1.64e-38 instead of -0
    xt, yt = x64[grid.size :], y[grid.size :]
    np.testing.assert_array_equal(yt[xt >= 0], xt[xt >= 0])
    neg = xt < 0
    assert np.all(yt[neg] <= 0) and np.all(np.abs(yt[neg]) <= 1.7e-38 * np.abs(xt[neg]))


def test_gelu_times_two_keeps_its_mul_when_the_product_is_read_elsewhere(tmp_path: Path) -> None:
    """x * (1 + erf(x / sqrt(2))) also a graph output: the 2 cannot go into W2, Gelu(x) * 2 stays."""
    graph, mnn, worst = _run(_mlp("xp", extra_out="g"), tmp_path)
    ops = [n.op for n in graph.ops()]
    assert ops.count("Gelu") == 1 and ops.count("Mul") == 1
    assert worst <= MAX_REL


def test_mnn_gelu_option_writes_mnns_unary_gelu_on_the_packed_rows(tmp_path: Path) -> None:
    """MnnOptions(gelu="mnn"): one UnaryOp GELU (the tanh form, 4.7e-4 per element at most), no copies."""
    graph, mnn, worst = _run(_mlp(), tmp_path, MnnOptions(gelu="mnn"))
    assert _unary_kinds(mnn) == [fb.UnaryOpOperation.GELU]
    assert types_count(mnn, "BinaryOp") == 0
    assert types_count(mnn, "ConvertTensor") == 3
    assert 1e-5 < worst <= 5e-4  # less exact than the exact chain (1e-5), as documented


def test_mnn_gelu_option_is_checked() -> None:
    with pytest.raises(OptionError, match="--mnn-gelu 'tanh'"):
        MnnOptions(gelu="tanh")
    p = argparse.ArgumentParser()
    BACKEND.add_arguments(p)
    assert BACKEND.options_from_args(p.parse_args(["--mnn-gelu", "exact"]), requested=True) == MnnOptions(
        gelu="exact"
    )
    assert BACKEND.options_from_args(p.parse_args([]), requested=True) == MnnOptions(gelu="auto")
    assert MnnOptions().gelu == "auto"
    with pytest.raises(OptionError, match="--mnn-gelu needs --emit mnn"):
        BACKEND.options_from_args(p.parse_args(["--mnn-gelu", "exact"]), requested=False)


def _amplified_gelu() -> onnx.ModelProto:
    """y = 10 (Gelu(x) - x): near x = 2.7, where the tanh form is 4.7e-4 off, y is small, so the
    fast kernel's error is 4.7e-3 relative to max(1, max|y|)."""
    graph = oh.make_graph(
        [
            oh.make_node("Gelu", ["x"], ["g"]),
            oh.make_node("Sub", ["g", "x"], ["d"]),
            oh.make_node("Mul", ["d", "ten"], ["y"]),
        ],
        "amplified",
        [oh.make_tensor_value_info("x", T.FLOAT, [1, 256])],
        [oh.make_tensor_value_info("y", T.FLOAT, [1, 256])],
        [onnx.numpy_helper.from_array(np.array(10.0, np.float32), "ten")],
    )
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 20)])


@pytest.mark.parametrize(
    ("flag", "stem", "form", "precision"),
    [
        ([], "gelu", "mnn", "fp32-approx"),  # auto: the fast kernel measured within 5e-4
        ([], "amplified", "exact", "fp32"),  # auto: 4.7e-3 measured, so the exact chain
        (["--mnn-gelu", "mnn"], "amplified", "mnn", "fp32-approx"),  # forced: misses 1e-3, exit 1
        (["--mnn-gelu", "exact"], "gelu", "exact", "fp32"),
        ([], "plain", None, "fp32"),  # no Gelu: nothing measured
    ],
)
def test_gelu_form_and_verified_precision(
    tmp_path: Path, flag: list[str], stem: str, form: str | None, precision: str
) -> None:
    """kiln compile --emit mnn: --mnn-gelu auto (default) measures MNN's tanh-form kernel against the
    exact chain on the compile inputs and keeps it within 5e-4 (judged as fp32-approx, max rel 1e-3),
    else writes the exact chain (fp32); the manifest records the choice."""
    from compiler.cli import main

    model = {"gelu": _mlp(), "plain": _mlp(half=0.6), "amplified": _amplified_gelu()}[stem]
    x = _X if stem != "amplified" else np.linspace(2.0, 3.5, 256, dtype=np.float32)[None]
    src, out = tmp_path / f"{stem}.onnx", tmp_path / stem
    onnx.save(model, src)
    np.savez(tmp_path / f"{stem}.npz", x=x)
    args = [
        "compile",
        str(src),
        "-o",
        str(out),
        "--emit",
        "mnn",
        *flag,
        "--inputs",
        str(tmp_path / f"{stem}.npz"),
    ]
    code = main(args)
    man = json.loads((out / "manifest.json").read_text())
    (art,) = [a for a in man["verification"]["artifacts"] if a["kind"] == "mnn"]
    assert art["precision"] == precision
    (written,) = [a for a in man["artifacts"] if a["kind"] == "mnn"]
    record = (written.get("details") or {}).get("gelu")
    assert man["options"]["mnn"]["gelu"] == (flag[-1] if flag else "auto")
    if flag:
        assert record is None  # the form was given: nothing measured
        assert _unary_kinds(out / "model.mnn").count(fb.UnaryOpOperation.GELU) == (form == "mnn")
    elif form is None:
        assert record is None
    else:
        assert record is not None and record["chosen"] == form
        assert (record["max_rel_mnn_vs_exact"] <= 5e-4) == (form == "mnn")
    forced_miss = flag == ["--mnn-gelu", "mnn"] and stem == "amplified"
    assert code == (1 if forced_miss else 0) and art["passed"] == (not forced_miss)


def test_a_failed_approximate_gelu_file_names_the_exact_form(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Where the tanh-form file misses its tolerance, the one-line error says --mnn-gelu exact
    (the tolerance is tightened here to force the miss)."""
    from compiler import verification
    from compiler.cli import main

    src = tmp_path / "gelu.onnx"
    onnx.save(_mlp(), src)
    np.savez(tmp_path / "x.npz", x=_X)
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(
            verification.TOLERANCES, "fp32-approx", verification.Tolerance(max_rel=1e-9, min_cosine=1.0)
        )
        code = main(
            [
                "compile",
                str(src),
                "-o",
                str(tmp_path / "out"),
                "--emit",
                "mnn",
                "--inputs",
                str(tmp_path / "x.npz"),
            ]
        )
    assert code == 1 and (tmp_path / "out" / "manifest.json").exists()  # kept for inspection
    err = capsys.readouterr().err
    assert "verification failed" in err and "--mnn-gelu exact" in err


def _amplified_and_plain_gelu() -> onnx.ModelProto:
    """y = [10 (Gelu(x) - x), Gelu(x / 10)]: the first GELU's fast-kernel error is amplified (4.7e-3
    relative, as in _amplified_gelu), the second's stays under 1e-5 (|x / 10| <= 0.35)."""
    graph = oh.make_graph(
        [
            oh.make_node("Gelu", ["x"], ["g"], name="amplified_gelu"),
            oh.make_node("Sub", ["g", "x"], ["d"]),
            oh.make_node("Mul", ["d", "ten"], ["y1"]),
            oh.make_node("Div", ["x", "ten"], ["x2"]),
            oh.make_node("Gelu", ["x2"], ["g2"], name="plain_gelu"),
            oh.make_node("Concat", ["y1", "g2"], ["y"], axis=1),
        ],
        "amplified_and_plain",
        [oh.make_tensor_value_info("x", T.FLOAT, [1, 256])],
        [oh.make_tensor_value_info("y", T.FLOAT, [1, 512])],
        [onnx.numpy_helper.from_array(np.array(10.0, np.float32), "ten")],
    )
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 20)])


def test_gelu_auto_keeps_only_the_sensitive_gelus_exact(tmp_path: Path) -> None:
    """--mnn-gelu auto where the all-fast file misses 5e-4: each GELU is measured fast alone, and the
    fewest most sensitive ones stay exact (here the amplified one); the rest use MNN's fast kernel.
    The manifest records ``mixed`` with the exact node names and the chosen file's error."""
    from compiler.cli import main

    src, out = tmp_path / "two.onnx", tmp_path / "out"
    onnx.save(_amplified_and_plain_gelu(), src)
    np.savez(tmp_path / "x.npz", x=np.linspace(2.0, 3.5, 256, dtype=np.float32)[None])
    args = ["compile", str(src), "-o", str(out), "--emit", "mnn", "--inputs", str(tmp_path / "x.npz")]
    assert main(args) == 0
    man = json.loads((out / "manifest.json").read_text())
    (written,) = [a for a in man["artifacts"] if a["kind"] == "mnn"]
    record = written["details"]["gelu"]
    assert record["chosen"] == "mixed" and record["fast_nodes"] == 1
    assert record["exact_nodes"] == ["amplified_gelu"]
    assert record["max_rel_mnn_vs_exact"] > 1e-3 >= 5e-4 >= record["max_rel_chosen_vs_exact"]
    assert _unary_kinds(out / "model.mnn").count(fb.UnaryOpOperation.GELU) == 1
    (art,) = [a for a in man["verification"]["artifacts"] if a["kind"] == "mnn"]
    assert art["precision"] == "fp32-approx" and art["passed"]
