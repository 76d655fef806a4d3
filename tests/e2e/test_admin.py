"""The admin endpoint on the embedded (in-process) stores: purge answers, list and lift blocks."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from load.stack import Stack, free_port

CHAT = "/v1/chat/completions"


def chat(content: str) -> dict[str, object]:
    return {"model": "llama-3-8b", "messages": [{"role": "user", "content": content}]}


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    config = {
        "server": {"admin_port": free_port()},
        "ratelimit": {"repeat": {"enabled": True, "max_repeats": 5, "window_s": 10, "block_s": 60}},
    }
    with Stack(gate_config=config) as s:
        yield s


@pytest.fixture
def admin(stack: Stack) -> Iterator[httpx.Client]:
    port = stack.gate_config["server"]["admin_port"]
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10) as c:
        yield c


def test_purge_by_key_or_tenant_makes_the_next_ask_a_miss(stack: Stack, admin: httpx.Client) -> None:
    with httpx.Client(base_url=stack.url, timeout=10, headers={"x-user-id": "purger"}) as client:
        assert client.post(CHAT, json=chat("purge me")).headers["x-gate-cache"] == "miss"
        hit = client.post(CHAT, json=chat("purge me"))
        assert hit.headers["x-gate-cache"] == "hit"
        r = admin.post("/admin/cache/purge", json={"key": hit.headers["x-gate-cache-key"]})
        assert r.status_code == 200 and r.json() == {"purged": 1}
        assert client.post(CHAT, json=chat("purge me")).headers["x-gate-cache"] == "miss"
        assert admin.post("/admin/cache/purge", json={"tenant": "anonymous"}).json()["purged"] >= 1
        assert client.post(CHAT, json=chat("purge me")).headers["x-gate-cache"] == "miss"


def test_a_block_is_listed_and_can_be_lifted(stack: Stack, admin: httpx.Client) -> None:
    with httpx.Client(base_url=stack.url, timeout=10, headers={"x-user-id": "repeater"}) as client:
        statuses = [client.post(CHAT, json=chat("same again")).status_code for _ in range(6)]
        assert statuses == [200] * 5 + [429]
        blocks = admin.get("/admin/blocks").json()["blocks"]
        assert len(blocks) == 1 and blocks[0]["seconds_left"] > 50
        assert client.post(CHAT, json=chat("something else")).status_code == 429  # the caller is blocked
        lifted = admin.post("/admin/blocks/lift", json={"caller": blocks[0]["caller"]})
        assert lifted.json() == {"lifted": True}
        assert admin.get("/admin/blocks").json()["blocks"] == []
        assert client.post(CHAT, json=chat("something else")).status_code == 200


def test_bad_admin_requests_get_a_json_error(admin: httpx.Client) -> None:
    for body in ({}, {"tenant": ""}, [1]):
        r = admin.post("/admin/cache/purge", json=body)
        assert r.status_code == 400 and r.json()["error"]["message"]
    assert admin.post("/admin/blocks/lift", content=b"{").status_code == 400
