"""The Graph: edits, users/producers, determinism, clone isolation, printer and verifier."""

from __future__ import annotations

import numpy as np
import pytest

from compiler.ir import DType, Graph, GraphError, TensorType, print_graph, run_graph, verify
from compiler.ir.verifier import VerificationError

F32 = DType.FLOAT32


def small_graph() -> Graph:
    g = Graph("g")
    x = g.add_input("x", TensorType(F32, ("N", 3)))
    c = g.add_constant(np.arange(3, dtype=np.float32), "c")
    add = g.add_node("Add", [x, c], name="add0")
    relu = g.add_node("Relu", [g.value(add)], name="relu0")
    twice = g.add_node("Add", [g.value(relu), g.value(relu)], name="twice")
    g.set_outputs([g.value(twice)])
    return g


def test_multi_edges_users_and_producer() -> None:
    g = small_graph()
    relu_v = g.find_value("relu0")
    users = g.users(relu_v)
    assert [(n.name, p) for n, p in users] == [("twice", 0), ("twice", 1)]
    assert relu_v.producer.op == "Relu"
    assert g.find_value("twice").type == TensorType(F32, ("N", 3))


def test_constants_are_read_only_and_stored_once() -> None:
    g = Graph()
    a = g.add_constant(np.ones(4, np.float32), "a")
    b = g.add_constant(np.ones(4, np.float32), "b")
    assert a.const is b.const
    assert a.const is not None and not a.const.flags.writeable
    with pytest.raises(ValueError):
        a.const[0] = 2


def test_remove_refuses_while_used() -> None:
    g = small_graph()
    with pytest.raises(GraphError, match="still has users"):
        g.remove(g.find_value("relu0").producer)


def test_replace_all_uses_keeps_output_name() -> None:
    g = small_graph()
    relu = g.find_value("relu0")
    twice = g.find_value("twice")
    g.replace_all_uses(twice, relu)
    g.remove(twice.producer)
    assert g.output_names == ["twice"]
    assert g.outputs[0].name == "twice"  # the internal value took the public name
    verify(g)


def test_replace_with_graph_input_keeps_public_name() -> None:
    g = Graph()
    x = g.add_input("x", TensorType(F32, (2,)))
    y = g.add_node("Identity", [x], name="y")
    g.set_outputs([g.value(y)])
    g.replace_all_uses(g.value(y), x)
    g.remove(y)
    assert g.output_names == ["y"] and g.outputs[0].name == "x"
    assert "return %x as 'y'" in print_graph(g)


def test_clone_is_isolated() -> None:
    g = small_graph()
    before = print_graph(g)
    h = g.clone()
    relu = h.find_value("relu0")
    neg = h.add_node("Neg", [relu], name="neg")
    h.set_input(h.find_value("twice").producer, 1, h.value(neg))
    assert print_graph(g) == before
    assert print_graph(h) != before
    verify(h)


def test_deterministic_order_and_golden_text() -> None:
    text = print_graph(small_graph())
    assert text == (
        "graph g(\n"
        "  %x: f32[N,3],\n"
        ") {\n"
        "  %c = Constant [0.0,1.0,2.0] : f32[3]\n"
        "  %add0 = Add(%x, %c) : f32[N,3]\n"
        "  %relu0 = Relu(%add0) : f32[N,3]\n"
        "  %twice = Add(%relu0, %relu0) : f32[N,3]\n"
        "  return %twice\n"
        "}\n"
    )
    assert print_graph(small_graph()) == text


def test_cycle_is_refused() -> None:
    g = small_graph()
    add0 = g.find_value("add0").producer
    with pytest.raises(GraphError, match="cycle"):
        g.set_input(add0, 0, g.find_value("twice"))


def test_verifier_names_node_with_wrong_types() -> None:
    g = small_graph()
    relu = g.find_value("relu0").producer
    relu.output_types[0] = TensorType(F32, (7,))
    with pytest.raises(VerificationError, match="Relu 'relu0'") as info:
        verify(g)
    assert ">> %relu0 = Relu" in str(info.value)


def test_verifier_catches_missing_input() -> None:
    g = small_graph()
    relu = g.find_value("relu0").producer
    g.set_input(relu, 0, None)
    with pytest.raises(VerificationError, match="relu0"):
        verify(g)


def test_shape_errors_name_the_node() -> None:
    g = Graph()
    a = g.add_input("a", TensorType(F32, (2, 3)))
    b = g.add_input("b", TensorType(F32, (4, 3)))
    with pytest.raises(ValueError, match="Add 'bad'"):
        g.add_node("Add", [a, b], name="bad")


def test_interpreter_runs_multi_edge_graph() -> None:
    g = small_graph()
    x = np.array([[-5, 0, 1], [1, 2, 3]], np.float32)
    out = run_graph(g, {"x": x})["twice"]
    np.testing.assert_array_equal(out, 2 * np.maximum(x + np.arange(3, dtype=np.float32), 0))


def test_unknown_attribute_is_rejected() -> None:
    g = Graph()
    x = g.add_input("x", TensorType(F32, (2,)))
    with pytest.raises(ValueError, match="unknown attribute"):
        g.add_node("LeakyRelu", [x], {"alpha": 0.1, "beta": 2.0}, name="lr")
