"""Model versions: weighted sticky choice, traffic overrides, progressive delivery."""
