"""The architecture zoo (../shared/zoo) in tests: named models materialized once per session.

The zoo stores each model without its weights; ``../shared/tools/zoo/zoo.py materialize`` writes
the full ``model.onnx`` (deterministic), ``inputs.npz`` (batch 1), ``calib.npz`` (8 samples on a
leading axis) and ``meta.json``. The session fixture :func:`zoo` materializes a model the first time
a test asks for it, into one session-scoped temporary directory, and hands back its paths::

    from tests.helpers.zoo import zoo  # noqa: F401 - the session fixture

    def test_resnet(zoo: ZooCache) -> None:
        m = zoo.get("resnet18")                      # ZooModel: .model, .inputs, .calib, .meta
        a, b = zoo.get_many(["bert", "gpt2"])        # one zoo.py call for both

A missing ../shared (or zoo tool, or an unknown name) is a test failure, never a skip.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import SHARED

__all__ = ["ZOO", "ZOO_TOOL", "ZooModel", "ZooCache", "zoo_names", "zoo"]

ZOO = SHARED / "zoo"
ZOO_TOOL = SHARED / "tools" / "zoo" / "zoo.py"
MATERIALIZE_TIMEOUT_S = 900


@dataclass(frozen=True)
class ZooModel:
    """The files of one materialized zoo model."""

    name: str
    model: Path
    inputs: Path
    calib: Path
    meta: Path


def _require_shared() -> None:
    if not SHARED.is_dir():
        pytest.fail(f"../shared is missing (expected at {SHARED}); CI must provide it", pytrace=False)
    if not ZOO_TOOL.is_file() or not ZOO.is_dir():
        pytest.fail(f"the zoo is missing from ../shared (expected {ZOO} and {ZOO_TOOL})", pytrace=False)


def zoo_names() -> list[str]:
    """Every model name in ../shared/zoo, sorted (usable at collection time, e.g. to parametrize)."""
    _require_shared()
    return sorted(d.name for d in ZOO.iterdir() if (d / "model.skel.onnx").is_file())


class ZooCache:
    """Zoo models materialized on demand under ``root``, each at most once."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def _entry(self, name: str) -> ZooModel:
        d = self.root / name
        return ZooModel(name, d / "model.onnx", d / "inputs.npz", d / "calib.npz", d / "meta.json")

    def _ready(self, name: str) -> bool:
        m = self._entry(name)
        return all(p.is_file() for p in (m.model, m.inputs, m.calib, m.meta))

    def get_many(self, names: Sequence[str]) -> list[ZooModel]:
        """The models ``names`` (in that order); the missing ones are written by one zoo.py call."""
        _require_shared()
        unknown = [n for n in names if not (ZOO / n / "model.skel.onnx").is_file()]
        if unknown:
            pytest.fail(f"no zoo model(s) {unknown} in {ZOO}", pytrace=False)
        todo = sorted({n for n in names if not self._ready(n)})
        if todo:
            proc = subprocess.run(
                [sys.executable, str(ZOO_TOOL), "materialize", ",".join(todo), str(self.root)],
                capture_output=True,
                text=True,
                timeout=MATERIALIZE_TIMEOUT_S,
            )
            if proc.returncode != 0 or not all(self._ready(n) for n in todo):
                pytest.fail(
                    f"zoo.py materialize {','.join(todo)} failed (exit {proc.returncode}): "
                    f"{proc.stderr.strip()[-2000:]}",
                    pytrace=False,
                )
        return [self._entry(n) for n in names]

    def get(self, name: str) -> ZooModel:
        """One model's paths (materialized on first use)."""
        return self.get_many([name])[0]


@pytest.fixture(scope="session")
def zoo(tmp_path_factory: pytest.TempPathFactory) -> ZooCache:
    """The session's zoo: models are materialized into one session temp directory on first use."""
    _require_shared()
    return ZooCache(tmp_path_factory.mktemp("zoo"))
