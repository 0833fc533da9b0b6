"""backends.tvm.runtime: exported Relax executables run by name, checked feeds, thread counts."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from backends.tvm.runtime import TvmModel, configure_threads, load_artifact, run_tvm
from backends.tvm.target import resolve_target
from compiler.errors import InputShapeError, ModelFileError

ROWS, COLS = 64, 2048


def _heavy_prim_func() -> object:
    """B[i, j] = sin(cos(A[i, j]) * 1.5 + sin(A[i, j])), rows in a parallel loop."""
    from tvm.script import tirx as T

    @T.prim_func(s_tir=True)
    def heavy(A: T.Buffer((ROWS, COLS), "float32"), B: T.Buffer((ROWS, COLS), "float32")) -> None:  # type: ignore[valid-type]
        for i in T.parallel(ROWS):
            for j in range(COLS):
                with T.sblock("b"):
                    vi = T.axis.spatial(ROWS, i)
                    vj = T.axis.spatial(COLS, j)
                    B[vi, vj] = T.sin(T.cos(A[vi, vj]) * T.float32(1.5) + T.sin(A[vi, vj]))

    return heavy


def _write_meta(so: Path, inputs: list[tuple[str, list[int]]], outputs: list[tuple[str, list[int]]]) -> None:
    meta = {
        "inputs": [{"name": n, "shape": s, "dtype": "float32"} for n, s in inputs],
        "outputs": [{"name": n, "shape": s, "dtype": "float32"} for n, s in outputs],
        "target": resolve_target("cpu").manifest_view(),
    }
    so.with_suffix(".json").write_text(json.dumps(meta))


def build_small_artifact(out: Path) -> Path:
    """``out/model.so`` + ``model.json``: main(x, z) -> (sum_relu = relu(x + z), twice = 2 x), 1x3x4x5."""
    import tvm
    from tvm import relax

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 3, 4, 5), "float32"))
    z = relax.Var("z", relax.TensorType((1, 3, 4, 5), "float32"))
    with bb.function("main", [x, z]):
        with bb.dataflow():
            s = bb.emit(relax.op.nn.relu(relax.op.add(x, z)))
            m = bb.emit(relax.op.multiply(x, relax.const(2.0, "float32")))
            res = bb.emit_output(relax.Tuple([s, m]))
        bb.emit_func_output(res)
    so = out / "model.so"
    out.mkdir(parents=True, exist_ok=True)
    tvm.compile(bb.get(), resolve_target("cpu").tvm_target()).export_library(str(so))
    shape = [1, 3, 4, 5]
    _write_meta(so, [("x", shape), ("z", shape)], [("sum_relu", shape), ("twice", shape)])
    return so


def build_heavy_artifact(out: Path) -> Path:
    """``out/model.so``: main(a) -> b, one parallel elementwise kernel over ROWS x COLS."""
    import tvm
    from tvm import relax

    bb = relax.BlockBuilder()
    a = relax.Var("a", relax.TensorType((ROWS, COLS), "float32"))
    gv = bb.add_func(_heavy_prim_func(), "heavy")
    with bb.function("main", [a]):
        with bb.dataflow():
            b = bb.emit_output(relax.call_tir(gv, [a], relax.TensorType((ROWS, COLS), "float32")))
        bb.emit_func_output(b)
    so = out / "model.so"
    out.mkdir(parents=True, exist_ok=True)
    tvm.compile(bb.get(), resolve_target("cpu").tvm_target()).export_library(str(so))
    _write_meta(so, [("a", [ROWS, COLS])], [("b", [ROWS, COLS])])
    return so


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Two artifacts: two-in/two-out elementwise (``small``) and one parallel kernel (``heavy``)."""
    out = tmp_path_factory.mktemp("tvm_rt")
    return {"small": build_small_artifact(out / "small"), "heavy": build_heavy_artifact(out / "heavy")}


def _feeds(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {k: rng.standard_normal((1, 3, 4, 5)).astype(np.float32) for k in ("x", "z")}


def test_run_tvm_matches_numpy(artifacts: dict[str, Path]) -> None:
    feeds = _feeds()
    got = run_tvm(artifacts["small"], feeds)
    assert list(got) == ["sum_relu", "twice"]
    np.testing.assert_allclose(got["sum_relu"], np.maximum(feeds["x"] + feeds["z"], 0), rtol=0, atol=1e-6)
    np.testing.assert_allclose(got["twice"], 2 * feeds["x"], rtol=0, atol=0)
    assert got["twice"].dtype == np.float32 and got["twice"].shape == (1, 3, 4, 5)


def test_single_output_and_parallel_kernel(artifacts: dict[str, Path]) -> None:
    a = np.random.default_rng(1).standard_normal((ROWS, COLS)).astype(np.float32)
    ref = np.sin(np.cos(a) * np.float32(1.5) + np.sin(a))
    for threads in (1, 2):
        model = load_artifact(artifacts["heavy"], threads=threads)
        got = model.run({"a": a})
        assert list(got) == ["b"]
        np.testing.assert_allclose(got["b"], ref, rtol=0, atol=2e-6)
        model.close()


def test_thread_counts_are_honored(artifacts: dict[str, Path]) -> None:
    import tvm_ffi

    num_threads = tvm_ffi.get_global_func("runtime.NumThreads")
    for threads in (1, 2, 1):
        model = load_artifact(artifacts["heavy"], threads=threads)
        model.bind({"a": np.zeros((ROWS, COLS), np.float32)})()
        if model._executor is None:  # the calling thread's own pool
            assert num_threads() == threads
        assert configure_threads(threads) == threads
        model.close()


def test_wrong_input_name(artifacts: dict[str, Path]) -> None:
    feeds = _feeds()
    feeds["y"] = feeds.pop("z")
    with pytest.raises(InputShapeError, match=r"model\.so: unknown input 'y' \(the model's inputs: x, z\)"):
        run_tvm(artifacts["small"], feeds)
    with pytest.raises(InputShapeError, match=r"missing input 'z'"):
        run_tvm(artifacts["small"], {"x": feeds["x"]})


def test_wrong_shape_and_dtype(artifacts: dict[str, Path]) -> None:
    feeds = _feeds()
    feeds["z"] = np.zeros((1, 3, 5, 4), np.float32)
    with pytest.raises(
        InputShapeError, match=r"input 'z' has shape 1x3x5x4 but the model was compiled for 1x3x4x5"
    ):
        run_tvm(artifacts["small"], feeds)
    feeds["z"] = np.zeros((1, 3, 4, 5), np.float64)
    with pytest.raises(InputShapeError, match=r"input 'z' has dtype float64 but the model takes float32"):
        run_tvm(artifacts["small"], feeds)


def test_missing_files(artifacts: dict[str, Path], tmp_path: Path) -> None:
    with pytest.raises(ModelFileError, match=r"model\.json: missing"):
        run_tvm(tmp_path / "model.so", _feeds())
    (tmp_path / "model.json").write_text(artifacts["small"].with_suffix(".json").read_text())
    with pytest.raises(ModelFileError, match=r"model\.so: no such TVM artifact"):
        run_tvm(tmp_path / "model.so", _feeds())
    (tmp_path / "model.so").write_bytes(b"not a shared library")
    with pytest.raises(ModelFileError, match=r"model\.so: TVM cannot load it"):
        run_tvm(tmp_path / "model.so", _feeds())
    (tmp_path / "model.json").write_text("{")
    with pytest.raises(ModelFileError, match=r"not a readable model\.json"):
        TvmModel(tmp_path / "model.so")


def test_foreign_target_is_refused(artifacts: dict[str, Path], tmp_path: Path) -> None:
    meta = json.loads(artifacts["small"].with_suffix(".json").read_text())
    meta["target"] = resolve_target("arm").manifest_view()
    so = tmp_path / "model.so"
    so.write_bytes(artifacts["small"].read_bytes())
    so.with_suffix(".json").write_text(json.dumps(meta))
    with pytest.raises(ModelFileError, match=r"built for arm"):
        run_tvm(so, _feeds())
