"""The LSH recall benchmark's samples: a centre is fitted on pairs the measurement never uses."""

from __future__ import annotations

from pathlib import Path

from extproc.cache.center import read_prompts
from load.lsh_recall import TEMPLATE, main


def test_the_fit_sample_is_the_pairs_after_the_measured_ones_as_request_bodies(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    rows = [f"stored {i}\tquery {i}\t4.0" for i in range(10)]
    (data / "stsb-en.train.tsv").write_text("\n".join(rows) + "\n")
    out = tmp_path / "fit.jsonl"
    args = ["--lang", "en", "--template", "--data", str(data), "--write-prompts", str(out)]
    assert main([*args, "--skip", "6", "--n", "3"]) == 0
    texts, skipped = read_prompts(out)  # what `llm-gate lsh-center --prompts` reads
    assert skipped == 0
    assert texts == [TEMPLATE["en"].format(t) for t in ("stored 6", "stored 7", "stored 8",
                                                          "query 6", "query 7", "query 8")]
