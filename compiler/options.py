"""Option dataclasses. Options travel through the driver and pass context, never globals."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from compiler.quant.options import QuantOptions

__all__ = ["CompileOptions"]


@dataclass(frozen=True)
class CompileOptions:
    """Everything ``kiln compile`` takes; recorded in the manifest (paths by file name only)."""

    model: Path
    out_dir: Path
    emit: tuple[str, ...] = ("onnx",)
    targets: tuple[str, ...] = ()  # TVM targets: cpu, x86-avx2, x86-avx512, arm, arm-dotprod, cuda[:sm_XX]
    input_shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    inputs: Path | None = None
    verify: bool = True
    seed: int = 0
    pipeline: str = "default"
    passes: str | None = None
    dump_ir: Path | None = None
    timing: bool = False
    progress: bool = True  # progress bars on stderr (calibration, kernel building)
    quant: QuantOptions | None = None
    # backend name -> that backend's own options dataclass (MnnOptions, CannOptions, ...), built by
    # the backend from its own flags (compiler.backend.Backend.options_from_args)
    backend_options: Mapping[str, Any] = field(default_factory=dict)

    def backend(self, name: str) -> Any:
        """The options of backend ``name`` (None when it has none or was not requested)."""
        return self.backend_options.get(name)

    @property
    def precision(self) -> str:
        """The artifacts' numeric precision: fp32, fp16, int8, or weight-only int4w / int8w."""
        return self.quant.mode if self.quant is not None else "fp32"

    def manifest_view(self) -> dict[str, Any]:
        """The options as recorded in the manifest: deterministic, without machine paths."""
        d = asdict(replace(self, backend_options={}))
        d.pop("backend_options")
        d["model"] = self.model.name
        d["inputs"] = self.inputs.name if self.inputs else None
        d["input_shapes"] = {k: list(v) for k, v in sorted(self.input_shapes.items())}
        d["emit"] = list(self.emit)
        d["targets"] = list(self.targets)
        d["quant"] = self.quant.manifest_view() if self.quant is not None else None
        for name, opts in sorted(self.backend_options.items()):
            d[name] = opts.manifest_view() if hasattr(opts, "manifest_view") else asdict(opts)
        for k in ("out_dir", "dump_ir", "timing", "progress"):
            d.pop(k)
        return d
