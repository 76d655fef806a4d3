"""The label-agreement report: its rewrites never join two different questions, and its figures
are counts of the pairs it is given."""

from __future__ import annotations

from pathlib import Path

import pytest

from extproc.dedup.calibrate import Pair
from load.label_agreement import band_rows, edits, interval, main, reworded


@pytest.mark.parametrize(
    ("a", "b"),
    [("蚂蚁花呗怎么还款", "花呗如何还款？"), ("为啥借呗用不了呢", "为什么借呗用不了"),
     ("查一下账单", "查账单")],
)
def test_rewordings_that_cannot_change_the_question_are_made_equal(a: str, b: str) -> None:
    assert reworded(a) == reworded(b)


@pytest.mark.parametrize(
    ("a", "b"),
    [("花呗能用吗", "花呗不能用吗"), ("花呗怎么还款", "借呗怎么还款"), ("推迟三天还款", "推迟一天还款"),
     ("how do I pay", "how do I not pay")],
)
def test_a_difference_that_matters_is_kept(a: str, b: str) -> None:
    assert reworded(a) != reworded(b)


def test_edits_name_only_the_differing_fragments() -> None:
    assert edits("花呗付款要密码吗", "蚂蚁花呗付款要密码吗") == "+蚂蚁"
    assert edits("推迟三天还款", "推迟一天还") == "三→一, -款"


def test_bands_count_the_pairs_and_the_share_labelled_same() -> None:
    pairs = [Pair("abcdefghij", "abcdefghij!", True), Pair("abcdefghij", "abcdefghiX", False),
             Pair("abcdefghij", "abcdefghiX", True), Pair("abc", "xyz", True)]
    rows = band_rows(pairs)
    top = rows[0].split(" | ")
    assert top[1:3] == ["1", "1"]  # the pair equal in near-exact form, labelled same
    nine = next(r for r in rows if r.startswith("| 0.90"))
    assert nine.split(" | ")[1:3] == ["2", "1"]  # one edit in ten: labelled both ways
    assert rows[-1].endswith("| 0.667 |")  # 2 of the 3 labelled same reached from the top
    assert interval(0, 0) == "—" and interval(4, 4).startswith("1.000 (0.5")


def test_report_on_the_shared_pairs(tmp_path: Path) -> None:
    out = tmp_path / "agreement.md"
    main(["--out", str(out)])
    text = out.read_text(encoding="utf-8")
    assert "20,000 pairs, 3,688 labelled same" in text
    assert "7,249 pairs, 1,670 with score >= 4" in text
    assert "| +蚂蚁 |" in text  # a product's full name for its short one, labelled different
