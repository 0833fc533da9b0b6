"""Runtimes that execute artifacts: the independent judges of Kiln's output.

Each artifact kind maps to one runner ``(path, feeds) -> {output name: array}``.
ONNX artifacts run in onnxruntime; every backend that has a runtime of its own (MNN's runtime,
the TVM runtime, the .om read-back) names it in its ``Backend.runtime``, registered here on first
use and imported only when an artifact of that kind runs.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np

from compiler.errors import KilnError, ModelFileError

__all__ = ["Runner", "register_runner", "runner_for", "run_artifact", "run_onnxruntime", "kind_of"]

log = logging.getLogger(__name__)

Runner = Callable[[Path, Mapping[str, np.ndarray]], dict[str, np.ndarray]]

_RUNNERS: dict[str, Runner] = {}
_SUFFIX_KIND = {".onnx": "onnx"}


def register_runner(kind: str, suffix: str, runner: Runner) -> None:
    """Register the runtime for an artifact kind (and the file suffix that marks it)."""
    _RUNNERS[kind] = runner
    _SUFFIX_KIND[suffix] = kind


_BACKENDS_REGISTERED = False


def _register_backend_runtimes() -> None:
    """Register each backend's runtime (``Backend.runtime``: suffix, ``"module:function"``) once."""
    global _BACKENDS_REGISTERED
    if _BACKENDS_REGISTERED:
        return
    _BACKENDS_REGISTERED = True
    from compiler.backend import all_backends

    for backend in all_backends():
        if backend.runtime is not None and backend.name not in _RUNNERS:
            suffix, spec = backend.runtime
            register_runner(backend.name, suffix, _lazy(spec))


def _lazy(spec: str) -> Runner:
    def run(path: Path, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        from compiler.plugins import entry

        out: dict[str, np.ndarray] = entry(spec)(path, feeds)
        return out

    return run


def kind_of(path: Path) -> str:
    """The artifact kind of a file, from its suffix."""
    _register_backend_runtimes()
    kind = _SUFFIX_KIND.get(Path(path).suffix.lower())
    if kind is None:
        known = ", ".join(sorted(_SUFFIX_KIND))
        raise ModelFileError(f"{path}: no runtime for this kind of file (known suffixes: {known})")
    return kind


def runner_for(kind: str) -> Runner:
    """The runner for an artifact kind."""
    _register_backend_runtimes()
    try:
        return _RUNNERS[kind]
    except KeyError:
        raise KilnError(f"no runtime is available for {kind} artifacts") from None


def run_artifact(path: Path, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Run any artifact with its runtime."""
    return runner_for(kind_of(path))(Path(path), feeds)


def run_onnxruntime(
    path: Path | bytes, feeds: Mapping[str, np.ndarray], optimized: bool = False
) -> dict[str, np.ndarray]:
    """Run an ONNX model in onnxruntime's CPU provider with graph optimizations off (``optimized``:
    all of them on, onnxruntime's own production path: fused kernels, other summation orders)."""
    try:
        import onnxruntime as ort
    except ImportError:
        raise KilnError(
            "verification needs onnxruntime: install kiln-compiler[verify] (or pass --no-verify)"
        ) from None
    so = ort.SessionOptions()
    level = ort.GraphOptimizationLevel
    so.graph_optimization_level = level.ORT_ENABLE_ALL if optimized else level.ORT_DISABLE_ALL
    so.log_severity_level = 4  # fatal only: Kiln reports onnxruntime's errors in its own one line
    src = path if isinstance(path, bytes) else str(path)
    try:
        sess = ort.InferenceSession(src, so, providers=["CPUExecutionProvider"])
    except Exception as exc:  # noqa: BLE001 - onnxruntime raises several private types
        where = "model bytes" if isinstance(path, bytes) else str(path)
        raise ModelFileError(f"{where}: onnxruntime cannot load it ({str(exc).splitlines()[0]})") from None
    names = [o.name for o in sess.get_outputs()]
    want = {i.name for i in sess.get_inputs()}
    outs = sess.run(names, {k: v for k, v in feeds.items() if k in want})
    return {n: np.asarray(o) for n, o in zip(names, outs, strict=True)}


_RUNNERS["onnx"] = run_onnxruntime
