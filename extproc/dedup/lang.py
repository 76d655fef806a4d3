"""The language a prompt is judged in: operating points are per embedder and language."""

from __future__ import annotations

import re
from functools import lru_cache

_HAN = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]")
_KANA = re.compile(r"[\u3040-\u30ff]")
_HANGUL = re.compile(r"[\uac00-\ud7af]")
_LATIN = re.compile(r"[A-Za-z\u00c0-\u024f]+")


@lru_cache(maxsize=4096)  # asked for a query before its embedding and for each of its pairs
def language(text: str) -> str:
    """'zh', 'ja', 'ko', 'en' (any Latin-script text), 'other', or '' for text without letters."""
    kana, hangul, han = len(_KANA.findall(text)), len(_HANGUL.findall(text)), len(_HAN.findall(text))
    latin = len(_LATIN.findall(text))
    if kana:
        return "ja"
    if hangul > han:
        return "ko"
    if han and han * 2 >= latin:  # Han characters against Latin words
        return "zh"
    if latin:
        return "en"
    return "other" if any(ch.isalpha() for ch in text) else ""
