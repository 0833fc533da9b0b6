"""Run an ``.mnn`` file in MNN's own runtime (pip ``mnn``): the judge of Kiln's MNN files.

The runner uses MNN's Module API with an explicit RuntimeManager (CPU, fp32 "high"
precision, a fixed thread count) and the Winograd memory level hint set to 0: MNN's
default level lets it pick large Winograd tiles whose fp32 error reaches 1e-3 relative,
too coarse to check Kiln's output (NOTES.md section 5). Inputs are fed in NCHW (floats as
float32, integers as int32: MNN has no 64-bit tensors) and outputs come back in NCHW.
A model whose external ``.weight`` file is missing or short is refused: MNN itself would
only print a warning and compute with garbage.
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from compiler.errors import KilnError, ModelFileError
from schemas.mnn.external import check_side_file

__all__ = ["run_mnn", "WINOGRAD_MEMORY_LEVEL_HINT"]

WINOGRAD_MEMORY_LEVEL_HINT = 3  # MNN's Interpreter::HintMode::WINOGRAD_MEMORY_LEVEL


def _import_mnn() -> object:
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            import MNN
    except ImportError:
        raise KilnError("running .mnn files needs MNN's runtime: pip install mnn==3.6.1") from None
    return MNN


def _feed(array: np.ndarray) -> np.ndarray:
    a = np.asarray(array)
    if a.dtype.kind == "f":
        return np.ascontiguousarray(a, np.float32)
    if a.dtype.kind in "iub":
        return np.ascontiguousarray(a, np.int32)
    raise KilnError(f"MNN cannot take {a.dtype} inputs")


def run_mnn(
    path: Path, feeds: Mapping[str, np.ndarray], *, threads: int = 1, winograd_level: int = 0
) -> dict[str, np.ndarray]:
    """Run ``path`` on ``feeds`` (by input name); returns ``{output name: array}``."""
    path = Path(path)
    check_side_file(path)
    mnn = _import_mnn()
    nn, expr = mnn.nn, mnn.expr  # type: ignore[attr-defined]
    config = {"backend": 0, "numThread": int(threads), "precision": "high"}
    rt = nn.create_runtime_manager((config,))
    rt.set_hint(WINOGRAD_MEMORY_LEVEL_HINT, int(winograd_level))
    try:
        module = nn.load_module_from_file(str(path), [], [], runtime_manager=rt)
    except Exception as exc:  # noqa: BLE001 - MNN raises plain exceptions with C++ messages
        raise ModelFileError(f"{path}: MNN cannot load it ({exc})") from None
    if module is None:
        raise ModelFileError(f"{path}: MNN cannot load it")
    info = module.get_info()
    in_names, out_names = list(info["inputNames"]), list(info["outputNames"])
    missing = [n for n in in_names if n not in feeds]
    if missing:
        raise KilnError(f"{path}: no input data for {', '.join(missing)}")
    # MNN's const Vars may point at the numpy buffers: keep them alive until the outputs are read.
    arrays = [_feed(feeds[name]) for name in in_names]
    args = [
        expr.const(a, list(a.shape), expr.NCHW, expr.float if a.dtype == np.float32 else expr.int)
        for a in arrays
    ]
    outs = module.forward(args)
    if not isinstance(outs, list | tuple):
        outs = [outs]
    result: dict[str, np.ndarray] = {}
    for name, var in zip(out_names, outs, strict=True):
        if var.data_format == expr.NC4HW4:
            var = expr.convert(var, expr.NCHW)
        result[name] = np.array(var.read(), copy=True)
    del args, arrays
    return result
