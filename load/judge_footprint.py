"""Resident memory of the e5-small embedder with and without the pair judge, in one process.

    python -m load.judge_footprint

Loads the embedder as the gate does (one thread), embeds 600 prompts with their token states,
then loads the judge and judges 600 pairs; prints the process's resident set after each step.
"""

from __future__ import annotations

from pathlib import Path

from extproc.dedup.align import alignment
from extproc.dedup.calibrate import default_data_dir
from extproc.dedup.judge import judge_features, load_judge
from extproc.embed import load_embedder


def rss_mb() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS"):
            return int(line.split()[1]) // 1024
    return 0


def main() -> int:
    data = default_data_dir()
    texts = [
        r.split("\t")[0] for r in (data / "atec-zh.valid.tsv").read_text(encoding="utf-8").splitlines()[:300]
    ]
    texts += [
        r.split("\t")[0] for r in (data / "stsb-en.dev.tsv").read_text(encoding="utf-8").splitlines()[:300]
    ]
    start = rss_mb()
    emb = load_embedder("e5-small", None, threads=1)
    states = []
    vectors = []
    for i in range(0, len(texts), 32):
        vec, st = emb.embed_with_states(texts[i : i + 32])
        states += st
        vectors += list(vec)
    embedded = rss_mb()
    judge = load_judge()
    for i in range(len(texts) - 1):
        a, b = states[i], states[i + 1]
        align = alignment(a.pieces, a.vectors, b.pieces, b.vectors)
        cos = float(vectors[i] @ vectors[i + 1])
        judge.score(a.vectors, b.vectors, judge_features(texts[i], texts[i + 1], cos, align))
    print(f"interpreter and imports: {start} MB resident")
    print(f"+ e5-small embedder, 600 prompts embedded with token states: {embedded} MB")
    print(f"+ pair judge, 599 pairs judged: {rss_mb()} MB (judge: +{rss_mb() - embedded} MB)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
