"""Synthetic prose for the big-prompt benchmarks: words, punctuation and numbers, as documents have.

Words are drawn from the default tokenizer's vocabulary (its whole English words, most common
first) with a long-tailed rank distribution, one in ten with punctuation after it, and one in
fifty a fresh number: each document repeats its common words, as prose does, and brings
pieces never seen before. A repeated phrase ("lorem ipsum" over and over) would flatter any
counter that remembers words. The same distribution in Python (`document`) and in wrk's Lua
(`LUA_DOCUMENT`).
"""

from __future__ import annotations

import json
import random
from functools import lru_cache

from extproc.tokens import default_tokenizer_path

VOCABULARY = 20_000
PUNCTUATION = ".,;:"
PUNCTUATED = 0.1
FRESH_NUMBER = 0.02


@lru_cache(maxsize=1)
def vocabulary() -> list[str]:
    vocab = json.loads(default_tokenizer_path().read_text("utf-8"))["model"]["vocab"]
    words = [w for w in vocab if w.isascii() and w.isalpha() and len(w) > 1]  # in the file's order
    return words[:VOCABULARY]


def document(chars: int, rng: random.Random) -> str:
    """About `chars` characters of prose, starting with a number of its own (a new text)."""
    words = vocabulary()
    out, size = [f"{rng.randrange(10**9):09d}"], 10
    while size < chars:
        if rng.random() < FRESH_NUMBER:
            word = str(rng.randrange(1, 10**9))
        else:
            word = words[int(len(words) ** rng.random()) - 1]
        if rng.random() < PUNCTUATED:
            word += rng.choice(PUNCTUATION)
        out.append(word)
        size += len(word) + 1
    return " ".join(out)


def lua_document(chars: int) -> str:
    """Lua for wrk: a `document()` function giving what `document(chars, ...)` gives."""
    table = ",".join(f'"{w}"' for w in vocabulary())
    return f"""
local vocab = {{{table}}}
local punctuation = {{{",".join(f'"{p}"' for p in PUNCTUATION)}}}
function document()
  local out, size = {{string.format('%09d', math.random(1e9))}}, 10
  while size < {chars} do
    local word
    if math.random() < {FRESH_NUMBER} then
      word = tostring(math.random(1e9))
    else
      word = vocab[math.floor((#vocab) ^ math.random())]
    end
    if math.random() < {PUNCTUATED} then
      word = word .. punctuation[math.random(#punctuation)]
    end
    out[#out + 1] = word
    size = size + #word + 1
  end
  return table.concat(out, ' ')
end
"""
