"""Build a Kiln Graph from a parsed MegEngine model.

Order of work: a scan that collects *every* unsupported operator (by class and
operator name), then the operators in load order (each through its converter,
with quantized outputs rounded onto their grid), the graph outputs under their
MegEngine names, and finally the removal of nodes nothing uses any more.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Mapping, Sequence

from compiler.errors import ConversionError, InputShapeError, KilnError, ModelFileError, UnsupportedOpsError
from compiler.ir.graph import INPUT_OP, Graph, GraphError
from frontends.megengine.converter import OprContext, Var, find_converter
from frontends.megengine.model import MgeModel, MgeOpr
from frontends.megengine.quant import round_to_grid

__all__ = ["MgeImporter"]

logger = logging.getLogger(__name__)


class MgeImporter:
    """Converts one parsed MegEngine model into a Kiln Graph (use :meth:`run` once)."""

    def __init__(self, model: MgeModel, source: str, input_shapes: Mapping[str, Sequence[int]]) -> None:
        self.model = model
        self.source = source
        self.input_shapes = dict(input_shapes)
        self.graph = Graph("main")
        self.env: dict[int, Var | None] = {}
        self.node_names: set[str] = set()

    def check_supported(self) -> None:
        """Raise UnsupportedOpsError listing every unsupported operator with all its names."""
        missing: dict[str, list[str]] = {}
        for opr in self.model.oprs:
            entry = find_converter(opr.family)
            key: str | None = (opr.family or opr.type) if entry is None else None
            if entry is not None and entry.check is not None:
                try:
                    key = entry.check(opr)
                except Exception as exc:  # noqa: BLE001 - a corrupt param must not crash the scan
                    raise ModelFileError(
                        f"{self.source}: corrupt params of opr {opr.label!r}: {exc}"
                    ) from None
            if key is not None:
                missing.setdefault(key, []).append(opr.label)
        if missing:
            raise UnsupportedOpsError(self.source, missing)

    def run(self) -> Graph:
        """Convert the whole model."""
        self.check_supported()
        md = self.graph.metadata
        md["source_format"] = "megengine"
        md["megengine.format"] = self.model.format
        md["producer"] = f"MegEngine {self.model.version}"
        for k, v in self.model.metadata.items():
            md[f"megengine.{k}"] = v
        for opr in self.model.oprs:
            self._convert(opr)
        self._check_input_shapes()
        self._set_outputs()
        self._prune()
        logger.info("imported %s: %d nodes", self.source, len(self.graph))
        return self.graph

    def _inputs(self, opr: MgeOpr) -> list[Var]:
        out = []
        for var in opr.inputs:
            if var not in self.env:
                raise ModelFileError(
                    f"{self.source}: opr {opr.label!r} ({opr.type}) reads variable {var}, which no earlier "
                    "opr defines (corrupt or truncated model?)"
                )
            v = self.env[var]
            if v is None:
                raise ConversionError(
                    f"{self.source}: opr {opr.label!r} ({opr.type}) reads variable {var}, an output Kiln's "
                    "import does not produce (e.g. BatchNorm statistics)"
                )
            out.append(v)
        return out

    def _convert(self, opr: MgeOpr) -> None:
        entry = find_converter(opr.family)
        assert entry is not None  # check_supported ran first
        ctx = OprContext(self.graph, opr, self._inputs(opr), self.source, self.input_shapes, self.node_names)
        try:
            outs = list(entry.fn(ctx))
            if len(outs) > len(opr.outputs):
                raise ctx.fail(f"produces {len(outs)} outputs, the file lists {len(opr.outputs)}")
            outs += [None] * (len(opr.outputs) - len(outs))
            if entry.requantize:
                outs = [
                    o
                    if o is None or not o.dtype.has_qdq
                    else Var(round_to_grid(ctx, o.value, o.dtype), o.dtype)
                    for o in outs
                ]
        except KilnError:
            raise
        except Exception as exc:  # noqa: BLE001 - corrupt params or a converter bug still name the opr
            raise ctx.fail(f"conversion failed ({type(exc).__name__}: {exc})") from exc
        for var, out in zip(opr.outputs, outs, strict=True):
            if var in self.env:
                raise ModelFileError(f"{self.source}: variable {var} is defined twice (opr {opr.label!r})")
            if out is not None:
                self._name(ctx, var, out)
            self.env[var] = out

    def _name(self, ctx: OprContext, var: int, out: Var) -> None:
        """Give a value this operator created its MegEngine variable name."""
        want = self.model.var_names.get(var)
        node = out.value.producer
        if not want or node.id not in ctx.created or node.op == INPUT_OP or self.graph.has_name(want):
            return
        with contextlib.suppress(GraphError):
            self.graph.rename(out.value, want)

    def _check_input_shapes(self) -> None:
        names = [v.name for v in self.graph.inputs]
        unknown = sorted(set(self.input_shapes) - set(names))
        if unknown:
            raise InputShapeError(
                f"{self.source}: --input-shape names {', '.join(map(repr, unknown))}, which "
                f"{'is not a graph input' if len(unknown) == 1 else 'are not graph inputs'} "
                f"(inputs: {', '.join(names) or 'none'})"
            )

    def _set_outputs(self) -> None:
        if not self.model.outputs:
            raise ModelFileError(f"{self.source}: the model declares no outputs")
        values, names = [], []
        for var, alias in self.model.outputs:
            out = self.env.get(var)
            if out is None:
                raise ModelFileError(f"{self.source}: graph output variable {var} is never computed")
            values.append(out.value)
            names.append(alias or self.model.var_names.get(var) or out.value.name)
        for v, nm in zip(values, names, strict=True):
            if nm != v.name and not self.graph.has_name(nm) and v.producer.op != INPUT_OP:
                self.graph.rename(v, nm)
        self.graph.set_outputs(values)

    def _prune(self) -> None:
        """Remove nodes (constants and dead computations) that nothing uses."""
        for node in reversed(self.graph.nodes()):
            if node.op != INPUT_OP and not self.graph.has_users(node):
                self.graph.remove(node)
