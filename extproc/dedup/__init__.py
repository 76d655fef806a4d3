"""Is this prompt the same question as a cached one? Near-exact text, then a guarded semantic layer."""

from .canonical import canonical
from .decide import Decision, LanguagePoint, Policy, decide, load_policy
from .guards import guard
from .lang import language

__all__ = ["Decision", "LanguagePoint", "Policy", "canonical", "decide", "guard", "language", "load_policy"]
