"""The safety screen's pure parts: the prompt sanitizer and the answer redactor."""
