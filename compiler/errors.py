"""Kiln's user-facing errors. Each carries the exit code the CLI returns.

A ``KilnError`` message is one clear sentence that names the file, node or op
at fault; the CLI prints it as ``kiln: error: <message>`` and exits with
``exit_code`` (2 for bad input, 1 for a failed verification). An unexpected exception
becomes an :class:`InternalError` (exit 3) naming the stage, pass or backend, and node.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

__all__ = [
    "KilnError",
    "ModelFileError",
    "UnsupportedOpsError",
    "InputShapeError",
    "OptionError",
    "ConversionError",
    "VerificationFailed",
    "InternalError",
    "internal_errors",
    "blame_node",
    "blamed_node",
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


class InternalError(KilnError):
    """An unexpected exception inside Kiln (a bug, not bad input); the CLI exits 3.

    ``stage`` is the compile step it happened in (import, verify, optimize, preflight, quantize,
    legalize, emit, verification), ``where`` what ran there (a backend, a pass) and ``node`` the
    node being rewritten, when known. ``str()`` is the full message; :meth:`headline` is one line,
    with ``detail`` (default: the message) after that context.
    """

    exit_code = 3

    def __init__(
        self,
        message: str,
        *,
        stage: str | None = None,
        where: Sequence[str] = (),
        node: str | None = None,
        detail: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = detail or message  # what the headline shows after the context
        self.stage = stage
        self.where = list(where)
        self.node = node

    @classmethod
    def wrap(cls, exc: BaseException, stage: str | None = None, where: Sequence[str] = ()) -> InternalError:
        """An InternalError for an unexpected exception (its type, message and blamed node)."""
        return cls(f"{type(exc).__name__}: {exc}", stage=stage, where=where, node=blamed_node(exc))

    def headline(self) -> str:
        """``internal error in <stage> (<where>, node ...): <first line of the message>``."""
        parts = [*self.where, *([f"node {self.node}"] if self.node else [])]
        lines = self.message.strip().splitlines()
        first = lines[0] if lines else type(self).__name__
        context = f" ({', '.join(parts)})" if parts else ""
        return f"internal error in {self.stage or 'kiln'}{context}: {first}"


_NODE_ATTR = "_kiln_node"


def blame_node(exc: BaseException, node: str) -> None:
    """Record on ``exc`` the node being processed when it was raised (the innermost one wins)."""
    if getattr(exc, _NODE_ATTR, None) is None:
        with contextlib.suppress(AttributeError):  # an exception type without a __dict__
            setattr(exc, _NODE_ATTR, node)


def blamed_node(exc: BaseException) -> str | None:
    """The node :func:`blame_node` recorded on ``exc``, if any."""
    node = getattr(exc, _NODE_ATTR, None)
    return node if isinstance(node, str) else None


@contextlib.contextmanager
def internal_errors(stage: str, where: str | None = None) -> Iterator[None]:
    """Turn an unexpected exception in the block into an :class:`InternalError` of ``stage``.

    KilnErrors (bad input, failed verification) pass through; an InternalError from an inner
    step keeps its stage and gets ``where`` (e.g. the backend) in front of its own context.
    """
    try:
        yield
    except InternalError as exc:
        if exc.stage is None:
            exc.stage = stage
        if where and where not in exc.where:
            exc.where.insert(0, where)
        raise
    except KilnError:
        raise
    except Exception as exc:
        raise InternalError.wrap(exc, stage, [where] if where else []) from exc
