"""The int8 acceptance yardstick: onnxruntime's ``quantize_static`` and the SQNR we judge by.

SQNR of one output over a hold-out set of samples ``s`` (``ref`` = fp32 model, ``q`` = int8 model),
accumulated over all samples before taking the ratio::

    SQNR = 10 log10( sum_s sum_i ref_s,i^2 / sum_s sum_i (q_s,i - ref_s,i)^2 )   [dB]

onnxruntime's side is ``quantize_static(QuantFormat.QDQ, activation_type=QUInt8,
weight_type=QInt8, per_channel=True)`` with the matching ``CalibrationMethod`` and its defaults
(Percentile 99.999, Entropy 128 bins / 128 quantized bins), on a model whose opset is raised
to 13 (per-channel QDQ needs it) and whose dynamic input dims are fixed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
from onnx import version_converter
from onnxruntime.quantization import (
    CalibrationDataReader,
    CalibrationMethod,
    QuantFormat,
    QuantType,
    quantize_static,
)

__all__ = [
    "FUSED_INT8_EXACT",
    "ModelCase",
    "QuantBench",
    "SqnrRow",
    "ORT_METHODS",
    "MIN_OPSET",
    "ort_ready_model",
    "load_samples",
    "ort_quantize",
    "run_samples",
    "sqnr_db",
]

ORT_METHODS: dict[str, CalibrationMethod] = {
    "minmax": CalibrationMethod.MinMax,
    "entropy": CalibrationMethod.Entropy,
    "percentile": CalibrationMethod.Percentile,
}
MIN_OPSET = 13

ort.set_default_logger_severity(3)  # quantize_static's sessions warn about IR-4 initializer inputs

Feeds = dict[str, np.ndarray]


def ort_ready_model(src: Path, dst: Path, input_shapes: Mapping[str, Sequence[int]] | None = None) -> Path:
    """``src`` with fixed input dims and opset >= 13 (onnx.version_converter), written to ``dst``."""
    model = onnx.load(str(src))
    for inp in model.graph.input:
        shape = (input_shapes or {}).get(inp.name)
        if shape is None:
            continue
        dims = inp.type.tensor_type.shape.dim
        assert len(dims) == len(shape), f"{src.name}: input {inp.name} has rank {len(dims)}"
        for d, n in zip(dims, shape, strict=True):
            d.Clear()
            d.dim_value = int(n)
    opset = next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
    if opset < MIN_OPSET:
        model = version_converter.convert_version(model, MIN_OPSET)
    onnx.save(model, str(dst))
    return dst


def load_samples(npz: Path, input_names: Sequence[str]) -> list[Feeds]:
    """One feed dict per sample of a ``[S, *input_shape]`` npz (other keys, e.g. labels, ignored)."""
    with np.load(npz) as z:
        stacks = {n: np.asarray(z[n], dtype=np.float32) for n in input_names}
    count = {a.shape[0] for a in stacks.values()}
    assert len(count) == 1, f"{npz.name}: inputs hold different sample counts"
    return [{n: a[i] for n, a in stacks.items()} for i in range(count.pop())]


class _Reader(CalibrationDataReader):
    def __init__(self, samples: Sequence[Feeds]) -> None:
        self._samples = list(samples)
        self._it: Iterator[Feeds] = iter(self._samples)

    def get_next(self) -> Feeds | None:
        return next(self._it, None)

    def rewind(self) -> None:
        self._it = iter(self._samples)

    def __len__(self) -> int:
        return len(self._samples)


def ort_quantize(model: Path, calib: Sequence[Feeds], method: str, out: Path) -> Path:
    """onnxruntime's static QDQ quantization of ``model`` (opset >= 13) with ``method``."""
    quantize_static(
        str(model),
        str(out),
        _Reader(calib),
        quant_format=QuantFormat.QDQ,
        activation_type=QuantType.QUInt8,
        weight_type=QuantType.QInt8,
        per_channel=True,
        calibrate_method=ORT_METHODS[method],
    )
    return out


def _fused_int8_is_exact(cpuinfo: Path = Path("/proc/cpuinfo")) -> bool:
    """Whether onnxruntime's fused u8 x s8 kernels compute the QDQ definition on this host.

    On x86 without VNNI (AVX2, AVX-512F) MLAS adds byte products in pairs with VPMADDUBSW, which
    saturates at int16 (a QLinearConv probe with full-range int8 weights: 37 LSB off); with
    AVX512-VNNI or AVX-VNNI, and on ARM, the dot products accumulate in int32.
    """
    import platform

    if platform.machine().lower() not in ("x86_64", "amd64", "i686", "x86"):
        return True
    flags: set[str] = set()
    if cpuinfo.exists():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    return bool({"avx512_vnni", "avx_vnni"} & flags)


FUSED_INT8_EXACT = _fused_int8_is_exact()
"""True where onnxruntime's default (fused) execution of a QDQ model is a judge of its integer
semantics; elsewhere tests that judge a model's int8 numerics run it as written (``exact=True``)."""


def run_samples(
    model: Path | bytes, samples: Sequence[Feeds], exact: bool = False
) -> dict[str, list[np.ndarray]]:
    """Outputs by name, one array per sample, from onnxruntime (CPU).

    ``exact=False``: default optimizations, so a QDQ model runs on onnxruntime's fused integer
    kernels (QLinearConv, QLinearMul, ...). ``exact=True``: no graph optimization, so the model
    runs as written (each DequantizeLinear -> float op -> QuantizeLinear), the QDQ semantics.
    """
    so = ort.SessionOptions()
    so.log_severity_level = 3
    if exact:
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(
        model if isinstance(model, bytes) else str(model), so, providers=["CPUExecutionProvider"]
    )
    names = [o.name for o in sess.get_outputs()]
    wanted = {i.name for i in sess.get_inputs()}
    outs: dict[str, list[np.ndarray]] = {n: [] for n in names}
    for feeds in samples:
        for n, v in zip(names, sess.run(names, {k: v for k, v in feeds.items() if k in wanted}), strict=True):
            outs[n].append(np.asarray(v))
    return outs


def sqnr_db(got: Sequence[np.ndarray], ref: Sequence[np.ndarray]) -> float:
    """``10 log10(sum ref^2 / sum (got - ref)^2)`` over all samples, in float64 (inf when exact)."""
    signal = sum(float(np.sum(np.square(r.astype(np.float64)))) for r in ref)
    noise = sum(
        float(np.sum(np.square(g.astype(np.float64) - r.astype(np.float64))))
        for g, r in zip(got, ref, strict=True)
    )
    if noise == 0.0:
        return float("inf")
    return float(10.0 * np.log10(signal / noise)) if signal > 0 else float("-inf")


@dataclass(frozen=True)
class ModelCase:
    """One acceptance model: its fp32 file, calibration, hold-out and real-input npz files."""

    stem: str
    model: Path
    calib: Path
    holdout: Path
    real: Path
    input_shapes: Mapping[str, tuple[int, ...]] = field(default_factory=dict)


@dataclass(frozen=True)
class SqnrRow:
    """One output's hold-out SQNR for Kiln's and onnxruntime's int8 models."""

    stem: str
    method: str
    output: str
    kiln: float
    ort: float


class QuantBench:
    """Kiln and onnxruntime int8 models of each case, built once and cached for a test session.

    Args:
        cases: The models by stem.
        work: A scratch folder for the converted and quantized models.
        verify: Keep Kiln's own verification in the compile (it then must pass); the benchmark
            turns it off to score models whose int8 output fails the verification rule.
    """

    def __init__(self, cases: Mapping[str, ModelCase], work: Path, verify: bool = True) -> None:
        self.cases = dict(cases)
        self.work = work
        self.verify = verify
        self._cache: dict[tuple[str, ...], Any] = {}

    def _memo(self, key: tuple[str, ...], make: Callable[[], Any]) -> Any:
        if key not in self._cache:
            self._cache[key] = make()
        return self._cache[key]

    def input_names(self, stem: str) -> list[str]:
        """The model's real (non-initializer) inputs."""
        model = onnx.load(str(self.cases[stem].model), load_external_data=False)
        inits = {t.name for t in model.graph.initializer}
        return [i.name for i in model.graph.input if i.name not in inits]

    def holdout(self, stem: str) -> list[Feeds]:
        """The hold-out samples, one feed dict each."""
        return self._memo(
            ("holdout", stem), lambda: load_samples(self.cases[stem].holdout, self.input_names(stem))
        )

    def reference(self, stem: str) -> dict[str, list[np.ndarray]]:
        """The fp32 model's outputs on the hold-out samples."""
        return self._memo(("ref", stem), lambda: run_samples(self.cases[stem].model, self.holdout(stem)))

    def ort_model(self, stem: str, method: str) -> Path:
        """onnxruntime's QDQ model (``quantize_static`` on the opset >= 13 model)."""

        def make() -> Path:
            case = self.cases[stem]
            ready = ort_ready_model(case.model, self.work / f"{stem}.fp32.onnx", case.input_shapes)
            calib = load_samples(case.calib, self.input_names(stem))
            return ort_quantize(ready, calib, method, self.work / f"{stem}.{method}.ort.onnx")

        return self._memo(("ort", stem, method), make)

    def kiln_dir(self, stem: str, method: str, floor: bool = False) -> Path:
        """Kiln's output folder: ``kiln compile MODEL --quantize int8 --calib DATA --emit onnx``.

        ``floor=False`` (``--no-sensitivity``): every candidate int8, the like-for-like model.
        ``floor=True``: Kiln's defaults, whose 25 dB floor may keep layers in float.
        """

        def make() -> Path:
            from compiler.cli import main

            case = self.cases[stem]
            out = self.work / f"{stem}.{method}.kiln{'.floor' if floor else ''}"
            argv = ["compile", str(case.model), "-o", str(out), "--quantize", "int8", "--calib"]
            argv += [str(case.calib), "--calib-method", method, "--emit", "onnx", "--inputs", str(case.real)]
            if not floor:
                argv += ["--no-sensitivity"]  # no report and no floor: every candidate stays int8
            if not self.verify:
                argv += ["--no-verify"]
            for name, shape in case.input_shapes.items():
                argv += ["--input-shape", f"{name}={'x'.join(map(str, shape))}"]
            rc = main(argv)
            assert rc == 0, f"kiln {' '.join(argv)} exited with {rc}"
            return out

        return self._memo(("kiln", stem, method, str(floor)), make)

    def sqnr(self, stem: str, method: str, exact: bool = False, floor: bool = False) -> list[SqnrRow]:
        """Per output: SQNR of Kiln's and of onnxruntime's int8 model over the hold-out set.

        ``exact`` runs both QDQ models as written (:func:`run_samples`); ``floor`` scores Kiln's
        default compile (:meth:`kiln_dir`).
        """

        def make() -> list[SqnrRow]:
            ref = self.reference(stem)
            hold = self.holdout(stem)
            kiln = run_samples(self.kiln_dir(stem, method, floor) / "model.onnx", hold, exact)
            ort_q = run_samples(self.ort_model(stem, method), hold, exact)
            return [
                SqnrRow(stem, method, o, sqnr_db(kiln[o], r), sqnr_db(ort_q[o], r)) for o, r in ref.items()
            ]

        return self._memo(("sqnr", stem, method, str(exact), str(floor)), make)
