"""The ONNX exporter: validity, determinism, output naming, attributes and Kiln-op expansion."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

from compiler.errors import ConversionError
from compiler.ir import DType, Graph, TensorType
from compiler.onnx_export import export_onnx, model_bytes, save_onnx
from compiler.ops import registry
from frontends.onnx import load_onnx
from tests.helpers import models
from tests.helpers.conformance import ort_session
from tests.helpers.numerics import assert_close

F32 = DType.FLOAT32


def _run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    onnx.checker.check_model(model, full_check=True)
    return list(ort_session(model_bytes(model)).run(None, feeds))


def test_export_is_byte_identical_across_runs() -> None:
    first = model_bytes(export_onnx(load_onnx(models.residual_add())))
    second = model_bytes(export_onnx(load_onnx(models.residual_add())))
    assert first == second


def test_model_header_and_initializers() -> None:
    model = export_onnx(load_onnx(models.conv_bn_relu()))
    assert model.ir_version == 10
    assert [(o.domain, o.version) for o in model.opset_import] == [("", 21)]
    assert sorted(t.name for t in model.graph.initializer) == ["b", "beta", "g", "mu", "var", "w"]
    conv = next(n for n in model.graph.node if n.op_type == "Conv")
    assert conv.name == "conv1"
    # only non-default attributes are written
    assert sorted(a.name for a in conv.attribute) == ["kernel_shape", "pads"]
    bn = next(n for n in model.graph.node if n.op_type == "BatchNormalization")
    eps = next(a for a in bn.attribute if a.name == "epsilon")
    assert eps.type == onnx.AttributeProto.FLOAT


def test_outputs_that_are_inputs_constants_or_repeated_get_identity() -> None:
    g = Graph("outs")
    x = g.add_input("x", TensorType(F32, (2, 3)))
    c = g.add_constant(np.arange(3, dtype=np.float32), "c")
    y = g.value(g.add_node("Add", [x, c], name="add", output_names=["y"]))
    g.set_outputs([x, y, y, c])
    model = export_onnx(g)
    names = [o.name for o in model.graph.output]
    assert names == ["x_out", "y", "y_out", "c"]
    feed = np.ones((2, 3), dtype=np.float32)
    got = _run(model, {"x": feed})
    assert_close(got[0], feed, rtol=0, atol=0)
    assert_close(got[1], feed + np.arange(3, dtype=np.float32), rtol=0, atol=0)
    assert_close(got[2], got[1], rtol=0, atol=0)
    assert_close(got[3], np.arange(3, dtype=np.float32), rtol=0, atol=0)


def test_absent_optional_inputs_are_empty_names() -> None:
    g = Graph("clip")
    x = g.add_input("x", TensorType(F32, ("N", 4)))
    hi = g.add_constant(np.array(0.5, dtype=np.float32), "hi")
    y = g.value(g.add_node("Clip", [x, None, hi], name="clip", output_names=["y"]))
    g.set_outputs([y])
    model = export_onnx(g)
    assert list(model.graph.node[0].input) == ["x", "", "hi"]
    assert model.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "N"
    feed = np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4)
    assert_close(_run(model, {"x": feed})[0], np.minimum(feed, 0.5), rtol=0, atol=0)


def test_kiln_ops_are_expanded() -> None:
    g = Graph("relu6")
    x = g.add_input("x", TensorType(F32, (2, 3)))
    y = g.value(g.add_node("Relu6", [x], domain="kiln", name="r6", output_names=["y"]))
    g.set_outputs([y])
    model = export_onnx(g)
    assert all(n.domain == "" for n in model.graph.node) and model.graph.output[0].name == "y"
    assert [n.op for n in g.ops()] == ["Relu6"]  # the graph itself is untouched
    feed = np.linspace(-3, 9, 6, dtype=np.float32).reshape(2, 3)
    assert_close(_run(model, {"x": feed})[0], np.clip(feed, 0, 6), rtol=0, atol=0)


def test_kiln_op_without_expansion_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    opdef = registry.OpDef(
        "NoExpand", registry.same_as_input(), lambda ins, a, n: [np.asarray(ins[0])], domain="kiln_test"
    )
    monkeypatch.setitem(registry._REGISTRY, ("kiln_test", "NoExpand"), opdef)
    g = Graph("custom")
    x = g.add_input("x", TensorType(F32, (2,)))
    y = g.value(g.add_node("NoExpand", [x], domain="kiln_test", name="odd"))
    g.set_outputs([y])
    with pytest.raises(ConversionError, match="odd.*NoExpand"):
        export_onnx(g)


def test_save_onnx_writes_a_loadable_file(tmp_path: Path) -> None:
    graph = load_onnx(models.symbolic_batch())
    path = save_onnx(graph, tmp_path / "sub" / "model.onnx")
    assert path.read_bytes() == model_bytes(export_onnx(graph))
    assert sorted(p.name for p in path.parent.iterdir()) == ["model.onnx"]
    assert load_onnx(path).outputs[0].type.shape == ("N", 5)


def test_public_output_name_survives_identity_elimination() -> None:
    """y = Identity(x) with x a graph input: after eliminate-identities the output is still named y."""
    import numpy as np

    from compiler.pass_manager import PassManager
    from compiler.runners import run_onnxruntime
    from frontends.onnx.loader import load_onnx
    from tests.helpers.onnx_text import text_model

    m = text_model("""g (float[3] x) => (float[3] y, float[3] z) { y = Identity(x)  z = Relu(x) }""")
    g = load_onnx(m)
    PassManager(["eliminate-identities"]).run(g)
    assert g.output_names == ["y", "z"]
    model = export_onnx(g)
    assert [o.name for o in model.graph.output] == ["y", "z"]
    x = np.array([-1, 0, 2], np.float32)
    out = run_onnxruntime(model.SerializeToString(), {"x": x})
    np.testing.assert_array_equal(out["y"], x)
