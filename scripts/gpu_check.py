"""Run every shared model's `--target cuda` build on the GPU and compare with onnxruntime on the CPU.

fp32: max rel 1e-3 against the ONNX model; int8: cosine >= 0.999 against Kiln's QDQ ONNX model from the
same compile. Prints one table (Kiln-GPU vs onnxruntime-CPU medians) and exits 1 on any failure.
Usage (repo root): ``.venv/bin/python scripts/gpu_check.py [OUT_DIR]``.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
MODELS = ROOT.parent / "shared" / "models"
STEMS = ["pan_mnv3s_skin_clothes_hair", "ppocr_mobile_v2_cls", "ultraface_rfb320", "yunet_n_320"]
SHAPES: dict[str, dict[str, tuple[int, ...]]] = {"ppocr_mobile_v2_cls": {"x": (1, 3, 48, 192)}}
FP32_MAX_REL = 1e-3
INT8_MIN_COSINE = 0.999

__all__ = ["main"]


def _compile(stem: str, out: Path, int8: bool) -> None:
    from compiler.driver import compile_model
    from compiler.options import CompileOptions
    from compiler.quant.options import QuantOptions

    quant = QuantOptions(calib=MODELS / "data" / f"{stem}.calib.npz", calib_count=8, sensitivity=False)
    compile_model(
        CompileOptions(
            model=MODELS / f"{stem}.onnx",
            out_dir=out,
            emit=("onnx",) if int8 else (),
            targets=("cuda",),
            input_shapes=SHAPES.get(stem, {}),
            verify=False,
            progress=False,
            quant=quant if int8 else None,
        )
    )


def _median_ms(fn: Any, reps: int = 20) -> float:
    fn()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1e3)
    return float(np.median(times))


def _run_gpu(lib: Path, feeds: dict[str, np.ndarray]) -> tuple[list[np.ndarray], float]:
    import tvm
    from tvm import relax

    from backends.tvm.cuda_build import register_prebuilt_cuda

    register_prebuilt_cuda(lib)
    dev = tvm.cuda(0)
    vm = relax.VirtualMachine(tvm.runtime.load_module(str(lib)), dev)
    args = [tvm.runtime.tensor(v, dev) for v in feeds.values()]

    def once() -> Any:
        r = vm["main"](*args)
        dev.sync()
        return r

    res = once()
    outs = (
        [r.numpy() for r in res]
        if isinstance(res, (list, tuple)) or hasattr(res, "__len__")
        else [res.numpy()]
    )
    return outs, _median_ms(once)


def _run_ort(model: Path, feeds: dict[str, np.ndarray]) -> tuple[list[np.ndarray], float]:
    import onnxruntime as ort

    sess = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    outs = sess.run(None, feeds)
    return [np.asarray(o) for o in outs], _median_ms(lambda: sess.run(None, feeds))


def main(argv: list[str]) -> int:
    """Compile, run, compare, time; returns the exit status."""
    from compiler.metrics import agreement

    out_root = Path(argv[0]) if argv else Path(tempfile.mkdtemp(prefix="kiln-gpu-check-"))
    rows, failed = [], False
    for stem in STEMS:
        feeds = {k: np.asarray(v) for k, v in np.load(MODELS / "data" / f"{stem}.npz").items()}
        for int8 in (False, True):
            prec = "int8" if int8 else "fp32"
            out = out_root / f"{stem}_{prec}"
            try:
                t0 = time.perf_counter()
                _compile(stem, out, int8)
                build_s = time.perf_counter() - t0
                got, gpu_ms = _run_gpu(out / "cuda" / "model.so", feeds)
                ref_model = next(out.glob("*.onnx")) if int8 else MODELS / f"{stem}.onnx"
                ref, ort_ms = _run_ort(ref_model, feeds)
                if int8:
                    score = min(agreement(g, r).cosine for g, r in zip(got, ref, strict=True))
                    ok = score >= INT8_MIN_COSINE
                else:
                    score = max(agreement(g, r).max_rel for g, r in zip(got, ref, strict=True))
                    ok = score <= FP32_MAX_REL
                rows.append(
                    (stem, prec, f"{score:.3g}", f"{build_s:.1f}", f"{gpu_ms:.3f}", f"{ort_ms:.3f}", ok)
                )
            except Exception as exc:  # noqa: BLE001  (report every model, fail at the end)
                rows.append((stem, prec, f"error: {type(exc).__name__}: {exc}"[:80], "-", "-", "-", False))
                ok = False
            failed |= not ok
    head = ("model", "prec", "max rel / cosine", "build s", "kiln-gpu ms", "ort-cpu ms", "ok")
    print(" | ".join(head))
    for r in rows:
        print(" | ".join(str(c) for c in r[:-1]) + (" | PASS" if r[-1] else " | FAIL"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
