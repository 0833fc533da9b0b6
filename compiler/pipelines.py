"""Named pass pipelines, all in one place, and the driver's ``optimize`` step."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from compiler.instruments import DumpIR, Instrument, PassTiming
from compiler.ir.graph import Graph
from compiler.options import CompileOptions
from compiler.pass_infra import PassContext
from compiler.pass_manager import FixedPoint, PassManager, PipelineItem
from compiler.quant.options import QuantOptions
from compiler.rewriter import PassResult

__all__ = [
    "PIPELINES",
    "LEGALIZATION",
    "pipeline",
    "optimize",
    "tvm_legalization",
    "instruments_for",
    "quantization_pipeline",
]

# The optimize pipelines keep dq(W_q) of a quantized source as a node (its integer weights reach the
# backends' integer forms and the ONNX artifact), fold-constants{dequantize=0}
_FOLD = "fold-constants{dequantize=0}"
_BATCHNORM = FixedPoint(("fold-batchnorm", _FOLD, "eliminate-dead-nodes"), max_steps=8, name="batchnorm")
_CLEANUP = FixedPoint(
    (
        _FOLD,
        "inline-constant-if",
        "deduplicate-constants",
        "eliminate-identities",
        "eliminate-dead-nodes",
    ),
    max_steps=8,
    name="cleanup",
)

PIPELINES: dict[str, list[PipelineItem]] = {
    "none": [],
    "cleanup": [_CLEANUP],
    # The default pipeline without canonicalize, whose hard-swish/hard-sigmoid rewrites are exact in
    # math but not in float32 rounding (pan: 5e-5): for checks that need the source model's numerics.
    # unroll-loops after the first cleanup: an If folded to its branch may expose a static Loop
    "exact": [
        _CLEANUP,
        "unroll-loops",
        "lift-weight-only",
        _BATCHNORM,
        "fuse-conv-bias-act",
        _CLEANUP,
    ],
    "default": [
        _CLEANUP,
        "unroll-loops",
        "canonicalize",
        "lift-weight-only",
        _BATCHNORM,
        "fuse-conv-bias-act",
        _CLEANUP,
    ],
}


# Backend legalization: run by the driver on a clone of the optimized graph, per requested artifact,
# before the backend's emit (and by the preflight, before calibration). Each backend names its own.
# (no fold-constants here: it would fold the DequantizeLinear of int8 weights that the backends'
# integer forms read)
_LEGALIZE_CLEANUP = FixedPoint(
    ("eliminate-identities", "eliminate-dead-nodes"), max_steps=8, name="legalize-cleanup"
)
LEGALIZATION: dict[str, list[PipelineItem]] = {
    "legalize-onnx": [],
    # MNN's int8 convs: QDQ regions with a quantized output, depthwise convs left to float (MNN's
    # int8 depthwise kernel gets zero points wrong, backends/mnn/lower/quant.py); last, GPTQ levels of
    # weight-only int8/int4 weights with --calib (a pass of the MNN backend's, registered with it)
    "legalize-mnn": [
        "fuse-quantized-ops{depthwise=0,float_out=0,gemm=0}",
        # the dq(W_q) left (depthwise convs, Gemms) read as float weights by MNN's float ops; a
        # gathered int8 table (a quantized embedding) is a gathered float one: MNN's dq marks its
        # input's grid, which only MNN's own quantize ops give (no size cap: MNN reads float weights
        # only, e.g. a VGG classifier's 25088 x 4096)
        "dequantize-moves",
        "fold-constants{only_dequantize=1,max_elements=1073741824}",
        # N-D MatMuls by constant weights as MNN's fully connected conv (bias fused, input packed once)
        "matmul-to-gemm{image=1}",
        "normalize-gemm",
        # normalize-gemm gives each Gemm its own copy of B; a weight tied across layers is one again
        # (the MNN writer then stores it once, backends/mnn/lower/linear.py)
        "deduplicate-constants",
        # x/2 (1 + erf(x/sqrt(2))) as one Gelu, which the MNN writer computes with vectorized kernels
        "mnn-fuse-gelu",
        # x / sqrt(mean(x^2) + eps) * w as one RMSNormalization (MNN's LayerNorm with useRMSNorm)
        "fuse-rms-norm",
        "decompose{backend=mnn}",
        _LEGALIZE_CLEANUP,
        "mnn-gptq-weights",
    ],
    # CANN's int8 convs and Gemms (AscendQuant -> Conv2D/FullyConnection -> AscendDequant, float output
    # included); MatMul stays QDQ, as FullyConnection reads 2-D data (backends/cann/lower_quant.py)
    "legalize-cann": [
        # int8 tensors that only move (a QOperator attention's reshaped Q, K, V; a flattened pool) move
        # in float: Ascend's int8 data may only be read by AscendDequant and its int8 ops
        "dequantize-moves{activations=1}",
        "fuse-quantized-ops{matmul=0}",
        "normalize-gemm",
        "decompose{backend=cann}",
        _LEGALIZE_CLEANUP,
    ],
}
PIPELINES.update(LEGALIZATION)

# --quantize: calibration and QDQ insertion (int8), the fp16 conversion, or weight-only int4/int8 of
# MatMul/Gemm weights (canonical Gemms first; the compile's block size, scale type and grid replace
# quantize-weights' defaults, see quantization_pipeline), as passes
QUANTIZATION: dict[str, list[PipelineItem]] = {
    # smooth-quant changes nothing unless --smoothquant is on
    "quantize-int8": ["smooth-quant", "calibrate", "quantize-int8", "eliminate-dead-nodes"],
    "quantize-fp16": ["convert-fp16", "eliminate-dead-nodes"],
    "quantize-int4w": ["normalize-gemm", "quantize-weights{bits=4}", "eliminate-dead-nodes"],
    "quantize-int8w": ["normalize-gemm", "quantize-weights{bits=8}", "eliminate-dead-nodes"],
}
PIPELINES.update(QUANTIZATION)


def quantization_pipeline(q: QuantOptions) -> list[PipelineItem]:
    """The ``--quantize`` pipeline ``quantize-<mode>``; a weight-only one runs ``quantize-weights``
    with the options' block size, scale type and grid."""
    items = pipeline(f"quantize-{q.mode}")
    if q.weight_bits is None:
        return items
    return [q.weight_pass_spec() if str(i).startswith("quantize-weights") else i for i in items]


def tvm_legalization(target: str, lanes: int | None) -> list[PipelineItem]:
    """TVM's legalization for one target: integer convs, decompositions, blocked layouts (CPU).

    A reloaded QDQ model (Conv -> Relu -> Q) fuses exactly as a compile does; QDQ regions become
    kiln::QConv integer kernels and the DequantizeLinear of constant weights elsewhere folds to
    float; on CPU targets choose-layout picks NCHW[b]c layouts for ``lanes``-wide SIMD.
    """
    items: list[PipelineItem] = [
        "fuse-conv-bias-act",
        "fuse-quantized-ops{conv1d=1}",  # 1-D convs too (H = 1): the int8 conv kernel, not fake quant
        "fold-quantized-relu",  # Q(Relu(dq(q))) on one grid = max(q, z): a residual Add's int8 tail
        "normalize-gemm",
        "fold-constants",
        f"decompose{{backend=tvm,target={target}}}",
        f"fuse-attention{{backend=tvm,target={target}}}",
        "fuse-rms-norm",
        "eliminate-dead-nodes",
    ]
    if lanes is not None:
        items += [f"choose-layout{{lanes={lanes}}}", "eliminate-dead-nodes"]
    return items


def pipeline(name: str) -> list[PipelineItem]:
    """The named pipeline."""
    from compiler.errors import OptionError

    if name not in PIPELINES:
        raise OptionError(f"unknown pipeline {name!r} (choose from {', '.join(sorted(PIPELINES))})")
    return list(PIPELINES[name])


def describe_pipeline(name: str) -> str:
    """A pipeline as one line of text."""

    def item(i: PipelineItem) -> str:
        if isinstance(i, FixedPoint):
            return f"{i.name}(" + ",".join(item(p) for p in i.passes) + ")"
        return i if isinstance(i, str) else i.spec()

    return ", ".join(item(i) for i in pipeline(name)) or "(no passes)"


def run_passes(
    graph: Graph,
    passes: str | None,
    pipeline_name: str,
    dump_ir: Path | None,
    options: CompileOptions | None = None,
) -> PassTiming:
    """Run a pipeline string (or else the named pipeline) with timing and optional IR dumps."""
    items: list[PipelineItem] = [passes] if passes else pipeline(pipeline_name)
    timing = PassTiming()
    instruments: list[Instrument] = [timing]
    if dump_ir is not None:
        instruments.append(DumpIR(dump_ir))
    PassManager(items, PassContext(verify_each=True, options=options), instruments).run(graph)
    return timing


def instruments_for(options: CompileOptions, timing: PassTiming, stage: str) -> list[Instrument]:
    """The instruments of a later stage (legalization, quantization): the compile's timing, plus
    IR dumps in ``--dump-ir DIR/<stage>`` when asked for."""
    out: list[Instrument] = [_Staged(timing, stage)]
    if options.dump_ir is not None:
        out.append(DumpIR(options.dump_ir / stage))
    return out


@dataclass
class _Staged(Instrument):
    """Forward pass timings into the compile's PassTiming under ``[stage] pass``."""

    timing: PassTiming
    stage: str
    _own: PassTiming = field(default_factory=PassTiming)

    def before_pass(self, name: str, graph: Graph) -> None:
        self._own.before_pass(name, graph)

    def after_pass(self, name: str, graph: Graph, result: PassResult) -> None:
        self._own.after_pass(name, graph, result)
        self.timing.timings.append((f"[{self.stage}] {name}", self._own.timings[-1][1]))


def optimize(graph: Graph, options: CompileOptions) -> PassTiming:
    """The driver's optimize step: the options' pipeline with its instruments."""
    return run_passes(graph, options.passes, options.pipeline, options.dump_ir, options)
