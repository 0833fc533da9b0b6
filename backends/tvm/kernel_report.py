"""Which kernel ran: per op class, the schedules a TVM artifact uses and their instruction paths.

Every compiled PrimFunc carries what chose it: Kiln's kernels set ``kiln.scheduled`` (the
rule), ``kiln.op_class`` and ``kiln.isa`` where they are built (:func:`backends.tvm.kernels.
kernel.mark_scheduled`), and the generic schedule sets them on the functions it schedules,
classifying each from its blocks (:func:`classify_generic`). :func:`kernel_entry` reads one
function's record and :func:`kernel_report` folds the records into the manifest's and
``model.json``'s ``kernel_report``::

    {"conv": {"isa": ["avx512"], "kernels": 12, "schedules": {"conv2d_nchwc": 12}},
     "matmul": {"isa": ["generic"], "kernels": 3, "schedules": {"generic:matmul": 3}}, ...}

Op classes: conv, depthwise_conv, grouped_conv, conv_transpose, dense (Kiln's packed kernel),
matmul (a shared 2-D weight), batched_matmul, pooling, softmax, attention (Kiln's fused kernel),
normalization (LayerNorm / RMSNorm rows), reduction, resize, elementwise, scatter (Kiln's
ScatterElements kernel).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["kernel_entry", "kernel_report", "classify_generic", "GENERIC_NAME_CLASSES", "OP_CLASSES"]

OP_CLASSES = (
    "conv",
    "depthwise_conv",
    "grouped_conv",
    "conv_transpose",
    "dense",
    "matmul",
    "batched_matmul",
    "pooling",
    "softmax",
    "attention",
    "normalization",
    "reduction",
    "resize",
    "elementwise",
    "recurrent",
    "scatter",
)

# (pattern on the function's and its blocks' names, op class), first match wins; the names are
# those of Relax's legalization (topi) and of Kiln's own TE stages.
GENERIC_NAME_CLASSES: tuple[tuple[str, str], ...] = (
    (r"conv2d_transpose", "conv_transpose"),
    (r"group_conv2d", "grouped_conv"),  # depthwise when the weight has one input channel a group
    (r"conv2d", "conv"),
    (r"pool", "pooling"),
    (r"softmax", "softmax"),
    (r"resize", "resize"),
)


def _group_class(block: Any) -> str:
    """``grouped_conv`` or ``depthwise_conv`` for a topi group conv block (weight [OC, IC/g, kh, kw])."""
    if len(block.reads) >= 2:
        shape = [int(d) for d in block.reads[1].source.shape]
        if len(shape) == 4 and shape[1] == 1:
            return "depthwise_conv"
    return "grouped_conv"


def _batched(block: Any, batch_vars: list[Any]) -> bool:
    """True when both operands of a matmul block vary along one batch iter var (of extent > 1)."""

    def uses(region: Any, var: Any) -> bool:
        return any(var.same_as(r.min) for r in region.region)

    reads = list(block.reads)[-2:]
    return len(reads) == 2 and any(all(uses(r, v) for r in reads) for v in batch_vars)


def classify_generic(func_name: str, blocks: Mapping[str, Any], rules: Mapping[str, str]) -> str:
    """The op class of a generic-scheduled function from its name, blocks and applied rules.

    ``blocks`` maps block names to the (unscheduled) ``SBlock``; ``rules`` the names of the blocks
    a rule scheduled to that rule ("matmul", "reduction", "spatial"...).
    """
    for pattern, cls in GENERIC_NAME_CLASSES:
        for name, block in blocks.items():
            if re.search(pattern, name):
                return _group_class(block) if cls == "grouped_conv" else cls
        if re.search(pattern, func_name):
            return cls
    for name, rule in rules.items():
        if rule == "matmul":
            block = blocks[name]
            spatial = [iv for iv in block.iter_vars if int(iv.iter_type) == 0]
            batch = [iv.var for iv in spatial[:-2] if int(iv.dom.extent) > 1]
            return "batched_matmul" if _batched(block, batch) else "matmul"
    if any(int(iv.iter_type) != 0 for b in blocks.values() for iv in b.iter_vars):
        return "reduction"
    return "elementwise"


def kernel_entry(name: str, func: Any) -> dict[str, str]:
    """The record of one compiled PrimFunc: kernel, rule, op_class, isa."""
    attrs = func.attrs or {}
    rule = str(attrs.get("kiln.scheduled", "unscheduled"))
    generic_rule = attrs.get("kiln.generic_rule")
    if generic_rule is not None:
        rule = f"{rule}:{generic_rule}"
    return {
        "kernel": name,
        "rule": rule,
        "op_class": str(attrs.get("kiln.op_class", "other")),
        "isa": str(attrs.get("kiln.isa", "generic")),
    }


def kernel_report(entries: Iterable[Mapping[str, str]]) -> dict[str, dict[str, Any]]:
    """Per op class (sorted): the ISA paths used, the number of kernels and the count per rule."""
    out: dict[str, dict[str, Any]] = {}
    for e in entries:
        row = out.setdefault(e["op_class"], {"isa": set(), "kernels": 0, "schedules": {}})
        row["isa"].add(e["isa"])
        row["kernels"] += 1
        row["schedules"][e["rule"]] = row["schedules"].get(e["rule"], 0) + 1
    return {
        cls: {
            "isa": sorted(r["isa"]),
            "kernels": r["kernels"],
            "schedules": dict(sorted(r["schedules"].items())),
        }
        for cls, r in sorted(out.items())
    }
