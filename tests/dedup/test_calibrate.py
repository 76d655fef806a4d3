from __future__ import annotations

import json
from pathlib import Path

import pytest

from extproc.dedup.calibrate import LabelError, main, parse_spec, read_pairs, subsample
from extproc.dedup.selfcheck import wilson_lower

DATA = Path("/work/shared/data/paraphrase")
if not DATA.is_dir():
    DATA = Path.cwd().parent / "shared" / "data" / "paraphrase"


def test_label_kinds_are_read_as_declared(tmp_path: Path) -> None:
    f = tmp_path / "p.tsv"
    f.write_text("a\tb\t1\nc\td\t0\n", encoding="utf-8")
    assert [p.same for p in read_pairs(f, "binary")] == [True, False]
    f.write_text("a\tb\t4.2\nc\td\t3.8\ne\tf\t1\n", encoding="utf-8")
    assert [p.same for p in read_pairs(f, "score", cut=4.0)] == [True, False, False]


def test_input_that_would_be_misread_is_refused(tmp_path: Path) -> None:
    scored, binary = tmp_path / "s.tsv", tmp_path / "b.tsv"
    scored.write_text("a\tb\t4.2\nc\td\t1\n", encoding="utf-8")
    binary.write_text("a\tb\t1\nc\td\t0\n", encoding="utf-8")
    with pytest.raises(LabelError, match="binary labels must be 0 or 1"):
        read_pairs(scored, "binary")
    with pytest.raises(LabelError, match="read it as :binary"):
        read_pairs(binary, "score")  # every 1 would have become "different"
    with pytest.raises(LabelError, match="FILE:binary"):
        parse_spec(str(binary))
    assert parse_spec(f"{binary}:binary") == (binary, "binary")
    # the CLI refuses a mix it would misread instead of fitting on it
    assert main([f"{binary}:binary", f"{binary}:score"]) == 2


def test_wilson_lower_bound() -> None:
    assert wilson_lower(0, 0) == 0.0
    assert wilson_lower(20, 20) == pytest.approx(0.839, abs=1e-3)  # 20 of 20 is not 0.95 yet
    assert wilson_lower(73, 73) >= 0.95 > wilson_lower(72, 72)
    assert wilson_lower(95, 100) == pytest.approx(0.888, abs=1e-3)


@pytest.mark.skipif(not DATA.is_dir(), reason="calibration data not at ../shared/data/paraphrase")
def test_calibrate_cli_fits_and_reports(
    model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pairs = subsample(read_pairs(DATA / "stsb-en.dev.tsv", "score"), 400)
    f = tmp_path / "mine.tsv"
    f.write_text("".join(f"{p.a}\t{p.b}\t{int(p.same)}\n" for p in pairs), encoding="utf-8")
    out = tmp_path / "policy.json"
    argv = [f"{f}:binary", "--embedder", "minilm", "--model-dir", str(model_dir), "--out", str(out)]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert (
        "| cosine | cos>=0.80 |" in printed and "guards+verifier" in printed and "95% lower bound" in printed
    )
    assert "target precision 0.95 (lower bound" in printed
    doc = json.loads(out.read_text(encoding="utf-8"))
    assert "en" in doc["embedders"]["minilm"]
