"""Cross-checks `llm-gate check-config` runs beyond the schema: settings that are each valid
alone but do not fit together, or do not fit the Envoy in front of the gate."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from .config import Config

# What `llm-gate envoy-config` writes when not told otherwise.
DEFAULT_MESSAGE_TIMEOUT_S = 35.0
_DURATION = re.compile(r"^(\d+(?:\.\d+)?)(ms|s)$")


def _seconds(value: object) -> float | None:
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str) and (m := _DURATION.match(value.strip())):
        return float(m.group(1)) / (1000.0 if m.group(2) == "ms" else 1.0)
    return None


def _walk(node: Any) -> list[dict[str, Any]]:
    """Every mapping in a YAML document, depth first."""
    found: list[dict[str, Any]] = []
    stack = [node]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            found.append(item)
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return found


def envoy_message_timeouts(path: Path) -> list[float]:
    """The ext_proc `message_timeout` of every ext_proc filter in an Envoy file (bootstrap,
    include or Istio EnvoyFilter, one or more YAML documents)."""
    out: list[float] = []
    for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")):
        for node in _walk(doc):
            if "grpc_service" in node and "message_timeout" in node:
                seconds = _seconds(node["message_timeout"])
                if seconds is not None:
                    out.append(seconds)
    return out


def cross_check(config: Config, message_timeout_s: float = DEFAULT_MESSAGE_TIMEOUT_S) -> list[str]:
    """Problems, one line each; empty when the settings fit together."""
    problems: list[str] = []
    pools = config.routing.pools
    adm = config.admission
    if adm.enabled:
        for cls, ms in sorted(adm.deadline_ms.items()):
            if ms / 1000.0 >= message_timeout_s:
                problems.append(
                    f"admission.deadline_ms.{cls}: {ms:g} ms is not shorter than Envoy's ext_proc "
                    f"message_timeout ({message_timeout_s:g} s): Envoy would fail the request before "
                    "the queue answers it"
                )
        for name in sorted(adm.pools):
            if name not in pools:
                problems.append(f"admission.pools.{name}: unknown pool (routing.pools has {sorted(pools)})")
    coalesce = config.cache.coalesce
    if config.cache.enabled and coalesce.enabled and coalesce.max_wait_s >= message_timeout_s:
        problems.append(
            f"cache.coalesce.max_wait_s: {coalesce.max_wait_s:g} s is not shorter than Envoy's ext_proc "
            f"message_timeout ({message_timeout_s:g} s)"
        )
    for name, pool in sorted(pools.items()):
        if pool.fallback == name:
            problems.append(f"routing.pools.{name}.fallback: a pool cannot be its own fallback")
    return problems


def center_files(config: Config) -> list[tuple[str, Path, str]]:
    """(setting, file, embedder) of every LSH centre the gate reads at start: the default
    section's and each enabled profile's (its own, or the default's when it keeps the embedder)."""
    if not config.cache.enabled:
        return []
    sem = config.cache.semantic
    found: dict[tuple[Path, str], str] = {}
    sections = [("cache.semantic", sem)] + [
        (f"cache.semantic.profiles.{i}", sem.for_profile(p)) for i, p in enumerate(sem.profiles)
    ]
    own: list[Path | None] = [sem.lsh_center_file, *(p.lsh_center_file for p in sem.profiles)]
    for (where, section), own_file in zip(sections, own, strict=True):
        if not section.enabled or section.lsh_center_file is None:
            continue
        setting = where if own_file is not None else "cache.semantic"
        found.setdefault((section.lsh_center_file, section.embedder), f"{setting}.lsh_center_file")
    return [(setting, path, embedder) for (path, embedder), setting in found.items()]


def secret_warnings(config: Config) -> list[str]:
    """Secrets written in the config file itself: it usually ships as a ConfigMap, readable by
    anyone who can read the namespace's configuration."""
    warnings = []
    if config.identity.api_keys:
        warnings.append(
            f"identity.api_keys: {len(config.identity.api_keys)} API key(s) in the config file; move them "
            "to identity.api_keys_file (a mounted Secret) or identity.api_keys_env"
        )
    url = config.store.redis_url or ""
    if "@" in url and ":" in url.split("@", 1)[0].split("//", 1)[-1]:
        warnings.append(
            "store.redis_url: the URL carries a password; give it through a file or the environment instead"
        )
    return warnings


def file_problems(config: Config) -> list[str]:
    """Problems in the files the gate reads at start, one line each (the LSH centres; their
    dimension against the model itself is checked when the gate loads it)."""
    from .cache.center import CenterError, read_center

    problems: list[str] = []
    try:
        config.identity.keys()
    except (OSError, ValueError, yaml.YAMLError) as exc:
        problems.append(f"identity: the API keys cannot be read: {exc}")
    for setting, path, embedder in center_files(config):
        try:
            read_center(path, embedder)
        except CenterError as exc:
            problems.append(f"{setting}: {exc}")
    return problems
