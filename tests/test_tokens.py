"""Prompt counts do not depend on how many messages are counted in one call."""

from __future__ import annotations

from extproc.tokens import FEW_TEXTS, PER_MESSAGE_OVERHEAD, TokenCounter

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
