"""Rate limits: pure GCRA and repeat window, the stores that run them, and the keys."""
