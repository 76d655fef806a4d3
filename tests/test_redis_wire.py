"""The request path's Redis client (`FastRedis`): many calls on one connection, each its own
reply, and redis-py's failure behaviour, against a real redis-server."""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import redis.asyncio as aioredis
from redis.exceptions import AuthenticationError, DataError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from extproc import redis_wire
from extproc.redis_client import connect_topology
from extproc.redis_config import RedisTopology
from extproc.redis_wire import FastRedis
from load.stack import LOOPBACK, RedisServer, free_port, redis_command, wait_port


@pytest.fixture
async def client(redis_server: RedisServer) -> AsyncIterator[FastRedis]:
    if redis_server.proc is None:
        redis_server.start()
    redis_server.flush()
    c = FastRedis.from_url(redis_server.url)
    yield c
    await c.aclose()


def test_the_request_path_gets_it_for_a_plain_node_only() -> None:
    fast = connect_topology(RedisTopology(url="redis://127.0.0.1:1/0"), 0.1, request_path=True)
    plain = connect_topology(RedisTopology(url="redis://127.0.0.1:1/0"), 0.1)
    tls = connect_topology(RedisTopology(url="rediss://127.0.0.1:1/0"), 0.1, request_path=True)
    assert isinstance(fast, FastRedis)
    assert not isinstance(plain, FastRedis) and not isinstance(tls, FastRedis)


async def test_concurrent_calls_share_one_connection_and_each_gets_its_own_reply(client: FastRedis) -> None:
    script = client.register_script("return {KEYS[1], ARGV[1], redis.call('INCR', KEYS[1])}")
    replies = await asyncio.gather(*(script(keys=[f"k{i % 7}"], args=[i]) for i in range(300)))
    assert [(r[0], r[1]) for r in replies] == [(f"k{i % 7}".encode(), str(i).encode()) for i in range(300)]
    counts = sorted(r[2] for r in replies if r[0] == b"k0")
    assert counts == list(range(1, len(counts) + 1))  # every INCR ran once
    info = await client.info("clients")  # redis-py's own pool: one more connection
    assert info["connected_clients"] <= 3


async def test_a_caller_that_gave_up_leaves_the_connection_matched(client: FastRedis) -> None:
    """BLPOP holds the connection 0.3 s; its caller stops waiting at 0.05 s. The calls after
    it, on the same connection, still get their own replies, not the BLPOP's."""
    await client.call("SET", "a", "1")
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.05):
            await client.call("BLPOP", "empty", 0.3)
    assert await client.call("GET", "a") == b"1"
    assert await client.mget(["a", "missing"]) == [b"1", None]


async def test_errors_raise_what_redis_py_raises_and_scripts_survive_a_flush(client: FastRedis) -> None:
    await client.call("SET", "s", "x")
    with pytest.raises(ResponseError, match="WRONGTYPE"):
        await client.call("HGET", "s", "f")
    script = client.register_script("return redis.call('GET', KEYS[1])")
    assert await script(keys=["s"]) == b"x"
    await client.call("SCRIPT", "FLUSH")  # a restarted master: no script cached
    assert await script(keys=["s"]) == b"x"
    await client.call("SCRIPT", "FLUSH")
    async with client.pipeline(transaction=False) as pipe:
        await script(keys=["s"], client=pipe)
        pipe.sadd("set", "m")
        pipe.pexpire("set", 60_000, nx=True)
        # sent again whole once the script is loaded: the set's commands ran twice, harmlessly
        assert (await pipe.execute())[0] == b"x"
    assert await client.smembers("set") == {b"m"} and 0 < await client.pttl("set") <= 60_000


async def test_a_restart_costs_no_call(redis_server: RedisServer) -> None:
    """After a restart the open connection is dead: the next call goes once more on a new one."""
    if redis_server.proc is None:
        redis_server.start()
    client = FastRedis.from_url(redis_server.url)
    try:
        await client.call("SET", "before", "1")
        redis_server.kill()
        redis_server.start()
        assert await client.call("SET", "after", "1") == b"OK"
        assert await client.ping()
    finally:
        await client.aclose()


async def test_a_connection_that_stopped_answering_is_replaced(monkeypatch: pytest.MonkeyPatch) -> None:
    """A server that takes the connection and never answers, then answers on the next one. A
    call still waiting when the silent connection is dropped gets a time-out and is not sent
    again (a script that ran late must not run twice)."""
    monkeypatch.setattr(redis_wire, "SOCKET_TIMEOUT_S", 0.2)
    pings: list[int] = []  # PINGs each connection received

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        pings.append(0)
        n, silent = len(pings) - 1, len(pings) == 1
        while data := await reader.read(1024):
            pings[n] += data.count(b"PING")
            if not silent:
                writer.write(b"+PONG\r\n" * data.count(b"PING"))
        writer.close()

    server = await asyncio.start_server(serve, LOOPBACK, 0)
    port = server.sockets[0].getsockname()[1]
    client = FastRedis.from_url(f"redis://{LOOPBACK}:{port}/0")
    try:
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.1):
                await client.ping()  # a caller that gives up
        patient = asyncio.ensure_future(client.ping())  # one that does not
        await asyncio.sleep(0.25)  # the unanswered pings are now older than the socket time-out
        assert await client.ping()
        with pytest.raises(RedisTimeoutError):
            await patient
        assert pings == [2, 1]
    finally:
        await client.aclose()
        server.close()


@pytest.fixture
def locked_server(tmp_path: Path) -> Iterator[int]:
    """A redis-server that asks for a password: its port."""
    port = free_port()
    args = [*redis_command(port, tmp_path), "--requirepass", "s3cret"]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_port(port, 10, proc)
        yield port
    finally:
        proc.kill()
        proc.wait(5)


async def test_credentials_and_db_from_the_topology(locked_server: int) -> None:
    good = FastRedis.from_url(f"redis://{LOOPBACK}:{locked_server}/3", password="s3cret")
    bad = FastRedis.from_url(f"redis://{LOOPBACK}:{locked_server}/0", password="wrong")
    try:
        await good.call("SET", "k", "v")
        assert await aioredis.Redis(port=locked_server, db=3, password="s3cret").get("k") == b"v"
        with pytest.raises(AuthenticationError):
            await bad.ping()
    finally:
        await good.aclose()
        await bad.aclose()


async def test_pubsub_and_the_rest_stay_redis_pys(client: FastRedis) -> None:
    assert isinstance(client, aioredis.Redis)
    async with client.pubsub(ignore_subscribe_messages=True) as pubsub:
        await pubsub.subscribe("ch")
        async with client.pipeline(transaction=False) as pipe:
            pipe.publish("ch", "hello")
            await pipe.execute()
        message = None
        for _ in range(20):
            message = await pubsub.get_message(timeout=0.1)
            if message is not None:
                break
        assert message is not None and message["data"] == b"hello"


async def test_arguments_are_sent_as_redis_py_sends_them(client: FastRedis) -> None:
    await client.call("SET", "b", bytearray(b"raw"))
    await client.call("SET", "f", 0.1 + 0.2)
    assert await client.mget(["b", "f"]) == [b"raw", repr(0.1 + 0.2).encode()]
    for bad in (None, True):
        with pytest.raises(DataError):
            await client.call("SET", "x", bad)
    assert await client.ping()  # a refused command leaves the connection as it was
