"""The scales file: calibrate once, reuse everywhere (``--scales FILE``).

JSON with activation parameters by value name and weight parameters by node::

    {"format": "kiln-scales", "version": 1, "activation_dtype": "uint8", "calib_method": "minmax",
     "activations": {"x": {"dtype": "uint8", "axis": null, "scale": 0.0123, "zero_point": 128,
                           "range": [-1.57, 1.56]}},
     "weights": {"conv1": {"dtype": "int8", "axis": 0, "scale": [...], "zero_point": [...]}}}
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from compiler.errors import ModelFileError
from compiler.quant.params import QParams

__all__ = ["write_scales", "read_scales", "SCALES_FORMAT"]

SCALES_FORMAT = "kiln-scales"


def write_scales(
    path: Path,
    activations: Mapping[str, QParams],
    weights: Mapping[str, QParams],
    ranges: Mapping[str, tuple[float, float]],
    meta: Mapping[str, Any],
) -> None:
    """Write the scales file deterministically (sorted keys)."""
    acts = {}
    for name, p in activations.items():
        d = p.as_json()
        if name in ranges:
            d["range"] = [float(ranges[name][0]), float(ranges[name][1])]
        acts[name] = d
    doc = {
        "format": SCALES_FORMAT,
        "version": 1,
        **dict(meta),
        "activations": acts,
        "weights": {k: p.as_json() for k, p in weights.items()},
    }
    path.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")


def read_scales(path: Path) -> dict[str, QParams]:
    """Activation parameters from a scales file; errors name the file."""
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise ModelFileError(f"{path}: not a readable scales file ({exc})") from None
    if not isinstance(doc, dict) or doc.get("format") != SCALES_FORMAT:
        raise ModelFileError(f"{path}: not a Kiln scales file (format must be {SCALES_FORMAT!r})")
    try:
        return {name: QParams.from_json(d) for name, d in doc["activations"].items()}
    except (KeyError, TypeError, ValueError) as exc:
        raise ModelFileError(f"{path}: malformed activation entry ({exc})") from None
