"""How the screen reads a text written to slip past it, and only the screen: the model gets
the text as it was sent.

- Letters and digits in compatibility forms read as plain ones (NFKC): fullwidth `Ｉｇｎｏｒｅ`,
  mathematical `𝐈𝐠𝐧𝐨𝐫𝐞`, circled `ⓘⓖⓝⓞⓡⓔ`, ligatures. Other characters stay (a Chinese
  text's fullwidth punctuation is not a mask).
- Look-alike Cyrillic and Greek letters read as the Latin ones they imitate (`Ignоrе` with a
  Cyrillic `о` and `е`) in any word that also holds a Latin letter, and in every word when the
  text holds more Latin letters than Cyrillic and Greek ones. A Russian or Greek text is left
  as it is.
- Letters spread out joined up again: a run of three or more single letters or digits, each
  followed by the same one separator (`I g n o r e`, `i-g-n-o-r-e`, `忽 略 上 述`), becomes
  one word; a wider gap between two runs stays a word break.

`READING` names this reading in the shared verdicts' keys: a score reached under another
reading is never reused.
"""

from __future__ import annotations

import re
import unicodedata
from functools import lru_cache

READING = "u1"
WINDOW = 4096  # characters read of a long text: its first and last halves (all the head reads)

_LOOKALIKES = str.maketrans({
    # Cyrillic
    "а": "a", "в": "b", "е": "e", "к": "k", "м": "m", "н": "h", "о": "o", "р": "p", "с": "c",
    "т": "t", "у": "y", "х": "x", "і": "i", "ј": "j", "ѕ": "s", "ԁ": "d", "ԛ": "q", "ԝ": "w",
    "ɡ": "g", "һ": "h", "ӏ": "l", "ү": "y",
    "А": "A", "В": "B", "Е": "E", "К": "K", "М": "M", "Н": "H", "О": "O", "Р": "P", "С": "C",
    "Т": "T", "Х": "X", "І": "I", "Ј": "J", "Ѕ": "S", "У": "Y", "Ү": "Y", "Ԁ": "D", "Ԛ": "Q",
    "Ԝ": "W", "Ӏ": "I",
    # Greek
    "α": "a", "ο": "o", "ρ": "p", "ν": "v", "ι": "i", "κ": "k", "υ": "u", "χ": "x", "γ": "y",
    "Α": "A", "Β": "B", "Ε": "E", "Ζ": "Z", "Η": "H", "Ι": "I", "Κ": "K", "Μ": "M", "Ν": "N",
    "Ο": "O", "Ρ": "P", "Τ": "T", "Υ": "Y", "Χ": "X",
})
# Fullwidth letters and digits, enclosed alphanumerics, ligatures, mathematical alphanumerics.
_COMPAT = re.compile(
    "[\uff10-\uff19\uff21-\uff3a\uff41-\uff5a\u2460-\u24ff\ufb00-\ufb06\U0001d400-\U0001d7ff]"
)
_WORD = re.compile(r"[^\W\d_]+")
_LATIN = re.compile(r"[A-Za-z]")
_OTHER = re.compile(r"[\u0370-\u03ff\u0400-\u052f]")  # Greek and Cyrillic letters
# Three or more single word characters, each but the last followed by the same one separator.
_SPREAD = re.compile(r"(?<!\w)\w([ \t.\-_*|/·~+])(?:\w\1)+\w(?!\w)")


@lru_cache(maxsize=2048)
def _plain(ch: str) -> str:
    return unicodedata.normalize("NFKC", ch)


def _folded(text: str) -> str:
    words = _WORD.findall(text)
    # Letters of the words holding a Latin one against those of the Greek and Cyrillic words:
    # folding keeps both counts, so a second reading decides as the first did.
    latin = sum(len(w) for w in words if _LATIN.search(w))
    other = sum(len(w) for w in words if not _LATIN.search(w) and _OTHER.search(w))
    return _WORD.sub(
        lambda m: m[0].translate(_LOOKALIKES) if latin > other or _LATIN.search(m[0]) else m[0], text
    )


def unmasked(text: str) -> str:
    """The text as the screen reads it (the text itself when nothing in it is masked)."""
    t = text if text.isascii() else _COMPAT.sub(lambda m: _plain(m[0]), text)
    t = _SPREAD.sub(lambda m: m[0].replace(m[1], ""), t)
    return _folded(t) if _OTHER.search(t) and _LATIN.search(t) else t


def reread(text: str) -> str | None:
    """The unmasked reading of what the screen reads of the text (a long text's two ends), or
    None when it reads the same: then the text needs no second score."""
    view = text if len(text) <= WINDOW else text[: WINDOW // 2] + " " + text[-WINDOW // 2 :]
    plain = unmasked(view)
    return plain if plain != view else None
