"""The MNN emitter (``--emit mnn``): writes ``model.mnn`` (and ``model.mnn.weight``).

The side file is written next to the model inside the driver's temporary output
directory, so both appear together or not at all. The int8/int4 weight plan is measured
on the same inputs verification uses (``--inputs``, else seeded random inputs), and recorded
under the artifact's ``details.weight_plan``: the layers that kept fp16 (or fp32) weights and the
worst output cosine (in onnxruntime, against fp32) with every layer quantized and as planned.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from backends.mnn.options import MnnOptions
from backends.mnn.precision import WeightPlan
from backends.mnn.writer import weight_plan, write_mnn
from compiler.backend import Artifact
from compiler.errors import OptionError
from compiler.input_spec import check_inputs, load_inputs, random_graph_inputs
from compiler.ir.graph import Graph
from compiler.options import CompileOptions

__all__ = ["emit_mnn", "mnn_options_of", "plan_feeds", "compile_feeds", "plan_record", "MODEL_FILE"]

MODEL_FILE = "model.mnn"


def mnn_options_of(options: CompileOptions) -> MnnOptions:
    """The MnnOptions a compile carries (``backend_options["mnn"]``), else the defaults."""
    mnn = options.backend("mnn")
    return mnn if isinstance(mnn, MnnOptions) else MnnOptions()


def plan_feeds(graph: Graph, options: CompileOptions, mnn: MnnOptions) -> dict[str, np.ndarray] | None:
    """The inputs the weight plan is measured on (None: no plan to measure)."""
    return compile_feeds(graph, options) if mnn.target_cosine > 0.0 else None


def compile_feeds(graph: Graph, options: CompileOptions) -> dict[str, np.ndarray]:
    """The inputs verification uses (--inputs, else seeded random inputs)."""
    types = graph.input_types()
    if options.inputs is not None:
        return check_inputs(load_inputs(options.inputs), types, str(options.inputs))
    return random_graph_inputs(graph, options.seed)


def plan_record(plan: WeightPlan) -> dict[str, Any]:
    """The manifest's view of a weight plan."""
    return {
        "layers": plan.layers,
        "kept": list(plan.kept),
        "kept_fp32": list(plan.kept_fp32),
        "cosine_all_quantized": round(float(plan.cosine_all_quantized), 8),
        "cosine": round(float(plan.cosine), 8),
    }


def emit_mnn(
    graph: Graph, out_dir: Path, options: CompileOptions, plan: WeightPlan | None = None
) -> list[Artifact]:
    """Write the legalized graph as an MNN model into the (temporary) output directory.

    ``plan`` is the weight plan the ``mnn-gptq-weights`` pass made (GPTQ levels with
    ``--calib``); None: the emitter plans the storage itself (nearest rounding).
    """
    mnn = mnn_options_of(options)
    if options.quant is not None and options.quant.mode == "fp16":
        raise OptionError(
            "--emit mnn: use --mnn-weights fp16 instead of --quantize fp16 (MNN computes in fp32)"
        )
    if mnn.calib is not None and options.quant is not None:
        raise OptionError(
            "--emit mnn: MnnOptions.calib (GPTQ weight-only rounding) and --quantize are exclusive"
        )
    if plan is None:
        plan = weight_plan(graph, mnn, plan_feeds(graph, options, mnn))
    from backends.mnn.gelu_choice import resolve_gelu

    has_gelu = any(n.op == "Gelu" for n in graph.ops())
    feeds = compile_feeds(graph, options) if mnn.gelu == "auto" and has_gelu else {}
    mnn, gelu_record = resolve_gelu(graph, mnn, feeds, options.model.name, plan.storage)
    write_mnn(graph, out_dir / MODEL_FILE, mnn, options.model.name, storage=plan.storage)
    # Full int8 (--quantize int8): QDQ regions are written as MNN int8 casts (backends.mnn.lower.quant),
    # so the artifact is judged with the int8 tolerance, like the QDQ ONNX model.
    full_int8 = options.quant is not None and options.quant.mode == "int8"
    precision = "int8" if full_int8 else mnn.precision
    # MnnOptions(gelu="mnn"), or "auto" where it measured safe: MNN's own tanh-form GELU kernel is
    # not fp32-exact (backends.mnn.lower.gelu); a file that misses even fp32-approx names the exact form
    remedy = ""
    if precision == "fp32" and mnn.gelu == "mnn" and has_gelu:
        precision = "fp32-approx"
        remedy = "MNN's tanh-form GELU kernel (4.7e-4 per element); --mnn-gelu exact writes the erf GELU"
    # --quantize int4w/int8w: kiln::WeightOnlyMatMul's levels as they are (the coarser of the two wins)
    if options.quant is not None and options.quant.weight_bits is not None:
        precision = "int4w" if "int4w" in (precision, options.quant.mode) else options.quant.mode
    from passes.choose_layout import record_layouts

    details: dict[str, Any] = {"layout": "NC4HW4", "layouts": record_layouts(graph, 4)}
    if mnn.bits is not None and mnn.target_cosine > 0.0:
        details["weight_plan"] = plan_record(plan)
    if gelu_record is not None:
        details["gelu"] = gelu_record
    return [
        Artifact(
            kind="mnn", target="mnn", path=MODEL_FILE, precision=precision, details=details, remedy=remedy
        )
    ]
