"""Training and evaluation of the injection screen's head (data never committed)."""
