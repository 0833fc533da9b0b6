"""The .om container and reader: layout, GE's loader checks, and files written by other tools.

Structure: header fields and the partition table Kiln writes, 512-byte weight alignment.
Negative cases: each GE check gives one ModelFileError naming the file and the fault.
Foreign files: the research samples in ../shared/reference/cann (ge with a weights partition,
inline weights with a legacy 32-bit table or a one-entry 64-bit table, the int8 sample without
Kiln's exact-scale attributes, and two seed-schema domi files) read and compute what their
format says, checked against numpy.
"""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest

from compiler.api import load_model
from compiler.errors import ModelFileError
from compiler.onnx_export import export_onnx, model_bytes
from compiler.runners import run_onnxruntime
from frontends.registry import detect_format
from schemas.cann.codes import MODEL_DEF, WEIGHTS_DATA
from schemas.cann.om_container import HEAD_LEN, MAGIC, MODEL_VERSION, pack_om, read_om
from tests.conftest import SHARED
from tests.helpers.cann import compile_tiny, ge_consts, tiny_net

SAMPLES = SHARED / "reference" / "cann" / "samples"


def _fp32_ge(tmp_path: Path) -> bytes:
    return (compile_tiny(tiny_net(), tmp_path / "om", "fp32", "ge") / "model.om").read_bytes()


@pytest.fixture(scope="module")
def tiny_ge(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    return _fp32_ge(tmp_path_factory.mktemp("cann-container"))


def test_header_and_table_layout(tiny_ge: bytes) -> None:
    data = tiny_ge
    magic, headsize, version = struct.unpack_from("<III", data, 0)
    assert (magic, headsize, version) == (MAGIC, HEAD_LEN, MODEL_VERSION) and data[:4] == b"IMOD"
    assert struct.unpack_from("<I", data, 76)[0] == 0  # legacy length unused
    assert struct.unpack_from("<Q", data, 184)[0] == len(data) - HEAD_LEN
    assert struct.unpack_from("<II", data, 152) == (2, 1)  # om_ir_version, model_num
    assert data[12:76] == b"\0" * 64  # checksum of an unsigned model
    (num,) = struct.unpack_from("<I", data, 256)
    entries = [struct.unpack_from("<I4xQQ", data, 264 + 24 * i) for i in range(num)]
    assert [e[0] for e in entries] == [MODEL_DEF, WEIGHTS_DATA]
    assert entries[0][1] == 0 and entries[1][1] == entries[0][2]  # cumulative offsets
    assert HEAD_LEN + 8 + 24 * num + entries[1][1] + entries[1][2] == len(data)


def test_weights_are_512_aligned(tmp_path: Path, tiny_ge: bytes) -> None:
    path = tmp_path / "m.om"
    path.write_bytes(tiny_ge)
    blob = read_om(tiny_ge, "m.om").partitions[WEIGHTS_DATA]
    assert len(blob) % 512 == 0 and blob[:512] == b"\0" * 512
    model, shas = ge_consts(path)
    consts = [op for op in model.graph[0].op if op.type == "Const"]
    assert consts and len(shas) == len(consts)
    for op in consts:
        d = op.attr["value"].t.desc
        assert d.data_offset >= 512 and d.data_offset % 512 == 0 and op.attr["value"].t.data == b""


def _patched(data: bytes, fmt: str, offset: int, value: int) -> bytes:
    buf = bytearray(data)
    struct.pack_into(fmt, buf, offset, value)
    return bytes(buf)


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda d: d[:200], "shorter than the 256-byte header"),
        (lambda d: d[:-1], "!= file size - 256"),
        (lambda d: d + b"\0", "!= file size - 256"),
        (lambda d: _patched(d, "<I", 0, 0x12345678), "bad magic"),
        (lambda d: _patched(d, "<I", 4, 128), "header size 128"),
        (lambda d: _patched(d, "<I", 8, 0x30000000), "unsupported header version"),
        (lambda d: _patched(d, "<B", 80, 1), "encrypted"),
        (lambda d: _patched(d, "<I", 156, 2), "model_num 2"),
        (lambda d: _patched(d, "<I", 256, 0), "0 partitions"),
        (lambda d: _patched(d, "<I", 256, 9), "9 partitions"),
        (lambda d: _patched(d, "<I", 264, 1), "appears twice"),
        (lambda d: _patched(d, "<I", 264, 99), "unknown type 99"),
        (lambda d: _patched(d, "<Q", 296, 0), "back to back"),
        (lambda d: _patched(d, "<Q", 304, 10**9), "runs past the end"),
        (lambda d: _patched(d, "<I", 264, 3), "no MODEL_DEF partition"),
    ],
)
def test_ge_loader_checks(tiny_ge: bytes, edit: object, message: str) -> None:
    assert callable(edit)
    with pytest.raises(ModelFileError, match=message) as err:
        read_om(edit(tiny_ge), "broken.om")
    assert str(err.value).startswith("broken.om: not a valid .om file: ")


def test_trailing_bytes_and_weights_outside_the_blob(tiny_ge: bytes) -> None:
    (num,) = struct.unpack_from("<I", tiny_ge, 256)
    _, _, md_size = struct.unpack_from("<I4xQQ", tiny_ge, 264)
    table_end = 256 + 8 + 24 * num
    model_def = tiny_ge[table_end : table_end + md_size]
    with pytest.raises(ModelFileError, match="weights at offset"):
        load_bytes(pack_om([(MODEL_DEF, model_def), (WEIGHTS_DATA, b"\0" * 512)], "short"))
    with pytest.raises(ModelFileError, match="no such partition"):
        load_bytes(pack_om([(MODEL_DEF, model_def)], "noweights"))
    with pytest.raises(ModelFileError, match="neither a ge.proto.ModelDef"):
        load_bytes(pack_om([(MODEL_DEF, b"\xff" * 40), (WEIGHTS_DATA, b"\0" * 512)], "garbage"))


def load_bytes(data: bytes) -> object:
    from frontends.cann.lift import lift_graph
    from frontends.cann.loader import read_om_graph

    _, om = read_om_graph(data, "mem.om")
    return lift_graph(om, "mem.om")


def test_detected_by_suffix_and_by_magic(tmp_path: Path, tiny_ge: bytes) -> None:
    for name in ("model.om", "model.bin"):
        (tmp_path / name).write_bytes(tiny_ge)
        assert detect_format(tmp_path / name) == "cann"
    assert load_model(tmp_path / "model.bin").ops()


@pytest.mark.parametrize(
    "name",
    [
        "ge_fp32_weights_partition.om",
        "ge_inline_legacy32.om",
        "ge_fp32_inline_weights.om",
        "domi_fp32_sn0.om",
        "domi_fp32_sn1.om",
    ],
)
def test_foreign_fp32_samples(name: str) -> None:
    """Data -> Conv2D(3x3, pad 1, +bias) -> Relu, weights inline or in WEIGHTS_DATA: compare with numpy."""
    graph = load_model(SAMPLES / name)
    assert [n.op for n in graph.ops()] == ["Conv", "Relu"]
    conv = graph.ops()[0]
    ins = graph.inputs_of(conv)
    assert ins[1] is not None and ins[2] is not None
    w, b = ins[1].const, ins[2].const
    assert w is not None and b is not None and w.shape == (4, 3, 3, 3)
    x = np.random.default_rng(0).standard_normal((1, 3, 8, 8)).astype(np.float32)
    got = run_onnxruntime(model_bytes(export_onnx(graph)), {graph.inputs[0].name: x})
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    ref = np.zeros((1, 4, 8, 8), np.float64)
    for i in range(8):
        for j in range(8):
            ref[0, :, i, j] = np.einsum("chw,ochw->o", xp[0, :, i : i + 3, j : j + 3], w) + b
    np.testing.assert_allclose(next(iter(got.values())), np.maximum(ref, 0), rtol=1e-5, atol=1e-5)


def test_foreign_int8_sample_without_kiln_attrs() -> None:
    """AscendQuant(scale 50) -> Conv2D int8 -> AscendDequant(uint64 deq, relu_flag): the Ascend formula."""
    graph = load_model(SAMPLES / "ge_int8_quant.om")
    ops = [n.op for n in graph.ops()]
    assert ops.count("QuantizeLinear") == 1 and ops.count("Conv") == 1 and ops[-1] == "Relu"
    conv = next(n for n in graph.ops() if n.op == "Conv")
    conv_ins = graph.inputs_of(conv)
    assert all(v is not None for v in conv_ins)
    x_dq, w_dq, b_dq = (v.producer for v in conv_ins if v is not None)
    x_scale = graph.inputs_of(x_dq)[1]
    assert x_scale is not None and x_scale.const is not None and float(x_scale.const) == np.float32(1 / 50)
    wq, bq = (graph.inputs_of(n)[0] for n in (w_dq, b_dq))
    deq = graph.inputs_of(b_dq)[1]
    assert wq is not None and bq is not None and deq is not None
    assert wq.const is not None and bq.const is not None and deq.const is not None
    x = np.random.default_rng(1).standard_normal((1, 3, 8, 8)).astype(np.float32)
    got = next(iter(run_onnxruntime(model_bytes(export_onnx(graph)), {graph.inputs[0].name: x}).values()))
    xq = np.clip(np.rint(x * 50.0), -128, 127).astype(np.int64)  # y = round(x * scale + offset)
    xp = np.pad(xq, ((0, 0), (0, 0), (1, 1), (1, 1)))
    acc = np.zeros((1, 4, 8, 8), np.int64)
    for i in range(8):
        for j in range(8):
            acc[0, :, i, j] = np.einsum(
                "chw,ochw->o", xp[0, :, i : i + 3, j : j + 3], wq.const.astype(np.int64)
            )
    acc += bq.const.astype(np.int64).reshape(1, 4, 1, 1)
    ref = np.maximum(
        acc * deq.const.astype(np.float64).reshape(1, 4, 1, 1), 0
    )  # int32 accumulator x deq_scale, then ReLU
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)
