"""The ``kiln`` command line: inspect, compile, run.

Every user error prints one line ``kiln: error: ...`` naming the file, node or
op, and exits 2 (1 when an artifact fails verification). A single-value flag given
twice is refused (exit 2). An unexpected exception prints one line ``kiln: internal
error in <stage> (...): ...`` with the path of a log file holding the traceback, and exits 3.
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from compiler.errors import InternalError, KilnError, OptionError

if TYPE_CHECKING:
    from compiler.quant.options import QuantOptions

__all__ = ["main", "build_parser"]

log = logging.getLogger("kiln")


_GIVEN = "_kiln_given"  # the dests set during one parse, dropped when it ends


class _StoreOnce(argparse._StoreAction):
    """argparse's plain store, refusing a second value (``--seed 1 --seed 2``, ``-o a -o b``)."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        given: set[str] = namespace.__dict__.setdefault(_GIVEN, set())
        if self.dest in given:
            flags = "/".join(self.option_strings) or self.dest
            parser.error(f"{flags} is given more than once (it takes one value)")
        given.add(self.dest)
        super().__call__(parser, namespace, values, option_string)


class _Parser(argparse.ArgumentParser):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.register("action", None, _StoreOnce)
        self.register("action", "store", _StoreOnce)

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        ns, rest = super().parse_known_args(args, namespace)
        ns.__dict__.pop(_GIVEN, None)
        return ns, rest

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"kiln: error: {self.prog}: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every subcommand."""
    p = _Parser(prog="kiln", description="Kiln: offline model optimization and quantization compiler")
    p.add_argument("-v", "--verbose", action="store_true", help="log progress to stderr")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)

    ins = sub.add_parser("inspect", help="print inputs, outputs, op histogram and parameter size")
    ins.add_argument("model", type=Path)
    ins.add_argument("--input-shape", action="append", default=[], metavar="NAME=1x3xHxW")

    comp = sub.add_parser("compile", help="optimize a model and write artifacts plus manifest.json")
    comp.add_argument("model", type=Path)
    comp.add_argument("-o", "--output", type=Path, required=True, metavar="OUTDIR")
    comp.add_argument(
        "--emit",
        action="append",
        default=None,
        metavar="K[,K]",
        help="artifact kinds, comma-separated or repeated (default: onnx, or none with --target)",
    )
    comp.add_argument(
        "--target",
        action="append",
        default=[],
        metavar="T[,T]",
        help="TVM targets, comma-separated or repeated: cpu (host), x86-avx2, x86-avx512, arm, "
        "arm-dotprod, cuda[:sm_XX]; writes OUT/<target>/model.so",
    )
    comp.add_argument(
        "--input-shape",
        action="append",
        default=[],
        metavar="NAME=1x3xHxW",
        help="fix dynamic input dims (repeatable)",
    )
    comp.add_argument("--inputs", type=Path, help=".npz of named inputs for verification")
    comp.add_argument("--no-verify", action="store_true", help="skip checking artifacts against onnxruntime")
    comp.add_argument("--seed", type=int, default=0, help="seed of random verification inputs")
    _add_pipeline_flags(comp)
    _add_quant_flags(comp)
    from compiler.backend import all_backends

    for backend in all_backends():
        backend.add_arguments(comp)

    ops = sub.add_parser("ops", help="print the op x backend support matrix (native / decomposed / refused)")
    ops.add_argument("--backend", action="append", default=[], metavar="B", help="only these backends")
    ops.add_argument("--json", action="store_true", help="print the matrix as JSON")
    ops.add_argument("--markdown", action="store_true", help="print the matrix as a Markdown table")

    lst = sub.add_parser("passes", help="list the registered passes and named pipelines")
    lst.add_argument("--verbose-docs", action="store_true", help="print each pass's full docstring")

    opt = sub.add_parser("opt", help="run passes on a model and write the optimized ONNX model")
    opt.add_argument("model", type=Path)
    opt.add_argument("-o", "--output", type=Path, required=True, metavar="OUT.onnx")
    opt.add_argument("--input-shape", action="append", default=[], metavar="NAME=1x3xHxW")
    _add_pipeline_flags(opt)

    run = sub.add_parser("run", help="run an artifact on inputs and save its outputs")
    run.add_argument("artifact", type=Path)
    run.add_argument("--inputs", type=Path, required=True)
    run.add_argument("-o", "--output", type=Path, required=True, metavar="Y.npz")
    run.add_argument(
        "--rpc", metavar="HOST:PORT", help="run a TVM library on a remote device (or tracker:HOST:PORT:KEY)"
    )

    bench = sub.add_parser("bench", help="time an artifact (median latency), optionally against onnxruntime")
    bench.add_argument("artifact", type=Path)
    bench.add_argument("--threads", type=int, default=1, help="worker threads for both engines")
    bench.add_argument("--inputs", type=Path, help=".npz of named inputs (default: random normal)")
    bench.add_argument("--vs", type=Path, metavar="MODEL.onnx", help="also time onnxruntime, interleaved")
    bench.add_argument("--rounds", type=int, default=30, help="timed rounds (median reported)")
    bench.add_argument("--json", action="store_true", help="print the result as JSON")
    bench.add_argument(
        "--rpc", metavar="HOST:PORT", help="time a TVM library on a remote device (or tracker:HOST:PORT:KEY)"
    )
    return p


def _add_quant_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("quantization")
    g.add_argument(
        "--quantize",
        choices=["int8", "fp16", "int4w", "int8w"],
        help="post-training quantization (int4w/int8w: weight-only MatMul/Gemm weights, GPTQ with --calib)",
    )
    g.add_argument("--calib", type=Path, metavar="DATA", help=".npz/.npy (leading sample axis), or a folder")
    g.add_argument("--calib-count", type=int, metavar="N", help="use the first N calibration samples")
    g.add_argument(
        "--calib-method",
        default="minmax",
        help="minmax | percentile[=99.999] | entropy | entropy-ort | mse | auto",
    )
    g.add_argument("--preprocess", help='image folders: "resize=224x224,mean=..,std=..,layout=NCHW,bgr"')
    g.add_argument("--activation-type", default="uint8", choices=["uint8", "int8"])
    g.add_argument("--per-tensor-weights", action="store_true", help="one weight scale per tensor")
    g.add_argument(
        "--keep-float",
        action="append",
        default=[],
        metavar="PATTERN",
        help="keep matching nodes in float (node name, op type or regex; repeatable)",
    )
    g.add_argument("--scales", type=Path, metavar="FILE", help="reuse a scales.json instead of calibrating")
    g.add_argument(
        "--min-sqnr",
        type=_floor_flag,
        metavar="DB|off",
        help="int8 SQNR floor on the worst output (calibration samples and --inputs; default 25): "
        "layers go back to float (most sensitive first; with --inputs, most noise removed per int8 "
        "op first) until it holds; 'off' disables it",
    )
    g.add_argument(
        "--strict", action="store_true", help="fail (exit 1) when int8 misses the SQNR floor, no fallback"
    )
    g.add_argument(
        "--bias-correction", action="store_true", help="remove each layer's mean int8 error from its bias"
    )
    g.add_argument(
        "--no-sensitivity",
        action="store_true",
        help="skip the per-layer sensitivity analysis (report.md, sensitivity.png)",
    )
    g.add_argument("--calib-runtime", default="onnxruntime", choices=["onnxruntime", "interpreter"])
    g.add_argument(
        "--smoothquant",
        default="off",
        metavar="{off,auto,ALPHA}",
        help="int8: fold SmoothQuant scales into LayerNorm/linear producers and MatMul/Gemm weights; "
        "auto searches alpha per layer on --calib (default off)",
    )
    g.add_argument(
        "--weight-block-size",
        type=int,
        choices=[32, 64, 128],
        help="int4w/int8w: weights of a row per scale, along K (default 32)",
    )
    g.add_argument(
        "--weight-scale-type", choices=["fp16", "fp32"], help="int4w/int8w: scale storage (default fp16)"
    )
    g.add_argument(
        "--weight-asymmetric",
        action="store_true",
        help="int4w/int8w: a zero point per block (default symmetric)",
    )
    g.add_argument(
        "--weight-min-cosine",
        type=float,
        metavar="C",
        help="int4w/int8w: output cosine the layer fallback (int8, float) keeps on the compile inputs "
        "(default the verification floor: int4w 0.98, int8w 0.999; 0: off)",
    )


def _floor_flag(text: str) -> float | str:
    """--min-sqnr: a number of dB, or 'off'."""
    if text.strip().lower() == "off":
        return "off"
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give a number of dB or 'off'") from None


def _calib_taken_by_backend(args: argparse.Namespace) -> bool:
    """True when a requested backend uses --calib without --quantize (MNN's GPTQ weight rounding)."""
    from compiler.backend import all_backends

    return any(bool(getattr(b, "consumes_calib", lambda a: False)(args)) for b in all_backends())


def _quant_options(args: argparse.Namespace) -> QuantOptions | None:
    from compiler.quant.options import (
        DEFAULT_WEIGHT_BLOCK_SIZE,
        DEFAULT_WEIGHT_SCALE_TYPE,
        WEIGHT_ONLY_MODES,
        QuantOptions,
    )

    given = [
        f"--{f.replace('_', '-')}" for f in ("calib", "scales", "min_sqnr") if getattr(args, f) is not None
    ]
    given += ["--keep-float"] if args.keep_float else []
    given += ["--bias-correction"] if args.bias_correction else []
    given += ["--no-sensitivity"] if args.no_sensitivity else []
    given += ["--strict"] if args.strict else []
    given += ["--smoothquant"] if args.smoothquant != "off" else []
    weight_flags = [
        flag
        for flag, on in (
            ("--weight-block-size", args.weight_block_size is not None),
            ("--weight-scale-type", args.weight_scale_type is not None),
            ("--weight-asymmetric", args.weight_asymmetric),
            ("--weight-min-cosine", args.weight_min_cosine is not None),
        )
        if on
    ]
    if weight_flags and args.quantize not in WEIGHT_ONLY_MODES:
        raise OptionError(f"{weight_flags[0]} needs --quantize int4w or int8w")
    if args.quantize is None:
        if args.calib is not None and _calib_taken_by_backend(args):  # e.g. MNN's GPTQ weight rounding
            given.remove("--calib")
        if given:
            raise OptionError(
                f"{given[0]} needs --quantize int8 (--calib also: --emit mnn --mnn-weights int8|int4)"
            )
        return None
    return QuantOptions(
        mode=args.quantize,
        calib=args.calib,
        calib_count=args.calib_count,
        calib_method=args.calib_method,
        preprocess=args.preprocess,
        activation_dtype=args.activation_type,
        per_channel=not args.per_tensor_weights,
        keep_float=tuple(args.keep_float),
        scales=args.scales,
        min_sqnr=None if args.min_sqnr in (None, "off") else float(args.min_sqnr),
        floor=args.min_sqnr != "off",
        strict=args.strict,
        bias_correction=args.bias_correction,
        calib_runtime=args.calib_runtime,
        sensitivity=not args.no_sensitivity,
        smoothquant=args.smoothquant,
        weight_block_size=args.weight_block_size or DEFAULT_WEIGHT_BLOCK_SIZE,
        weight_scale_type=args.weight_scale_type or DEFAULT_WEIGHT_SCALE_TYPE,
        weight_asymmetric=args.weight_asymmetric,
        weight_min_cosine=args.weight_min_cosine,
    )


def _add_pipeline_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--passes", help='pipeline string, e.g. "fold-constants,fuse-conv-bias-act{residual=1}"')
    p.add_argument("--pipeline", default="default", help="named pipeline (see `kiln passes`)")
    p.add_argument("--dump-ir", type=Path, metavar="DIR", help="write the IR after every pass into DIR")
    p.add_argument("--timing", action="store_true", help="print per-pass wall time")


def _cmd_passes(args: argparse.Namespace) -> int:
    from compiler.pass_infra import all_passes
    from compiler.pipelines import PIPELINES, describe_pipeline

    print("passes:")
    for name, cls in all_passes().items():
        print(f"  {name:<24} {cls.doc()}")
    print("pipelines:")
    for name in PIPELINES:
        print(f"  {name:<24} {describe_pipeline(name)}")
    return 0


def _cmd_opt(args: argparse.Namespace) -> int:
    from compiler.api import save_model
    from compiler.input_spec import parse_input_shapes
    from compiler.ir.verifier import verify
    from compiler.pipelines import run_passes
    from compiler.plugins import load_model

    if args.output.suffix.lower() != ".onnx":
        raise OptionError(f"-o {args.output}: kiln opt writes an .onnx file")
    graph = load_model(args.model, input_shapes=parse_input_shapes(args.input_shape))
    verify(graph)
    timing = run_passes(graph, args.passes, args.pipeline, args.dump_ir)
    save_model(graph, args.output)
    if args.timing:
        print(timing.report())
    print(f"wrote {args.output}")
    return 0


def _cmd_inspect(args: argparse.Namespace) -> int:
    from compiler.input_spec import parse_input_shapes
    from compiler.inspect import summarize
    from compiler.plugins import load_model

    graph = load_model(args.model, input_shapes=parse_input_shapes(args.input_shape))
    print(summarize(graph, args.model.name))
    return 0


def _list_flag(flag: str, values: Sequence[str]) -> tuple[str, ...]:
    """A repeatable, comma-separated flag as one tuple in order; a value given twice is refused."""
    out: list[str] = []
    for text in values:
        for item in (k.strip() for k in text.split(",")):
            if not item:
                continue
            if item in out:
                raise OptionError(f"{flag} {item!r} is given twice")
            out.append(item)
    return tuple(out)


def _cmd_ops(args: argparse.Namespace) -> int:
    import json

    from compiler.support_matrix import format_markdown, format_text, support_matrix

    matrix = support_matrix(args.backend or None)
    if args.json:
        print(json.dumps(matrix.as_json(), indent=2, sort_keys=True))
    elif args.markdown:
        print(format_markdown(matrix))
    else:
        print(format_text(matrix))
    return 0


def _cmd_compile(args: argparse.Namespace) -> int:
    from compiler.backend import all_backends, emit_kinds, resolve_emit, resolve_target
    from compiler.driver import compile_model
    from compiler.input_spec import parse_input_shapes
    from compiler.options import CompileOptions
    from compiler.quant.weight_only_plan import fallback_summary
    from compiler.verification import format_table

    targets = _list_flag("--target", args.target)
    emit = _list_flag("--emit", args.emit) if args.emit is not None else (() if targets else ("onnx",))
    if not emit and not targets:
        raise OptionError(f"--emit: give at least one kind (choose from {', '.join(emit_kinds())})")
    requests = resolve_emit(emit) + resolve_target(targets)
    requested = {r.backend.name for r in requests}
    backend_options = {}
    for backend in all_backends():
        opts = backend.options_from_args(args, backend.name in requested)
        if opts is not None:
            backend_options[backend.name] = opts
    if not args.model.is_file():
        from compiler.errors import ModelFileError

        raise ModelFileError(f"{args.model}: model file not found")
    options = CompileOptions(
        model=args.model,
        out_dir=args.output,
        emit=emit,
        targets=targets,
        input_shapes=parse_input_shapes(args.input_shape),
        inputs=args.inputs,
        verify=not args.no_verify,
        seed=args.seed,
        passes=args.passes,
        pipeline=args.pipeline,
        dump_ir=args.dump_ir,
        timing=args.timing,
        quant=_quant_options(args),
        backend_options=backend_options,
    )
    try:
        result = compile_model(options)
    except KilnError as exc:
        res = getattr(exc, "result", None)
        if res is not None and res.checks:
            print(format_table(res.checks))
        raise
    if args.timing:
        print(result.timing_report)
    if result.checks:
        print(format_table(result.checks))
    if (line := fallback_summary(result.manifest.get("quantization", {}).get("fallback"))) is not None:
        print(line)
    print(
        f"wrote {', '.join(a['path'] for a in result.manifest['artifacts'])} and manifest.json "
        f"to {args.output}"
    )
    return 0


def _cmd_run(args: argparse.Namespace) -> int:
    from compiler.input_spec import load_inputs
    from compiler.output_dir import atomic_output_file
    from compiler.runners import run_artifact

    if not args.artifact.is_file():
        from compiler.errors import ModelFileError

        raise ModelFileError(f"{args.artifact}: artifact not found")
    if args.rpc:
        from compiler.plugins import TVM_RPC, entry

        address = entry(f"{TVM_RPC}:RpcAddress").parse(args.rpc)
        outs = entry(f"{TVM_RPC}:run_remote")(args.artifact, load_inputs(args.inputs), address)
    else:
        outs = run_artifact(args.artifact, load_inputs(args.inputs))
    with atomic_output_file(args.output) as tmp, open(tmp, "wb") as f:
        np.savez(f, **outs)
    for k, v in outs.items():
        print(f"{k}: {v.dtype}{list(v.shape)}")
    return 0


def _cmd_bench(args: argparse.Namespace) -> int:
    import json

    from compiler.bench import bench_artifact

    if not args.artifact.is_file():
        from compiler.errors import ModelFileError

        raise ModelFileError(f"{args.artifact}: artifact not found")
    if args.vs is not None and not args.vs.is_file():
        from compiler.errors import ModelFileError

        raise ModelFileError(f"{args.vs}: --vs model not found")
    if args.threads < 1 or args.rounds < 1:
        raise OptionError("--threads and --rounds must be >= 1")
    feeds = None
    if args.inputs is not None:
        from compiler.input_spec import load_inputs

        feeds = load_inputs(args.inputs)
    if args.rpc:
        from compiler.bench import bench_remote

        if args.vs is not None:
            raise OptionError("--vs times onnxruntime in the same process; it does not combine with --rpc")
        report = bench_remote(args.artifact, feeds, args.rpc, args.rounds)
    else:
        report = bench_artifact(args.artifact, feeds, args.threads, args.vs, args.rounds)
    if args.json:
        print(json.dumps(report.as_json(), indent=2, sort_keys=True))
    else:
        print(report.summary())
    return 0


_COMMANDS = {
    "bench": _cmd_bench,
    "inspect": _cmd_inspect,
    "compile": _cmd_compile,
    "run": _cmd_run,
    "passes": _cmd_passes,
    "opt": _cmd_opt,
    "ops": _cmd_ops,
}


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``kiln`` console script; returns the exit code."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="kiln: %(message)s")
    try:
        return _COMMANDS[args.command](args)
    except InternalError as exc:
        return _internal_error(exc, args.command)
    except KilnError as exc:
        print(f"kiln: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except Exception as exc:  # noqa: BLE001 - a bug outside any staged step: still one line, exit 3
        wrapped = InternalError.wrap(exc, args.command)
        wrapped.__cause__ = exc
        return _internal_error(wrapped, args.command)


def _internal_error(exc: InternalError, command: str) -> int:
    """Write the traceback to a log file in the system temp dir; print one line naming it; exit 3."""
    if exc.stage is None:
        exc.stage = command
    text = "".join(traceback.format_exception(exc))
    try:
        with tempfile.NamedTemporaryFile(
            "w", prefix="kiln-internal-error-", suffix=".log", delete=False, encoding="utf-8"
        ) as f:
            f.write(f"kiln {command}: {exc.headline()}\n\n{text}")
        where = f"traceback in {f.name}"
    except OSError as err:
        where = f"no log file ({err.strerror})"
    print(f"kiln: {exc.headline()} [{where}]", file=sys.stderr)
    return exc.exit_code


if __name__ == "__main__":
    sys.exit(main())
