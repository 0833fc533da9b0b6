"""ONNX's whole node test suite through the real ``kiln compile --emit onnx --inputs`` (issue 15).

Cases are those of the onnx wheel's node suite (``onnx/backend/test/data/node/<case>/``:
``model.onnx``, ``test_data_set_0/input_*.pb``, ``output_*.pb``). The wheel ships the cases'
generator code rather than the files, so they come from
``onnx.backend.test.loader.load_model_tests(kind="node")``, the same models and tensors; a folder
laid out as above can be read instead with :func:`cases_from_dir`. Function expansions
(``*_expanded*``) are cases like any other.

A case onnxruntime cannot load or run (CPU provider, no graph optimization) is *skipped*, with
ORT's reason. Every other case is written to a temp folder (the model, and its inputs as an
``.npz`` keyed by input name) and compiled in-process by :func:`compiler.cli.main`. Its class:

* ``pass``: exit 0 (Kiln's own verification against onnxruntime passed) and, where onnxruntime
  on the original model matches the case's expected outputs, the artifact matches them too;
* ``refused``: exit 2 with a message that says *unsupported* (the op, attribute or dtype);
* ``wrong``: exit 1 (verification failed), or exit 0 but the artifact misses the expected outputs;
* ``crash``: exit 3, an exception out of ``main``, a timeout, or exit 2 without a clear refusal.
"""

from __future__ import annotations

import contextlib
import io
import re
import signal
import tempfile
import warnings
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

__all__ = [
    "NodeCase",
    "Outcome",
    "CLASSES",
    "load_cases",
    "cases_from_dir",
    "run_case",
    "run_cases",
    "summarize",
]

CLASSES = ("pass", "refused", "wrong", "crash", "skipped")
CASE_TIMEOUT_S = 120
_UNSUPPORTED_OPS = re.compile(r"unsupported op\(s\): (.*)$")
_BACKEND_GAPS = re.compile(r"(?:for [\w, ]+: |; )\w+: ([\w:.]+) \(nodes? ")
_REFUSAL = re.compile(r"unsupported|not supported", re.IGNORECASE)


@dataclass(frozen=True)
class NodeCase:
    """One node-suite case: the model's bytes, its input and expected output values."""

    name: str
    model: bytes
    inputs: tuple[Any, ...]
    outputs: tuple[Any, ...]
    rtol: float = 1e-3
    atol: float = 1e-7


@dataclass(frozen=True)
class Outcome:
    """The class of one case (see the module docstring), why, and the ops a refusal names."""

    name: str
    kind: str
    reason: str = ""
    ops: tuple[str, ...] = field(default=())


def load_cases() -> list[NodeCase]:
    """Every case of the onnx wheel's node suite, in name order."""
    from onnx.backend.test.loader import load_model_tests

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cases = load_model_tests(kind="node")
    out = []
    for c in cases:
        if c.model is None or not c.data_sets:
            continue
        inputs, outputs = c.data_sets[0]
        out.append(
            NodeCase(c.name, c.model.SerializeToString(), tuple(inputs), tuple(outputs), c.rtol, c.atol)
        )
    return sorted(out, key=lambda c: c.name)


def cases_from_dir(root: Path) -> list[NodeCase]:
    """The cases of an on-disk node suite folder (``<case>/model.onnx``, ``<case>/test_data_set_0``)."""
    out = []
    for d in sorted(p for p in root.iterdir() if (p / "model.onnx").is_file()):
        data = d / "test_data_set_0"

        def read(prefix: str, data: Path = data) -> tuple[Any, ...]:
            files = sorted(data.glob(f"{prefix}_*.pb"), key=lambda p: int(p.stem.split("_")[1]))
            return tuple(numpy_helper.to_array(onnx.load_tensor(str(p))) for p in files)

        out.append(NodeCase(d.name, (d / "model.onnx").read_bytes(), read("input"), read("output")))
    return out


def _ort_session(model: bytes) -> Any:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.log_severity_level = 3
    so.intra_op_num_threads = 1
    return ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])


def _first_line(text: str, limit: int = 400) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return (lines[0] if lines else "").strip()[:limit]


def _mismatch(got: Sequence[Any], want: Sequence[Any], rtol: float, atol: float) -> str | None:
    """Why ``got`` misses ``want`` (the onnx backend runner's assert_allclose rule), or None."""
    if len(got) != len(want):
        return f"{len(got)} outputs, expected {len(want)}"
    for i, (g, w) in enumerate(zip(got, map(_value, want), strict=True)):
        if not isinstance(w, np.ndarray):
            return f"output {i}: expected a {type(w).__name__}"
        g = np.asarray(g)
        if g.dtype != w.dtype and not (g.dtype.kind == w.dtype.kind == "U"):
            return f"output {i}: dtype {g.dtype}, expected {w.dtype}"
        if g.shape != w.shape:
            return f"output {i}: shape {g.shape}, expected {w.shape}"
        if w.dtype.kind in "OUSb" or w.dtype.kind in "iu":
            if not np.array_equal(g, w):
                return f"output {i}: values differ"
            continue
        try:
            np.testing.assert_allclose(
                g.astype(np.float64), w.astype(np.float64), rtol=rtol, atol=atol, equal_nan=True
            )
        except AssertionError as exc:
            detail = " ".join(str(exc).split())
            return f"output {i}: {detail[:200]}"
    return None


def _feeds(case: NodeCase, model: onnx.ModelProto) -> dict[str, Any]:
    inits = {t.name for t in model.graph.initializer}
    names = [vi.name for vi in model.graph.input if vi.name not in inits]
    return dict(zip(names, (_value(x) for x in case.inputs), strict=False))


def _value(x: Any) -> Any:
    """A case's tensor as an ndarray (0-d ones come as numpy scalars; strings as str arrays)."""
    if isinstance(x, onnx.TensorProto):
        x = numpy_helper.to_array(x)
    if isinstance(x, np.ndarray | np.generic):
        x = np.asarray(x)
        if x.dtype == object and all(isinstance(v, str) for v in x.flat):
            x = x.astype(str)
    return x


@contextlib.contextmanager
def _time_limit(seconds: int) -> Iterator[None]:
    def on_alarm(signum: int, frame: FrameType | None) -> None:
        raise TimeoutError(f"no result after {seconds} s")

    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def _refused_ops(message: str, op_types: Sequence[str]) -> tuple[str, ...]:
    """The ops a refusal names: the unsupported ops it lists, else the first node op it names."""
    m = _UNSUPPORTED_OPS.search(message)
    if m:
        return tuple(sorted({part.split(" (nodes")[0].strip() for part in m.group(1).split("; ")}))
    gaps = _BACKEND_GAPS.findall(message)
    if gaps:
        return tuple(sorted(set(gaps)))
    named = [op for op in dict.fromkeys(op_types) if re.search(rf"\({re.escape(op)}\)", message)]
    if named:
        return tuple(named[:1])
    if "is not a tensor" in message:
        return ("<non-tensor graph input>",)
    opset = re.search(r"opset (\d+) is not supported", message)
    return (f"<opset {opset.group(1)}>",) if opset else ("<unnamed>",)


def run_case(case: NodeCase, timeout_s: int = CASE_TIMEOUT_S) -> Outcome:
    """Classify one case (see the module docstring)."""
    from compiler.cli import main as kiln_main

    model = onnx.load_from_string(case.model)
    feeds = _feeds(case, model)
    try:
        ort_out = _ort_session(case.model).run(None, feeds)
    except Exception as exc:  # noqa: BLE001 - ORT cannot run it: skipped, with its reason
        return Outcome(case.name, "skipped", f"{type(exc).__name__}: {_first_line(str(exc))}")
    ort_matches = _mismatch(ort_out, case.outputs, case.rtol, case.atol) is None
    op_types = [n.op_type for n in model.graph.node]
    with tempfile.TemporaryDirectory(prefix="kiln-node-") as tmp:
        model_path, npz, out = Path(tmp) / "model.onnx", Path(tmp) / "inputs.npz", Path(tmp) / "out"
        model_path.write_bytes(case.model)
        # sequence / optional inputs cannot travel in an .npz: Kiln must refuse their types itself
        arrays = {k: v for k, v in feeds.items() if isinstance(v, np.ndarray)}
        np.savez(npz, **arrays)  # type: ignore[arg-type]
        argv = ["compile", str(model_path), "-o", str(out), "--emit", "onnx", "--inputs", str(npz)]
        err, sink = io.StringIO(), io.StringIO()
        try:
            with (
                _time_limit(timeout_s),
                contextlib.redirect_stderr(err),
                contextlib.redirect_stdout(sink),
                warnings.catch_warnings(),
            ):
                warnings.simplefilter("ignore")
                rc = kiln_main(argv)
        except SystemExit as exc:
            rc = int(exc.code) if isinstance(exc.code, int) else 3
        except BaseException as exc:  # noqa: BLE001 - anything out of main is a crash
            return Outcome(case.name, "crash", f"{type(exc).__name__}: {_first_line(str(exc))}")
        full = _first_line(err.getvalue().replace("kiln: error: ", "", 1).replace(f"{tmp}/", ""), 100_000)
        message = full[:400]
        if rc == 2 and _REFUSAL.search(full):
            return Outcome(case.name, "refused", message, _refused_ops(full, op_types))
        if rc == 1:
            return Outcome(case.name, "wrong", message)
        if rc != 0:
            return Outcome(case.name, "crash", f"exit {rc}: {message}")
        if not ort_matches:
            return Outcome(case.name, "pass", "onnxruntime misses the expected outputs; checked against it")
        try:
            got = _ort_session((out / "model.onnx").read_bytes()).run(None, arrays)
        except Exception as exc:  # noqa: BLE001
            return Outcome(case.name, "crash", f"artifact does not run: {_first_line(str(exc))}")
        miss = _mismatch(got, case.outputs, case.rtol, case.atol)
        return (
            Outcome(case.name, "wrong", f"artifact vs expected: {miss}")
            if miss
            else Outcome(case.name, "pass")
        )


def run_cases(cases: Iterable[NodeCase], jobs: int = 1) -> list[Outcome]:
    """Classify every case; with ``jobs > 1``, in that many worker processes (order kept)."""
    cases = list(cases)
    if jobs <= 1:
        return [run_case(c) for c in cases]
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        return list(pool.map(run_case, cases, chunksize=4))


def summarize(outcomes: Sequence[Outcome]) -> str:
    """Counts, the pass rate over ORT-runnable cases, and each failing class's cases."""
    counts = Counter(o.kind for o in outcomes)
    runnable = len(outcomes) - counts["skipped"]
    rate = counts["pass"] / runnable if runnable else 0.0
    lines = [
        f"ONNX node suite: {len(outcomes)} cases, {runnable} runnable by onnxruntime, "
        + ", ".join(f"{k} {counts[k]}" for k in CLASSES),
        f"pass rate: {counts['pass']}/{runnable} = {rate:.1%}",
    ]
    refused = Counter(op for o in outcomes if o.kind == "refused" for op in (o.ops or ("<unnamed>",)))
    lines.append(f"refused ops ({len(refused)}):")
    lines += [f"  {op}: {n}" for op, n in sorted(refused.items(), key=lambda kv: (-kv[1], kv[0]))]
    for kind in ("wrong", "crash", "refused"):
        lines.append(f"{kind} ({counts[kind]}):")
        lines += [f"  {o.name}: {o.reason}" for o in outcomes if o.kind == kind]
    skipped = Counter(
        o.reason.split(":")[0] + ": " + o.reason.split(":", 1)[-1][:80]
        for o in outcomes
        if o.kind == "skipped"
    )
    lines.append(f"skipped by onnxruntime ({counts['skipped']}):")
    lines += [f"  {n} x {why}" for why, n in skipped.most_common()]
    return "\n".join(lines)
