"""Pass infrastructure: the Pass base class, its registry and the pass context.

A pass is a small frozen dataclass: ``name`` is its kebab-case registry name,
its fields are its options, and ``run(graph, ctx)`` returns the
:class:`~compiler.rewriter.PassResult` counted by the rewriter that edited the
graph. One registry feeds the CLI pipeline string ``"a,b{opt=1}"`` and the
Python API.
"""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil
import typing
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from compiler.errors import OptionError
from compiler.ir.graph import Graph
from compiler.pattern import NearMiss
from compiler.rewriter import PassResult

if TYPE_CHECKING:
    from compiler.backend import CapabilityTable

__all__ = ["Pass", "PassContext", "register_pass", "get_pass", "all_passes", "make_pass", "parse_pipeline"]


@dataclass
class PassContext:
    """What every pass sees besides the graph: options, switches and diagnostics.

    ``capabilities``, when set, is the backend op table that legalization passes
    (``decompose``) use instead of looking one up from their ``backend`` option.
    """

    verify_each: bool = True
    options: Any = None
    capabilities: CapabilityTable[Any] | None = None
    near_misses: list[NearMiss] = field(default_factory=list)
    log: list[str] = field(default_factory=list)
    # what passes hand to later passes and to the driver, by producing pass name
    # (e.g. "calibrate" -> its Calibration, "quantize-int8" -> its QuantOutcome)
    state: dict[str, Any] = field(default_factory=dict)
    # True while the preflight legalizes only to ask the backends' tables: passes that measure or
    # calibrate (e.g. GPTQ weight rounding) do nothing then
    preflight: bool = False


@dataclass(frozen=True)
class Pass:
    """Base class of passes. Subclasses set ``name`` and implement ``run``."""

    name: ClassVar[str] = ""

    def run(self, graph: Graph, ctx: PassContext) -> PassResult:
        """Transform ``graph`` in place and return what changed."""
        raise NotImplementedError

    @classmethod
    def doc(cls) -> str:
        """First line of the module or class docstring."""
        text = (importlib.import_module(cls.__module__).__doc__ or cls.__doc__ or "").strip()
        return text.splitlines()[0] if text else ""

    def spec(self) -> str:
        """This pass with its non-default options, in pipeline-string form."""
        opts = []
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if v != f.default:
                opts.append(f"{f.name}={v}")
        return self.name + ("{" + ",".join(opts) + "}" if opts else "")


_PASSES: dict[str, type[Pass]] = {}


def register_pass(cls: type[Pass]) -> type[Pass]:
    """Class decorator that registers a pass under its ``name``."""
    if not cls.name or cls.name != cls.name.lower() or " " in cls.name:
        raise ValueError(f"pass {cls.__name__} needs a kebab-case name")
    if cls.name in _PASSES and _PASSES[cls.name] is not cls:
        raise ValueError(f"pass {cls.name} registered twice")
    _PASSES[cls.name] = cls
    return cls


def _load_builtin() -> None:
    import passes

    for info in pkgutil.iter_modules(passes.__path__):
        importlib.import_module(f"passes.{info.name}")


def all_passes() -> dict[str, type[Pass]]:
    """Every registered pass by name (built-ins are imported on first use)."""
    _load_builtin()
    return dict(sorted(_PASSES.items()))


def get_pass(name: str) -> type[Pass]:
    """The pass class registered under ``name``."""
    passes = all_passes()
    if name not in passes:
        raise OptionError(f"unknown pass {name!r} (see `kiln passes`)")
    return passes[name]


def make_pass(name: str, options: dict[str, str | Any] | None = None) -> Pass:
    """Instantiate a pass, converting string option values to the field types."""
    cls = get_pass(name)
    hints = typing.get_type_hints(cls)
    fields = {f.name for f in dataclasses.fields(cls)}
    kwargs: dict[str, Any] = {}
    for key, raw in (options or {}).items():
        if key not in fields:
            raise OptionError(
                f"pass {name!r} has no option {key!r} (options: {', '.join(sorted(fields)) or 'none'})"
            )
        kwargs[key] = _convert(hints[key], raw, f"{name}{{{key}}}")
    return cls(**kwargs)


def _convert(hint: Any, raw: Any, where: str) -> Any:
    if not isinstance(raw, str):
        return raw
    try:
        if hint is bool:
            if raw.lower() not in ("1", "0", "true", "false", "yes", "no"):
                raise ValueError(raw)
            return raw.lower() in ("1", "true", "yes")
        if hint is int:
            return int(raw)
        if hint is float:
            return float(raw)
    except ValueError:
        raise OptionError(f"{where}: {raw!r} is not a valid {getattr(hint, '__name__', hint)}") from None
    return raw


def parse_pipeline(text: str) -> list[Pass]:
    """Parse ``"a,b{opt=1,x=2},c"`` into pass instances."""
    out: list[Pass] = []
    i, n = 0, len(text)
    while i < n:
        j = i
        while j < n and text[j] not in ",{":
            j += 1
        name = text[i:j].strip()
        opts: dict[str, str] = {}
        if j < n and text[j] == "{":
            k = text.find("}", j)
            if k < 0:
                raise OptionError(f"pipeline {text!r}: missing '}}' after {name!r}")
            for item in filter(None, (s.strip() for s in text[j + 1 : k].split(","))):
                key, sep, val = item.partition("=")
                if not sep:
                    raise OptionError(f"pipeline {text!r}: option {item!r} of {name!r} needs key=value")
                opts[key.strip()] = val.strip()
            j = k + 1
        if name:
            out.append(make_pass(name, opts))
        elif opts:
            raise OptionError(f"pipeline {text!r}: options without a pass name")
        while j < n and text[j] in ", ":
            j += 1
        i = j
    if not out:
        raise OptionError(f"pipeline {text!r} names no pass")
    return out
