"""MNN writer options (``--emit mnn --mnn-...``), carried in ``CompileOptions.backend_options["mnn"]``."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from compiler.errors import OptionError

__all__ = ["MnnOptions", "WEIGHT_MODES", "SCALE_MODES", "GELU_MODES", "PRECISIONS"]

WEIGHT_MODES = ("fp32", "fp16", "int8", "int4")
SCALE_MODES = ("fp32", "fp16")
# auto (default): MNN's UnaryOp GELU where the compile inputs show it costs at most GELU_AUTO_MAX_REL,
# else the exact chain (backends.mnn.gelu_choice); mnn: MNN's UnaryOp GELU, what its converter writes
# (tanh form, 4.7e-4 per element, verified as fp32-approx); exact: the erf GELU to 1.7e-6
# (backends.mnn.lower.gelu), about 7 % slower on a ViT
GELU_MODES = ("auto", "mnn", "exact")
# The artifact precision recorded in the manifest (and the key of its verification tolerance).
PRECISIONS = {"fp32": "fp32", "fp16": "fp16", "int8": "int8w", "int4": "int4w"}


@dataclass(frozen=True)
class MnnOptions:
    """How the ``.mnn`` file stores its weights, and its metadata.

    Attributes:
        weights: conv/deconv/gemm weight storage: fp32, fp16 (IEEE half, decoded to float at load)
            or weight-only int8/int4 (IDSTQuan table coding, per output channel or per block).
        scale: storage of the int8/int4 scales: fp32 (``alpha``) or fp16 (``alphaFp16``).
        asymmetric: int weights with a per-channel (min, scale) pair instead of a symmetric scale.
        block_size: block-wise scales: one scale per ``block_size`` input channels of each output
            channel (layers whose input channels per group it does not divide stay per channel).
        external: keep weights in ``model.mnn.weight`` next to the ``.mnn`` (MNN's external data).
        biz_code: ``Net.bizCode``, returned by MNN's ``Module.get_info()``.
        min_cosine: int8/int4 only: the output cosine (against fp32) the weight plan must keep on
            the compile inputs; the layers that hurt most keep fp16 weights until it holds.
            None: the verification floor of the precision (int8w 0.999, int4w 0.98); 0: none.
        calib: int8/int4 only: calibration data (``--calib``, as :mod:`compiler.calibration.dataset`
            reads it); each layer's integer weights are then rounded by GPTQ on the same grid
            (:mod:`backends.mnn.gptq_weights`) instead of to nearest. None: nearest rounding.
        calib_count: use the first N calibration samples (None: all).
        preprocess: ``--preprocess`` spec for image calibration data.
        gelu: how the erf GELU is written: ``mnn`` (MNN's own UnaryOp GELU, what MNN's converter
            writes; the tanh form, up to 4.7e-4 off per element, so the file is verified as
            ``fp32-approx``, max rel 1e-3), ``exact`` (a rational sigmoid chain, 1.7e-6 from the erf
            GELU, verified as ``fp32``, 5-8 % slower on the erf-GELU transformers; see
            :mod:`backends.mnn.lower.gelu`) or ``auto`` (default: the emitter measures both files on
            the compile inputs and writes ``mnn`` where its outputs stay within
            :data:`backends.mnn.gelu_choice.GELU_AUTO_MAX_REL` of the exact file's, else
            ``exact``; :func:`backends.mnn.writer.write_mnn` alone writes ``auto`` as ``exact``).
        gelu_exact_nodes: with ``gelu="mnn"``, the Gelu nodes (by IR node name) still written as the
            exact chain; ``auto`` sets it where only some GELUs are safe in the fast form.
    """

    weights: str = "fp32"
    scale: str = "fp32"
    asymmetric: bool = False
    block_size: int | None = None
    external: bool = False
    biz_code: str = "kiln"
    min_cosine: float | None = None
    calib: Path | None = None
    calib_count: int | None = None
    preprocess: str | None = None
    gelu: str = "auto"
    gelu_exact_nodes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.gelu not in GELU_MODES:
            raise OptionError(f"--mnn-gelu {self.gelu!r}: choose from {', '.join(GELU_MODES)}")
        if self.weights not in WEIGHT_MODES:
            raise OptionError(f"--mnn-weights {self.weights!r}: choose from {', '.join(WEIGHT_MODES)}")
        if self.scale not in SCALE_MODES:
            raise OptionError(f"--mnn-scale {self.scale!r}: choose from {', '.join(SCALE_MODES)}")
        if self.block_size is not None and self.block_size < 1:
            raise OptionError(f"--mnn-block-size {self.block_size}: must be >= 1")
        quantized = self.weights in ("int8", "int4")
        extras = self.scale != "fp32" or self.asymmetric or self.block_size is not None
        if not quantized and (extras or self.min_cosine is not None):
            raise OptionError(
                "--mnn-scale, --mnn-asymmetric, --mnn-block-size and --mnn-min-cosine apply to "
                "--mnn-weights int8 or int4"
            )
        if self.calib is not None and not quantized:
            raise OptionError("--calib with --emit mnn applies to --mnn-weights int8 or int4 (GPTQ rounding)")
        if self.calib is None and (self.calib_count is not None or self.preprocess is not None):
            raise OptionError("--calib-count and --preprocess need --calib")
        if self.calib_count is not None and self.calib_count < 1:
            raise OptionError(f"--calib-count {self.calib_count}: must be >= 1")
        if self.min_cosine is not None and not 0.0 <= self.min_cosine <= 1.0:
            raise OptionError(f"--mnn-min-cosine {self.min_cosine}: must be in [0, 1]")

    @property
    def bits(self) -> int | None:
        """Bit width of quantized weights (None for float storage)."""
        return {"int8": 8, "int4": 4}.get(self.weights)

    @property
    def precision(self) -> str:
        """The artifact precision: fp32, fp16, int8w or int4w (weight-only)."""
        return PRECISIONS[self.weights]

    @property
    def target_cosine(self) -> float:
        """The cosine the weight plan keeps (0: quantize every layer)."""
        if self.bits is None:
            return 0.0
        if self.min_cosine is not None:
            return self.min_cosine
        from compiler.verification import TOLERANCES

        return TOLERANCES[self.precision].min_cosine

    def manifest_view(self) -> dict[str, Any]:
        """The options as recorded in the manifest (the calibration path by file name)."""
        d = asdict(self)
        d["calib"] = self.calib.name if self.calib is not None else None
        return d
