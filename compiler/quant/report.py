"""The quantization report: ``report.md`` (tables) and ``sensitivity.png`` (a bar chart).

report.md lists the settings (calibration method and sample count, evaluation samples,
bias correction, the pattern-level policy, the SQNR floor), the per-output SQNR and cosine of
the all-int8 model and of the emitted one, the layers sent back to float, and one row per planned
layer with its single-layer scores (see :mod:`compiler.quant.sensitivity` for the math). The
chart draws each layer's single-layer SQNR of its worst output (the quantity ``--min-sqnr`` bounds),
layers sent back to float in orange, and the threshold as a red vertical line.
Numbers are printed with fixed precision, so both files are byte-identical across runs.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING

from compiler.quant.chart import Bar, bar_chart, encode_png

if TYPE_CHECKING:
    from compiler.quant.options import QuantOptions
    from compiler.quant.quantize import QuantOutcome

__all__ = ["write_report", "REPORT_FILE", "CHART_FILE", "report_text", "chart_png"]

REPORT_FILE = "report.md"
CHART_FILE = "sensitivity.png"


def _db(v: float) -> str:
    if v >= 999.0:
        return "exact"
    if v <= -999.0:
        return "-inf"
    return f"{v:.2f}"


def _cos(v: float) -> str:
    return f"{v:.6f}" if math.isfinite(v) else "nan"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def report_text(outcome: QuantOutcome, q: QuantOptions, model_name: str) -> str:
    """The Markdown report."""
    sens = outcome.sensitivity
    assert sens is not None
    fb = outcome.fallback
    float_set = set(fb.float_nodes) if fb is not None else set()
    lines = [f"# Quantization report: {_cell(model_name)}", ""]
    calib = q.calib.name if q.calib else "none"
    weights = "per channel" if q.per_channel else "per tensor"
    lines += [
        f"- calibration: {q.calib_method}, {len(outcome.samples)} sample(s) from `{calib}`",
        f"- calibration peak memory: {outcome.calibration.get('peak_memory_mib', 0)} MiB (tracemalloc)",
        *_entropy_summary(outcome),
        f"- evaluation: the first {sens.samples} calibration sample(s), against the float graph",
        f"- activations {q.activation_dtype}, int8 weights {weights}",
        f"- bias correction: {_bias_line(outcome) if q.bias_correction else 'off'}",
        f"- planned layers: {len(sens.layers)}; in int8: {len(sens.layers) - len(float_set)}",
        f"- policy: {_policy_line(outcome)}",
        *_smooth_lines(outcome),
        "",
        "SQNR = 10 log10(sum y^2 / sum (y_q - y)^2) over the evaluation samples (dB); cosine of y_q and y.",
        "",
        "## Model outputs",
        "",
        "| output | SQNR all-int8 (dB) | cosine all-int8 | SQNR emitted (dB) | cosine emitted |",
        "|---|---:|---:|---:|---:|",
    ]
    final = outcome.final_scores
    for name, s in sens.full_model.items():
        f = final.get(name, s)
        lines.append(
            f"| {_cell(name)} | {_db(s.sqnr_db)} | {_cos(s.cosine)} | {_db(f.sqnr_db)} | {_cos(f.cosine)} |"
        )
    lines += ["", "## SQNR floor and mixed precision", ""]
    floor = outcome.floor
    where = "the evaluation samples" + (" and `--inputs`" if fb is not None and fb.holdout_before else "")
    kind = "default floor" if floor.get("default") else "floor"
    if fb is None:
        lines.append("SQNR floor off (`--min-sqnr off`): every planned layer is int8.")
    elif not fb.float_layers:
        lines.append(
            f"{kind.capitalize()} {fb.target_db:g} dB on the worst output, on {where}: met at full int8 "
            f"({_db(fb.worst_db)} dB); no layer sent back to float."
        )
    else:
        lines.append(
            f"{kind.capitalize()} {fb.target_db:g} dB on the worst output, on {where}: missed at full "
            f"int8 ({_db(fb.worst_before_db)} dB); {len(fb.float_layers)} layer(s) sent back "
            "to float (most sensitive first; with --inputs, most noise removed per int8 op first); "
            f"worst output now {_db(fb.worst_db)} dB "
            f"({fb.evaluations} model evaluations)."
        )
        lines += ["", "Float fallbacks:", ""]
        lines += [f"{i}. `{_cell(name)}`" for i, name in enumerate(fb.float_layers, 1)]
    lines += _form_lines(outcome)
    lines += _entropy_lines(outcome)
    lines += [
        "",
        "## Layers",
        "",
        "Each layer quantized alone (inputs, weights, bias and outputs), every other layer float.",
        "",
        "| # | layer | op | SQNR (dB) | worst output (dB) | cosine | precision |",
        "|---:|---|---|---:|---:|---:|---|",
    ]
    for i, lay in enumerate(sens.layers, 1):
        prec = "float" if lay.node in float_set else "int8"
        lines.append(
            f"| {i} | {_cell(lay.name)} | {_cell(lay.op)} | {_db(lay.overall.sqnr_db)} | "
            f"{_db(lay.worst_sqnr)} | {_cos(lay.overall.cosine)} | {prec} |"
        )
    lines += ["", f"Chart: `{CHART_FILE}` (bars: worst-output SQNR; orange: sent back to float).", ""]
    return "\n".join(lines)


def _entropy_summary(outcome: QuantOutcome) -> list[str]:
    check = outcome.calibration.get("entropy_check")
    if not check:
        return []
    return [
        f"- entropy clips checked on {check['evaluation_samples']} calibration sample(s): "
        f"{check['clipped_kept']} kept ({check['clipped_without_effect']} without effect), "
        f"{check['full_range']} back to the full range"
    ]


def _entropy_lines(outcome: QuantOutcome) -> list[str]:
    """The activations whose KL-clipped range went back to the full range, and why."""
    check = outcome.calibration.get("entropy_check")
    if not check or not check["full_range_why"]:
        return []
    lines = ["", "## Entropy ranges kept at full range", ""]
    lines += ["A KL clip stays only where no output's error on the calibration samples grows.", ""]
    lines += ["| activation | why |", "|---|---|"]
    lines += [f"| `{_cell(n)}` | {_cell(why)} |" for n, why in check["full_range_why"].items()]
    return lines


def _policy_line(outcome: QuantOutcome) -> str:
    by_rule = outcome.plan.by_rule
    if not by_rule:
        return "no pattern-level rule matched"
    counts: dict[str, int] = {}
    for name in by_rule.values():
        counts[name] = counts.get(name, 0) + 1
    listed = ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
    return f"kept float by rule: {listed}; admitted to int8 by measurement: {len(outcome.admitted)}"


def _smooth_lines(outcome: QuantOutcome) -> list[str]:
    sq = outcome.smoothquant
    if not sq:
        return []
    groups = sq.get("groups", [])
    moved = sum(1 for g in groups if g.get("alpha") is not None)
    return [
        f"- SmoothQuant ({sq.get('alpha')}): {moved} of {len(groups)} foldable group(s) smoothed, "
        f"{len(sq.get('not_smoothed', {}))} layer(s) not foldable"
    ]


def _form_lines(outcome: QuantOutcome) -> list[str]:
    if not outcome.forms:
        return []
    lines = [
        "",
        "## Int8 forms",
        "",
        "| layer | op | form | measured worst-output SQNR (dB) |",
        "|---|---|---|---|",
    ]
    for c in outcome.forms:
        measured = ", ".join(f"{k} {_db(v)}" for k, v in c.sqnr_db.items()) or "not measured"
        lines.append(f"| {_cell(c.name)} | {_cell(c.op)} | {c.form} | {measured} |")
    return lines


def _bias_line(outcome: QuantOutcome) -> str:
    s = outcome.bias_summary
    return f"on, {s.get('layers', 0)} layer(s) corrected, largest shift {s.get('max_abs_shift', 0.0)}"


def chart_png(outcome: QuantOutcome, q: QuantOptions) -> bytes:
    """The sensitivity bar chart as PNG bytes."""
    sens = outcome.sensitivity
    assert sens is not None
    float_set = set(outcome.fallback.float_nodes) if outcome.fallback is not None else set()
    bars = [Bar(lay.name, round(lay.worst_sqnr, 4), lay.node in float_set) for lay in sens.layers]
    return encode_png(bar_chart(bars, threshold=q.floor_db))


def write_report(out_dir: Path, outcome: QuantOutcome, q: QuantOptions, model_name: str) -> list[str]:
    """Write report.md and sensitivity.png into ``out_dir``; their names ([] without the analysis)."""
    if outcome.sensitivity is None:
        return []
    (out_dir / REPORT_FILE).write_text(report_text(outcome, q, model_name))
    (out_dir / CHART_FILE).write_bytes(chart_png(outcome, q))
    return [REPORT_FILE, CHART_FILE]
