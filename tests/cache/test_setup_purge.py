"""Start-up (model present, built on demand, or a clear error) and the purge CLI."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from extproc.cache.purge import main as purge_main
from extproc.cache.redis_store import RedisStore
from extproc.cache.setup import ModelError, ensure_model, load_matcher, load_matchers
from extproc.cache.store import MemoryStore, Put
from extproc.config import CacheSemantic, Config, SemanticProfile
from extproc.metrics import Metrics
from extproc.redis_wire import FastRedis
from extproc.services import Services
from extproc.stages.cache import Cache
from load.stack import RedisServer


def test_missing_model_is_built_or_named_with_the_fix(tmp_path: Path) -> None:
    with pytest.raises(ModelError, match=r"python -m extproc\.embed\.build --out"):
        ensure_model("minilm", tmp_path / "none", build_missing=False)
    with pytest.raises(ModelError, match="no 'bert-xl' model"):
        ensure_model("bert-xl", tmp_path, build_missing=True)
    ensure_model("minilm", tmp_path, build_missing=True)
    assert (tmp_path / "minilm" / "embedder.json").exists()


def test_semantic_layer_loads_warm_only_where_the_policy_allows(tmp_path: Path) -> None:
    off = load_matcher(CacheSemantic(embedder="minilm", model_dir=tmp_path), Metrics())
    assert off is None  # the shipped calibration reaches 0.95 in no language: nothing to load
    assert not (tmp_path / "minilm").exists()
    on = load_matcher(CacheSemantic(embedder="minilm", model_dir=tmp_path, target_precision=0.8), Metrics())
    assert on is not None and on.lsh.rows >= 1
    assert on.skip_reason("How do I reset my password?") is None
    assert on.skip_reason("怎么开通花呗") == "language_off"


def test_a_chinese_tenant_can_have_the_multilingual_embedder(model_dir: Path) -> None:
    cfg = CacheSemantic(
        embedder="minilm",
        model_dir=model_dir,
        target_precision=0.8,
        profiles=[
            # e5-small's zh point reaches only a ~0.5 lower bound on held-out ATEC pairs
            SemanticProfile(tenant="cn", embedder="e5-small", target_precision=0.45),
            SemanticProfile(tenant="zz", enabled=False),
            SemanticProfile(tenant="en2", target_precision=0.8),
        ],
    )
    loaded = load_matchers(cfg, Metrics())
    default, profiles = loaded.default, loaded.profiles
    (_, cn), (_, zz), (_, en2) = profiles
    assert default is not None and cn is not None and zz is None
    assert en2 is default  # the same choices share one loaded model
    assert default.skip_reason("怎么开通花呗") == "language_off"  # all-MiniLM cannot read Chinese
    assert cn.skip_reason("怎么开通花呗") is None  # e5-small's zh point at 0.45 is on


def test_default_gate_caches_in_process() -> None:
    stage = Cache.build(Config(), Services.build(Config(), Metrics()))
    assert isinstance(stage.b.store, MemoryStore) and stage.config.enabled


def test_purge_cli_by_tenant_and_by_key(
    redis_server: RedisServer, capsys: pytest.CaptureFixture[str]
) -> None:
    async def fill() -> None:
        client = FastRedis.from_url(redis_server.url)
        store = RedisStore(client)
        for scope, key, tenant in (("s1", "a", "acme"), ("s1", "b", "acme"), ("s2", "c", "globex")):
            await store.put(Put(scope, key, b"x", 60_000, 100, tenant, "m"))
        await client.aclose()

    if redis_server.proc is None:
        redis_server.start()
    asyncio.run(fill())
    assert purge_main(["--redis-url", redis_server.url, "--tenant", "acme"]) == 0
    assert "purged 2" in capsys.readouterr().out
    assert purge_main(["--redis-url", redis_server.url, "--key", "s2.c"]) == 0
    assert "purged 1" in capsys.readouterr().out
    assert purge_main(["--tenant", "acme"]) == 2  # no Redis configured: nothing shared to purge
    assert "in-process cache" in capsys.readouterr().err
