"""How far the paraphrase labels agree with themselves: the precision a matcher can be measured at.

    python -m load.label_agreement [--data DIR] [--out load/results/label_agreement.md]

The dedup bars are precision against labels. A pair whose two questions differ only by a
rewording that cannot change what is asked (a product's full name for its short one, 如何 for
怎么, a closing 吗) is the same question; a matcher that served only such pairs would be right
every time, yet it is measured at the rate the labels call them the same. This reads every pair
of ATEC and STS-B in place (nothing is fitted, so no split is needed) and reports, with 95%
Wilson intervals:

- ATEC pairs made equal by the rewrites below: how often they are labelled the same;
- ATEC and STS-B by character similarity of the two texts (the shipped near-exact form, then
  difflib's ratio): the share labelled the same in each band, from the most alike down;
- the edits that separate the most alike ATEC pairs labelled different (the differing
  fragments only, not the questions).
"""

from __future__ import annotations

import argparse
import difflib
import re
from collections import Counter
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path

from extproc.dedup.calibrate import Pair, default_data_dir, read_pairs
from extproc.dedup.canonical import canonical
from extproc.dedup.guards import guard
from extproc.dedup.selfcheck import wilson_lower

RESULTS = Path(__file__).parent / "results" / "label_agreement.md"
# Rewordings that cannot change a customer-service question: the products' full names (蚂蚁花呗
# is 花呗), the plain synonyms of "how" and "why", 一下 ("a bit": 查一下 is 查), and below, a
# closing particle and the punctuation.
REWRITES = (("蚂蚁花呗", "花呗"), ("蚂蚁借呗", "借呗"), ("如何", "怎么"), ("怎样", "怎么样"),
            ("为何", "为什么"), ("为啥", "为什么"), ("一下", ""))
_CLOSING = re.compile(r"[吗呢么啊呀吧]*[\s?？!！。.,，]*$")
_PUNCT = re.compile(r"[\s?？!！。.,，、]+")
BANDS = (0.95, 0.9, 0.85, 0.8, 0.75, 0.7, 0.6, 0.5)


def reworded(text: str) -> str:
    text = canonical(text)
    for old, new in REWRITES:
        text = text.replace(old, new)
    return _PUNCT.sub("", _CLOSING.sub("", text))


def similarity(a: str, b: str) -> float:
    return difflib.SequenceMatcher(None, canonical(a).lower(), canonical(b).lower(), autojunk=False).ratio()


def edits(a: str, b: str) -> str:
    """What separates two texts, fragment by fragment: `x→y`, `+y`, `-x`."""
    a, b = canonical(a), canonical(b)
    parts = []
    for op, i1, i2, j1, j2 in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
        if op == "replace":
            parts.append(f"{a[i1:i2]}→{b[j1:j2]}")
        elif op == "delete":
            parts.append(f"-{a[i1:i2]}")
        elif op == "insert":
            parts.append(f"+{b[j1:j2]}")
    return ", ".join(parts)


def interval(same: int, n: int) -> str:
    if n == 0:
        return "—"
    return f"{same / n:.3f} ({wilson_lower(same, n):.3f}–{1 - wilson_lower(n - same, n):.3f})"


def band_rows(pairs: Iterable[Pair]) -> list[str]:
    """Per similarity band (and cumulatively from the top): pairs, labelled same, the share."""
    scored = [(similarity(p.a, p.b), p.same) for p in pairs]
    total_same = sum(s for _, s in scored)
    rows, upper = [], 1.01
    cum_n = cum_same = 0
    for low in BANDS:
        inside = [s for sim, s in scored if low <= sim < upper]
        n, same = len(inside), sum(inside)
        cum_n, cum_same = cum_n + n, cum_same + same
        rows.append(f"| {low:.2f}–{min(upper, 1.0):.2f} | {n} | {same} | {interval(same, n)} | "
                    f"{interval(cum_same, cum_n)} | {cum_same / max(total_same, 1):.3f} |")
        upper = low
    return rows


BAND_HEAD = [
    "| similarity | pairs | labelled same | share same (95% interval) "
    "| from the top: share same (95% interval) | from the top: recall |",
    "|---|---:|---:|---|---|---:|",
]


def report(data: Path) -> str:
    atec = read_pairs(data / "atec-zh.valid.tsv", "binary")
    stsb = read_pairs(data / "stsb-en.train.tsv", "score") + read_pairs(data / "stsb-en.dev.tsv", "score")
    equal = [p for p in atec if reworded(p.a) == reworded(p.b)]
    guarded = [p for p in atec if guard(p.a, p.b, swaps=()) is None]
    near_apart = [p for p in guarded if not p.same and similarity(p.a, p.b) >= 0.85]
    kinds = Counter(edits(p.a, p.b) for p in near_apart)
    now = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    same_eq = sum(p.same for p in equal)
    lines = [
        f"# How far the paraphrase labels agree with themselves ({now})",
        "",
        "`python -m load.label_agreement` reads every pair of the shared paraphrase files in place "
        "(nothing is fitted). The dedup bars are precision against these labels: a matcher that "
        "serves only true duplicates is measured at the rate at which the labels call the same "
        "question the same.",
        "",
        "## ATEC: pairs equal once reworded in ways that cannot change the question",
        "",
        "Rewrites: " + ", ".join(f"{a}→{b or '(nothing)'}" for a, b in REWRITES)
        + "; a closing 吗/呢/么/啊/呀/吧 and all punctuation dropped (after the shipped near-exact form).",
        "",
        "| ATEC pairs | made equal | labelled same | share same (95% interval) |",
        "|---:|---:|---:|---|",
        f"| {len(atec):,} | {len(equal)} | {same_eq} | {interval(same_eq, len(equal))} |",
        "",
        "## ATEC by character similarity",
        "",
        f"{len(atec):,} pairs, {sum(p.same for p in atec):,} labelled same. Similarity: difflib's "
        "ratio of the two texts in the shipped near-exact form.",
        "",
        *BAND_HEAD,
        *band_rows(atec),
        "",
        f"The {len(guarded):,} of them the guards let through "
        f"({sum(p.same for p in guarded):,} labelled same): "
        "the guards that veto where a difference is exact by nature (numbers, amounts, dates, ids, "
        "negation, antonyms, direction, entities), without the small-edit swaps, so a pair that "
        "differs by a harmless word stays in.",
        "",
        *BAND_HEAD,
        *band_rows(guarded),
        "",
        "## STS-B (en, train + dev) by character similarity, score >= 4 = same",
        "",
        f"{len(stsb):,} pairs, {sum(p.same for p in stsb):,} with score >= 4 (lower case).",
        "",
        *BAND_HEAD,
        *band_rows(stsb),
        "",
        f"## What separates the {len(near_apart)} most alike ATEC pairs the guards pass, labelled different "
        "(similarity >= 0.85)",
        "",
        "The differing fragments only (`x→y` replaced, `+y` added, `-x` dropped), most common first.",
        "",
        "| edit | pairs |",
        "|---|---:|",
        *(f"| {kind or '(none)'} | {n} |" for kind, n in kinds.most_common()),
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=None, help="the paraphrase folder (default: found)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    text = report(args.data or default_data_dir())
    args.out.write_text(text, encoding="utf-8")
    print(text)


if __name__ == "__main__":
    main()
