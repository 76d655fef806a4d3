"""Prompt token counting with a real tokenizer (the `tokenizers` package).

The default tokenizer.json is all-MiniLM-L6-v2's BERT WordPiece vocabulary (Apache-2.0),
shipped inside this package as `extproc/data/minilm-tokenizer.json`; operators point
`validation.tokenizer` at their served model's own tokenizer.json for exact counts.

Big prompts must not stall the other streams of a worker: text is counted in slices cut at
whitespace (a WordPiece pre-tokenizer splits there anyway, so the sum is the whole count; a
tokenizer that keeps spaces inside its tokens, byte-level BPE, can count one token more at a
cut), each slice by its distinct pieces between spaces where the tokenizer allows it
(`piececount.py`); counting stops once a limit is passed (the rest is extrapolated from the
characters per token seen so far: an "about" figure, always above the limit); and
``measure`` counts prompts above ``offload_chars`` in the low-priority child process of
`background.py`, paced, with the same tokenizer file and the same code, so the count is the
one ``count`` gives here.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from functools import lru_cache
from importlib import resources
from pathlib import Path

from tokenizers import Tokenizer

from .background import Background
from .piececount import PieceCounts, plain_words_lowered, splits_at_spaces

# Chat templates add a few tokens per message (role markers, separators).
PER_MESSAGE_OVERHEAD = 4
SLICE_CHARS = 16_384
OFFLOAD_CHARS = 32_768
# The background process counts at most this share of the time: after each slice it sleeps
# three times the CPU time the slice took. Idle priority alone did not keep its bursts from the
# small requests' p99 on two busy cores (1.48x with 512 KB prompts in the mix, 1.14-1.26x
# paced: `python -m load.bench_gate --only big`); a 512 KB prompt waits ~0.2 s more.
BACKGROUND_CPU_SHARE = 0.25
FEW_TEXTS = 4
# Texts shorter than this are their own key in the known counts (at most ~4 MB for all of
# them); longer ones are known by a digest.
SELF_KEY_CHARS = 256
KNOWN_MAX = 4096


def default_tokenizer_path() -> Path:
    return Path(str(resources.files("extproc") / "data" / "minilm-tokenizer.json"))


def slices(text: str, size: int = SLICE_CHARS) -> Iterator[str]:
    """`text` in pieces of about `size` characters, each cut just after a space or a newline
    (never inside a word: where a window has none, the piece runs on to the next one)."""
    start = 0
    while len(text) - start > size:
        cut = start + size
        space = max(text.rfind(" ", start + size // 2, cut), text.rfind("\n", start + size // 2, cut))
        if space < 0:
            after = [i for i in (text.find(" ", cut), text.find("\n", cut)) if i >= 0]
            if not after:
                break
            space = min(after)
        yield text[start : space + 1]
        start = space + 1
    if start < len(text):
        yield text[start:]


def groups(texts: list[str], size: int) -> Iterator[list[str]]:
    """Consecutive texts of about `size` characters in all (each text at most `size`)."""
    group: list[str] = []
    chars = 0
    for text in texts:
        if group and chars + len(text) > size:
            yield group
            group, chars = [], 0
        group.append(text)
        chars += len(text)
    if group:
        yield group


@contextmanager
def paced(cpu_share: float) -> Iterator[None]:
    """Sleep after the block long enough that its CPU time (the process's: the tokenizer runs
    on its own threads) is `cpu_share` of the whole (1: no sleep)."""
    if cpu_share >= 1.0:  # the event loop's counts: no clock read on the per-request path
        yield
        return
    started = time.process_time()
    yield
    time.sleep((time.process_time() - started) * (1 / cpu_share - 1))


class KnownCounts:
    """Token counts of texts already counted, the most recently used `KNOWN_MAX` of them. Locked:
    where no child process can start, big prompts are counted in threads."""

    def __init__(self, size: int = KNOWN_MAX) -> None:
        self.size = size
        self._counts: OrderedDict[bytes | str, int] = OrderedDict()
        self._lock = threading.Lock()

    @staticmethod
    def key(text: str) -> bytes | str:
        """A short text is its own key, a longer one its digest. A system prompt, an earlier
        turn or a repeated question comes again and again: a look-up costs ~0.1 µs (a digest
        ~1 µs per KB), tokenizing 15-50 µs for a sentence and ~0.1 ms per KB."""
        if len(text) < SELF_KEY_CHARS:
            return text
        return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest()

    def get(self, key: bytes | str) -> int | None:
        with self._lock:
            tokens = self._counts.get(key)
            if tokens is not None:
                self._counts.move_to_end(key)
            return tokens

    def put(self, key: bytes | str, tokens: int) -> None:
        with self._lock:
            self._counts[key] = tokens
            self._counts.move_to_end(key)
            if len(self._counts) > self.size:
                self._counts.popitem(last=False)


class TokenCounter:
    def __init__(
        self, path: Path | None = None, *, slice_chars: int = SLICE_CHARS, offload_chars: int = OFFLOAD_CHARS
    ) -> None:
        self.path = path or default_tokenizer_path()
        self._tok = Tokenizer.from_file(str(self.path))
        self._tok.no_truncation()
        self._tok.no_padding()
        self.slice_chars = slice_chars
        self.offload_chars = offload_chars
        self.background = Background()
        self._known = KnownCounts()
        # Long texts by their pieces between spaces, where that gives this tokenizer's count.
        spec = json.loads(self.path.read_text("utf-8"))
        self._pieces = PieceCounts(lowered=plain_words_lowered(spec)) if splits_at_spaces(spec) else None

    def count(self, texts: list[str], limit: int | None = None, cpu_share: float = 1.0) -> int:
        """Tokens in `texts` plus the per-message template overhead.

        With a `limit`, counting stops as soon as the total passes it; the result is then an
        estimate of the whole (> limit), extrapolated from the part counted. A text counted in
        full is remembered (`KnownCounts`): a conversation resends every earlier turn, a system
        prompt or document comes again with each question, a popular question comes again, so
        only what is new is tokenized (the sum is the same count). With a
        `cpu_share` below 1, it sleeps after each slice's worth of text, so that it works at
        most that share of the time (the background process's calls; never the event loop's).
        """
        texts = [t for t in texts if t]
        if not texts:
            return 0
        total = PER_MESSAGE_OVERHEAD * len(texts)
        keys: dict[str, bytes | str] = {}  # each text hashed once, for the look-up and the store
        todo: list[str] = []
        for text in texts:
            key = keys[text] = self._known.key(text)
            known = self._known.get(key)
            if known is None:
                todo.append(text)
            else:
                total += known
        small = [t for t in todo if len(t) <= self.slice_chars]
        counts: list[int] = []
        for group in groups(small, self.slice_chars):
            with paced(cpu_share):
                counts += self._count_short(group)
        for text, n in zip(small, counts, strict=True):
            self._known.put(keys[text], n)
        total += sum(counts)
        counted, seen = sum(counts), sum(len(t) for t in small)
        remaining = sum(len(t) for t in todo) - seen
        for text in (t for t in todo if len(t) > self.slice_chars):
            tokens = 0
            for piece in slices(text, self.slice_chars):
                if limit is not None and total + tokens > limit:
                    return total + tokens + round(remaining * counted / max(seen, 1))
                with paced(cpu_share):
                    n = self._count_long(piece)
                tokens, counted = tokens + n, counted + n
                seen += len(piece)
                remaining -= len(piece)
            total += tokens
            self._known.put(keys[text], tokens)
        return total

    def _count_short(self, texts: list[str]) -> list[int]:
        if self._pieces is not None:
            return [self._pieces.count_short(self._tok, t) for t in texts]
        if len(texts) <= FEW_TEXTS:
            # one call per text: for a few short texts the batch call's thread pool costs more
            # than the tokenizing (28 against 40 µs for a system prompt and a question)
            return [len(self._tok.encode(t, add_special_tokens=False).ids) for t in texts]
        return [len(e) for e in self._tok.encode_batch_fast(texts, add_special_tokens=False)]

    def _count_long(self, text: str) -> int:
        if self._pieces is not None:
            return self._pieces.count(self._tok, text)
        # encode_batch_fast, even of one, runs without the GIL (the event loop keeps going) and
        # skips the offsets nobody reads here: a quarter less CPU than encode_batch
        return len(self._tok.encode_batch_fast([text], add_special_tokens=False)[0])

    async def measure(self, texts: list[str], limit: int | None = None) -> int:
        """`count`, in the background process when the prompt is big enough to hold the event loop."""
        if sum(len(t) for t in texts) <= self.offload_chars:
            return self.count(texts, limit)
        return await self.background.run(count_with, str(self.path), self.slice_chars, texts, limit)

    def close(self) -> None:
        self.background.close()


@lru_cache(maxsize=4)  # in the background process: one tokenizer per file, loaded once
def _counter(path: str, slice_chars: int) -> TokenCounter:
    return TokenCounter(Path(path), slice_chars=slice_chars)


def count_with(path: str, slice_chars: int, texts: list[str], limit: int | None) -> int:
    """`TokenCounter.count` with the tokenizer at `path`: what the background process runs."""
    return _counter(path, slice_chars).count(texts, limit, BACKGROUND_CPU_SHARE)
