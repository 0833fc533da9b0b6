"""`--target arm`: aarch64 libraries with NEON conv kernels, executed for real under qemu over TVM RPC.

The emulated server (tests/helpers/arm_rpc.py) starts once per session. The remote outputs
must match onnxruntime on x86 to max rel 1e-4; errors in addresses and feeds are clear.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import pytest

from backends.tvm.arm_emulator import ArmEmulatorError, emulated_rpc_server
from backends.tvm.rpc import RemoteModel, RpcAddress, RpcError, run_remote, time_remote
from compiler.driver import compile_model
from compiler.errors import InputShapeError, OptionError
from compiler.options import CompileOptions
from compiler.runners import run_onnxruntime
from tests.helpers.models import conv_bn_relu, random_feeds, residual_add
from tests.helpers.numerics import agreement

FP32_MAX_REL = 1e-4
MODELS: dict[str, Callable[[], onnx.ModelProto]] = {
    "conv_bn_relu": conv_bn_relu,
    "residual_add": residual_add,
}
_FUNC = re.compile(r"^[0-9a-f]+ <([^>]+)>:$")
_VEC = re.compile(r"\t(fmla|fmul|fadd)\s+v\d+\.4s")
_SCALAR_FMA = re.compile(r"\tfmadd\s+s\d+")


@pytest.fixture(scope="module")
def arm_builds(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path]]:
    """Each model saved as ONNX and compiled for ``--target arm``: name -> (model.onnx, arm/model.so)."""
    out: dict[str, tuple[Path, Path]] = {}
    for name, build in MODELS.items():
        d = tmp_path_factory.mktemp(f"arm_{name}")
        model = d / "model.onnx"
        onnx.save(build(), model)
        compile_model(CompileOptions(model=model, out_dir=d / "out", emit=(), targets=("arm",), verify=False))
        out[name] = (model, d / "out" / "arm" / "model.so")
    return out


def _disassembly(so: Path) -> str:
    return subprocess.run(
        ["aarch64-linux-gnu-objdump", "-d", str(so)], check=True, capture_output=True, text=True
    ).stdout


def _fp_counts(dis: str, name_part: str) -> dict[str, int]:
    """NEON fp32 vector ops (fmla/fmul/fadd on .4s) and scalar fmadd in functions whose name has ``name_part``."""
    counts = {"functions": 0, "vector": 0, "scalar_fmadd": 0}
    inside = False
    for line in dis.splitlines():
        m = _FUNC.match(line)
        if m:
            inside = name_part in m.group(1)
            counts["functions"] += inside
        elif inside:
            counts["vector"] += bool(_VEC.search(line))
            counts["scalar_fmadd"] += bool(_SCALAR_FMA.search(line))
    return counts


def test_arm_library_is_aarch64_with_neon_conv_kernels(arm_builds: dict[str, tuple[Path, Path]]) -> None:
    for name, (_, so) in arm_builds.items():
        dis = _disassembly(so)
        assert "file format elf64-littleaarch64" in dis, f"{name}: not an aarch64 library"
        conv = _fp_counts(dis, "conv")
        assert conv["functions"] >= 1, f"{name}: no conv kernel in the library"
        assert conv["vector"] > 0 and conv["vector"] > 2 * conv["scalar_fmadd"], f"{name}: {conv}"


def test_arm_library_refused_by_the_x86_runtime(arm_builds: dict[str, tuple[Path, Path]]) -> None:
    from backends.tvm.runtime import run_tvm
    from compiler.errors import ModelFileError

    model, so = arm_builds["conv_bn_relu"]
    with pytest.raises(ModelFileError, match="arm"):
        run_tvm(so, random_feeds(onnx.load(model)))


@pytest.mark.parametrize("name", list(MODELS))
def test_arm_remote_matches_onnxruntime(
    arm_rpc: RpcAddress,
    arm_builds: dict[str, tuple[Path, Path]],
    name: str,
) -> None:
    model, so = arm_builds[name]
    feeds = random_feeds(onnx.load(model), seed=3)
    got = run_remote(so, feeds, arm_rpc)
    ref = run_onnxruntime(model, feeds)
    assert list(got) == list(ref)
    for out in ref:
        assert got[out].shape == ref[out].shape and got[out].dtype == ref[out].dtype
        m = agreement(got[out], ref[out])
        assert m.max_rel <= FP32_MAX_REL, f"{name} {out}: max_rel {m.max_rel:.3g}"


def test_arm_tuple_outputs_and_timing(arm_rpc: RpcAddress, tmp_path: Path) -> None:
    so = _tuple_artifact(tmp_path)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 3, 5)).astype(np.float32)
    z = rng.standard_normal((2, 3, 5)).astype(np.float32)
    got = run_remote(so, {"z": z, "x": x}, arm_rpc)
    assert list(got) == ["sum_relu", "twice"]
    np.testing.assert_array_equal(got["sum_relu"], np.maximum(x + z, 0))
    np.testing.assert_array_equal(got["twice"], 2 * x)
    times = time_remote(so, {"x": x, "z": z}, arm_rpc, rounds=3)
    assert len(times) == 3 and all(0 < t < 5 for t in times), times


def test_busy_server_times_out_then_serves_again(arm_rpc: RpcAddress, tmp_path: Path) -> None:
    so = _tuple_artifact(tmp_path)
    x = np.ones((2, 3, 5), np.float32)
    feeds = {"x": x, "z": x}
    with RemoteModel(so, arm_rpc) as held:  # the server serves one client at a time
        with pytest.raises(RpcError, match=r"no handshake within 1\.5 s \(is another client using it\?\)"):
            run_remote(so, feeds, arm_rpc, timeout_s=1.5)
        np.testing.assert_array_equal(held.run(feeds)["twice"], 2 * x)
    # the abandoned handshake is dropped when it completes; the next client gets the server
    np.testing.assert_array_equal(run_remote(so, feeds, arm_rpc, timeout_s=20)["sum_relu"], 2 * x)


def _tuple_artifact(out: Path) -> Path:
    """``out/model.so`` for aarch64: main(x, z) -> (relu(x + z), 2 x) on 2x3x5, with its model.json."""
    import json

    import tvm
    from tvm import relax

    from backends.tvm.build import export
    from backends.tvm.target import resolve_target

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((2, 3, 5), "float32"))
    z = relax.Var("z", relax.TensorType((2, 3, 5), "float32"))
    with bb.function("main", [x, z]):
        with bb.dataflow():
            s = bb.emit(relax.op.nn.relu(relax.op.add(x, z)))
            m = bb.emit(relax.op.multiply(x, relax.const(2.0, "float32")))
            res = bb.emit_output(relax.Tuple([s, m]))
        bb.emit_func_output(res)
    target = resolve_target("arm")
    so = out / "model.so"
    export(tvm.compile(bb.get(), target.tvm_target()), so, target)
    spec = {"shape": [2, 3, 5], "dtype": "float32"}
    meta = {
        "inputs": [{"name": "x", **spec}, {"name": "z", **spec}],
        "outputs": [{"name": "sum_relu", **spec}, {"name": "twice", **spec}],
        "target": target.manifest_view(),
    }
    so.with_suffix(".json").write_text(json.dumps(meta))
    return so


def test_remote_feeds_are_checked_before_connecting(arm_builds: dict[str, tuple[Path, Path]]) -> None:
    _, so = arm_builds["conv_bn_relu"]
    nowhere = RpcAddress("127.0.0.1", 1)
    with pytest.raises(
        InputShapeError, match=r"input 'x' has shape 1x3x8x8 but the model was compiled for 1x3x16x16"
    ):
        run_remote(so, {"x": np.zeros((1, 3, 8, 8), np.float32)}, nowhere)
    with pytest.raises(InputShapeError, match=r"input 'x' has dtype float64"):
        run_remote(so, {"x": np.zeros((1, 3, 16, 16))}, nowhere)
    with pytest.raises(InputShapeError, match=r"missing input 'x'"):
        run_remote(so, {}, nowhere)
    with pytest.raises(InputShapeError, match=r"unknown input 'y'"):
        time_remote(so, {"x": np.zeros((1, 3, 16, 16), np.float32), "y": np.zeros(1)}, nowhere, rounds=2)


def test_unreachable_server_is_a_clear_error(arm_builds: dict[str, tuple[Path, Path]]) -> None:
    _, so = arm_builds["conv_bn_relu"]
    feeds = {"x": np.zeros((1, 3, 16, 16), np.float32)}
    with pytest.raises(RpcError, match=r"cannot reach the RPC server at 127\.0\.0\.1:1 within 1 s"):
        run_remote(so, feeds, RpcAddress("127.0.0.1", 1), timeout_s=1.0)
    with pytest.raises(RpcError, match=r"cannot reach the RPC tracker at tracker:127\.0\.0\.1:1:rk3588"):
        run_remote(so, feeds, RpcAddress.parse("tracker:127.0.0.1:1:rk3588"), timeout_s=1.0)


def test_missing_emulator_setup_says_how_to_make_it(tmp_path: Path) -> None:
    with (
        pytest.raises(ArmEmulatorError, match=r"no emulated aarch64 setup here; run scripts/setup_arm\.sh"),
        emulated_rpc_server(tmp_path / "nothing"),
    ):
        pass


@pytest.mark.parametrize(
    ("spec", "want"),
    [
        ("127.0.0.1:9090", RpcAddress("127.0.0.1", 9090)),
        ("board.local:19090", RpcAddress("board.local", 19090)),
        (" 10.0.0.7:1 ", RpcAddress("10.0.0.7", 1)),
        ("[::1]:9090", RpcAddress("::1", 9090)),
        ("tracker:10.0.0.2:9190:rk3588", RpcAddress("10.0.0.2", 9190, "rk3588")),
        ("tracker:[fe80::1]:9190:pi4", RpcAddress("fe80::1", 9190, "pi4")),
    ],
)
def test_rpc_address_parses(spec: str, want: RpcAddress) -> None:
    got = RpcAddress.parse(spec)
    assert got == want
    assert got.is_tracker == (want.key is not None)
    assert RpcAddress.parse(str(got)) == got


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("", "no port"),
        ("localhost", "no port"),
        ("localhost:", "port '' is not a number"),
        (":9090", "missing or malformed host"),
        ("host:http", "port 'http' is not a number"),
        ("host:0", "port '0' is not a number in 1..65535"),
        ("host:65536", "port '65536'"),
        ("host:-1", "port '-1'"),
        ("a:b:9090", "too many ':'"),
        ("tracker:host:9190", "needs HOST, PORT and KEY"),
        ("tracker:host:9190:", "needs HOST, PORT and KEY"),
        ("tracker::9190:key", "missing or malformed host"),
        ("tracker:host:x:key", "port 'x'"),
        ("tracker:a:b:9190:key", "too many ':'"),
    ],
)
def test_rpc_address_rejects(spec: str, message: str) -> None:
    with pytest.raises(OptionError, match=re.escape(message)) as err:
        RpcAddress.parse(spec)
    assert "HOST:PORT" in str(err.value) and "tracker:HOST:PORT:KEY" in str(err.value)
