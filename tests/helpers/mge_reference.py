"""The shared MegEngine reference tools, run on written ``.mge`` files.

``../shared/reference/megengine/tools`` holds an independent reader
(``mgeparse.py``) and its numpy runner (``np_run.py``). Both need flatc-generated
bindings, made once per session with the tools' own ``gen_python_bindings.sh``
and the pinned flatc. The tools are read in place, never copied.

np_run's interpreter refuses blocked formats (it asserts NCHW and DENSE), so
:func:`run_reference` is a small interpreter over ``mgeparse.load`` that calls
np_run's kernels (``conv2d``, ``NONLIN``) for the math, group by group. Blocked
filters are read element by element at the addresses megdnn's naive kernel reads
(``get_filter_addr`` in ``dnn/src/naive/convolution/helper.h``), a formula
written independently of Kiln's transpose/reshape steps. Dilation (which megdnn
refuses for NCHWxx) is a zero-dilated filter; ``mode=CONVOLUTION`` a flipped one.
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from schemas.codegen import find_flatc
from tests.conftest import SHARED

__all__ = ["TOOLS", "ReferenceTools", "load_tools", "filter_oihw", "run_reference"]

TOOLS = SHARED / "reference" / "megengine" / "tools"
PACK = {"NCHW": 1, "NCHW44": 4, "NCHW44_DOT": 4, "NCHW88": 8}


class ReferenceTools:
    """The imported ``mgeparse`` and ``np_run`` modules."""

    def __init__(self, mgeparse: ModuleType, np_run: ModuleType) -> None:
        self.mgeparse = mgeparse
        self.np_run = np_run


def load_tools(out_dir: Path) -> ReferenceTools:
    """Generate the bindings into ``out_dir`` and import the shared tools (fails loudly without them)."""
    assert TOOLS.is_dir(), f"{TOOLS} is missing"
    flatc = find_flatc()
    env = {**os.environ, "PATH": f"{flatc.parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    subprocess.run(["sh", str(TOOLS / "gen_python_bindings.sh"), str(out_dir)], env=env, check=True)
    old = os.environ.get("MGE_PYGEN_DIR")
    os.environ["MGE_PYGEN_DIR"] = str(out_dir)  # read by mgeparse at import time only
    try:
        if str(TOOLS) not in sys.path:
            sys.path.insert(0, str(TOOLS))
        return ReferenceTools(importlib.import_module("mgeparse"), importlib.import_module("np_run"))
    finally:
        if old is None:
            del os.environ["MGE_PYGEN_DIR"]
        else:
            os.environ["MGE_PYGEN_DIR"] = old


def filter_oihw(flt: np.ndarray, fmt: str, sparse: str, src_ndim: int) -> tuple[np.ndarray, int]:
    """(OIHW filter, groups) of a MegEngine filter, gathered at megdnn's naive-kernel addresses."""
    b = PACK[fmt]
    s = flt.shape
    if b == 1:
        return (flt.reshape(-1, *s[2:]), s[0]) if sparse == "GROUP" else (flt, 1)
    if sparse == "DENSE" and src_ndim == 4:  # hybrid: ic < b, input is nchw
        groups, ocpg, icpg, fh, fw = 1, s[0] * b, s[3], s[1], s[2]
    elif sparse == "DENSE":
        groups, ocpg, icpg, fh, fw = 1, s[0] * b, s[1] * b, s[2], s[3]
    elif flt.ndim == 6:  # channel-wise
        groups, ocpg, icpg, fh, fw = s[0] * b, 1, 1, s[3], s[4]
    else:
        groups, ocpg, icpg, fh, fw = s[0], s[1] * b, s[2] * b, s[3], s[4]
    g, o, i, h, w = np.meshgrid(
        *(np.arange(n) for n in (groups, ocpg, icpg, fh, fw)), indexing="ij", sparse=True
    )
    spatial = h * fw + w
    if src_ndim == 4:
        fs_ic, fs_sp = b, icpg * b
        fs_oc = fh * fw * fs_sp
        addr = g * fs_oc * ocpg // b + o // b * fs_oc + spatial * fs_sp + i * fs_ic + o % b
    elif groups > 1 and ocpg == icpg == 1:
        fs_g = fh * fw * b
        addr = g // b * fs_g + spatial * b + g % b
    else:
        fs_ic = fh * fw * b * b
        fs_oc = fs_ic * icpg // b
        inner = (o % b) * b + i % b if fmt == "NCHW44_DOT" else (i % b) * b + o % b
        addr = g * fs_oc * ocpg // b + o // b * fs_oc + i // b * fs_ic + spatial * b * b + inner
    w_oihw = flt.reshape(-1)[addr]
    return w_oihw.reshape(groups * ocpg, icpg, fh, fw), groups


def _unblock(x: np.ndarray) -> np.ndarray:
    n, cb, h, w, b = x.shape
    return x.transpose(0, 1, 4, 2, 3).reshape(n, cb * b, h, w)


def _block(x: np.ndarray, b: int) -> np.ndarray:
    n, c, h, w = x.shape
    return x.reshape(n, c // b, b, h, w).transpose(0, 1, 3, 4, 2)


def _dilate(w: np.ndarray, dh: int, dw: int) -> np.ndarray:
    o, i, kh, kw = w.shape
    out = np.zeros((o, i, (kh - 1) * dh + 1, (kw - 1) * dw + 1), w.dtype)
    out[:, :, ::dh, ::dw] = w
    return out


def _conv(t: ReferenceTools, ins: list[np.ndarray], p: dict[str, Any], bias_ok: bool) -> np.ndarray:
    b = PACK[p["format"]]
    x = ins[0].astype(np.float64)
    w, groups = filter_oihw(ins[1].astype(np.float64), p["format"], p["sparse"], x.ndim)
    if b > 1 and x.ndim == 5:
        x = _unblock(x)
    if p["mode"] == "CONVOLUTION":
        w = w[:, :, ::-1, ::-1]
    w = _dilate(w, p["dilate_h"], p["dilate_w"])
    ocpg, icpg = w.shape[0] // groups, w.shape[1]
    y = np.concatenate(
        [
            t.np_run.conv2d(x[:, k * icpg : (k + 1) * icpg], w[k * ocpg : (k + 1) * ocpg], None, p)
            for k in range(groups)
        ],
        axis=1,
    ).astype(np.float64)
    for extra in ins[2:] if bias_ok else []:
        y = y + (_unblock(extra) if b > 1 else extra)
    y = t.np_run.NONLIN[p.get("nonlineMode", "IDENTITY")](y)
    return _block(y, b) if b > 1 else y


def _pool(ins: list[np.ndarray], p: dict[str, Any]) -> np.ndarray:
    b = PACK[p["format"]]
    x = _unblock(ins[0]) if b > 1 else ins[0]
    ph, pw, sh, sw, kh, kw = (
        p[k] for k in ("pad_h", "pad_w", "stride_h", "stride_w", "window_h", "window_w")
    )
    fill = -np.inf if p["mode"] == "MAX_" else 0.0
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (ph, ph), (pw, pw)), constant_values=fill)
    oh, ow = (xp.shape[2] - kh) // sh + 1, (xp.shape[3] - kw) // sw + 1
    win = np.stack(
        [xp[:, :, i : i + sh * oh : sh, j : j + sw * ow : sw] for i in range(kh) for j in range(kw)]
    )
    y = win.max(0) if p["mode"] == "MAX_" else win.sum(0) / (kh * kw)
    return _block(y, b) if b > 1 else y


_ELEMWISE: dict[str, Callable[..., np.ndarray]] = {
    "ADD": np.add,
    "MUL": np.multiply,
    "RELU": lambda a: np.maximum(a, 0),
    "FUSE_ADD_RELU": lambda a, c: np.maximum(a + c, 0),
    "H_SWISH": lambda a: a * np.clip(a + 3, 0, 6) / 6,
}


def _subtensor(ins: list[np.ndarray], items: list[dict[str, Any]]) -> np.ndarray:
    idx: list[Any] = [slice(None)] * ins[0].ndim
    rest = iter(int(v.reshape(-1)[0]) for v in ins[1:])
    for it in items:
        begin, end, step = (next(rest) if it[k] else None for k in ("Begin", "End", "Step"))
        idx[it["Axis"]] = next(rest) if it["Idx"] else slice(begin, end, step)
    return ins[0][tuple(idx)]


def run_reference(t: ReferenceTools, path: Path, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    """The outputs of the model at ``path``, read by mgeparse and computed with np_run's kernels."""
    model = t.mgeparse.load(str(path))
    vals: dict[int, np.ndarray] = {}
    for op in model["oprs"]:
        kind, p = op["type"], op.get("param", {})
        ins = [vals[i] for i in op["inputs"]]
        if kind == "Host2DeviceCopy":
            r = np.asarray(feeds[op["tensors"][0]["name"]], np.float64)
        elif kind == "ImmutableTensor":
            r = np.asarray(op["tensors"][0]["value"])
        elif kind in ("ConvBiasForward", "Convolution"):
            r = _conv(t, ins, p, kind == "ConvBiasForward")
        elif kind == "PoolingV1":
            r = _pool(ins, p)
        elif kind == "Elemwise":
            r = _ELEMWISE[p["mode"]](*ins)
        elif kind == "Dimshuffle":
            r = ins[0].transpose(p["pattern"])
        elif kind == "ReshapeV1":
            r = ins[0].reshape([int(v) for v in ins[1]])
        elif kind == "Subtensor":
            r = _subtensor(ins, p["items"])
        else:
            raise NotImplementedError(kind)
        for out in op["outputs"]:
            vals[out] = r
    return [vals[c] for c, _ in model["outputs"]]
