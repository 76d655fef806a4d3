"""Prompt counts do not depend on how many messages are counted in one call."""

from __future__ import annotations

import json
import random
import string

import pytest
from tokenizers import Tokenizer

from extproc import tokens
from extproc.piececount import PieceCounts, plain_words_lowered, splits_at_spaces
from extproc.tokens import FEW_TEXTS, PER_MESSAGE_OVERHEAD, KnownCounts, TokenCounter, default_tokenizer_path

MESSAGES = [
    "You are a helpful assistant.",
    "What is the capital of France?",
    "Paris.",
    "And of 日本?",
    "Explain the difference between TCP and UDP in two sentences, please!",
    "naïve café résumé",
    "x" * 300,
    "1, 2, 3, 4 — go",
]


def test_a_long_conversation_counts_what_its_messages_count_one_by_one() -> None:
    counter = TokenCounter()
    assert len(MESSAGES) > FEW_TEXTS  # the batched call
    one_by_one = sum(counter.count([m]) for m in MESSAGES)  # the per-text call
    assert counter.count(MESSAGES) == one_by_one
    assert one_by_one > PER_MESSAGE_OVERHEAD * len(MESSAGES)  # the texts themselves were counted


class Recording:
    """The tokenizer, noting how many characters it was given to tokenize."""

    def __init__(self, tok: object) -> None:
        self.tok, self.chars = tok, 0
        self.plain = 0  # of which given to the model alone

    def encode(self, text: str, **kw: object) -> object:
        self.chars += len(text)
        return self.tok.encode(text, **kw)  # type: ignore[attr-defined]

    def encode_batch_fast(self, texts: list[str], **kw: object) -> object:
        self.chars += sum(len(t) for t in texts)
        return self.tok.encode_batch_fast(texts, **kw)  # type: ignore[attr-defined]

    def encode_batch(self, texts: list[str], **kw: object) -> object:
        self.chars += sum(len(t) for t in texts)
        return self.tok.encode_batch(texts, **kw)  # type: ignore[attr-defined]

    @property
    def model(self) -> Recording:  # the model's own tokenize of a plain word, noted too
        return self

    def tokenize(self, word: str) -> object:
        self.chars += len(word)
        self.plain += len(word)
        return self.tok.model.tokenize(word)  # type: ignore[attr-defined]


def turn(i: int) -> str:
    return f"Turn {i}: " + " ".join(f"word{i}x{j} and some more text" for j in range(700))


def test_a_conversation_tokenizes_only_its_new_turn_and_counts_the_same() -> None:
    counter = TokenCounter(slice_chars=4096)
    history = [turn(i) for i in range(4)] + [turn(9)[:3000]]  # turns over a slice, one within
    counter.count(history)
    spy = Recording(counter._tok)
    counter._tok = spy  # type: ignore[assignment]
    new = "And what about the last point?"
    total = counter.count([*history, new])
    assert 0 < spy.chars <= len(new)  # the earlier turns were not tokenized again
    assert total == TokenCounter(slice_chars=4096).count([*history, new])  # a fresh count agrees


def test_a_count_stopped_at_the_limit_is_not_remembered() -> None:
    counter = TokenCounter(slice_chars=4096)
    text = " ".join(turn(i) for i in range(10))
    fresh = TokenCounter(slice_chars=4096).count([text])
    assert counter.count([text], limit=100) > 100  # stopped early: an estimate
    assert counter.count([text]) == fresh  # counted in full now, not the estimate


def test_known_counts_keep_the_most_recently_used() -> None:
    known = KnownCounts(size=2)
    a, b, c = (known.key(turn(i)) for i in range(3))
    known.put(a, 1)
    known.put(b, 2)
    assert known.get(a) == 1  # a is now the most recent
    known.put(c, 3)
    assert (known.get(a), known.get(b), known.get(c)) == (1, None, 3)
    known.put(known.key("short text"), 2)
    assert known.get(known.key("short text")) == 2  # a short text is its own key
    assert known.get(known.key("short text!")) is None


# Whatever a client may put between and inside words: accents that combine with the character
# before them (a space too), CJK without spaces, control characters (BERT deletes some, so the
# words on both sides join), spaces that are not " ", special-token names, a word over
# WordPiece's 100 characters, emoji.
FRAGMENTS = ["word", "Naïve", "cafe\u0301", "\u0301", "日本語の文章", "\x1c", "\x0b", "\x85", "\xa0",
             "\u3000", "\t", "\n", "  ", " ", " ", " ", "[CLS]", "[MASK]", "x" * 120, "🙂", "U.S.A.",
             "1,234.5", "é", "\u200b", "\x00", "\ufffd", "O'Brien", "--", "ǅ"]


def test_a_long_text_counted_by_its_pieces_is_counted_exactly_as_a_whole() -> None:
    counter = TokenCounter(slice_chars=512)
    assert counter._pieces is not None  # the default tokenizer is counted by pieces
    whole = TokenCounter(slice_chars=10**9)  # one text, one call: the tokenizer's own count
    rng = random.Random(7)
    for _ in range(40):
        text = "".join(rng.choice(FRAGMENTS) for _ in range(rng.randrange(200, 900)))
        expected = len(whole._tok.encode(text, add_special_tokens=False).ids) + PER_MESSAGE_OVERHEAD
        assert counter.count([text]) == expected, repr(text)


def test_a_short_text_is_counted_by_its_pieces_exactly_and_known_words_are_not_tokenized_again() -> None:
    counter = TokenCounter()
    whole = TokenCounter()._tok
    rng = random.Random(11)
    for _ in range(300):
        text = "".join(rng.choice(FRAGMENTS) for _ in range(rng.randrange(1, 12)))
        expected = len(whole.encode(text, add_special_tokens=False).ids) + PER_MESSAGE_OVERHEAD
        assert counter.count([text]) == expected, repr(text)
    counter.count(["How do I reset my password?"])
    spy = Recording(counter._tok)
    counter._tok = spy  # type: ignore[assignment]
    total = counter.count(["How do I reset my  password for order 4711?"])
    assert spy.chars == len("password" "for" "order" "4711?")  # "password?" and the rest were known
    assert total == TokenCounter().count(["How do I reset my  password for order 4711?"])


def test_a_second_document_tokenizes_only_the_pieces_it_brings_new() -> None:
    counter = TokenCounter(slice_chars=4096)
    vocabulary = [f"term{i}" for i in range(300)]
    rng = random.Random(3)
    first = " ".join(rng.choice(vocabulary) for _ in range(5000))
    second = " ".join(rng.choice(vocabulary) for _ in range(5000)) + " brand-new words"
    counter.count([first])
    spy = Recording(counter._tok)
    counter._tok = spy  # type: ignore[assignment]
    total = counter.count([second])
    assert spy.chars == len("brand-new words")  # every other piece's count was remembered
    assert total == TokenCounter(slice_chars=10**9).count([second])


def test_only_tokenizers_that_split_at_whitespace_are_counted_by_pieces() -> None:
    bert = json.loads(default_tokenizer_path().read_text())
    assert splits_at_spaces(bert)
    byte_level = {**bert, "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False}}
    metaspace = {**bert, "normalizer": None, "pre_tokenizer": {"type": "Metaspace", "replacement": "▁"}}
    replaces = {**bert, "normalizer": {"type": "Sequence", "normalizers": [
        {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]}}
    greedy = {**bert, "added_tokens": [{"content": "<mask>", "lstrip": True, "rstrip": False}]}
    spaced = {**bert, "added_tokens": [{"content": "<end of turn>", "lstrip": False, "rstrip": False}]}
    for spec in (byte_level, metaspace, replaces, greedy, spaced):
        assert not splits_at_spaces(spec)
    assert splits_at_spaces({**bert, "normalizer": {"type": "Sequence", "normalizers": [
        {"type": "NFD"}, {"type": "Lowercase"}, {"type": "StripAccents"}]}})


def test_a_plain_word_is_counted_by_the_model_alone_exactly_as_by_the_whole_pipeline() -> None:
    """New words of ASCII letters and digits (any case, up to past WordPiece's 100-character
    limit) skip the normalizer and pre-tokenizer calls and count the same; where an added token
    could match inside such a word, or the tokenizer does not lowercase, it says so."""
    bert = json.loads(default_tokenizer_path().read_text())
    assert plain_words_lowered(bert) is True
    keeps_case = {**bert, "normalizer": {**bert["normalizer"], "lowercase": False}}
    assert plain_words_lowered(keeps_case) is False
    added = {**bert, "added_tokens": [*bert["added_tokens"], {"content": "gate7"}]}
    assert plain_words_lowered(added) is None
    rng = random.Random(5)
    alphabet = string.ascii_letters + string.digits
    drawn = ("".join(rng.choice(alphabet) for _ in range(rng.randrange(1, 130))) for _ in range(2000))
    words = list(dict.fromkeys(drawn))  # each new to the counter
    for spec in (bert, keeps_case):
        tok = Tokenizer.from_str(json.dumps(spec))
        tok.no_padding()
        tok.no_truncation()
        spy = Recording(tok)
        pieces = PieceCounts(lowered=plain_words_lowered(spec))
        assert [pieces.count_short(spy, w) for w in words] == [  # type: ignore[arg-type]
            len(tok.encode(w, add_special_tokens=False).ids) for w in words]
        assert spy.plain == spy.chars == sum(map(len, words))  # each word to the model alone


def test_the_background_count_paces_itself_and_counts_the_same(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each slice of a long text is followed by a sleep three times the slice's CPU time (a
    quarter of the time counting); the event loop's own calls never sleep."""
    clock = [0.0]
    slept: list[float] = []

    def process_time() -> float:
        clock[0] += 0.001  # each reading: 1 ms of CPU later
        return clock[0]

    monkeypatch.setattr(tokens.time, "process_time", process_time)
    monkeypatch.setattr(tokens.time, "sleep", slept.append)
    counter = TokenCounter(slice_chars=4096)
    text = " ".join(turn(i) for i in range(3))
    slices = len(list(tokens.slices(text, 4096)))
    assert counter.count([text]) == TokenCounter(slice_chars=4096).count([text], cpu_share=0.25)
    assert len(slept) == slices and all(s == pytest.approx(0.003) for s in slept)


def test_many_short_texts_are_paced_by_groups_of_a_slice() -> None:
    texts = [f"turn {i} " + "word " * 200 for i in range(40)]  # ~1 KB each, 40 KB in all
    grouped = list(tokens.groups(texts, 4096))
    assert [t for g in grouped for t in g] == texts  # every text, in order, once
    assert all(sum(map(len, g)) <= 4096 for g in grouped) and len(grouped) >= 10
    whole = TokenCounter(slice_chars=10**9)  # all in one call
    assert TokenCounter(slice_chars=4096).count(texts, cpu_share=0.25) == whole.count(texts)
