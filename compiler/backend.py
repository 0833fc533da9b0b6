"""The Backend protocol, the capability table every backend fills in, and the backend registry.

Every artifact kind is one :class:`Backend`: ``onnx``, ``mnn`` and ``cann`` (``--emit``) and
``tvm`` (``--target cpu|arm|cuda...``). A backend has

* a ``name`` and the names it answers to (:meth:`Backend.resolve` maps ``--emit``/``--target``
  values to a :class:`Request`);
* its own options dataclass (``options_type``), built from its own CLI flags
  (:meth:`Backend.add_arguments` / :meth:`Backend.options_from_args`) and carried in
  ``CompileOptions.backend_options[name]``, so ``compiler/`` imports no backend;
* a :class:`CapabilityTable` of one shape, qualified op -> :class:`OpSupport` (``check``
  returning a reason or None, and the backend's own ``lower``);
* the legalization pipeline it needs (named in :mod:`compiler.pipelines`);
* ``emit``, which writes its files into the driver's temporary output directory.

Backends are plug-ins named in :data:`compiler.plugins.BACKENDS` and imported on first use.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

from compiler.errors import OptionError
from compiler.ir.graph import CONSTANT_OP, INPUT_OP, Graph, Node

if TYPE_CHECKING:
    from compiler.options import CompileOptions
    from compiler.pass_infra import PassContext
    from compiler.pass_manager import PipelineItem

__all__ = [
    "Artifact",
    "Backend",
    "CapabilityTable",
    "Check",
    "DYNAMIC_SHAPE",
    "OpSupport",
    "Request",
    "all_of",
    "all_backends",
    "get_backend",
    "resolve_emit",
    "resolve_target",
    "emit_kinds",
]

LowerT = TypeVar("LowerT")

Check = Callable[[Graph, Node], "str | None"]
"""``check(graph, node)``: why this backend cannot write ``node`` as it is, or None."""


@dataclass(frozen=True)
class Artifact:
    """One file written by a backend (path relative to the output directory)."""

    kind: str
    target: str
    path: str
    precision: str = "fp32"
    details: dict[str, Any] | None = None  # backend decisions recorded in the manifest
    unverifiable: str = ""  # why this machine cannot run the artifact (e.g. "needs a CUDA GPU")
    remedy: str = ""  # what to change when the artifact misses its verification tolerance


def all_of(*checks: Check | None) -> Check:
    """One check: the first reason any of ``checks`` gives (None entries are skipped)."""
    todo = [c for c in checks if c is not None]

    def check(graph: Graph, node: Node) -> str | None:
        for c in todo:
            why = c(graph, node)
            if why is not None:
                return why
        return None

    return check


@dataclass(frozen=True)
class OpSupport(Generic[LowerT]):
    """How a backend handles one op: ``check`` (a reason or None) and the backend's ``lower``.

    ``dynamic_outputs``: the op's outputs may have data-dependent dims (NonMaxSuppression's
    ``[?, 3]``) that the format resizes at run time; the static-shape requirement then covers
    its inputs only.
    """

    lower: LowerT
    check: Check | None = None
    dynamic_outputs: bool = field(default=False, kw_only=True)


DYNAMIC_SHAPE = "dynamic shape (fix it with --input-shape)"


def _static(graph: Graph, node: Node, outputs: bool = True) -> str | None:
    types = [v.type for v in graph.inputs_of(node) if v is not None]
    types += list(node.output_types) if outputs else []
    return None if all(t.is_static for t in types) else DYNAMIC_SHAPE


class CapabilityTable(Generic[LowerT]):
    """One backend's ops: qualified op name -> :class:`OpSupport`.

    ``requires_static`` adds the static-shape requirement to every check (the file formats
    and TVM kernels need concrete shapes).
    """

    def __init__(
        self, backend: str, entries: Mapping[str, OpSupport[LowerT]], *, requires_static: bool = True
    ) -> None:
        self.backend = backend
        self._entries = dict(entries)
        self.requires_static = requires_static

    def __contains__(self, op: object) -> bool:
        return op in self._entries

    def get(self, op: str) -> OpSupport[LowerT] | None:
        """The entry of a qualified op, or None."""
        return self._entries.get(op)

    def lower_for(self, op: str) -> LowerT:
        """The lowering of a qualified op (the caller checked it first)."""
        return self._entries[op].lower

    def ops(self) -> list[str]:
        """Every op with an entry, sorted."""
        return sorted(self._entries)

    def reason(self, graph: Graph, node: Node) -> str | None:
        """Why this backend cannot write ``node``, or None when it can."""
        if node.op in (INPUT_OP, CONSTANT_OP) and not node.domain:
            return None
        entry = self._entries.get(node.qualified_op)
        if entry is None:
            return f"no {self.backend} lowering"
        if self.requires_static:
            why = _static(graph, node, outputs=not entry.dynamic_outputs)
            if why is not None:
                return why
        return entry.check(graph, node) if entry.check is not None else None


@dataclass(frozen=True)
class Request:
    """One artifact the user asked for: a backend and its target (``mnn``, ``cpu``, ``cuda:sm_80``)."""

    backend: Backend
    target: str

    @property
    def label(self) -> str:
        """How messages name it: ``mnn``, ``tvm cpu``."""
        b = self.backend.name
        return b if self.target == b else f"{b} {self.target}"


class Backend(Protocol):
    """What every backend provides (see the module docstring)."""

    name: str
    flag: str  # "--emit" or "--target": the flag whose values this backend resolves
    options_type: type | None
    runtime: tuple[str, str] | None  # (artifact suffix, "module:function" runner) or None

    def targets(self) -> list[str]:
        """The ``--emit``/``--target`` values this backend answers to."""
        ...

    def resolve(self, value: str) -> str:
        """The canonical target for a flag value; OptionError if it is not one of this backend's."""
        ...

    def capabilities(self, target: str) -> CapabilityTable[Any]:
        """The op table for ``target``."""
        ...

    def legalization(self, target: str, options: CompileOptions | None) -> list[PipelineItem]:
        """The pass pipeline that makes a graph writable for ``target`` (run on a clone)."""
        ...

    def emit(self, graph: Graph, out_dir: Path, ctx: PassContext, target: str) -> list[Artifact]:
        """Write the artifacts of the legalized ``graph`` into ``out_dir``.

        ``ctx`` is the context the legalization ran in: ``ctx.options`` holds the CompileOptions
        and ``ctx.state`` what the legalization passes left for the writer (e.g. MNN's GPTQ levels).
        """
        ...

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        """Add this backend's own flags to ``kiln compile``."""
        ...

    def options_from_args(self, args: argparse.Namespace, requested: bool) -> Any:
        """This backend's options from parsed flags (None if not requested; flags then refused)."""
        ...


@dataclass
class BackendBase:
    """Defaults for the optional parts of :class:`Backend` (no flags, no options, no runtime)."""

    name: str
    flag: str = "--emit"
    options_type: type | None = None
    runtime: tuple[str, str] | None = None
    legalization_pipeline: str = ""
    _targets: tuple[str, ...] = field(default=())

    def targets(self) -> list[str]:
        """The flag values this backend answers to (default: its name)."""
        return list(self._targets or (self.name,))

    def resolve(self, value: str) -> str:
        """The canonical target for a flag value."""
        if value not in self.targets():
            raise OptionError(f"{self.flag} {value!r}: not a {self.name} target")
        return value

    def legalization(self, target: str, options: CompileOptions | None) -> list[PipelineItem]:
        """The named legalization pipeline of this backend (none by default)."""
        from compiler.pipelines import pipeline

        return pipeline(self.legalization_pipeline) if self.legalization_pipeline else []

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        """No flags of its own."""

    def options_from_args(self, args: argparse.Namespace, requested: bool) -> Any:
        """No options of its own."""
        return None


_LOADED: dict[str, Backend] = {}


def get_backend(name: str) -> Backend:
    """The backend registered under ``name`` (imported on first use)."""
    from compiler.plugins import BACKENDS, entry

    if name not in _LOADED:
        spec = BACKENDS.get(name)
        if spec is None:
            raise OptionError(f"unknown backend {name!r} (choose from {', '.join(sorted(BACKENDS))})")
        _LOADED[name] = entry(spec)
    return _LOADED[name]


def all_backends() -> list[Backend]:
    """Every registered backend, in registry order."""
    from compiler.plugins import BACKENDS

    return [get_backend(n) for n in BACKENDS]


def _by_flag(flag: str) -> list[Backend]:
    return [b for b in all_backends() if b.flag == flag]


def emit_kinds() -> list[str]:
    """Every ``--emit`` value."""
    return sorted(t for b in _by_flag("--emit") for t in b.targets())


def resolve_emit(values: Iterable[str]) -> list[Request]:
    """The requests of ``--emit`` values (each through the backend that answers to it)."""
    return _resolve("--emit", values)


def resolve_target(values: Iterable[str]) -> list[Request]:
    """The requests of ``--target`` values."""
    return _resolve("--target", values)


def _resolve(flag: str, values: Iterable[str]) -> list[Request]:
    backends = _by_flag(flag)
    out: list[Request] = []
    for value in values:
        for b in backends:
            try:
                out.append(Request(b, b.resolve(value)))
                break
            except OptionError:
                if len(backends) == 1:
                    raise
        else:
            known = ", ".join(t for b in backends for t in b.targets())
            raise OptionError(f"{flag} {value!r}: unknown (choose from {known})")
    return out
