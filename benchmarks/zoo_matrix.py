"""Benchmark: which architectures of the zoo Kiln compiles, per output path (the coverage matrix).

Usage, from the repository root (../shared must hold the zoo and its tool)::

    .venv/bin/python benchmarks/zoo_matrix.py --zoo-dir ZOO_DIR                   # all models, onnx,mnn,cann
    .venv/bin/python benchmarks/zoo_matrix.py --models resnet18,bert --paths onnx,tvm-cpu --json out.json

``ZOO_DIR`` is an already materialized zoo; without ``--zoo-dir`` the requested models are first
materialized into a temporary directory by ``../shared/tools/zoo/zoo.py`` (about a minute for all 36).
``--source ort-extended|ort-transformers|ort-qoperator|ort-qdq`` runs the matrix on the files
onnxruntime's own optimizer or quantizer makes of each model (``benchmarks/ort_sources.py``).

For every model x path, ``kiln compile MODEL -o OUT --inputs inputs.npz`` runs in a subprocess
(a fresh output folder in a temporary directory, ``--timeout`` seconds per compile) with
``--emit onnx``, ``--emit mnn``, ``--emit cann``, for ``mnn-int8w`` ``--emit mnn --mnn-weights int8``
(weight-only int8 with its fp16 fallback plan), for ``tvm-cpu`` ``--target cpu``, for ``tvm-cuda``
``--target cuda:sm_80,cuda:sm_90 --no-verify`` (CUDA codegen; ``ok`` means both libraries were
built with every kernel thread-bound, which Kiln's CUDA build checks; nothing runs), or for ``all``
``--emit mnn,cann --target cpu`` (the preflight: a refusal lists every backend's gaps at once and
comes before any calibration or emit, so its seconds are the time to refuse). The result is
classified from the exit code, stderr and ``manifest.json``:

* ``ok``: exit 0 and every artifact verified against onnxruntime (``verification.passed``, nothing in
  ``not_run_here``); for ``mnn`` also the worst output's max rel <= 1e-3 (the MNN bar). The ``.om``
  of ``cann`` is verified by Kiln itself (read back by the strict reader, run in onnxruntime); for
  ``mnn-int8w`` the worst output cosine against onnxruntime fp32 >= 0.999 (shown with the number of
  layers the plan kept in fp16);
* ``numeric miss``: exit 1, the artifact was written but missed its tolerance (worst max rel shown);
* ``refused``: exit 2 with a ``kiln: error:`` line; the op names it lists are extracted (the
  frontend's and the MNN writer's ``unsupported op(s): ...`` list every op; the CANN lowering stops
  at the first node it cannot map, so it names one);
* ``crash``: any other exit code, a Python traceback on stderr, or the timeout.

Printed: the CPU ISA and the kiln commit, one line per model x path (model, path, class, seconds,
detail) as each compile finishes, the counts per path, per path the union of refused ops with the
number of models each op blocks and who refused it (``import``: the ONNX frontend, so every path;
``mnn``: the MNN writer; ``cann``: the CANN lowering), and the crashes grouped by cause.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
ZOO_TOOL = ROOT.parent / "shared" / "tools" / "zoo" / "zoo.py"
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.ort_sources import SOURCES, derive  # noqa: E402

__all__ = [
    "main",
    "Result",
    "run_compile",
    "classify",
    "refused_ops",
    "worst_max_rel",
    "worst_cosine",
    "crash_causes",
    "cpu_isa",
    "kiln_commit",
    "materialize",
]

PATHS = ("onnx", "mnn", "mnn-int8w", "cann", "tvm-cpu", "tvm-cuda", "all")
CUDA_ARCHS = ("sm_80", "sm_90")
DEFAULT_PATHS = ("onnx", "mnn", "cann")
CLASSES = ("ok", "numeric miss", "refused", "crash")
MNN_MAX_REL = 1e-3
INT8W_MIN_COSINE = 0.999
DETAIL_CHARS = 110
STDERR_KEEP = 4000


@dataclass
class Result:
    """One compile: its class, time and a short detail (the refused ops, the worst max rel, the cause)."""

    model: str
    path: str
    cls: str
    seconds: float
    detail: str
    rc: int | None = None
    max_rel: float | None = None
    cosine: float | None = None
    ops: list[str] = field(default_factory=list)
    reasons: dict[str, str] = field(default_factory=dict)
    refused_by: dict[str, str] = field(default_factory=dict)
    import_error: bool = False
    stderr_tail: str = ""


def path_flags(path: str) -> list[str]:
    """The ``kiln compile`` flags of one path."""
    if path == "tvm-cpu":
        return ["--target", "cpu"]
    if path == "tvm-cuda":  # codegen only: no GPU here, so nothing can be verified
        return ["--target", ",".join(f"cuda:{a}" for a in CUDA_ARCHS), "--no-verify"]
    if path == "all":  # the preflight check: every backend at once, refused (if at all) in one message
        return ["--emit", "mnn,cann", "--target", "cpu"]
    if path == "mnn-int8w":
        return ["--emit", "mnn", "--mnn-weights", "int8"]
    return ["--emit", path]


def kiln_command() -> list[str]:
    """The ``kiln`` console script of this interpreter's environment (or ``python -m compiler.cli``)."""
    exe = Path(sys.executable).with_name("kiln")
    return [str(exe)] if exe.is_file() else [sys.executable, "-m", "compiler.cli"]


def _short(text: str, n: int = DETAIL_CHARS) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[: n - 3] + "..."


def worst_max_rel(manifest: dict[str, Any]) -> tuple[float | None, str]:
    """The largest max rel over every verified artifact's outputs, and ``artifact:output`` of it."""
    worst: float | None = None
    where = ""
    for art in manifest.get("verification", {}).get("artifacts", []):
        for out in art.get("outputs", []):
            rel = float(out.get("max_rel", float("inf")))
            if worst is None or rel > worst:
                worst, where = rel, f"{art.get('path')}:{out.get('name')}"
    return worst, where


def worst_cosine(manifest: dict[str, Any]) -> tuple[float | None, str]:
    """The smallest output cosine over every verified artifact, and ``artifact:output`` of it."""
    worst: float | None = None
    where = ""
    for art in manifest.get("verification", {}).get("artifacts", []):
        for out in art.get("outputs", []):
            cos = float(out.get("cosine", float("-inf")))
            if worst is None or cos < worst:
                worst, where = cos, f"{art.get('path')}:{out.get('name')}"
    return worst, where


def _fp16_layers(manifest: dict[str, Any]) -> str:
    """`` (N fp16 layers)`` from the MNN weight plan in the manifest, if it records one."""
    for art in manifest.get("artifacts", []):
        plan = (art.get("details") or {}).get("weight_plan")
        if isinstance(plan, dict) and "kept" in plan:
            fp32 = len(plan.get("kept_fp32", []))
            extra = f", {fp32} fp32" if fp32 else ""
            return f" ({len(plan['kept'])}/{plan.get('layers', '?')} layers fp16{extra})"
    return ""


_SEGMENT = re.compile(r"; (?=[\w.:]+(?: [\w.:]+)? \()")
# a gap: "LABEL: OP (node", LABEL like "mnn" or "tvm cuda:sm_80"
_GAP = re.compile(r"(?:^|; |: )([\w.+-]+(?: [\w.+:-]+)?): ([\w.:]+) \(nodes? ")
_NO_LOWERING = re.compile(r"^no \w+ (lowering|mapping)$", re.IGNORECASE)


def refused_ops(message: str) -> list[tuple[str, str, str]]:
    """``(op, reason, refused by)`` for every op a ``kiln: error:`` message lists (reason may be "").

    ``refused by`` is the backend's label (``mnn``, ``cann``, ``cpu``, ...) or ``import`` (the
    frontend: then every path is blocked). Understands the preflight's ``N unsupported op(s) for
    B: B: OP (nodes ...): reason; ...``, the older ``unsupported op(s): OP (nodes ...); OP (reason)
    (nodes ...)`` (frontend; MNN writer when the source says so), ``CANN backend: OP 'name' (#id ->
    %out): why`` and a frontend's ``node 'name' (OP): why``.
    """
    out: list[tuple[str, str, str]] = []
    m = re.search(r"\d+ unsupported op\(s\) for ", message)
    first = _GAP.search(message, m.end()) if m else None
    if m and first:
        body = message[first.start() :]
        starts = list(_GAP.finditer(body))
        for i, g in enumerate(starts):
            seg = body[g.end() : starts[i + 1].start() if i + 1 < len(starts) else len(body)]
            reason = seg.split("): ", 1)[1].strip() if "): " in seg else ""
            out.append((g.group(2), reason, g.group(1)))
        return out
    if "unsupported op(s): " in message:
        source, body = message.split("unsupported op(s): ", 1)
        by = "mnn" if "MNN writer" in source else "import"
        for part in _SEGMENT.split(body):
            head = part.rsplit(" (nodes ", 1)[0] if " (nodes " in part else part
            if head.startswith("graph input"):
                op, reason = "graph input", head[len("graph input") :].strip(" ()")
            else:
                op, _, rest = head.partition(" ")
                reason = rest.strip()
                if reason.startswith("(") and reason.endswith(")"):
                    reason = reason[1:-1]
            if op:
                out.append((op, reason, by))
        return out
    m = re.search(r"op ([\w.:]+) has no CANN mapping", message)
    if m:
        return [(m.group(1), "", "cann")]
    m = re.search(r"CANN backend: ([\w.:]+)(?: '[^']*')? \(#\d+[^)]*\): (.*)", message)
    if m:
        return [(m.group(1), m.group(2).strip(), "cann")]
    m = re.search(r"node '[^']*' \(([\w.:]+)\): (.*)", message)
    if m:
        return [(m.group(1), m.group(2).strip(), "import")]
    return out


def _traceback_cause(stderr: str) -> str:
    """The exception line at the end of a Python traceback."""
    tail = stderr.split("Traceback (most recent call last):")[-1]
    lines = [ln for ln in tail.strip().splitlines() if ln.strip()]
    for ln in reversed(lines):
        if re.match(r"^[\w.]+(Error|Exception|Interrupt|Exit|Warning)\b|^[\w.]+: ", ln):
            return ln.strip()
    return lines[-1].strip() if lines else "traceback"


def classify(
    model: str, path: str, rc: int | None, stderr: str, manifest: dict[str, Any] | None, seconds: float
) -> Result:
    """The class of one finished (or timed-out: ``rc`` None) compile."""
    r = Result(model, path, "crash", seconds, "", rc=rc, stderr_tail=stderr[-STDERR_KEEP:])
    if rc is None:
        r.detail = f"timeout (killed after {seconds:.1f} s)"
        return r
    if "Traceback (most recent call last):" in stderr:
        cause = _traceback_cause(stderr)
        r.import_error = bool(re.match(r"^(ModuleNotFoundError|ImportError)\b", cause))
        r.detail = _short(f"exit {rc}: {cause}")
        return r
    err_lines = [ln for ln in stderr.splitlines() if ln.startswith("kiln: error:")]
    where = cos_where = ""
    if manifest is not None:
        r.max_rel, where = worst_max_rel(manifest)
        r.cosine, cos_where = worst_cosine(manifest)
    if rc == 0 and path == "tvm-cuda":
        built = sorted(str(a.get("path")) for a in (manifest or {}).get("artifacts", []))
        want = sorted(f"cuda_{a}/model.so" for a in CUDA_ARCHS)
        ok = built == want
        r.cls = "ok" if ok else "crash"
        r.detail = (
            f"built {', '.join(built)} (not run: no GPU here)"
            if ok
            else f"artifacts {built}, expected {want}"
        )
        return r
    if rc == 0:
        ver = (manifest or {}).get("verification", {})
        if manifest is None:
            r.cls, r.detail = "crash", "exit 0 but no manifest.json"
        elif not ver.get("enabled") or not ver.get("artifacts") or ver.get("not_run_here"):
            why = "; ".join(s.get("why", "") for s in ver.get("not_run_here", [])) or "no verified artifact"
            r.cls, r.detail = "numeric miss", _short(f"not verified: {why}")
        elif not ver.get("passed"):
            r.cls, r.detail = "numeric miss", "exit 0 but verification.passed is false"
        elif path == "mnn" and (r.max_rel is None or r.max_rel > MNN_MAX_REL):
            r.cls, r.detail = "numeric miss", f"max_rel {r.max_rel:.3g} > {MNN_MAX_REL:g} ({where})"
        elif path == "mnn-int8w":
            ok = r.cosine is not None and r.cosine >= INT8W_MIN_COSINE
            r.cls = "ok" if ok else "numeric miss"
            r.detail = f"cosine {r.cosine:.6f} ({cos_where}){_fp16_layers(manifest)}"
        else:
            r.cls, r.detail = "ok", f"max_rel {r.max_rel:.3g}" if r.max_rel is not None else ""
        return r
    if rc == 1 and err_lines:
        r.cls = "numeric miss"
        if path == "mnn-int8w" and r.cosine is not None:
            r.detail = f"cosine {r.cosine:.6f} at {cos_where}"
        elif r.max_rel is None:
            r.detail = _short(err_lines[-1][len("kiln: error:") :])
        else:
            note = (
                f" (within the {MNN_MAX_REL:g} MNN bar)" if path == "mnn" and r.max_rel <= MNN_MAX_REL else ""
            )
            r.detail = f"max_rel {r.max_rel:.3g} at {where}{note}"
        return r
    if rc == 2 and err_lines:
        msg = err_lines[-1][len("kiln: error:") :].strip()
        r.cls = "refused"
        for op, reason, by in refused_ops(msg):
            if op not in r.ops:
                r.ops.append(op)
            if reason and not _NO_LOWERING.match(reason):
                r.reasons[op] = f"{r.reasons[op]} | {reason}" if op in r.reasons else reason
            r.refused_by[op] = "+".join(sorted({*r.refused_by.get(op, "").split("+"), by} - {""}))
        if r.ops:
            shown = ", ".join(f"{op} ({r.reasons[op]})" if op in r.reasons else op for op in r.ops)
            r.detail = _short(shown)
        else:
            r.detail = _short(re.sub(r"^\S*model\.onnx(?: \([^)]*\))?: ", "", msg))
        return r
    last = [ln for ln in stderr.splitlines() if ln.strip()]
    sig = f" (signal {signal.Signals(-rc).name})" if rc < 0 and -rc in signal.valid_signals() else ""
    r.detail = _short(f"exit {rc}{sig}: " + (last[-1] if last else "no stderr"))
    return r


def run_compile(model_dir: Path, path: str, timeout: float, kiln: Sequence[str] | None = None) -> Result:
    """Compile one zoo model for one path in a subprocess and classify the outcome.

    ``kiln`` is the command that runs the CLI (default: :func:`kiln_command`).
    """
    model = model_dir.name
    with tempfile.TemporaryDirectory(prefix=f"kiln-zoo-{model}-{path}-") as tmp:
        out = Path(tmp) / "out"
        cmd = [*(kiln or kiln_command()), "compile", str(model_dir / "model.onnx"), "-o", str(out)]
        cmd += [*path_flags(path), "--inputs", str(model_dir / "inputs.npz")]
        t0 = time.perf_counter()
        proc = subprocess.Popen(
            cmd,
            cwd=tmp,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            errors="replace",
            start_new_session=True,  # its own process group: a timeout kills any workers too
        )
        rc: int | None
        try:
            _, stderr = proc.communicate(timeout=timeout)
            rc = proc.returncode
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            _, stderr = proc.communicate()
            rc = None
        seconds = time.perf_counter() - t0
        manifest = None
        mpath = out / "manifest.json"
        if mpath.is_file():
            try:
                manifest = json.loads(mpath.read_text())
            except json.JSONDecodeError:
                manifest = None
        return classify(model, path, rc, stderr, manifest, seconds)


def cpu_isa() -> str:
    """The CPU and its best SIMD level (from /proc/cpuinfo flags), e.g. ``avx512_vnni``."""
    flags: set[str] = set()
    name = platform.processor() or platform.machine()
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        text = ""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip().lower()
        if key in ("flags", "features") and not flags:
            flags = set(value.split())
        elif key == "model name" and value.strip():
            name = value.strip()
    levels = ["avx512_vnni", "avx512f", "avx2", "avx", "sse4_2", "sve2", "sve", "i8mm", "asimddp", "asimd"]
    found = [f for f in levels if f in flags]
    best = found[0] if found else "unknown"
    return f"{best} ({name}; {os.cpu_count()} cpus; has {', '.join(found) or 'none of ' + ','.join(levels)})"


def kiln_commit() -> str:
    """The repository's HEAD commit, with ``+dirty`` when the work tree has changes."""
    try:
        head = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--short=12", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+dirty" if dirty else "")


def materialize(names: Sequence[str] | None, out_dir: Path) -> None:
    """Write the zoo models (all when ``names`` is None) into ``out_dir`` with ../shared's zoo.py."""
    if not ZOO_TOOL.is_file():
        raise SystemExit(
            f"zoo_matrix: {ZOO_TOOL} is missing (../shared must hold the zoo); or give --zoo-dir"
        )
    which = ",".join(names) if names else "all"
    subprocess.run(
        [sys.executable, str(ZOO_TOOL), "materialize", which, str(out_dir)],
        check=True,
        stdout=subprocess.DEVNULL,
    )


def _line(r: Result) -> str:
    return f"{r.model:<38} {r.path:<9} {r.cls:<13} {r.seconds:7.1f}  {r.detail}"


def count_table(results: Sequence[Result], paths: Sequence[str]) -> str:
    """Per path: how many compiles fell in each class."""
    head = f"{'path':<9} " + " ".join(f"{c:>12}" for c in CLASSES) + f" {'total':>6}"
    lines = [head, "-" * len(head)]
    for p in paths:
        c = Counter(r.cls for r in results if r.path == p)
        lines.append(f"{p:<9} " + " ".join(f"{c[k]:>12}" for k in CLASSES) + f" {sum(c.values()):>6}")
    return "\n".join(lines)


def refused_union(results: Sequence[Result], path: str) -> list[tuple[str, list[str], list[str], str]]:
    """``(op, models it blocks, distinct reasons, stages)`` for one path, most blocking first."""
    models: dict[str, list[str]] = defaultdict(list)
    reasons: dict[str, list[str]] = defaultdict(list)
    stages: dict[str, set[str]] = defaultdict(set)
    for r in results:
        if r.path != path or r.cls != "refused":
            continue
        for op in r.ops or ["(no op named)"]:
            models[op].append(r.model)
            stages[op].update(r.refused_by.get(op, "?").split("+"))
            why = r.reasons.get(op)
            if why and why not in reasons[op]:
                reasons[op].append(why)
    rows = [(op, ms, reasons[op], "+".join(sorted(stages[op]))) for op, ms in models.items()]
    return sorted(rows, key=lambda t: (-len(t[1]), t[0]))


def refused_table(results: Sequence[Result], paths: Sequence[str]) -> str:
    """Per path, every refused op with the number (and names) of the models it blocks."""
    lines = []
    for p in paths:
        rows = refused_union(results, p)
        lines.append(f"[{p}] refused ops (op, models blocked, refused by)" + ("" if rows else ": none"))
        for op, ms, why, stage in rows:
            extra = f"  [{_short('; '.join(why), 60)}]" if why else ""
            lines.append(f"  {op:<24} {len(ms):>3}  {stage:<7} {_short(', '.join(sorted(ms)), 90)}{extra}")
    return "\n".join(lines)


def crash_causes(results: Sequence[Result]) -> list[tuple[str, list[str]]]:
    """``(cause, ["model/path", ...])`` of the crashes, the most frequent cause first."""
    groups: dict[str, list[str]] = defaultdict(list)
    for r in results:
        if r.cls == "crash":
            groups[r.detail].append(f"{r.model}/{r.path}")
    return sorted(groups.items(), key=lambda t: (-len(t[1]), t[0]))


def _zoo_names(zoo_dir: Path) -> list[str]:
    return sorted(d.name for d in zoo_dir.iterdir() if (d / "model.onnx").is_file())


def main(argv: Sequence[str] | None = None) -> int:
    """Compile every requested model x path and print the matrix, the counts and the refused ops."""
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--zoo-dir", type=Path, help="materialized zoo (default: materialize into a temp dir)")
    p.add_argument("--models", default="", help="comma-separated zoo names (default: all)")
    p.add_argument(
        "--paths", default=",".join(DEFAULT_PATHS), help=f"comma-separated, from {','.join(PATHS)}"
    )
    p.add_argument(
        "--source",
        default="zoo",
        help=f"zoo (the exported models) or what onnxruntime makes of them: {', '.join(SOURCES)}",
    )
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per compile (then: crash)")
    p.add_argument("--jobs", type=int, default=1, help="compiles run at the same time")
    p.add_argument("--json", type=Path, metavar="FILE", help="save every result (and the tables' data)")
    p.add_argument(
        "--kiln",
        default="",
        metavar="CMD",
        help="the command that runs the CLI, split on spaces (default: this environment's kiln script)",
    )
    args = p.parse_args(argv)
    paths = [s.strip() for s in args.paths.split(",") if s.strip()]
    bad = [s for s in paths if s not in PATHS]
    if bad or not paths:
        p.error(f"--paths: unknown path(s) {bad} (choose from {', '.join(PATHS)})")
    if args.jobs < 1 or args.timeout <= 0:
        p.error("--jobs must be >= 1 and --timeout > 0")
    wanted = [s.strip() for s in args.models.split(",") if s.strip()] or None
    if args.source != "zoo" and args.source not in SOURCES:
        p.error(f"--source: unknown {args.source!r} (choose from zoo, {', '.join(SOURCES)})")

    with tempfile.TemporaryDirectory(prefix="kiln-zoo-") as tmp:
        zoo_dir = args.zoo_dir
        if zoo_dir is None:
            zoo_dir = Path(tmp) / "zoo"
            print(f"materializing {','.join(wanted) if wanted else 'all'} into {zoo_dir} ...", flush=True)
            materialize(wanted, zoo_dir)
        names = _zoo_names(zoo_dir)
        if wanted:
            missing = [n for n in wanted if n not in names]
            if missing:
                p.error(f"--models: not in {zoo_dir}: {', '.join(missing)}")
            names = [n for n in names if n in wanted]
        skipped: dict[str, str] = {}
        if args.source != "zoo":
            print(f"deriving the {args.source} files ...", flush=True)
            skipped = derive(args.source, zoo_dir, names, Path(tmp) / args.source)
            zoo_dir = Path(tmp) / args.source
            names = [n for n in names if n not in skipped]
            for n, why in sorted(skipped.items()):
                print(f"skipped {n}: onnxruntime's tool failed ({why})")
        isa, commit = cpu_isa(), kiln_commit()
        print(f"cpu isa: {isa}")
        print(f"kiln commit: {commit}")
        print(
            f"source: {args.source}, models: {len(names)} ({len(skipped)} skipped), "
            f"paths: {','.join(paths)}, timeout {args.timeout:g} s, jobs {args.jobs}"
        )
        head = f"{'model':<38} {'path':<9} {'class':<13} {'seconds':>7}  detail"
        print(head)
        print("-" * (len(head) + 40), flush=True)
        kiln = args.kiln.split() or kiln_command()
        t0 = time.perf_counter()
        cases = [(n, pth) for n in names for pth in paths]
        results: list[Result] = []

        def one(case: tuple[str, str]) -> Result:
            r = run_compile(zoo_dir / case[0], case[1], args.timeout, kiln)
            print(_line(r), flush=True)
            return r

        with ThreadPoolExecutor(max_workers=args.jobs) as pool:
            results = list(pool.map(one, cases))
        wall = time.perf_counter() - t0

    print()
    print(count_table(results, paths))
    print()
    print(refused_table(results, paths))
    crashes = crash_causes(results)
    if crashes:
        print()
        print("crashes (by cause):")
        for cause, where in crashes:
            print(f"  {len(where):>3}  {cause}")
            print(f"       {_short(', '.join(where), 150)}")
    imports = sorted({r.model for r in results if r.import_error})
    if imports:
        print(f"\nimport errors (a half-finished change? re-run with --models {','.join(imports)})")
    print(
        f"\nwall time: {wall:.0f} s ({len(cases)} compiles); kiln commit {commit}; cpu isa {isa.split()[0]}"
    )
    if args.json is not None:
        data = {
            "kiln_commit": commit,
            "kiln_command": " ".join(kiln),
            "cpu_isa": isa,
            "paths": paths,
            "source": args.source,
            "skipped": skipped,
            "timeout_s": args.timeout,
            "jobs": args.jobs,
            "wall_s": round(wall, 1),
            "counts": {pth: dict(Counter(r.cls for r in results if r.path == pth)) for pth in paths},
            "refused_ops": {
                pth: [
                    {"op": op, "models": ms, "reasons": why, "refused_by": stage}
                    for op, ms, why, stage in refused_union(results, pth)
                ]
                for pth in paths
            },
            "results": [asdict(r) for r in results],
        }
        args.json.write_text(json.dumps(data, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
