from __future__ import annotations

import json
from pathlib import Path

import pytest

from extproc.dedup.calibrate import main, read_pairs, subsample

DATA = Path.cwd().parent / "shared" / "data" / "paraphrase"


def test_read_pairs_binary_and_scored(tmp_path: Path) -> None:
    f = tmp_path / "p.tsv"
    f.write_text("a\tb\t1\nc\td\t0\n", encoding="utf-8")
    assert [p.same for p in read_pairs(f)] == [True, False]
    f.write_text("a\tb\t4.2\nc\td\t3.8\n", encoding="utf-8")
    assert [p.same for p in read_pairs(f, cut=4.0)] == [True, False]


@pytest.mark.skipif(not DATA.is_dir(), reason="calibration data not at ../shared/data/paraphrase")
def test_calibrate_cli_fits_and_reports(
    model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pairs = subsample(read_pairs(DATA / "stsb-en.dev.tsv"), 600)
    f = tmp_path / "mine.tsv"
    f.write_text("".join(f"{p.a}\t{p.b}\t{int(p.same)}\n" for p in pairs), encoding="utf-8")
    out = tmp_path / "policy.json"
    rc = main([str(f), "--embedder", "minilm", "--model-dir", str(model_dir), "--out", str(out)])
    assert rc == 0
    printed = capsys.readouterr().out
    assert "| cosine | cos>=0.80 |" in printed and "cosine+guards+verifier" in printed
    assert "target precision 0.95" in printed
    doc = json.loads(out.read_text(encoding="utf-8"))
    assert "en" in doc["embedders"]["minilm"]
