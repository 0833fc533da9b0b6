"""Elementwise TIR intrinsics that TVM 0.27's loop vectorizer should widen but does not.

The vectorizer widens a call only when its op carries ``TVectorizable``; 0.27 leaves
``tirx.nearbyint`` (every requantize, ``q = nearbyint(x / s) + z``) unmarked, so a vectorized loop
around it is scalarized whole (one lane at a time). Worse, an unwidened call whose argument holds
another one (requantize -> fast erf -> requantize) comes back rebuilt but scalar; ``a * b`` with
both operands scalar then visits them a second time (0.27's ``Mul`` falls through to
``BinaryVec``), and a ``Let`` inside (the fast-math forms bind every reused value) fails the
vectorizer's check "Let cannot bind the same var to two different values". LLVM lowers these ops
lane-wise (``llvm.nearbyint.v16f32`` is one ``vrndscaleps``), so marking them lets the loop
vectorize and never takes that path.
"""

from __future__ import annotations

__all__ = ["LANEWISE_INTRINSICS", "mark_vectorizable"]

LANEWISE_INTRINSICS: tuple[str, ...] = ("tirx.nearbyint",)


def mark_vectorizable() -> None:
    """Set ``TVectorizable`` on every op of :data:`LANEWISE_INTRINSICS` that lacks it (idempotent;
    the attribute is process-wide, like TVM's own registrations)."""
    import tvm

    for name in LANEWISE_INTRINSICS:
        if tvm.ir.Op.get(name).get_attr("TVectorizable") is None:
            tvm.ir.register_op_attr(name, "TVectorizable", True)
