"""Quantization options (``kiln compile --quantize ...``), carried in CompileOptions."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from compiler.errors import OptionError
from compiler.ir.types import DType

__all__ = [
    "QuantOptions",
    "QUANT_MODES",
    "WEIGHT_ONLY_MODES",
    "DEFAULT_MIN_SQNR",
    "DEFAULT_WEIGHT_BLOCK_SIZE",
    "DEFAULT_WEIGHT_SCALE_TYPE",
]

QUANT_MODES = ("int8", "fp16", "int4w", "int8w")
WEIGHT_ONLY_MODES: dict[str, int] = {"int4w": 4, "int8w": 8}
"""Weight-only modes (``--quantize int4w|int8w``) and their bits: MatMul/Gemm weights only."""
DEFAULT_WEIGHT_BLOCK_SIZE = 32
DEFAULT_WEIGHT_SCALE_TYPE = "fp16"
DEFAULT_MIN_SQNR = 25.0
"""The worst-output SQNR floor (dB) that int8 must meet when ``--min-sqnr`` is not given."""


@dataclass(frozen=True)
class QuantOptions:
    """How to quantize. ``activation_dtype`` uint8 is asymmetric, int8 symmetric.

    The SQNR floor (:attr:`floor_db`): ``min_sqnr`` is an explicit ``--min-sqnr DB``; without it
    the floor is :data:`DEFAULT_MIN_SQNR`; ``floor=False`` (``--min-sqnr off``) turns it off.
    ``strict``: a model that misses the floor in int8 fails (exit 1) instead of falling back.
    ``policy_rules``: the registry's pattern-level rules keep LayerNorm/GELU chains, residual adds
    and Softmax inputs float (off only to measure what they buy).
    ``smoothquant``: ``off``, ``auto`` (α searched per layer) or a fixed α in [0, 1] (int8 only;
    :mod:`compiler.quant.smoothquant`).

    Weight-only modes (``int4w``, ``int8w``: the ``quantize-weights`` pass): ``weight_block_size``
    weights of a row per scale (32, 64 or 128), ``weight_scale_type`` fp16 or fp32 scales,
    ``weight_asymmetric`` zero points per block; with ``calib`` the levels are rounded by GPTQ.
    ``weight_min_cosine``: the output floor the fallback plan keeps (None: the verification floor
    of the mode, 0: off).
    """

    mode: str = "int8"
    calib: Path | None = None
    calib_count: int | None = None
    calib_method: str = "minmax"
    preprocess: str | None = None
    activation_dtype: str = "uint8"
    per_channel: bool = True
    keep_float: tuple[str, ...] = ()
    scales: Path | None = None
    min_sqnr: float | None = None
    bias_correction: bool = False
    calib_runtime: str = "onnxruntime"
    sensitivity: bool = True
    floor: bool = True
    strict: bool = False
    policy_rules: bool = True
    smoothquant: str = "off"
    weight_block_size: int = DEFAULT_WEIGHT_BLOCK_SIZE
    weight_scale_type: str = DEFAULT_WEIGHT_SCALE_TYPE
    weight_asymmetric: bool = False
    weight_min_cosine: float | None = None

    def __post_init__(self) -> None:
        if self.mode not in QUANT_MODES:
            raise OptionError(f"--quantize {self.mode!r}: choose from {', '.join(QUANT_MODES)}")
        if self.mode in WEIGHT_ONLY_MODES:
            self._check_weight_only()
        if self.activation_dtype not in ("uint8", "int8"):
            raise OptionError(f"--activation-type {self.activation_dtype!r}: choose uint8 or int8")
        if self.calib_runtime not in ("onnxruntime", "interpreter"):
            raise OptionError(f"--calib-runtime {self.calib_runtime!r}: choose onnxruntime or interpreter")
        if self.calib_count is not None and self.calib_count < 1:
            raise OptionError(f"--calib-count {self.calib_count}: must be >= 1")
        if self.min_sqnr is not None and not self.floor:
            raise OptionError("--min-sqnr: give a floor in dB or 'off', not both")
        if self.strict and not self.floor:
            raise OptionError(
                "--strict fails on a missed SQNR floor; it does not combine with --min-sqnr off"
            )
        self._check_smoothquant()

    def _check_smoothquant(self) -> None:
        if self.smoothquant not in ("off", "auto"):
            try:
                ok = 0.0 <= float(self.smoothquant) <= 1.0
            except ValueError:
                ok = False
            if not ok:
                raise OptionError(
                    f"--smoothquant {self.smoothquant!r}: choose off, auto or an alpha in [0, 1]"
                )
        if self.smoothquant == "off":
            return
        if self.mode != "int8":
            raise OptionError(f"--smoothquant applies to --quantize int8, not to {self.mode}")
        if self.scales is not None or self.calib is None:
            raise OptionError(
                "--smoothquant measures activations on calibration samples: give --calib DATA "
                "(not --scales, whose scales belong to a graph without the smoothing)"
            )

    @property
    def smooth_alpha(self) -> float | None:
        """The fixed SmoothQuant α (None: searched per layer with ``auto``, or off)."""
        return None if self.smoothquant in ("off", "auto") else float(self.smoothquant)

    def _check_weight_only(self) -> None:
        if self.weight_block_size not in (32, 64, 128):
            raise OptionError(f"--weight-block-size {self.weight_block_size}: choose 32, 64 or 128")
        if self.weight_scale_type not in ("fp16", "fp32"):
            raise OptionError(f"--weight-scale-type {self.weight_scale_type!r}: choose fp16 or fp32")
        if self.weight_min_cosine is not None and not 0.0 <= self.weight_min_cosine <= 1.0:
            raise OptionError(f"--weight-min-cosine {self.weight_min_cosine}: must be in [0, 1]")
        int8_only = {
            "--scales": self.scales is not None,
            "--min-sqnr": self.min_sqnr is not None or not self.floor,
            "--strict": self.strict,
            "--bias-correction": self.bias_correction,
        }
        given = [flag for flag, on in int8_only.items() if on]
        if given:
            raise OptionError(f"{given[0]} applies to --quantize int8, not to weight-only {self.mode}")

    @property
    def weight_bits(self) -> int | None:
        """Bits of the weight-only modes (4 or 8); None for int8 and fp16."""
        return WEIGHT_ONLY_MODES.get(self.mode)

    def weight_pass_spec(self) -> str:
        """The ``quantize-weights{...}`` pipeline item of a weight-only mode."""
        if self.weight_bits is None:
            raise OptionError(f"--quantize {self.mode} is not a weight-only mode")
        floor = "" if self.weight_min_cosine is None else f",min_cosine={self.weight_min_cosine!r}"
        return (
            f"quantize-weights{{bits={self.weight_bits},block_size={self.weight_block_size},"
            f"scale_dtype={self.weight_scale_type},symmetric={int(not self.weight_asymmetric)}{floor}}}"
        )

    @property
    def floor_db(self) -> float | None:
        """The worst-output SQNR floor in dB (None: off)."""
        if not self.floor:
            return None
        return self.min_sqnr if self.min_sqnr is not None else DEFAULT_MIN_SQNR

    @property
    def act_dtype(self) -> DType:
        """The activation element type."""
        return DType.UINT8 if self.activation_dtype == "uint8" else DType.INT8

    @property
    def symmetric_activations(self) -> bool:
        """int8 activations are symmetric; uint8 ones asymmetric."""
        return self.act_dtype == DType.INT8

    def manifest_view(self) -> dict[str, Any]:
        """Deterministic manifest form (paths by file name)."""
        if self.weight_bits is not None:
            return {
                "mode": self.mode,
                "calib": self.calib.name if self.calib else None,
                "calib_count": self.calib_count,
                "preprocess": self.preprocess,
                "keep_float": list(self.keep_float),
                "weight_block_size": self.weight_block_size,
                "weight_scale_type": self.weight_scale_type,
                "weight_asymmetric": self.weight_asymmetric,
                "weight_min_cosine": self.weight_min_cosine,
            }
        return {
            "mode": self.mode,
            "calib": self.calib.name if self.calib else None,
            "calib_count": self.calib_count,
            "calib_method": self.calib_method,
            "preprocess": self.preprocess,
            "activation_dtype": self.activation_dtype,
            "per_channel": self.per_channel,
            "keep_float": list(self.keep_float),
            "scales": self.scales.name if self.scales else None,
            "min_sqnr": self.floor_db,
            "min_sqnr_default": self.floor and self.min_sqnr is None,
            "strict": self.strict,
            "bias_correction": self.bias_correction,
            "smoothquant": self.smoothquant,
        }
