"""The MNN backend object (``--emit mnn``): its flags, options, op table, legalization and emitter.

``BACKEND`` is what :data:`compiler.plugins.BACKENDS` names. Importing this module is cheap
(flags and :class:`~backends.mnn.options.MnnOptions` only); the op table and the writer are
imported on first use.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from backends.mnn.options import GELU_MODES, SCALE_MODES, WEIGHT_MODES, MnnOptions
from compiler.backend import Artifact, BackendBase, CapabilityTable
from compiler.errors import OptionError

if TYPE_CHECKING:
    from backends.mnn.lower.registry import LowerFn
    from compiler.ir.graph import Graph
    from compiler.options import CompileOptions
    from compiler.pass_infra import PassContext
    from compiler.pass_manager import PipelineItem

__all__ = ["BACKEND", "MnnBackend"]

_QUANTIZED = ("int8", "int4")


def _emit_kinds(emit: str | Sequence[str] | None) -> set[str]:
    """The kinds of ``--emit`` values (one comma-separated string, or a list of them)."""
    values = [emit] if isinstance(emit, str) else list(emit or ())
    return {k.strip() for v in values for k in v.split(",")}


class MnnBackend(BackendBase):
    """``.mnn`` files for Alibaba's MNN runtime; options: :class:`MnnOptions` (``--mnn-*`` flags)."""

    def legalization(self, target: str, options: CompileOptions | None) -> list[PipelineItem]:
        """``legalize-mnn`` (its last pass, ``mnn-gptq-weights``, is this backend's own)."""
        import backends.mnn.fuse_gelu  # noqa: F401  (registers mnn-fuse-gelu)
        import backends.mnn.gptq_pass  # noqa: F401  (registers mnn-gptq-weights)

        return super().legalization(target, options)

    def capabilities(self, target: str) -> CapabilityTable[LowerFn]:
        """The MNN op table (:data:`backends.mnn.lower.table.TABLE`; static shapes required)."""
        from backends.mnn.lower.table import TABLE

        return TABLE

    def emit(self, graph: Graph, out_dir: Path, ctx: PassContext, target: str) -> list[Artifact]:
        """Write ``model.mnn`` (and ``model.mnn.weight``) into ``out_dir`` (see :mod:`backends.mnn.emit`)."""
        from backends.mnn.emit import emit_mnn

        return emit_mnn(graph, out_dir, ctx.options, ctx.state.get("mnn-gptq-weights"))

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        """The ``--mnn-*`` and ``--external-weights`` flags (``--calib`` is the quantizer's)."""
        g = parser.add_argument_group("MNN (--emit mnn)")
        g.add_argument("--mnn-weights", choices=list(WEIGHT_MODES), help="weight storage (fp32)")
        g.add_argument("--mnn-scale", choices=list(SCALE_MODES), help="int8/int4 scale storage (fp32)")
        g.add_argument(
            "--mnn-asymmetric", action="store_true", help="int8/int4 weights with (min, scale) pairs"
        )
        g.add_argument("--mnn-block-size", type=int, metavar="N", help="one scale per N input channels")
        g.add_argument("--external-weights", action="store_true", help="weights in model.mnn.weight")
        g.add_argument("--mnn-biz-code", metavar="TEXT", help="Net.bizCode (default: kiln)")
        g.add_argument(
            "--mnn-gelu",
            choices=list(GELU_MODES),
            help="erf GELU: mnn (MNN's tanh-form UnaryOp, as its converter writes, 4.7e-4 per element; "
            "verified as fp32-approx), exact (1.7e-6, verified as fp32, slower) or auto (default: mnn "
            "where the compile inputs show it within 5e-4 of exact, else exact)",
        )
        g.add_argument(
            "--mnn-min-cosine",
            type=float,
            metavar="C",
            help="int8/int4: keep fp16 weights in the most sensitive layers until the output cosine "
            "reaches C (default: the precision's verification floor; 0 quantizes every layer)",
        )

    def consumes_calib(self, args: argparse.Namespace, requested: bool | None = None) -> bool:
        """True when ``--calib`` feeds GPTQ rounding of MNN int8/int4 weights (``MnnOptions.calib``).

        That is ``--calib`` without ``--quantize``, with ``--emit mnn --mnn-weights int8|int4``.
        ``requested`` says whether mnn was asked for (None: read ``args.emit``).
        """
        if requested is None:
            requested = "mnn" in _emit_kinds(getattr(args, "emit", None))
        return (
            requested
            and getattr(args, "calib", None) is not None
            and getattr(args, "quantize", None) is None
            and args.mnn_weights in _QUANTIZED
        )

    def options_from_args(self, args: argparse.Namespace, requested: bool) -> MnnOptions | None:
        """The MnnOptions of the flags; None if mnn is not requested (its flags are then refused).

        Raises:
            OptionError: an ``--mnn-*`` flag without ``--emit mnn``, or an invalid combination.
        """
        flags: dict[str, Any] = {
            "--mnn-weights": args.mnn_weights,
            "--mnn-scale": args.mnn_scale,
            "--mnn-asymmetric": args.mnn_asymmetric or None,
            "--mnn-block-size": args.mnn_block_size,
            "--external-weights": args.external_weights or None,
            "--mnn-biz-code": args.mnn_biz_code,
            "--mnn-min-cosine": args.mnn_min_cosine,
            "--mnn-gelu": getattr(args, "mnn_gelu", None),
        }
        given = [k for k, v in flags.items() if v is not None]
        if not requested:
            if given:
                raise OptionError(f"{given[0]} needs --emit mnn")
            return None
        gptq = self.consumes_calib(args, requested)
        return MnnOptions(
            weights=args.mnn_weights or "fp32",
            scale=args.mnn_scale or "fp32",
            asymmetric=args.mnn_asymmetric,
            block_size=args.mnn_block_size,
            external=args.external_weights,
            biz_code=args.mnn_biz_code if args.mnn_biz_code is not None else "kiln",
            min_cosine=args.mnn_min_cosine,
            calib=args.calib if gptq else None,
            calib_count=args.calib_count if gptq else None,
            preprocess=args.preprocess if gptq else None,
            gelu=getattr(args, "mnn_gelu", None) or "auto",
        )


BACKEND = MnnBackend(
    name="mnn",
    flag="--emit",
    options_type=MnnOptions,
    runtime=(".mnn", "backends.mnn.runtime:run_mnn"),
    legalization_pipeline="legalize-mnn",
)
