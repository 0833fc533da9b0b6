"""Benchmark: int8 quality of the non-CNN zoo models (transformers, audio, RNNs) under the default policy.

Usage, from the repository root::

    .venv/bin/python benchmarks/quant_zoo.py --zoo-dir ZOO_DIR                  # every non-CNN model
    .venv/bin/python benchmarks/quant_zoo.py --zoo-dir ZOO_DIR --models bert,gpt2 --json out.json
    .venv/bin/python benchmarks/quant_zoo.py --zoo-dir ZOO_DIR --smoothquant auto -- --min-sqnr 30

``ZOO_DIR/<name>/`` holds a materialized model (``model.onnx``, ``inputs.npz``, ``calib.npz``);
``../shared/tools/zoo/zoo.py materialize NAMES DIR`` writes them. For each model,
``kiln compile model.onnx -o OUT --quantize int8 --calib calib.npz --inputs inputs.npz`` runs in a
subprocess (``--timeout`` seconds), and the table shows, from its exit code and ``manifest.json``:

* ``exit``: the compile's exit code (1: ``--strict`` missed the floor, or verification failed);
* ``sqnr_inputs``: the worst output's SQNR (dB) of the emitted int8 model on ``--inputs``, against
  onnxruntime running the float model (``verification.artifacts[].outputs[].sqnr_db``);
* ``sqnr_calib``: the worst output's SQNR on the evaluation (calibration) samples, as the floor saw it;
* ``fallback``: what the SQNR floor did: ``met`` (no layer sent back), ``N layers`` (sent back to
  float until the floor held), ``off`` (no floor);
* ``mm_int8``: MatMul/Gemm nodes of the emitted model whose weight (input 1) is dequantized int8,
  over every MatMul/Gemm node (attention's activation x activation products included);
* ``policy``: nodes the registry's policy kept float (op classes and structural patterns).

With ``--smoothquant MODE`` each model is compiled a second time with ``--smoothquant MODE`` and the
table adds that compile's ``sq_in`` (sqnr_inputs), ``gain`` (sq_in - sqnr_in, dB), ``sq_fallback``,
``sq_share``, ``smoothed`` (activation groups smoothed / groups foldable, from
``quantization.smoothquant``), ``v_path`` (groups folded through attention's value path, smoothed /
found) and ``worse`` (smoothed groups whose searched SQNR is below their unsmoothed one: 0 by
construction). Flags after ``--`` go to every compile (``--min-sqnr 30`` judges the >= 60% at >= 30 dB
target by the floor; ``--calib-method entropy`` scores the alpha search on entropy's ranges).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

__all__ = ["NON_CNN", "Row", "run_model", "matmul_share", "main"]

NON_CNN = (
    "albert",
    "bert",
    "clip_vision",
    "distilbert",
    "gpt2",
    "hf_vit",
    "llama",
    "mobilebert",
    "t5_encoder",
    "vit_tiny_patch16_224",
    "whisper_encoder",
    "crnn",
    "lstm_text",
    "maxvit_pico_rw_256",
    "mobilevit_xs",
    "convit_tiny",
    "swin_tiny_half",
)
FLOOR_DB = 25.0
SHARE = 0.6


@dataclass
class Row:
    """One model's result."""

    model: str
    exit: int
    seconds: float
    sqnr_inputs: float | None = None
    sqnr_calib: float | None = None
    fallback: str = ""
    mm_int8: int = 0
    mm_total: int = 0
    policy_float: int = 0
    detail: str = ""
    smoothed: str = ""
    value_path: str = ""
    worse_groups: int = 0
    smooth: Row | None = None

    @property
    def share(self) -> float:
        """Fraction of MatMul/Gemm nodes in int8."""
        return self.mm_int8 / self.mm_total if self.mm_total else 0.0


def matmul_share(model: Path) -> tuple[int, int]:
    """(MatMul/Gemm nodes whose input 1 comes from a DequantizeLinear, all MatMul/Gemm nodes)."""
    import onnx

    g = onnx.load(str(model), load_external_data=False).graph
    dq = {o for n in g.node if n.op_type == "DequantizeLinear" for o in n.output}
    mms = [n for n in g.node if n.op_type in ("MatMul", "Gemm", "MatMulInteger", "QLinearMatMul")]
    return sum(1 for n in mms if len(n.input) > 1 and n.input[1] in dq), len(mms)


def _worst_inputs(manifest: dict[str, Any]) -> float | None:
    arts = manifest.get("verification", {}).get("artifacts", [])
    vals = [o["sqnr_db"] for a in arts for o in a.get("outputs", []) if o.get("sqnr_db") is not None]
    return min(vals) if vals else None


def _fallback(q: dict[str, Any]) -> tuple[str, float | None]:
    floor = q.get("sqnr_floor") or {}
    mp = q.get("mixed_precision")
    worst = None
    if q.get("full_model"):
        worst = min(s["sqnr_db"] for s in q["full_model"].values())
    action = str(floor.get("action", ""))
    if action.startswith("fell back"):
        return f"{len(q.get('float_fallback', []))} layers", worst
    if action:
        return action, worst
    if mp is None:
        return "off", worst
    n = len(mp.get("float_layers", []))
    return ("met" if n == 0 else f"{n} layers"), worst


def run_model(zoo_dir: Path, name: str, out: Path, timeout: float, extra: Sequence[str] = ()) -> Row:
    """Compile one zoo model with --quantize int8 and read its manifest."""
    d = zoo_dir / name
    cmd = [sys.executable, "-m", "compiler.cli", "compile", str(d / "model.onnx"), "-o", str(out)]
    cmd += ["--quantize", "int8", "--calib", str(d / "calib.npz"), "--inputs", str(d / "inputs.npz")]
    cmd += list(extra)
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return Row(name, -1, time.perf_counter() - t0, detail=f"timeout after {timeout:g} s")
    row = Row(name, proc.returncode, time.perf_counter() - t0)
    err = [ln for ln in proc.stderr.splitlines() if ln.startswith("kiln:")]
    row.detail = err[-1][:160] if err else ""
    manifest_file = out / "manifest.json"
    if not manifest_file.is_file():
        return row
    manifest = json.loads(manifest_file.read_text())
    q = manifest.get("quantization", {})
    row.sqnr_inputs = _worst_inputs(manifest)
    row.fallback, row.sqnr_calib = _fallback(q)
    row.policy_float = sum(1 for why in q.get("float_nodes", {}).values() if "policy" in why)
    groups = q.get("smoothquant", {}).get("groups")
    if groups is not None:
        row.smoothed = f"{sum(1 for g in groups if g.get('alpha') is not None)}/{len(groups)}"
        vp = [g for g in groups if ">MatMul>" in g["fold"]]  # through a MatMul of two computed operands
        row.value_path = f"{sum(1 for g in vp if g.get('alpha') is not None)}/{len(vp)}"
        row.worse_groups = sum(
            1
            for g in groups
            if g.get("alpha") is not None and g["sqnr_db"][f"{g['alpha']:g}"] < g["sqnr_db"]["off"]
        )
    if (out / "model.onnx").is_file():
        row.mm_int8, row.mm_total = matmul_share(out / "model.onnx")
    return row


def _db(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}"


def _gain(r: Row) -> float | None:
    s = r.smooth
    if s is None or s.sqnr_inputs is None or r.sqnr_inputs is None:
        return None
    return s.sqnr_inputs - r.sqnr_inputs


def _smooth_cells(r: Row) -> str:
    s = r.smooth
    if s is None:
        return ""
    gain = _gain(r)
    return (
        f"{_db(s.sqnr_inputs):>7}{'-' if gain is None else f'{gain:+.2f}':>7}  {s.fallback:<12}"
        f"{s.share:>9.0%}{s.smoothed:>9}{s.value_path:>7}{s.worse_groups:>6}"
    )


def _good(r: Row) -> bool:
    return r.share >= SHARE and (r.sqnr_inputs or 0.0) >= 30.0


def _print(rows: Sequence[Row]) -> None:
    head = f"{'model':<22}{'exit':>5}{'sec':>7}{'sqnr_in':>9}{'sqnr_cal':>9}  {'fallback':<12}"
    smooth = any(r.smooth is not None for r in rows)
    sq_head = f"{'sq_in':>7}{'gain':>7}  {'sq_fallback':<12}{'sq_share':>9}{'smoothed':>9}"
    sq_head = f"{sq_head}{'v_path':>7}{'worse':>6}  " if smooth else ""
    print(head + f"{'mm_int8':>10}{'share':>7}{'policy':>8}  {sq_head}detail")
    print("-" * (len(head) + 35 + len(sq_head)))
    for r in rows:
        sq = f"{_smooth_cells(r)}  " if smooth else ""
        print(
            f"{r.model:<22}{r.exit:>5}{r.seconds:>7.1f}{_db(r.sqnr_inputs):>9}{_db(r.sqnr_calib):>9}  "
            f"{r.fallback:<12}{f'{r.mm_int8}/{r.mm_total}':>10}{r.share:>7.0%}{r.policy_float:>8}  "
            f"{sq}{r.detail or (r.smooth.detail if r.smooth else '')}"
        )
    ok = [r for r in rows if r.exit != 0 or (r.sqnr_inputs is not None and r.sqnr_inputs >= FLOOR_DB)]
    good = [r for r in rows if _good(r)]
    print(f"\nno exit 0 below {FLOOR_DB:g} dB on --inputs: {len(ok)}/{len(rows)}")
    print(f">= {SHARE:.0%} MatMul/Gemm int8 at >= 30 dB: {len(good)}/{len(rows)}")
    if smooth:
        sq_good = [r for r in rows if r.smooth is not None and _good(r.smooth)]
        print(f"  with SmoothQuant: {len(sq_good)}/{len(rows)}")
        gains = [g for r in rows if (g := _gain(r)) is not None]
        if gains:
            lower = [g for g in gains if g < 0]
            print(
                f"SmoothQuant gain on --inputs (dB): median {sorted(gains)[len(gains) // 2]:+.2f}, "
                f"best {max(gains):+.2f}, lower on {len(lower)}/{len(gains)} models"
                + (f" (worst {min(lower):+.2f})" if lower else "")
            )
            worse = sum(r.smooth.worse_groups for r in rows if r.smooth is not None)
            print(f"smoothed groups measured worse than unsmoothed by the search: {worse}")


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark; exit 1 if a model exits 0 below the floor."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--zoo-dir", type=Path, required=True)
    p.add_argument("--models", default=",".join(NON_CNN))
    p.add_argument("--timeout", type=float, default=900.0)
    p.add_argument("--json", type=Path)
    p.add_argument("--smoothquant", metavar="MODE", help="also compile each model with --smoothquant MODE")
    p.add_argument("extra", nargs="*", help="extra kiln compile flags (after --)")
    args = p.parse_args(argv)
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="kiln-quant-zoo-") as tmp:
        for name in [m for m in args.models.split(",") if m]:
            row = run_model(args.zoo_dir, name, Path(tmp) / name, args.timeout, args.extra)
            print(f"{name}: exit {row.exit}, {row.seconds:.1f} s", file=sys.stderr, flush=True)
            if args.smoothquant:
                extra = [*args.extra, "--smoothquant", args.smoothquant]
                row.smooth = run_model(args.zoo_dir, name, Path(tmp) / f"{name}-sq", args.timeout, extra)
                print(f"{name} --smoothquant: exit {row.smooth.exit}", file=sys.stderr, flush=True)
            rows.append(row)
    _print(rows)
    if args.json is not None:
        args.json.write_text(json.dumps([asdict(r) for r in rows], indent=2) + "\n")
    every = [*rows, *(r.smooth for r in rows if r.smooth is not None)]
    silent = [r for r in every if r.exit == 0 and (r.sqnr_inputs is None or r.sqnr_inputs < FLOOR_DB)]
    return 1 if silent else 0


if __name__ == "__main__":
    sys.exit(main())
