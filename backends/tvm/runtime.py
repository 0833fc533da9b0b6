"""Run Kiln's TVM CPU artifacts (``model.so`` + ``model.json``) in the TVM runtime's Relax VM.

``model.so`` is an exported ``tvm.runtime.Executable`` whose ``main`` takes the model inputs in
graph-input order and returns one tensor or a tuple; ``model.json`` next to it names them::

    {"inputs": [{"name", "shape", "dtype"}...], "outputs": [...], "target": {...}}

Threads: TVM's pool is per calling thread and is sized when that thread first uses it (on x86
its default is half the logical cores, and it pins the calling thread to one core). Kiln
therefore configures the pool itself through the runtime global ``runtime.config_threadpool``
in "share all cores" mode, which keeps the caller's CPU affinity. A thread whose pool was
created earlier, too small for the request, runs the model on a private worker thread instead.
Pool workers do not spin-wait between kernels (``TVM_THREAD_POOL_SPIN_COUNT`` = 0 unless
already set; TVM reads it once, when its first worker starts), so TVM does not steal cores
from onnxruntime or other pools in the same process.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from compiler.errors import InputShapeError, ModelFileError

if TYPE_CHECKING:
    from compiler.bench import Stats

__all__ = [
    "TensorSpec",
    "TvmModel",
    "load_artifact",
    "run_tvm",
    "configure_threads",
    "available_cpus",
    "load_cuda_runtime",
    "kernel_report_of",
]

_T = TypeVar("_T")

# threading::ThreadGroup::AffinityMode kSpecifyThreadShareAllCore: every worker may run on every
# listed CPU (no pinning) and the calling thread keeps that full set.
_SHARE_ALL_CORES = -3
_SPIN_ENV = "TVM_THREAD_POOL_SPIN_COUNT"
_CPUS: tuple[int, ...] = tuple(sorted(os.sched_getaffinity(0)))
_local = threading.local()


def available_cpus() -> tuple[int, ...]:
    """The CPUs this process may run on (as seen when this module was first imported)."""
    return _CPUS


def _globals() -> tuple[Callable[..., Any], Callable[[], int]]:
    import tvm  # noqa: F401 - loads libtvm_runtime, which registers the globals
    import tvm_ffi

    return (
        tvm_ffi.get_global_func("runtime.config_threadpool"),
        tvm_ffi.get_global_func("runtime.NumThreads"),
    )


def configure_threads(threads: int | None) -> int:
    """Size the calling thread's TVM pool to ``threads`` (None: every available CPU).

    Returns the number of threads the pool will use, which is less than asked when this
    thread's pool was created earlier with fewer workers (its size is fixed at creation).
    """
    want = len(_CPUS) if threads is None else max(1, min(int(threads), len(_CPUS)))
    if getattr(_local, "threads", None) == want:
        return want
    os.environ.setdefault(_SPIN_ENV, "0")
    config, num_threads = _globals()
    config(_SHARE_ALL_CORES, want, [str(c) for c in _CPUS])
    got = int(num_threads())
    _local.threads = want if got == want else None
    return got


@dataclass(frozen=True)
class TensorSpec:
    """Name, shape (None or a string for a dimension fixed only at run time) and dtype of one tensor."""

    name: str
    shape: tuple[int | str | None, ...] | None
    dtype: str

    @staticmethod
    def parse(d: Mapping[str, Any]) -> TensorSpec:
        """From a model.json entry."""
        shape = d.get("shape")
        return TensorSpec(
            str(d["name"]), None if shape is None else tuple(shape), str(d.get("dtype", "float32"))
        )

    def check(self, value: object) -> np.ndarray:
        """The feed as an array; raises InputShapeError on a shape or dtype mismatch."""
        arr = np.asarray(value)
        if arr.dtype != np.dtype(self.dtype):
            raise InputShapeError(
                f"input {self.name!r} has dtype {arr.dtype.name} but the model takes {self.dtype}"
            )
        if self.shape is not None:
            fixed = len(arr.shape) == len(self.shape) and all(
                not isinstance(want, int) or want == got
                for want, got in zip(self.shape, arr.shape, strict=True)
            )
            if not fixed:
                raise InputShapeError(
                    f"input {self.name!r} has shape {_fmt(arr.shape)} but the model was compiled for "
                    f"{_fmt(self.shape)}"
                )
        return np.ascontiguousarray(arr)


def _fmt(shape: Sequence[object]) -> str:
    return "x".join("?" if d is None else str(d) for d in shape) or "scalar"


def load_cuda_runtime() -> str:
    """Load TVM's CUDA runtime library if ``import tvm`` did not; "" when loaded, else why not.

    A runtime-only TVM (no compiler library, or ``TVM_USE_RUNTIME_LIB=1``: a deployment machine)
    skips the backend autoload, so CUDA's device API and module loader are missing until
    ``libtvm_runtime_cuda`` is loaded by hand.
    """
    import tvm  # noqa: F401 - loads libtvm_runtime
    from tvm.base import _LOADED_LIBS
    from tvm_ffi.libinfo import load_lib_ctypes

    if "tvm_runtime_cuda" in _LOADED_LIBS:
        return ""
    lib_dir = Path(_LOADED_LIBS["tvm_runtime"]._name).resolve().parent
    try:
        _LOADED_LIBS["tvm_runtime_cuda"] = load_lib_ctypes(
            package="tvm", target_name="tvm_runtime_cuda", extra_lib_paths=[lib_dir], mode="RTLD_LOCAL"
        )
    except (OSError, RuntimeError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return f"TVM's CUDA runtime did not load: {first}"
    return ""


def _read_json(path: Path) -> dict[str, Any]:
    try:
        meta = json.loads(path.read_text())
    except FileNotFoundError:
        raise ModelFileError(
            f"{path}: missing (a TVM artifact needs its model.json next to the .so)"
        ) from None
    except (OSError, ValueError) as exc:
        raise ModelFileError(f"{path}: not a readable model.json ({exc})") from None
    if not isinstance(meta, dict) or not isinstance(meta.get("inputs"), list) or not meta.get("outputs"):
        raise ModelFileError(f"{path}: model.json needs 'inputs' and 'outputs' lists")
    return meta


def _check_host(target: Mapping[str, Any], path: Path) -> None:
    """Refuse artifacts this host cannot execute (a wrong ISA would crash the process)."""
    from backends.tvm.target import host_target

    tvm_cfg = target.get("tvm", target)
    kind = tvm_cfg.get("kind", "llvm") if isinstance(tvm_cfg, Mapping) else "llvm"
    triple = str(tvm_cfg.get("mtriple", "")) if isinstance(tvm_cfg, Mapping) else ""
    if kind == "cuda":
        return  # runs on a GPU when one is present (checked when loading)
    if kind != "llvm" or (triple and not triple.startswith("x86_64")):
        raise ModelFileError(
            f"{path}: built for {target.get('name', kind)}; this runtime runs x86 CPU artifacts"
        )
    lanes = target.get("lanes")
    if isinstance(lanes, int):
        host = host_target()
        if lanes > host.lanes:
            raise ModelFileError(
                f"{path}: built for {target.get('name')} ({lanes}-lane SIMD); this CPU has {host.lanes} lanes"
            )


class TvmModel:
    """A loaded TVM artifact bound to a thread count; ``run`` maps input names to output names."""

    def __init__(self, path: Path, threads: int | None = None) -> None:
        self.path = Path(path)
        self.inputs, self.outputs, self.target = self.read_meta(self.path)
        if self.target:
            _check_host(self.target, self.path)
        self.threads = len(_CPUS) if threads is None else max(1, min(int(threads), len(_CPUS)))
        self._executor: ThreadPoolExecutor | None = None
        if configure_threads(self.threads) < self.threads:
            # This thread's pool is too small and cannot grow: use a fresh thread with its own pool.
            self._executor = ThreadPoolExecutor(
                max_workers=1,
                thread_name_prefix="kiln-tvm",
                initializer=configure_threads,
                initargs=(self.threads,),
            )
        self._vm, self._main = self._call(self._load)

    @staticmethod
    def read_meta(path: Path) -> tuple[tuple[TensorSpec, ...], tuple[TensorSpec, ...], dict[str, Any]]:
        """Inputs, outputs and target recorded in the model.json next to ``path`` (no TVM import)."""
        meta = _read_json(Path(path).with_suffix(".json"))
        inputs = tuple(TensorSpec.parse(d) for d in meta["inputs"])
        outputs = tuple(TensorSpec.parse(d) for d in meta["outputs"])
        return inputs, outputs, dict(meta.get("target") or {})

    def _load(self) -> tuple[Any, Any]:
        if not self.path.is_file():
            raise ModelFileError(f"{self.path}: no such TVM artifact")
        import tvm
        from tvm.runtime.vm import VirtualMachine

        try:
            if self.is_cuda:
                from backends.tvm.cuda_build import register_prebuilt_cuda

                why = load_cuda_runtime()
                if not tvm.cuda(0).exist:
                    raise ModelFileError(
                        f"{self.path}: a CUDA library, and this machine has no CUDA GPU"
                        + (f" ({why})" if why else "")
                    )
                register_prebuilt_cuda(self.path)
            lib = tvm.runtime.load_module(str(self.path))
            vm = VirtualMachine(lib, self._device())
            main = vm["main"]
        except ModelFileError:
            raise
        except Exception as exc:  # noqa: BLE001 - TVM raises several FFI error types
            raise ModelFileError(f"{self.path}: TVM cannot load it ({str(exc).splitlines()[0]})") from None
        return vm, main

    @property
    def is_cuda(self) -> bool:
        """True for a CUDA library (runs on GPU 0)."""
        tvm_cfg = self.target.get("tvm", self.target) if self.target else {}
        return isinstance(tvm_cfg, Mapping) and tvm_cfg.get("kind") == "cuda"

    def _device(self) -> Any:
        import tvm

        return tvm.cuda(0) if self.is_cuda else tvm.cpu()

    def _call(self, fn: Callable[[], _T]) -> _T:
        if self._executor is not None:
            return self._executor.submit(fn).result()
        configure_threads(self.threads)
        return fn()

    def close(self) -> None:
        """Stop the private worker thread, if one was needed."""
        if self._executor is not None:
            self._executor.shutdown()
            self._executor = None

    def check_feeds(self, feeds: Mapping[str, object]) -> list[np.ndarray]:
        """The feeds in parameter order; raises InputShapeError naming a missing, unknown or misfit input."""
        names = [s.name for s in self.inputs]
        for k in feeds:
            if k not in names:
                raise InputShapeError(
                    f"{self.path.name}: unknown input {k!r} (the model's inputs: {', '.join(names)})"
                )
        missing = [n for n in names if n not in feeds]
        if missing:
            raise InputShapeError(
                f"{self.path.name}: missing input {missing[0]!r} (the model's inputs: {', '.join(names)})"
            )
        return [spec.check(feeds[spec.name]) for spec in self.inputs]

    def _tensors(self, arrays: Sequence[np.ndarray]) -> list[Any]:
        import tvm

        dev = self._device()
        return [tvm.runtime.tensor(a, dev) for a in arrays]

    def _outputs(self, result: Any) -> dict[str, np.ndarray]:
        values = [result] if hasattr(result, "numpy") else list(result)
        if len(values) != len(self.outputs):
            raise ModelFileError(
                f"{self.path}: main returned {len(values)} tensors, model.json lists {len(self.outputs)}"
            )
        return {spec.name: np.asarray(v.numpy()) for spec, v in zip(self.outputs, values, strict=True)}

    def run(self, feeds: Mapping[str, object]) -> dict[str, np.ndarray]:
        """Outputs by name for one set of feeds (checked against model.json)."""
        arrays = self.check_feeds(feeds)
        return self._call(lambda: self._outputs(self._main(*self._tensors(arrays))))

    def bind(self, feeds: Mapping[str, object]) -> Callable[[], object]:
        """A zero-argument call for timing: inputs converted once, outputs left as TVM tensors."""
        args = self._call(lambda: self._tensors(self.check_feeds(feeds)))
        main = self._main
        if self.is_cuda:  # kernels launch asynchronously: a timed call waits for the device
            dev = self._device()

            def call_gpu() -> object:
                result = main(*args)
                dev.sync()
                return result

            return call_gpu
        if self._executor is None:
            threads = self.threads

            def call() -> object:
                configure_threads(threads)
                return main(*args)

            return call
        executor = self._executor
        return lambda: executor.submit(main, *args).result()

    def time(self, feeds: Mapping[str, object], rounds: int = 30, min_batch_s: float = 0.02) -> Stats:
        """Median seconds per run (see :func:`compiler.bench.interleaved`)."""
        from compiler.bench import interleaved

        return interleaved({"tvm": self.bind(feeds)}, rounds=rounds, min_batch_s=min_batch_s)["tvm"]


def kernel_report_of(path: Path) -> dict[str, Any] | None:
    """The "which kernel ran" report (per op class: ISA paths, kernels, schedules) in the
    ``model.json`` next to ``path``; None for an artifact written before Kiln recorded it."""
    report = _read_json(Path(path).with_suffix(".json")).get("kernel_report")
    return dict(report) if isinstance(report, dict) else None


def load_artifact(path: Path, threads: int | None = None) -> TvmModel:
    """Load ``model.so`` (and its ``model.json``) to run with ``threads`` threads (None: all CPUs)."""
    return TvmModel(Path(path), threads)


def run_tvm(path: Path, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Runner for ``.so`` artifacts: load, run once, return the outputs by name."""
    model = load_artifact(path)
    try:
        return model.run(feeds)
    finally:
        model.close()
