"""Loop and Scan with a static trip count through TVM: the ``unroll-loop`` / ``unroll-scan``
decompositions in the legalization (``--pipeline none``, so the optimizer's ``unroll-loops`` pass does
not do it first), compiled for the host CPU and compared with onnxruntime on the source model
(max rel <= 1e-5: a cumulative-sum Loop with a carried state and a scan output, a Scan forward and
reversed). Must not fire: a Loop whose trip count is a graph input stays refused, and the message says why.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

from compiler.cli import main
from compiler.runners import run_artifact, run_onnxruntime
from tests.helpers import control_flow_models as cf
from tests.helpers.numerics import assert_close
from tests.helpers.onnx_text import rand

TOL = 1e-5


def _compile(model: onnx.ModelProto, feeds: dict[str, np.ndarray], tmp_path: Path) -> tuple[int, Path]:
    src, inputs, out = tmp_path / "model.onnx", tmp_path / "inputs.npz", tmp_path / "out"
    onnx.save(model, src)
    np.savez(inputs, allow_pickle=False, **feeds)
    rc = main(
        [
            "compile",
            str(src),
            "-o",
            str(out),
            "--inputs",
            str(inputs),
            "--target",
            "cpu",
            "--pipeline",
            "none",
        ]
    )
    return rc, out


CASES = {
    "loop": (lambda: cf.loop_cumsum_model(5), lambda: {"x": rand(3), "s0": rand(3, seed=1)}),
    "scan": (
        lambda: cf.scan_cumsum_model(),
        lambda: {"s0": rand(2, 3), "x": rand(2, 5, 3, seed=1), "wx": rand(3, seed=2)},
    ),
    "scan-reverse": (
        lambda: cf.scan_cumsum_model(reverse=True),
        lambda: {"s0": rand(2, 3), "x": rand(2, 5, 3, seed=1), "wx": rand(3, seed=2)},
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_static_loops_compile_and_match_onnxruntime(case: str, tmp_path: Path) -> None:
    make, feeds_of = CASES[case]
    model, feeds = make(), feeds_of()
    rc, out = _compile(model, feeds, tmp_path)
    assert rc == 0
    want = run_onnxruntime(tmp_path / "model.onnx", feeds)
    got = run_artifact(out / "cpu" / "model.so", feeds)
    assert set(got) == set(want)
    for k, e in want.items():
        assert got[k].shape == e.shape, k
        assert_close(got[k], e, rtol=0.0, atol=TOL * max(1.0, float(np.abs(e).max())), what=k)


def test_data_dependent_trip_count_is_refused_with_the_reason(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    feeds = {"x": rand(3), "s0": rand(3, seed=1), "M": np.asarray(4, np.int64)}
    model = cf.loop_cumsum_model(m_input=True)
    rc, out = _compile(
        model, {k: v for k, v in feeds.items() if k in {i.name for i in model.graph.input}}, tmp_path
    )
    assert rc == 2 and not out.exists()
    err = capsys.readouterr().err
    assert "Loop" in err and "trip count" in err and "is not static" in err, err
