"""Loop-nest analysis shared by Kiln's generic CPU schedule rules (:mod:`backends.tvm.schedule_generic`,
:mod:`backends.tvm.schedule_matmul`): which loop binds which iter var, contiguity of an axis in a
block's accesses, matmul-like indexing.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "Nest",
    "condition_vars",
    "as_int",
    "vec_width",
    "contiguous_in",
    "is_plain_indexed",
    "TVM_ERRORS",
    "PARALLEL_MIN_WORK",
    "STACK_BYTES",
    "fits_stack",
]

PARALLEL_MIN_WORK = 16384  # loop iterations below which a block stays serial
# TVM puts a CPU buffer on the stack only when its scope is global and it is smaller than this; any
# other (a "local" one, or one this big) comes from the workspace pool: a call pair per tile
STACK_BYTES = 1024
TVM_ERRORS = (RuntimeError, ValueError, TypeError, IndexError, AttributeError, AssertionError, KeyError)


def as_int(x: Any) -> int | None:
    """``x`` as a Python int when it is a constant, else None."""
    from tvm import tirx

    if isinstance(x, int):
        return x
    if isinstance(x, tirx.IntImm):
        return int(x.value)
    return None


def fits_stack(elements: int, dtype_bytes: int = 4) -> bool:
    """True when a global tile buffer of ``elements`` is a stack array (``< STACK_BYTES``), which
    LLVM keeps in registers when the tile loops are unrolled."""
    return elements * dtype_bytes < STACK_BYTES


def vec_width(extent: int | None, lanes: int) -> int | None:
    """The largest of ``lanes``, ``lanes/2`` (at least 4) that divides ``extent``."""
    if extent is None:
        return None
    for w in (lanes, lanes // 2):
        if w >= 4 and extent % w == 0:
            return w
    return None


class Nest:
    """The loops directly binding one block's iter vars, outermost first."""

    def __init__(self, sch: Any, block: Any) -> None:
        from tvm import s_tir, tirx

        self.block = sch.get(block)
        self.loops = list(sch.get_loops(block))
        self.extents = [as_int(sch.get(lp).extent) for lp in self.loops]
        self.kinds: list[str | None] = [None] * len(self.loops)
        self.iter_vars: list[Any] = [None] * len(self.loops)
        loop_vars = [sch.get(lp).loop_var for lp in self.loops]
        realize: Any = sch.get(self.loops[-1]).body if self.loops else None
        if not isinstance(realize, s_tir.SBlockRealize):
            return
        for iv, value in zip(self.block.iter_vars, realize.iter_values, strict=True):
            if not isinstance(value, tirx.Var):
                continue
            for i, lv in enumerate(loop_vars):
                if lv.same_as(value):
                    self.kinds[i] = "S" if int(iv.iter_type) == 0 else "R" if int(iv.iter_type) == 2 else None
                    self.iter_vars[i] = iv.var

    @property
    def simple(self) -> bool:
        """Every loop binds exactly one spatial or reduction iter var and has a constant extent."""
        return bool(self.loops) and all(k is not None for k in self.kinds) and None not in self.extents

    @property
    def work(self) -> int:
        """Product of the loop extents (0 when any is symbolic)."""
        w = 1
        for e in self.extents:
            if e is None:
                return 0
            w *= e
        return w


def contiguous_in(block: Any, var: Any, writes: bool = True) -> bool:
    """True when ``var`` indexes only the last axis of the write, with stride 1, and of every
    read either the same way or not at all (so a vector along ``var`` is contiguous or a broadcast).
    ``writes=False`` checks the reads only (a reduction variable does not index the write)."""
    from tvm import sym

    ana = sym.Analyzer()
    for iv in block.iter_vars:  # bounds simplify inlined pack/unpack pairs: (c*16 + b) // 16 -> c
        ana.bind(iv.var, iv.dom)

    def coefs(region: Any) -> list[int | None]:
        out: list[int | None] = []
        for rng in region.region:
            eq = sym.detect_linear_equation(ana.simplify(rng.min), [var])
            out.append(as_int(eq[0]) if len(eq) == 2 else None)
        return out

    def ok(region: Any, allow_broadcast: bool) -> bool:
        c = coefs(region)
        if not c:
            return allow_broadcast
        if any(x != 0 for x in c[:-1]):
            return False
        return c[-1] == 1 or (allow_broadcast and c[-1] == 0)

    return all(ok(w, False) for w in (block.writes if writes else [])) and all(
        ok(r, True) for r in block.reads
    )


def is_plain_indexed(block: Any) -> bool:
    """True when every read/write index is a bare iter var or a constant (matmul-like access)."""
    from tvm import tirx

    for reg in list(block.reads) + list(block.writes):
        for rng in reg.region:
            if as_int(rng.extent) != 1:
                return False
            if not isinstance(rng.min, tirx.Var | tirx.IntImm):
                return False
    return True


_CHILDREN = ("a", "b", "value", "condition", "true_value", "false_value", "base", "stride")


def condition_vars(block: Any) -> list[Any]:
    """The variables the ``if_then_else`` conditions of ``block``'s stored value depend on
    (concat, pad and similar selections), in no particular order."""
    import tvm
    from tvm import tirx

    found: list[Any] = []

    def walk(e: Any) -> None:
        if isinstance(e, tvm.ir.Call):
            if str(getattr(e.op, "name", "")).endswith("if_then_else"):
                found.extend(tirx.analysis.undefined_vars(e.args[0]))
            for arg in e.args:
                walk(arg)
            return
        indices = getattr(e, "indices", None)  # a buffer load (tvm.ir.TensorLoad in 0.27)
        if indices is not None:
            for i in indices:
                walk(i)
            return
        for attr in _CHILDREN:
            child = getattr(e, attr, None)
            if isinstance(child, tirx.Expr):
                walk(child)

    body = block.body
    if isinstance(body, tirx.BufferStore):
        walk(body.value)
    return found
