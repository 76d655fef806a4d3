"""Prompt token counting with a real tokenizer (the `tokenizers` package).

The default tokenizer.json is all-MiniLM-L6-v2's BERT WordPiece vocabulary (Apache-2.0),
shipped inside this package as `extproc/data/minilm-tokenizer.json`; operators point
`validation.tokenizer` at their served model's own tokenizer.json for exact counts.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from tokenizers import Tokenizer

# Chat templates add a few tokens per message (role markers, separators).
PER_MESSAGE_OVERHEAD = 4


def default_tokenizer_path() -> Path:
    return Path(str(resources.files("extproc") / "data" / "minilm-tokenizer.json"))


class TokenCounter:
    def __init__(self, path: Path | None = None) -> None:
        self.path = path or default_tokenizer_path()
        self._tok = Tokenizer.from_file(str(self.path))
        self._tok.no_truncation()
        self._tok.no_padding()

    def count(self, texts: list[str]) -> int:
        """Tokens in `texts` plus the per-message template overhead."""
        texts = [t for t in texts if t]
        if not texts:
            return 0
        encodings = self._tok.encode_batch(texts, add_special_tokens=False)
        return sum(len(e.ids) for e in encodings) + PER_MESSAGE_OVERHEAD * len(texts)
