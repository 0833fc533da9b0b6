"""4-bit weight-only levels in TVM libraries: two levels a byte, unpacked inside the fused kernel.

* :func:`pack_nibbles`: P[j, n] = (Q[2j, n] & 15) | (Q[2j + 1, n] & 15) << 4 (two's complement,
  low nibble first), an odd row count padded with 0; the kernel's shift/mask decode gives Q back;
  a value outside [-8, 7] is refused (must-not-pack).
* A MatMul model from the ONNX text parser (constant W [512, 128], 3-D A) compiled with ``--quantize int4w
  --weight-asymmetric --emit onnx --target cpu``: the library equals onnxruntime running Kiln's own
  MatMulNBits export within 1e-5 · max(1, max|e|) (measured: bit-exact); its constants are exactly the
  packed levels (K·N/2 bytes), the packed zero points (N·n_blocks/2) and the float32 scales, and
  no byte-per-level table.
* K = 99 (odd), one row (nibbles decoded inside the reduction) and five rows (a decoded column
  panel shared by all row tiles): both equal the op's reference within 1e-5 · max(1, max|e|).
* ``--target arm``: the same op builds to an aarch64 library whose weight-only kernel uses NEON
  fp32 vector ops.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest

from backends.tvm.build import compile_module, export
from backends.tvm.emit import prepare_graph
from backends.tvm.lower import lower_graph
from backends.tvm.lowering.weight_only import pack_nibbles
from backends.tvm.target import resolve_target
from compiler.api import load_model
from compiler.cli import main
from compiler.ir.interpreter import run_graph
from compiler.runners import run_artifact, run_onnxruntime
from tests.helpers.numerics import assert_close
from tests.helpers.onnx_text import rand, text_model
from tests.helpers.weight_only_graphs import weight_only_graph

TOL = 1e-5
K, N, BLOCK = 512, 128, 32


def test_pack_nibbles_layout_and_range() -> None:
    q = np.array([[-8, 7], [0, -1], [3, -5]], np.int8)  # 3 rows: the last pair is padded
    p = pack_nibbles(q)
    assert p.dtype == np.int8 and p.shape == (2, 2)
    # two's complement nibbles, low first: -8 -> 0x8, 0 -> 0x0, 7 -> 0x7, -1 -> 0xF, 3 -> 0x3, -5 -> 0xB
    assert p.view(np.uint8).tolist() == [[0x08, 0xF7], [0x03, 0x0B]]
    v = p.astype(np.int32)  # the kernel's decode: (v << 28) >> 28 and (v & -16) / 16
    lo, hi = (v << 28) >> 28, (v & -16) // 16
    np.testing.assert_array_equal(np.stack([lo, hi], axis=1).reshape(4, 2)[:3], q)
    with pytest.raises(ValueError, match=r"must lie in \[-8, 7\]"):
        pack_nibbles(np.array([[8]], np.int16))


def _library_consts(model: Path) -> list[Any]:
    import tvm
    from tvm import relax

    target = resolve_target("cpu")
    legal, _ = prepare_graph(load_model(model), target)  # MatMulNBits lifts to kiln::WeightOnlyMatMul
    assert {n.qualified_op for n in legal.ops()} == {"kiln::WeightOnlyMatMul"}
    seen: list[Any] = []
    for func in lower_graph(legal, target).mod.functions.values():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func.body, lambda e: seen.append(getattr(e, "value", None)))
    return [c for c in seen if isinstance(c, tvm.runtime.Tensor)]


def test_int4w_library_is_packed_and_matches_matmulnbits(tmp_path: Path) -> None:
    src = tmp_path / "m.onnx"
    onnx.save(
        text_model(f"g (float[2,3,{K}] x) => (float[2,3,{N}] y) {{ y = MatMul(x, W) }}", W=rand(K, N)), src
    )
    out = tmp_path / "out"
    flags = ["--weight-block-size", str(BLOCK), "--weight-scale-type", "fp32", "--weight-asymmetric"]
    args = [
        "compile",
        str(src),
        "-o",
        str(out),
        "--quantize",
        "int4w",
        *flags,
        "--emit",
        "onnx",
        "--target",
        "cpu",
    ]
    assert main(args) == 0
    feeds = {"x": rand(2, 3, K, seed=5)}
    want = run_onnxruntime(out / "model.onnx", feeds)["y"]  # com.microsoft MatMulNBits
    got = run_artifact(out / "cpu" / "model.so", feeds)["y"]
    assert_close(got, want, rtol=0.0, atol=TOL * max(1.0, float(np.abs(want).max())), what="y")
    consts = _library_consts(out / "model.onnx")
    nb = K // BLOCK
    tables = sorted((c.dtype, tuple(c.shape)) for c in consts if c.dtype in ("int8", "uint8"))
    assert tables == [("int8", (nb // 2, N)), ("int8", (K // 2, N))]  # packed zero points, levels
    nbytes = sum(int(np.prod(c.shape)) * np.dtype(c.dtype).itemsize for c in consts)
    assert nbytes == K * N // 2 + N * nb // 2 + 4 * N * nb  # levels + zero points + float32 scales


def test_arm_library_unpacks_with_neon(tmp_path: Path) -> None:
    target = resolve_target("arm")
    g, _ = weight_only_graph([((4, 256), 64, 4, 32, "fp16", False, True)], seed=2)
    legal, _ = prepare_graph(g, target)
    lowered = lower_graph(legal, target)
    assert [e["rule"] for e in lowered.kernels if e["kernel"].startswith("kiln_weight_only")] == [
        "weight-only-matmul"
    ]
    so = tmp_path / "model.so"
    export(compile_module(lowered.mod, target), so, target)
    dis = subprocess.run(
        ["aarch64-linux-gnu-objdump", "-d", str(so)], check=True, capture_output=True, text=True
    )
    assert "file format elf64-littleaarch64" in dis.stdout
    body = re.search(r"<kiln_weight_only_matmul\w*_compute_>:\n(.*?)\n\n", dis.stdout, flags=re.S)
    assert body is not None
    asm = body.group(1)
    assert len(re.findall(r"\tfmla\s+v\d+\.4s", asm)) >= 4  # the register tile's vector FMAs
    unpack = r"\t(shl|sshr|and|sshll|sxtl|ushll|uxtl)\s+v\d+\."  # nibble unpacking, in vector registers
    assert re.search(unpack, asm)


def test_odd_k_and_both_decode_paths_match_the_reference() -> None:
    """K = 99 (an odd count of levels: the last byte's high nibble is padding): one row decodes
    inside the reduction, five rows through the column panel; both equal the op's reference."""
    import tvm
    from tvm import relax

    g, feeds = weight_only_graph(
        [((1, 99), 16, 4, 32, "fp32", False, False), ((5, 99), 16, 4, 32, "fp16", True, True)], seed=4
    )
    ref = run_graph(g, feeds)
    target = resolve_target("cpu")
    legal, _ = prepare_graph(g, target)
    lowered = lower_graph(legal, target)
    rules = [e["rule"] for e in lowered.kernels if e["kernel"].startswith("kiln_weight_only")]
    assert rules == ["weight-only-matmul"] * 2
    vm = relax.VirtualMachine(compile_module(lowered.mod, target), tvm.cpu())
    res = vm["main"](*[tvm.runtime.tensor(feeds[f"a{i}"], tvm.cpu()) for i in range(2)])
    for i, name in enumerate(g.output_names):
        e = ref[name]
        assert_close(res[i].numpy(), e, rtol=0.0, atol=TOL * max(1.0, float(np.abs(e).max())), what=name)
