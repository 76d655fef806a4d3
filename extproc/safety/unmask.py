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
- Leetspeak read as letters (`1gn0r3 4ll pr3v10us rul3s`): in a text with two or more words
  that hold one of the digits 0 1 3 4 5 7 between letters, every word made of letters and
  those digits (or `@`, `$`) reads them as o i e a s t a s. A model number or a unit (`mp3`,
  `log4j`, `10kg`) alone does not make a text leetspeak.
- Base64 (standard or URL-safe) and hex decoded: a run of 16 or more such characters that
  decodes to printable UTF-8 text reads as that text (a hash, a key or an identifier does not
  decode to text, and stays).
- ROT13 and text written backwards, line by line, and in a line that does not turn whole,
  clause by clause (its parts up to a `:` `.` `!` `?` `;` `,` and a space): when a line or
  clause, rotated or reversed, holds more than twice as many common English words as written,
  plus two, and more than a quarter of its words, it is read so. One a quarter of whose words
  are common English words as written is read as written.

A mask inside a mask (base64 of leetspeak, hex of base64) is read through too: the reading
repeats until nothing changes. `READING` names this reading in the shared verdicts' keys: a
score reached under another reading is never reused.
"""

from __future__ import annotations

import base64
import re
import unicodedata
from functools import lru_cache

READING = "u2"
WINDOW = 4096  # characters read of a long text: its first and last halves (all the head reads)
# Of the middle a window leaves out, the characters read at most: a text of up to 69,632
# characters (more than the default 16,384-token prompt limit holds) is read end to end.
MIDDLE_MAX = 65_536

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
# Between letters, one of these digits makes a word leetspeak; a word of letters and these
# characters reads them as letters.
_LEET_INSIDE = re.compile(r"[A-Za-z][013457]+[A-Za-z]")
_LEET_WORD = re.compile(r"(?<![\w@$])(?=[\w@$]*[A-Za-z])(?=[\w@$]*[013457@$])[A-Za-z013457@$]{2,}(?![\w@$])")
_LEET = str.maketrans("013457@$", "oieastas")
_ENCODED = re.compile(r"(?<![\w+/=-])[\w+/-]{16,}={0,2}(?![\w+/=-])")  # base64 (URL-safe too) or hex
_HEX = re.compile(r"(?:[0-9a-fA-F]{2})+")
_URLSAFE = str.maketrans("-_", "+/")
_ROT13 = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz",
                       "NOPQRSTUVWXYZABCDEFGHIJKLMnopqrstuvwxyzabcdefghijklm")
_COMMON_WORDS = """
a about above after again all also am an and any are as ask at be been before being but by
can could did do does don for forget from give had has have he her here him his how i if
ignore in instead instructions into is it its just know let like make me my new no not now
of on only or our out password please previous print prompt reveal rules say secret she show
so system tell than that the their them then there these they this to up us was we were what
when which who will with would write you your
"""
_ENGLISH = frozenset(_COMMON_WORDS.split())
_LATIN_WORD = re.compile(r"[A-Za-z]+")
_CLAUSE = re.compile(r"((?<=[:.!?;,])\s+)")  # where a cover phrase ends ("Do this: Vtaber nyy …")


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


def _leet(text: str) -> str:
    if len(_LEET_INSIDE.findall(text)) < 2:
        return text
    return _LEET_WORD.sub(lambda m: m[0].translate(_LEET), text)


def _decoded(m: re.Match[str]) -> str:
    run = m[0]
    try:
        if _HEX.fullmatch(run):
            raw = bytes.fromhex(run)
        else:
            raw = base64.b64decode(run.translate(_URLSAFE) + "=" * (-len(run) % 4), validate=True)
        plain = raw.decode()
    except ValueError:  # not base64 or hex, or not UTF-8 (binascii.Error, UnicodeDecodeError)
        return run
    return plain if plain.strip() and all(c.isprintable() or c.isspace() for c in plain) else run


def _english(text: str) -> int:
    return sum(map(_ENGLISH.__contains__, _LATIN_WORD.findall(text)))


def _turned(clause: str) -> str:
    """The clause rotated by 13 or reversed, when that reading holds enough more common English
    words than the clause as written."""
    low = clause.lower()
    found = _LATIN_WORD.findall(low)
    if len(found) < 3:
        return clause
    words, common = len(found), sum(map(_ENGLISH.__contains__, found))
    if 4 * common >= words:  # English as written (a quarter of its words common)
        return clause
    most = max(2 * common + 2, (words - 1) // 4)
    rotated, backwards = _english(low.translate(_ROT13)), _english(low[::-1])
    if max(rotated, backwards) <= most:
        return clause
    return clause.translate(_ROT13) if rotated >= backwards else clause[::-1]


def _once(text: str) -> str:
    t = text if text.isascii() else _COMPAT.sub(lambda m: _plain(m[0]), text)
    t = _SPREAD.sub(lambda m: m[0].replace(m[1], ""), t)
    t = _folded(t) if _OTHER.search(t) and _LATIN.search(t) else t
    t = _ENCODED.sub(_decoded, _leet(t))
    return "\n".join(map(_turned_line, t.split("\n")))


def _turned_line(line: str) -> str:
    """The line turned whole, or else clause by clause (a cover phrase before the mask)."""
    turned = _turned(line)
    if turned != line:
        return turned
    parts = _CLAUSE.split(line)  # clauses, then the breaks between them
    return "".join(_turned(part) if i % 2 == 0 else part for i, part in enumerate(parts))


def unmasked(text: str) -> str:
    """The text as the screen reads it (the text itself when nothing in it is masked); a mask
    inside a mask (base64 of leetspeak, hex of base64) is read through too."""
    for _ in range(8):
        plain = _once(text)
        if plain == text:
            break
        text = plain
    return text


def window(text: str) -> str:
    """What the screen reads of a text: all of it, or a long text's first and last halves."""
    return text if len(text) <= WINDOW else text[: WINDOW // 2] + " " + text[-WINDOW // 2 :]


def unread(text: str, overlap: int = 200) -> str:
    """The middle of a long text that `window` leaves out ("" for a text within it), its first
    `MIDDLE_MAX` characters, with `overlap` characters of each half it joins, so that a sentence
    cut where the window ends is whole in one of them."""
    if len(text) <= WINDOW:
        return ""
    start = WINDOW // 2
    end = min(len(text) - WINDOW // 2, start + MIDDLE_MAX)
    return text[start - overlap : end + overlap]


def reread(text: str) -> str | None:
    """The unmasked reading of what the screen reads of the text (`window`), or None when it
    reads the same: then the text needs no second score."""
    view = window(text)
    plain = unmasked(view)
    return plain if plain != view else None
