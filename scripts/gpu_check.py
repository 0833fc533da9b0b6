"""Run every shared model's `--target cuda` build on a GPU and compare with onnxruntime.

fp32: max rel 1e-3 against the ONNX model; int8: cosine >= 0.999 against Kiln's QDQ ONNX model from the
same compile. Prints one table (Kiln on the GPU vs onnxruntime on the CPU, medians) and exits 1 on any
failure.

Usage (repo root)::

    .venv/bin/python scripts/gpu_check.py build DIR [--arch sm_90]   # needs TVM's compiler and nvcc, no GPU
    python scripts/gpu_check.py run DIR [--json FILE]                # needs a GPU and TVM's runtime only
    .venv/bin/python scripts/gpu_check.py [DIR]                      # both, on one machine

``build`` writes, per model and precision, the library, its fatbin and model.json, the real inputs, the
onnxruntime reference outputs and the reference ONNX model (for timing onnxruntime there). ``run`` loads
each library through Kiln's runtime (``backends.tvm.runtime``), so a machine with the TVM runtime alone
(no compiler library) can check artifacts built elsewhere, the way a deployment machine would.
"""

from __future__ import annotations

import argparse
import json
import shutil
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

__all__ = ["main", "build", "run"]


def _compile(stem: str, out: Path, int8: bool, target: str) -> None:
    from compiler.driver import compile_model
    from compiler.options import CompileOptions
    from compiler.quant.options import QuantOptions

    quant = QuantOptions(calib=MODELS / "data" / f"{stem}.calib.npz", calib_count=8, sensitivity=False)
    compile_model(
        CompileOptions(
            model=MODELS / f"{stem}.onnx",
            out_dir=out,
            emit=("onnx",) if int8 else (),
            targets=(target,),
            input_shapes=SHAPES.get(stem, {}),
            verify=False,
            progress=False,
            quant=quant if int8 else None,
        )
    )


def build(root: Path, arch: str) -> int:
    """Compile every case into ``root/<stem>_<prec>/`` with its inputs and onnxruntime's outputs."""
    from compiler.runners import run_onnxruntime

    target = f"cuda:{arch}"
    for stem in STEMS:
        feeds = {k: np.asarray(v) for k, v in np.load(MODELS / "data" / f"{stem}.npz").items()}
        for prec in ("fp32", "int8"):
            case = root / f"{stem}_{prec}"
            work = Path(tempfile.mkdtemp(prefix="kiln-gpu-build-"))
            t0 = time.perf_counter()
            _compile(stem, work / "out", prec == "int8", target)
            build_s = time.perf_counter() - t0
            case.mkdir(parents=True, exist_ok=True)
            for f in (work / "out" / target.replace(":", "_")).iterdir():
                if f.suffix != ".ptx":  # the fatbin holds the PTX too; the text copy is for reading
                    shutil.copy2(f, case / f.name)
            ref = next((work / "out").glob("*.onnx")) if prec == "int8" else MODELS / f"{stem}.onnx"
            shutil.copy2(ref, case / "reference.onnx")
            expected = run_onnxruntime(ref, feeds)
            outs: dict[str, Any] = {f"out{i}": np.asarray(v) for i, v in enumerate(expected.values())}
            np.savez(case / "inputs.npz", **feeds)  # type: ignore[arg-type]
            np.savez(case / "expected.npz", **outs)
            (case / "case.json").write_text(json.dumps({"build_s": round(build_s, 1), "precision": prec}))
            shutil.rmtree(work)
            print(f"built {case.name} in {build_s:.1f} s", flush=True)
    return 0


def _median_ms(fn: Any, reps: int = 50) -> float:
    fn()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1e3)
    return float(np.median(times))


def _ort_ms(model: Path, feeds: dict[str, np.ndarray]) -> float | None:
    try:
        import onnxruntime as ort
    except ImportError:
        return None
    sess = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    return _median_ms(lambda: sess.run(None, feeds), reps=20)


def _check_case(case: Path) -> tuple[str, str, str, str, str, bool]:
    from backends.tvm.runtime import load_artifact
    from compiler.metrics import agreement

    meta = json.loads((case / "case.json").read_text())
    prec = str(meta["precision"])
    feeds = {k: np.asarray(v) for k, v in np.load(case / "inputs.npz").items()}
    exp = np.load(case / "expected.npz")
    expected = [exp[f"out{i}"] for i in range(len(exp.files))]
    model = load_artifact(case / "model.so", threads=1)
    try:
        got = list(model.run(feeds).values())
        gpu_ms = _median_ms(model.bind(feeds))
    finally:
        model.close()
    if prec == "int8":
        score = min(agreement(g, r).cosine for g, r in zip(got, expected, strict=True))
        ok = len(got) == len(expected) and score >= INT8_MIN_COSINE
    else:
        score = max(agreement(g, r).max_rel for g, r in zip(got, expected, strict=True))
        ok = len(got) == len(expected) and score <= FP32_MAX_REL
    ort_ms = _ort_ms(case / "reference.onnx", feeds)
    ort = "-" if ort_ms is None else f"{ort_ms:.3f}"
    return prec, f"{score:.6g}", str(meta["build_s"]), f"{gpu_ms:.3f}", ort, ok


def run(root: Path, json_out: Path | None = None) -> int:
    """Run every case under ``root`` on GPU 0; print the table; 1 if any case fails."""
    rows: list[tuple[str, ...]] = []
    failed = False
    for case in sorted(p for p in root.iterdir() if (p / "case.json").is_file()):
        try:
            prec, score, build_s, gpu_ms, ort_ms, ok = _check_case(case)
        except Exception as exc:  # noqa: BLE001  (report every model, fail at the end)
            error = f"error: {type(exc).__name__}: {exc}"[:160]
            prec, score, build_s, gpu_ms, ort_ms, ok = "?", error, "-", "-", "-", False
        failed |= not ok
        stem = case.name.rsplit("_", 1)[0]
        rows.append((stem, prec, score, build_s, gpu_ms, ort_ms, "PASS" if ok else "FAIL"))
    if not rows:
        print(f"gpu_check: no cases under {root}", file=sys.stderr)
        return 2
    head = ("model", "prec", "max rel / cosine", "build s", "kiln-gpu ms", "ort-cpu ms", "ok")
    print(" | ".join(head))
    for r in rows:
        print(" | ".join(r))
    if json_out is not None:
        json_out.write_text(json.dumps([dict(zip(head, r, strict=True)) for r in rows], indent=1) + "\n")
    return 1 if failed else 0


def main(argv: list[str]) -> int:
    """``build DIR``, ``run DIR`` or (no verb) both into DIR or a temporary folder."""
    if argv and argv[0] in ("build", "run"):
        ap = argparse.ArgumentParser(prog="gpu_check.py " + argv[0])
        ap.add_argument("dir", type=Path)
        ap.add_argument("--arch", default="sm_90")
        ap.add_argument("--json", type=Path, default=None)
        ns = ap.parse_args(argv[1:])
        return build(ns.dir, ns.arch) if argv[0] == "build" else run(ns.dir, ns.json)
    root = Path(argv[0]) if argv else Path(tempfile.mkdtemp(prefix="kiln-gpu-check-"))
    import tvm

    dev = tvm.cuda(0)
    arch = "sm_" + str(dev.compute_version).replace(".", "") if dev.exist else "sm_90"
    return build(root, arch) or run(root)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
