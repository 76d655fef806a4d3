"""The answer cache: scope and keys, stores (memory, Redis), LSH, capture, replay, coalescing."""
