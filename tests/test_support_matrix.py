"""`kiln ops`: the op x backend matrix comes from the tables, and the README's copy is fresh."""

from __future__ import annotations

import json

import pytest

from compiler.cli import main
from compiler.support_matrix import format_markdown, support_matrix
from tests.conftest import ROOT

BEGIN, END = "<!-- kiln ops: begin -->", "<!-- kiln ops: end -->"


def test_readme_matrix_is_fresh() -> None:
    text = (ROOT / "README.md").read_text()
    shown = text.split(BEGIN, 1)[1].split(END, 1)[0].strip()
    assert shown == format_markdown(support_matrix()).strip(), (
        "README's op matrix is stale: run python -m compiler.support_matrix --update-readme"
    )


def test_matrix_classes(capsys: pytest.CaptureFixture[str]) -> None:
    rows = support_matrix().rows
    assert rows["Conv"]["mnn"].status == rows["Conv"]["cann"].status == rows["Conv"]["tvm"].status == "native"
    # LogSoftmax: MNN through the decomposition library, TVM natively
    assert rows["LogSoftmax"]["mnn"].status == "decomposed"
    assert "log-softmax" in rows["LogSoftmax"]["mnn"].detail
    assert rows["LogSoftmax"]["tvm"].status == "native"
    # Loop: unrolled (a static trip count) for CANN; refused cells name the backend
    assert rows["Loop"]["cann"].status == "decomposed" and rows["Loop"]["cann"].detail == "unroll-loop"
    assert (
        rows["NonZero"]["cann"].status == "refused" and "no cann lowering" in rows["NonZero"]["cann"].detail
    )
    # Compress: a Gather of NonZero's positions where NonZero is native, of constant ones elsewhere
    assert rows["Compress"]["tvm"].detail == "compress-nonzero"
    assert rows["Compress"]["cann"].detail == "compress-constant-gather"
    assert main(["ops", "--json", "--backend", "mnn"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert set(doc["Conv"]) == {"mnn"} and doc["Conv"]["mnn"]["status"] == "native"
