"""The compile driver: model file -> Graph -> passes -> artifacts + manifest.json.

Read top to bottom, each step is one call::

    graph = load_model(...)          # frontends, picked by suffix / magic bytes (dynamic input
                                     # dims from --inputs / --calib samples when not given)
    verify(graph)                    # structural and type checks
    optimize(graph, ctx)             # the named pass pipeline
    preflight(graph, requests)       # every requested backend can write the legalized graph
    quantize(graph, options)         # --quantize: calibration and QDQ (fp16 conversion, weight-only)
    legalize + emit per request      # each backend's own pipeline on a clone, then its emit
    verification = check(...)        # every artifact against the reference runtime and the
                                     # float64 interpreter on the unoptimized import
    manifest.json, then rename       # nothing partial is ever left behind

Each step runs under ``internal_errors(stage)``: an unexpected exception becomes an InternalError
naming the stage (and pass or backend, and node), which the CLI reports in one line (exit 3).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from compiler.backend import Artifact, Request, resolve_emit, resolve_target
from compiler.errors import KilnError, ModelFileError, VerificationFailed, internal_errors
from compiler.input_spec import check_inputs, load_inputs, random_graph_inputs, sample_shapes
from compiler.instruments import PassTiming
from compiler.ir.graph import Graph
from compiler.ir.verifier import verify
from compiler.options import CompileOptions
from compiler.output_dir import atomic_output_dir
from compiler.plugins import detect_format, load_model
from compiler.preflight import legalize, preflight
from compiler.quant.quantize import QuantOutcome
from compiler.runners import run_artifact, run_onnxruntime
from compiler.verification import TOLERANCES, ArtifactCheck, ExactReference, compare_outputs, exact_outputs

__all__ = [
    "compile_model",
    "requests_of",
    "CompileResult",
    "reference_outputs",
    "describe_values",
    "sha256_file",
]

log = logging.getLogger(__name__)

KILN_VERSION = "0.1.0"


@dataclass
class CompileResult:
    """What ``compile_model`` produced."""

    out_dir: Path
    manifest: dict[str, Any]
    checks: list[ArtifactCheck] = field(default_factory=list)
    timing_report: str = ""


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file's bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def describe_values(graph: Graph, which: str) -> list[dict[str, Any]]:
    """Names, shapes and dtypes of graph inputs or outputs."""
    values = graph.inputs if which == "inputs" else graph.outputs
    return [
        {
            "name": v.name,
            "shape": None if v.type.shape is None else list(v.type.shape),
            "dtype": v.type.dtype.numpy.name if v.type.dtype.name != "BFLOAT16" else "bfloat16",
        }
        for v in values
    ]


def reference_outputs(
    model: Path, fmt: str, feeds: dict[str, np.ndarray]
) -> tuple[str, dict[str, np.ndarray]]:
    """Run the *source* model in its own reference runtime.

    MegEngine has no runtime here (its wheel needs Python <= 3.10), so a ``.mge``
    source is judged by onnxruntime running the ONNX export of the *unoptimized*
    imported graph: the artifacts are checked against a runtime other than Kiln,
    on a graph no Kiln pass has touched. (The import itself is checked against
    outputs MegEngine computed, in tests/test_megengine_frontend.py.)
    """
    if fmt == "onnx":
        try:
            return "onnxruntime", run_onnxruntime(model, feeds)
        except KilnError:
            raise
        except Exception as exc:  # noqa: BLE001 - onnxruntime's run errors are private types
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise ModelFileError(
                f"{model.name}: onnxruntime cannot run the source model on the verification inputs "
                f"({first}); --no-verify skips the check"
            ) from None
    if fmt == "megengine":
        from compiler.onnx_export import export_onnx, model_bytes

        shapes = {name: tuple(np.shape(arr)) for name, arr in feeds.items()}
        imported = load_model(model, input_shapes=shapes)
        return "onnxruntime (unoptimized import)", run_onnxruntime(model_bytes(export_onnx(imported)), feeds)
    return fmt, run_artifact(model, feeds)


def alternate_references(
    model: Path, fmt: str, feeds: dict[str, np.ndarray]
) -> dict[str, dict[str, np.ndarray]]:
    """Other valid float32 evaluations of an ONNX source by its reference runtime, by name.

    onnxruntime with every graph optimization on sums and fuses differently from the
    unoptimized reference; on a model that amplifies float32 rounding the two can stand far
    apart from the exact result, and the verification rule then takes the farther as the
    runtime's own noise (:func:`compiler.verification.compare_outputs`). None for other formats.
    """
    if fmt != "onnx":
        return {}
    try:
        return {"onnxruntime (all graph optimizations)": run_onnxruntime(model, feeds, optimized=True)}
    except Exception as exc:  # noqa: BLE001 - the reference itself ran; this only means no alternate
        log.warning("no alternate reference: %s", exc)
        return {}


def compile_model(options: CompileOptions) -> CompileResult:
    """Compile one model; raises KilnError subclasses on bad input or failed verification
    (InternalError, naming the stage, on an unexpected exception)."""
    from compiler.pipelines import instruments_for, optimize

    requests = requests_of(options)
    fmt = detect_format(options.model)
    with internal_errors("import"):
        graph, options, shapes_from = _import(options)
    with internal_errors("verify"):
        verify(graph)
    with internal_errors("import"):
        feeds = _feeds(graph, options)
    source = graph.clone() if options.verify else None  # the exact oracle runs the unoptimized import
    with internal_errors("optimize"):
        timing = optimize(graph, options)
    with internal_errors("preflight"):
        preflight(graph, requests, options, options.model.name)
    with internal_errors("quantize"):
        outcome, weight_only = _quantize(graph, options, timing)

    with atomic_output_dir(options.out_dir) as tmp:
        artifacts: list[Artifact] = []
        for req in requests:
            stage = f"legalize-{req.label}"
            with internal_errors("legalize", f"backend {req.label}"):
                legal, ctx = legalize(graph, req, options, instruments_for(options, timing, stage))
            with internal_errors("emit", f"backend {req.label}"):
                artifacts.extend(req.backend.emit(legal, tmp, ctx, req.target))
        with internal_errors("emit"):
            if outcome is not None:
                _write_quant_files(outcome, options, tmp)
        checks: list[ArtifactCheck] = []
        verification: dict[str, Any] = {"enabled": options.verify}
        if source is not None:
            with internal_errors("verification"):
                checks = _verify_artifacts(options, fmt, source, feeds, artifacts, tmp, verification)
        manifest = {
            "kiln_version": KILN_VERSION,
            "source": {"file": options.model.name, "format": fmt, "sha256": sha256_file(options.model)},
            "inputs": describe_values(graph, "inputs"),
            "outputs": describe_values(graph, "outputs"),
            "options": options.manifest_view(),
            "artifacts": [
                {
                    "kind": a.kind,
                    "target": a.target,
                    "path": a.path,
                    "precision": a.precision,
                    "sha256": sha256_file(tmp / a.path),
                    **({"details": a.details} if a.details else {}),
                }
                for a in artifacts
            ],
            "verification": verification,
        }
        if shapes_from is not None:
            manifest["input_shapes_from"] = shapes_from
        if outcome is not None:
            manifest["quantization"] = outcome.report
        elif weight_only is not None:
            manifest["quantization"] = weight_only
        (tmp / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    result = CompileResult(options.out_dir, manifest, checks, timing.report())
    failed = [(c.path, name) for c in checks for name in c.failures()]
    if failed:
        what = ", ".join(f"output {n!r} of {p}" for p, n in failed)
        paths = {p for p, _ in failed}
        remedies = "".join(f"; {a.path}: {a.remedy}" for a in artifacts if a.path in paths and a.remedy)
        err = VerificationFailed(
            f"{options.model.name}: verification failed for {what} (see manifest.json){remedies}"
        )
        err.result = result  # type: ignore[attr-defined]
        raise err
    return result


def _import(options: CompileOptions) -> tuple[Graph, CompileOptions, dict[str, Any] | None]:
    """Load the model; dynamic input dims that --input-shape leaves open come from the samples
    (--inputs, else the calibration data): then the model is loaded again with those shapes, and
    the options (and manifest) record them. Returns the graph, the options and where shapes came from."""
    graph = load_model(options.model, input_shapes=options.input_shapes)
    dynamic = [name for name, t in graph.input_types().items() if not t.is_static]
    calib = options.quant.calib if options.quant is not None else None
    calib = calib or next(
        (o.calib for o in options.backend_options.values() if getattr(o, "calib", None)), None
    )
    if not dynamic or (options.inputs is None and calib is None):
        return graph, options, None
    source = options.inputs if options.inputs is not None else calib
    assert source is not None
    preprocess = options.quant.preprocess if options.quant is not None else None
    found = sample_shapes(
        source, graph.input_types(), dynamic, is_calib=options.inputs is None, preprocess=preprocess
    )
    shapes = {**options.input_shapes, **found}
    options = dataclasses.replace(options, input_shapes=shapes)
    log.info("input shapes from %s: %s", source.name, found)
    graph = load_model(options.model, input_shapes=shapes)
    return graph, options, {"file": source.name, "shapes": {k: list(v) for k, v in sorted(found.items())}}


def _verify_artifacts(
    options: CompileOptions,
    fmt: str,
    source: Graph,
    feeds: dict[str, np.ndarray],
    artifacts: list[Artifact],
    out_dir: Path,
    verification: dict[str, Any],
) -> list[ArtifactCheck]:
    """Run every artifact and check it against the reference runtime and the exact (float64)
    result of the unoptimized import; fills ``verification`` for the manifest."""
    ref_name, ref = reference_outputs(options.model, fmt, feeds)
    exact: ExactReference = exact_outputs(source, feeds)
    skipped = [{"path": a.path, "why": a.unverifiable} for a in artifacts if a.unverifiable]
    checks: list[ArtifactCheck] = []
    alternates: dict[str, dict[str, np.ndarray]] | None = None  # computed when an output misses
    for art in artifacts:
        if art.unverifiable:
            log.warning("not verified here: %s (%s)", art.path, art.unverifiable)
            continue
        tol = TOLERANCES[art.precision]
        got = run_artifact(out_dir / art.path, feeds)
        outputs = compare_outputs(got, ref, tol, exact.outputs)
        if not all(o.passed for o in outputs) and exact.outputs is not None:
            if alternates is None:
                alternates = alternate_references(options.model, fmt, feeds)
            outputs = compare_outputs(got, ref, tol, exact.outputs, list(alternates.values()))
        runtime = None
        if not all(o.passed for o in outputs) and art.kind == "onnx":
            # as deployed: onnxruntime's production path runs a QDQ file's integer kernels, where the
            # unoptimized one simulates them in float32 (a rounding tie may land on the other side)
            deployed = run_onnxruntime(out_dir / art.path, feeds, optimized=True)
            again = compare_outputs(deployed, ref, tol, exact.outputs, list((alternates or {}).values()))
            if all(o.passed for o in again):
                outputs, runtime = again, "onnxruntime (all graph optimizations)"
        checks.append(ArtifactCheck(art.kind, art.path, art.precision, tol, outputs, runtime))
    if alternates:
        verification["reference_alternates"] = sorted(alternates)
    verification.update(
        reference=ref_name,
        exact=exact.as_dict(),
        inputs=options.inputs.name if options.inputs else f"random normal, seed {options.seed}",
        passed=all(c.passed for c in checks),
        artifacts=[c.as_dict() for c in checks],
    )
    if skipped:
        verification["not_run_here"] = skipped
    return checks


def requests_of(options: CompileOptions) -> list[Request]:
    """The artifacts asked for: every ``--emit`` kind and every ``--target``, each through its backend."""
    return resolve_emit(options.emit) + resolve_target(options.targets)


def _quantize(
    graph: Graph, options: CompileOptions, timing: PassTiming
) -> tuple[QuantOutcome | None, dict[str, Any] | None]:
    """The --quantize step as passes (pipeline ``quantize-int8``, ``quantize-fp16``,
    ``quantize-int4w`` or ``quantize-int8w``): the outcome of ``quantize-int8`` (plan, scores,
    report) for the reports and the manifest, and the record of ``quantize-weights``."""
    from compiler.pass_infra import PassContext
    from compiler.pass_manager import PassManager
    from compiler.pipelines import instruments_for, quantization_pipeline

    q = options.quant
    if q is None:
        return None, None
    name = f"quantize-{q.mode}"
    ctx = PassContext(verify_each=True, options=options)
    PassManager(quantization_pipeline(q), ctx, instruments_for(options, timing, name)).run(graph)
    outcome: QuantOutcome | None = ctx.state.get("quantize-int8")
    weights: dict[str, Any] | None = ctx.state.get("quantize-weights")
    return outcome, None if weights is None else {"mode": q.mode, **weights}


def _write_quant_files(outcome: QuantOutcome, options: CompileOptions, out_dir: Path) -> None:
    """scales.json (reusable with --scales); with the sensitivity analysis, report.md and sensitivity.png."""
    from compiler.quant.report import CHART_FILE, REPORT_FILE, write_report
    from compiler.quant.scales_file import write_scales

    assert options.quant is not None
    meta = {"activation_dtype": options.quant.activation_dtype, "calib_method": options.quant.calib_method}
    # every calibrated activation (layers sent back to float by --min-sqnr too), as used where used
    acts = {**outcome.params, **outcome.result.activations}
    write_scales(out_dir / "scales.json", acts, outcome.result.weights, outcome.ranges, meta)
    outcome.report["scales_file"] = "scales.json"
    written = write_report(out_dir, outcome, options.quant, options.model.name)
    if REPORT_FILE in written:
        outcome.report["report"] = REPORT_FILE
    if CHART_FILE in written:
        outcome.report["chart"] = CHART_FILE


def _feeds(graph: Graph, options: CompileOptions) -> dict[str, np.ndarray]:
    types = graph.input_types()
    if options.inputs is not None:
        return check_inputs(load_inputs(options.inputs), types, str(options.inputs))
    for name, t in types.items():
        if not t.is_static:
            from compiler.errors import InputShapeError

            raise InputShapeError(
                f"{options.model.name}: input {name!r} has dynamic shape {t}; fix it with "
                f"--input-shape {name}=... or give --inputs"
            )
    return random_graph_inputs(graph, options.seed)
