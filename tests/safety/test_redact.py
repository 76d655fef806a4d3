from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from extproc.safety.redact import KINDS, cn_id_ok, find, holdback, iban_ok, luhn_ok, redact


@pytest.mark.parametrize(
    ("text", "out", "counts"),
    [
        ("card 4111 1111 1111 1111 ok", "card [redacted:card] ok", {"card": 1}),
        ("card 4111-1111-1111-1111.", "card [redacted:card].", {"card": 1}),
        ("amex 378282246310005", "amex [redacted:card]", {"card": 1}),
        ("order 12 4111 1111 1111 1111", "order 12 [redacted:card]", {"card": 1}),
        ("not a card 4111 1111 1111 1112", "not a card 4111 1111 1111 1112", {}),  # Luhn fails
        ("id 11010519491231002X.", "id [redacted:cn_id].", {"cn_id": 1}),
        ("id 110105 19491231 002x", "id [redacted:cn_id]", {"cn_id": 1}),
        ("id 110105194912310021", "id 110105194912310021", {}),  # checksum fails
        ("call 13800138000 now", "call [redacted:phone] now", {"phone": 1}),
        ("call +86 138 0013 8000", "call [redacted:phone]", {"phone": 1}),
        ("call (415) 555-2671", "call [redacted:phone]", {"phone": 1}),
        ("call +44 20 7946 0958", "call [redacted:phone]", {"phone": 1}),
        ("mail john.doe+x@example.co.uk.", "mail [redacted:email].", {"email": 1}),
        ("email 张三@例子 is not ascii", "email 张三@例子 is not ascii", {}),
        ("iban DE89 3704 0044 0532 0130 00 OK", "iban [redacted:iban] OK", {"iban": 1}),
        ("iban GB82WEST12345698765432", "iban [redacted:iban]", {"iban": 1}),
        ("iban GB82WEST12345698765433", "iban GB82WEST12345698765433", {}),  # mod-97 fails
        ("v1.2.3, 2024-05-01, 3.14159, 42 apples", "v1.2.3, 2024-05-01, 3.14159, 42 apples", {}),
        ("您的卡号是4111111111111111，请核对", "您的卡号是[redacted:card]，请核对", {"card": 1}),
        ("身份证11010519491231002X号", "身份证[redacted:cn_id]号", {"cn_id": 1}),
        # Read as a person reads them: fullwidth forms, other scripts' digits, unusual spaces.
        ("电话：１３８００１３８０００。", "电话：[redacted:phone]。", {"phone": 1}),
        ("身份证１１０１０５１９４９１２３１００２Ｘ号", "身份证[redacted:cn_id]号", {"cn_id": 1}),
        ("卡号 ４１１１－１１１１－１１１１－１１１１", "卡号 [redacted:card]", {"card": 1}),
        ("card 4111\u00a01111\u202f1111\u20091111 ok", "card [redacted:card] ok", {"card": 1}),
        ("card 4111\u200b1111\u200b1111\u200b1111", "card [redacted:card]", {"card": 1}),
        ("card ٤١١١١١١١١١١١١١١١ ok", "card [redacted:card] ok", {"card": 1}),
        ("mail ｊｏｈｎ＠ｅｘａｍｐｌｅ．ｃｏｍ", "mail [redacted:email]", {"email": 1}),
    ],
)
def test_redact_table(text: str, out: str, counts: dict[str, int]) -> None:
    redacted, found = redact(text)
    assert redacted == out
    assert dict(found) == counts


def test_checksums() -> None:
    assert luhn_ok("4111111111111111") and not luhn_ok("4111111111111112")
    assert cn_id_ok("11010519491231002X") and not cn_id_ok("110105194912310021")
    assert iban_ok("DE89370400440532013000") and not iban_ok("DE89370400440532013001")


def test_kinds_can_be_chosen() -> None:
    assert redact("a@b.io 4111111111111111", ["card"])[0] == "a@b.io [redacted:card]"


@pytest.mark.parametrize(
    ("text", "held"),
    [
        ("Hello there. ", 0),
        ("Hello there", len("there")),  # a word may be the start of an e-mail address
        ("your card is 4111 11", len("4111 11")),
        ("call +", 1),
        ("iban DE89 3704 ", len("DE89 3704 ")),
        ("mail john@exam", len("john@exam")),
    ],
)
def test_holdback_is_only_what_a_match_could_still_need(text: str, held: int) -> None:
    assert holdback(text) == held


# Every match the stream could complete must start inside the held tail.
match_texts = st.sampled_from([
    "4111 1111 1111 1111", "378282246310005", "11010519491231002X", "13800138000", "+86 138 0013 8000",
    "(415) 555-2671", "+44 20 7946 0958", "john.doe@example.com", "DE89 3704 0044 0532 0130 00",
])
prose = st.text(alphabet="abc XYZ.,-:12\u00a0１ｃ", max_size=20)
FULLWIDTH = {c: c + 0xFEE0 for c in range(0x21, 0x7F)}


@given(prose, match_texts, st.booleans(), prose)
def test_every_prefix_of_a_match_is_held(before: str, secret: str, wide: bool, after: str) -> None:
    text = f"{before} {secret.translate(FULLWIDTH) if wide else secret} {after}"
    whole = find(text)
    for cut in range(len(text) + 1):
        head = text[:cut]
        kept = len(head) - holdback(head)
        # a match of the whole text that ends after the cut starts at or after what goes out
        for start, end, _ in whole:
            if end > cut:
                assert start >= kept or end <= kept, (head, kept, start, end)


def test_max_spans_bound_the_patterns() -> None:
    for kind in KINDS.values():
        assert kind.max_span >= 20
