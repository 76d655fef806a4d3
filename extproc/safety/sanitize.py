"""Hidden characters in prompt text: find them, count them by kind, strip them.

A character is hidden when it changes what a model reads without showing on a screen:
zero-width characters and invisible operators, bidirectional controls (text that reads
one way and is stored another), Unicode tag characters (a whole ASCII instruction can be
written in tags), soft hyphens, NUL and the other C0/C1 controls (except tab, newline and
carriage return), and variation selectors where they hide data rather than choose a glyph.

A variation selector is kept only where it can choose a glyph: one selector right after a
visible character (U+FE00-U+FE0F after any, U+E0100-U+E01EF after a Han ideograph). A run
of selectors, or one after a space, a control or nothing, carries bytes, not a glyph.
Everything else is left exactly as it was.
"""

from __future__ import annotations

import re
from collections import Counter

KINDS = ("control", "zero_width", "bidi", "tag", "variation_selector", "soft_hyphen")

_RANGES: dict[str, tuple[tuple[int, int], ...]] = {
    "control": ((0x00, 0x08), (0x0B, 0x0C), (0x0E, 0x1F), (0x7F, 0x9F)),
    "zero_width": ((0x200B, 0x200D), (0x2060, 0x2064), (0xFEFF, 0xFEFF), (0x180E, 0x180E)),
    "bidi": ((0x200E, 0x200F), (0x202A, 0x202E), (0x2066, 0x2069), (0x061C, 0x061C)),
    "tag": ((0xE0000, 0xE007F),),
    "variation_selector": ((0xFE00, 0xFE0F), (0xE0100, 0xE01EF)),
    "soft_hyphen": ((0x00AD, 0x00AD),),
}


def _kind_table() -> dict[int, str]:
    return {cp: kind for kind, spans in _RANGES.items() for lo, hi in spans for cp in range(lo, hi + 1)}


KIND_OF: dict[int, str] = _kind_table()  # read-only after import
_CLASS = "".join(f"\\U{lo:08x}-\\U{hi:08x}" for spans in _RANGES.values() for lo, hi in spans)
_CANDIDATE = re.compile(f"[{_CLASS}]")
_SUPPLEMENTARY_VS = 0xE0100
# Han ideographs (unified, extensions, compatibility): the bases of ideographic variation sequences.
_HAN = re.compile("[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0003134f]")


def _selector_kept(prev: str | None, vs: str) -> bool:
    """Whether a variation selector after `prev` (the last character kept) can choose a glyph."""
    if prev is None or prev.isspace() or ord(prev) in KIND_OF:
        return False
    if ord(vs) >= _SUPPLEMENTARY_VS:
        return _HAN.match(prev) is not None
    return True


def has_candidates(text: str) -> bool:
    """The fast path: almost every prompt has no character that could be hidden."""
    return _CANDIDATE.search(text) is not None


def sanitize(text: str) -> tuple[str, Counter[str]]:
    """`text` without its hidden characters, and how many of each kind were removed."""
    removed: Counter[str] = Counter()
    if not has_candidates(text):
        return text, removed
    out: list[str] = []
    prev: str | None = None
    for ch in text:
        kind = KIND_OF.get(ord(ch))
        if kind is None:
            out.append(ch)
            prev = ch
        elif kind == "variation_selector" and _selector_kept(prev, ch):
            out.append(ch)
            prev = ch  # a second selector after this one is a run: removed
        else:
            removed[kind] += 1
    return "".join(out), removed
