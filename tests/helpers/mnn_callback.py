"""What MNN's runtime really executes: the op types its per-op callback reports.

MNN's Session API calls ``after(tensors, info)`` once per command the pipeline runs (after
its geometry stage has lowered ops such as Raster-based reshapes or an LSTM's loops); the
``info.getType()`` string names the executed kernel's op type and ``info.getName()`` the op it
came from. A native op of Kiln's file shows up under its own type (``LayerNorm``, ``Softmax``);
an op MNN decomposes inside its runtime shows up as the kernels it became.
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Mapping
from pathlib import Path

import numpy as np

__all__ = ["executed_ops"]


def executed_ops(path: Path, feeds: Mapping[str, np.ndarray]) -> list[tuple[str, str]]:
    """``(op type, op name)`` of every command MNN's CPU runtime executes for ``feeds``, in order."""
    with contextlib.redirect_stdout(io.StringIO()):
        import MNN

    interp = MNN.Interpreter(str(path))
    sess = interp.createSession({"backend": "CPU", "numThread": 1, "precision": "high"})
    for name, t in interp.getSessionInputAll(sess).items():
        a = np.asarray(feeds[name])
        if a.dtype.kind == "f":
            a = np.ascontiguousarray(a, np.float32)
            kind = MNN.Halide_Type_Float
        else:
            a = np.ascontiguousarray(a, np.int32)
            kind = MNN.Halide_Type_Int
        t.copyFrom(MNN.Tensor(tuple(a.shape), kind, a, MNN.Tensor_DimensionType_Caffe))
    seen: list[tuple[str, str]] = []

    def before(tensors: object, info: object) -> bool:
        return True

    def after(tensors: object, info: object) -> bool:
        kind = str(info.getType()).split("[")[0].strip()  # type: ignore[attr-defined]
        seen.append((kind, str(info.getName())))  # type: ignore[attr-defined]
        return True

    interp.runSessionWithCallBackInfo(sess, before, after)
    return seen
