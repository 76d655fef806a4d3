"""Mixed Chinese and English sentences the embedder tests compare on."""

from __future__ import annotations

MIXED = [
    "怎么开通花呗",
    "怎么关闭花呗",
    "花呗可以提前还款吗",
    "花呗不可以提前还款吗",
    "借呗的额度为什么降低了",
    "How do I reset my password?",
    "What is the refund policy for order 12345?",
    "A man is playing a guitar.",
    "花呗 payment failed again, what should I do?",
    "请问 iPhone 15 可以用花呗分期付款吗",
    "The quick brown fox jumps over the lazy dog near the riverbank on a sunny afternoon.",
    "ok",
]
