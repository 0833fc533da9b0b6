"""Kiln's user-facing errors. Each carries the exit code the CLI returns.

A ``KilnError`` message is one clear sentence that names the file, node or op
at fault; the CLI prints it as ``kiln: error: <message>`` and exits with
``exit_code`` (2 for bad input, 1 for a failed verification).
"""

from __future__ import annotations

__all__ = [
    "KilnError",
    "ModelFileError",
    "UnsupportedOpsError",
    "InputShapeError",
    "OptionError",
    "ConversionError",
    "VerificationFailed",
]


class KilnError(Exception):
    """Base class of errors reported to the user without a traceback."""

    exit_code = 2


class ModelFileError(KilnError):
    """A model file is missing, truncated, corrupt or of an unknown format."""


class UnsupportedOpsError(KilnError):
    """The model uses ops Kiln cannot import; lists every op type with its node names."""

    def __init__(self, source: str, ops: dict[str, list[str]]) -> None:
        self.ops = ops
        parts = []
        for op in sorted(ops):
            names = ops[op]
            shown = ", ".join(repr(n) for n in names[:5]) + (
                f" and {len(names) - 5} more" if len(names) > 5 else ""
            )
            parts.append(f"{op} (nodes {shown})")
        super().__init__(f"{source}: unsupported op(s): " + "; ".join(parts))


class InputShapeError(KilnError):
    """An --input-shape is malformed, names no input, or cannot hold for the model."""


class OptionError(KilnError):
    """A command-line flag or option value is invalid."""


class ConversionError(KilnError):
    """A node could not be converted (bad attributes, inconsistent shapes); names the node."""


class VerificationFailed(KilnError):
    """An artifact missed its numerical tolerance; names the output."""

    exit_code = 1
