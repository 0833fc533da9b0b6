"""The Kiln IR: Graph, Node, Value, types, printer, verifier and interpreter."""

from compiler.ir.graph import Graph, GraphError, Node, Value
from compiler.ir.interpreter import run_graph
from compiler.ir.printer import print_graph
from compiler.ir.types import DType, TensorType
from compiler.ir.verifier import VerificationError, verify

__all__ = [
    "Graph",
    "GraphError",
    "Node",
    "Value",
    "DType",
    "TensorType",
    "print_graph",
    "run_graph",
    "verify",
    "VerificationError",
]
