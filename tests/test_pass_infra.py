"""Pass infrastructure: registry, pipeline strings, fixed points, verifier, instruments, near misses."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from compiler.api import FixedPoint, Pass, PassContext, PassManager, PassResult, Rewriter, register_pass
from compiler.errors import OptionError
from compiler.instruments import DumpIR, NumericsCheck, NumericsRegression, PassTiming
from compiler.ir import DType, Graph, TensorType, run_graph
from compiler.pass_infra import all_passes, make_pass, parse_pipeline
from compiler.pass_manager import PassFailed

F32 = DType.FLOAT32


def chain() -> Graph:
    g = Graph()
    x = g.add_input("x", TensorType(F32, (2, 3)))
    a = g.add_node("Identity", [x], name="id0")
    b = g.add_node("Relu", [g.value(a)], name="relu")
    c = g.add_node("Identity", [g.value(b)], name="id1")
    g.set_outputs([g.value(c)])
    return g


def test_every_builtin_pass_is_registered_with_a_doc() -> None:
    passes = all_passes()
    for name in (
        "fold-constants",
        "eliminate-dead-nodes",
        "eliminate-identities",
        "canonicalize",
        "fold-batchnorm",
        "fuse-conv-bias-act",
    ):
        assert name in passes
        assert passes[name].doc(), name
        assert passes[name].__module__ == "passes." + name.replace("-", "_")


def test_pipeline_string_with_options() -> None:
    ps = parse_pipeline(
        "fold-constants{max_elements=10,max_growth=2.5}, eliminate-dead-nodes,"
        "fuse-conv-bias-act{residual=true}"
    )
    assert [p.name for p in ps] == ["fold-constants", "eliminate-dead-nodes", "fuse-conv-bias-act"]
    assert ps[0].max_elements == 10 and ps[0].max_growth == 2.5  # type: ignore[attr-defined]
    assert ps[2].residual is True  # type: ignore[attr-defined]
    assert ps[0].spec() == "fold-constants{max_elements=10,max_growth=2.5}"


@pytest.mark.parametrize(
    ("text", "msg"),
    [
        ("no-such-pass", "unknown pass"),
        ("fold-constants{bogus=1}", "no option 'bogus'"),
        ("fold-constants{max_elements=ten}", "not a valid int"),
        ("fold-constants{max_elements=1", "missing '}'"),
        ("", "names no pass"),
    ],
)
def test_bad_pipeline_strings(text: str, msg: str) -> None:
    with pytest.raises(OptionError, match=msg):
        parse_pipeline(text)


@register_pass
@dataclasses.dataclass(frozen=True)
class _DoubleRelu(Pass):
    """test-only: Relu(x) -> Relu(Relu(x)) once per run (never converges)."""

    name = "test-grow-relu"

    def run(self, graph: Graph, ctx: PassContext) -> PassResult:
        with Rewriter(graph) as rw:
            out = graph.outputs[0]
            rw.replace(out, rw.op("Relu", [out]))
        return rw.result


@register_pass
@dataclasses.dataclass(frozen=True)
class _BreakGraph(Pass):
    """test-only: corrupts a recorded type."""

    name = "test-break-types"

    def run(self, graph: Graph, ctx: PassContext) -> PassResult:
        with Rewriter(graph) as rw:
            node = graph.ops()[0]
            node.output_types[0] = TensorType(F32, (9,))
            rw.result.edits["update"] += 1
        return rw.result


@register_pass
@dataclasses.dataclass(frozen=True)
class _Negate(Pass):
    """test-only: wrongly negates the output (a numerics bug)."""

    name = "test-negate"

    def run(self, graph: Graph, ctx: PassContext) -> PassResult:
        with Rewriter(graph) as rw:
            out = graph.outputs[0]
            rw.replace(out, rw.op("Neg", [out]))
        return rw.result


def test_changes_are_counted_by_the_rewriter() -> None:
    g = chain()
    res = PassManager(["eliminate-identities"]).run(g)
    assert res.changed and res.applied["identity"] == 2
    assert res.edits["remove"] == 2
    again = PassManager(["eliminate-identities"]).run(g)
    assert not again.changed


def test_fixed_point_has_a_step_cap_and_warns() -> None:
    g = chain()
    ctx = PassContext()
    PassManager([FixedPoint(("test-grow-relu",), max_steps=3, name="grow")], ctx).run(g)
    assert sum(1 for n in g.ops() if n.op == "Relu") == 4
    assert any("did not converge" in line for line in ctx.log)


def test_verifier_after_each_pass_names_the_pass() -> None:
    with pytest.raises(PassFailed, match="test-break-types.*invalid graph"):
        PassManager(["test-break-types"]).run(chain())


def test_numerics_instrument_names_first_bad_pass() -> None:
    feeds = {"x": np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3)}
    check = NumericsCheck(feeds, max_rel=1e-6)
    with pytest.raises(NumericsRegression, match="test-negate"):
        PassManager(["eliminate-identities", "test-negate", "eliminate-dead-nodes"], instruments=[check]).run(
            chain()
        )
    assert check.first_failure == "test-negate"


def test_timing_and_dump_instruments(tmp_path: Path) -> None:
    timing = PassTiming()
    PassManager(["eliminate-identities", "eliminate-dead-nodes"], instruments=[timing, DumpIR(tmp_path)]).run(
        chain()
    )
    assert [n for n, _ in timing.timings] == ["eliminate-identities", "eliminate-dead-nodes"]
    assert "total" in timing.report()
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["00-input.txt", "01-eliminate-identities.txt", "02-eliminate-dead-nodes.txt"]
    assert "Identity" in (tmp_path / "00-input.txt").read_text()
    assert "Identity" not in (tmp_path / "01-eliminate-identities.txt").read_text()


def test_pass_objects_and_names_mix_in_a_pipeline() -> None:
    g = chain()
    feeds = {"x": np.ones((2, 3), np.float32)}
    ref = run_graph(g, feeds)
    PassManager([make_pass("eliminate-identities"), "eliminate-dead-nodes"]).run(g)
    np.testing.assert_array_equal(run_graph(g, feeds)["id1"], ref["id1"])
    assert g.output_names == ["id1"]
