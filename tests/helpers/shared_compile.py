"""Compile a shared model (../shared/models) with Kiln for TVM targets, fp32 or int8, in tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from compiler.driver import compile_model
from compiler.options import CompileOptions
from compiler.quant.options import QuantOptions
from tests.conftest import MODELS

__all__ = ["INPUT_SHAPES", "compile_shared", "real_feeds"]

# ppocr declares dynamic N, H, W; its pipeline runs 1x3x48x192.
INPUT_SHAPES: dict[str, dict[str, tuple[int, ...]]] = {"ppocr_mobile_v2_cls": {"x": (1, 3, 48, 192)}}


def real_feeds(stem: str) -> dict[str, np.ndarray]:
    """The model's real inputs (``data/<stem>.npz``)."""
    return dict(np.load(MODELS / "data" / f"{stem}.npz"))


def compile_shared(
    stem: str,
    out: Path,
    targets: tuple[str, ...],
    *,
    int8: bool,
    emit: tuple[str, ...] = (),
    verify: bool = False,
) -> dict[str, Any]:
    """The manifest of one compile; int8 calibrates on 8 of the model's calibration samples.

    With ``verify`` the artifacts are checked on the real inputs by the driver itself.
    """
    quant = None
    if int8:
        quant = QuantOptions(calib=MODELS / "data" / f"{stem}.calib.npz", calib_count=8, sensitivity=False)
    opts = CompileOptions(
        model=MODELS / f"{stem}.onnx",
        out_dir=out,
        emit=emit,
        targets=targets,
        input_shapes=INPUT_SHAPES.get(stem, {}),
        inputs=MODELS / "data" / f"{stem}.npz" if verify else None,
        verify=verify,
        progress=False,
        quant=quant,
    )
    return compile_model(opts).manifest
