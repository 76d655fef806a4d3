"""LLM Gate: an Envoy ext_proc service that gates LLM traffic in front of vLLM."""

__version__ = "0.1.0"
