"""Quantization options (``kiln compile --quantize ...``), carried in CompileOptions."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from compiler.errors import OptionError
from compiler.ir.types import DType

__all__ = ["QuantOptions", "QUANT_MODES", "DEFAULT_MIN_SQNR"]

QUANT_MODES = ("int8", "fp16")
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

    def __post_init__(self) -> None:
        if self.mode not in QUANT_MODES:
            raise OptionError(f"--quantize {self.mode!r}: choose from {', '.join(QUANT_MODES)}")
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
        }
