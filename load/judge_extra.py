"""More labelled question pairs for fitting the pair judge (never for selecting or reporting).

Read in place from clones of public repositories at pinned commits, REPOS/<owner>/<name>
(nothing is copied into the project):
  zh  bq      BQ_corpus dev and test: bank customer-service questions (WeBank), the domain
              nearest ATEC's (IceFlameWorm/NLP_Datasets)
  zh  lcqmc   LCQMC dev and test: open-domain questions (Baidu Zhidao), same repository
  en  qqp     the first 9,998 pairs of Quora Question Pairs (ask95/quora-duplicate-questions)
  en  mqp     medical question pairs, a doctor's similar and dissimilar rewrites of a patient
              question (curai/medical-question-pair-dataset)
The train parts of BQ and LCQMC and the whole of QQP are not in those snapshots. The ATEC and
ATEC_CCKS folders of IceFlameWorm/NLP_Datasets are never read: they hold ATEC pairs, which may
be the report part's. A pair with a text that a shared paraphrase file holds is dropped, so no
selection or report text is ever fitted on.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from extproc.dedup.calibrate import Pair

from . import pinned

Row = tuple[str, str, str]  # text, text, label "0" | "1"


def _tsv(text: str) -> list[Row]:
    return [(r[0], r[1], r[2]) for r in (line.split("\t") for line in text.splitlines()) if len(r) >= 3]


def _csv_header(text: str) -> list[Row]:  # sentence1,sentence2,label
    return [(r[0], r[1], r[2]) for r in list(csv.reader(io.StringIO(text)))[1:] if len(r) >= 3]


def _qqp(text: str) -> list[Row]:  # id qid1 qid2 question1 question2 is_duplicate; quoted newlines
    rows = list(csv.reader(io.StringIO(text), delimiter="\t"))[1:]
    return [(r[3], r[4], r[5]) for r in rows if len(r) >= 6]


def _mqp(text: str) -> list[Row]:  # dr_id, question1, question2, label; no header
    return [(r[1], r[2], r[3]) for r in csv.reader(io.StringIO(text)) if len(r) >= 4]


@dataclass(frozen=True)
class Source:
    name: str
    lang: str
    repo: str
    commit: str
    paths: tuple[str, ...]
    rows: Callable[[str], list[Row]]


NLP_DATASETS = ("IceFlameWorm/NLP_Datasets", "a2203a7361b6386dd8d8b64f5d600aa1ec730d0d")
SOURCES = (
    Source("bq", "zh", *NLP_DATASETS, ("BQ_corpus/dev.csv", "BQ_corpus/test.csv"), _csv_header),
    Source("lcqmc", "zh", *NLP_DATASETS, ("LCQMC/dev.txt", "LCQMC/test.txt"), _tsv),
    Source("qqp", "en", "ask95/quora-duplicate-questions", "185e1b1abba9573f62a8398db1aaa10e18cf4998",
           ("data/mini_quora_duplicate_questions.tsv",), _qqp),
    Source("mqp", "en", "curai/medical-question-pair-dataset", "6c7f7fd7a53cedc6fec105c0c6cb78f2e9a82cd1",
           ("mqp.csv",), _mqp),
)
NAMES = frozenset(s.name for s in SOURCES)


def shared_texts(data: Path) -> set[str]:
    """Every sentence of the shared paraphrase files."""
    out: set[str] = set()
    for f in data.glob("*.tsv"):
        for line in f.read_text(encoding="utf-8").splitlines():
            out.update(line.split("\t")[:2])
    return out


def extra_pairs(repos: Path, lang: str, exclude: set[str]) -> list[Pair]:
    """One language's fit-only pairs, first occurrence of each, none touching ``exclude``."""
    seen: set[tuple[str, str]] = set()
    out = []
    for source in SOURCES:
        if source.lang != lang:
            continue
        for path in source.paths:
            text = pinned.blob(repos, source.repo, source.commit, path).decode("utf-8-sig")
            for a, b, label in source.rows(text):
                a, b, label = a.strip(), b.strip(), label.strip()
                if label not in ("0", "1") or not a or not b or a in exclude or b in exclude:
                    continue
                if (a, b) in seen or (b, a) in seen:
                    continue
                seen.add((a, b))
                out.append(Pair(a, b, label == "1", source.name, "fit"))
    return out
