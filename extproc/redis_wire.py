"""The request path's Redis calls on one pipelined connection per process, beside redis-py.

redis-py spends about two hundred Python calls on each command (its retry wrapper, pool,
events, a stream reader with a time-out per read): about 100 µs of CPU per call more than
writing the command on a connection of the gate's own and reading the reply there
(`python -m load.bench_hop --redis` measures whole requests both ways). `FastRedis` is a
redis-py client whose hot calls (the scripts, their pipelines, MGET, HMGET, PING) go over one
connection that carries every request's calls at once, replies matched in order; everything
else (pub/sub, admin commands, scans) is redis-py's, on its own pool.

Failure behaviour is redis-py's as the gate configures it: a call on a connection found dead
(a restart, a failover) is sent once more on a new one, never after a time-out; a
connection whose oldest call went unanswered for `SOCKET_TIMEOUT_S` is dropped; an error
reply raises the exception redis-py would. A call whose caller gave up (the store budget,
a cancelled request) leaves the connection as it was: its reply is read and dropped.

Single node over TCP only (`redis://`): TLS, a unix socket, Sentinel and Cluster stay
redis-py's alone (`redis_client.connect_topology`).
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections import deque
from collections.abc import Sequence
from typing import Any, cast

import hiredis
import redis.asyncio as aioredis
from redis._parsers.base import BaseParser
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import DataError, NoScriptError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

# A connection whose oldest call has had no reply for this long has stopped answering
# (redis-py's `socket_timeout` as the gate sets it); each call's own budget is shorter.
SOCKET_TIMEOUT_S = 2.0
Command = tuple[Any, ...]


def _pack(command: Command) -> bytes:
    try:
        packed: bytes = hiredis.pack_command(command)
    except TypeError:  # a bytearray is sent as redis-py sends it; None or a bool is refused as there
        args: Any = tuple(bytes(a) if isinstance(a, bytearray) else a for a in command)
        try:
            packed = hiredis.pack_command(args)
        except TypeError as exc:
            raise DataError(f"Invalid input in {command[0]!r}: {exc}") from None
    return packed


def _error(reply: hiredis.ReplyError) -> ResponseError:
    """The exception redis-py raises for this error reply (NOSCRIPT, WRONGPASS, BUSY...)."""
    error: ResponseError = BaseParser.parse_error(str(reply))  # type: ignore[no-untyped-call]
    return error


class Wire(asyncio.Protocol):
    """One connection: commands written as they come, replies matched to them in order."""

    def __init__(self) -> None:
        self.reader = hiredis.Reader()
        self.waiting: deque[tuple[asyncio.Future[Any], float]] = deque()
        self.transport: asyncio.Transport | None = None
        self.unsent: list[bytes] = []  # commands not yet written: they leave at the end of the turn
        self.closed = False
        self.failure: Exception | None = None  # what the calls still waiting get when it closes

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def data_received(self, data: bytes) -> None:
        self.reader.feed(data)
        try:
            while (reply := self.reader.gets()) is not False:
                if not self.waiting:
                    raise hiredis.ProtocolError("a reply to no command")
                future, _ = self.waiting.popleft()
                if not future.done():  # a caller that gave up: its reply is dropped
                    future.set_result(reply)
        except hiredis.ProtocolError:
            self.close()  # nothing more on this connection can be matched to its command

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        while self.waiting:
            future, _ = self.waiting.popleft()
            if not future.done():
                future.set_exception(self.failure or RedisConnectionError(f"connection to Redis lost: {exc}"))
                future.exception()  # a caller that gave up reads it never: no "never retrieved"

    def send(self, commands: Sequence[Command]) -> list[asyncio.Future[Any]]:
        """Write `commands` at once; a future per reply (a reply error is its result)."""
        if self.closed or self.transport is None:
            raise RedisConnectionError("connection to Redis closed")
        packed = [_pack(c) for c in commands]  # first: a command refused here is not waited for
        loop = asyncio.get_running_loop()
        now = time.monotonic()
        futures = [loop.create_future() for _ in commands]
        self.waiting.extend((f, now) for f in futures)
        if not self.unsent:
            loop.call_soon(self.flush)
        self.unsent.extend(packed)
        return futures

    def flush(self) -> None:
        """Every command written in one turn of the event loop, in one system call: under load
        the calls of many requests reach Redis together and it answers them in one read."""
        unsent, self.unsent = self.unsent, []
        if unsent and self.transport is not None and not self.transport.is_closing():
            self.transport.write(unsent[0] if len(unsent) == 1 else b"".join(unsent))

    def stalled(self, now: float) -> bool:
        return bool(self.waiting) and now - self.waiting[0][1] > SOCKET_TIMEOUT_S

    def close(self, failure: Exception | None = None) -> None:
        self.failure = failure
        if self.transport is not None:
            self.transport.abort()  # fails every call still waiting (connection_lost)
        self.closed = True


class FastRedis(aioredis.Redis):
    """A redis-py client (single node) whose request-path calls take a `Wire`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._wire: Wire | None = None
        self._dialing = asyncio.Lock()

    async def _connection(self) -> tuple[Wire, bool]:
        """The open connection, or a new one; True when it is new."""
        wire = self._wire
        if wire is not None and not wire.closed and not wire.stalled(time.monotonic()):
            return wire, False
        async with self._dialing:
            wire = self._wire
            if wire is not None and not wire.closed:
                if not wire.stalled(time.monotonic()):
                    return wire, False
                # a time-out, as redis-py's socket_timeout: not sent again
                wire.close(RedisTimeoutError(f"Redis did not answer for {SOCKET_TIMEOUT_S:g} s"))
            self._wire = await self._dial()
            return self._wire, True

    async def _dial(self) -> Wire:
        kw = self.connection_pool.connection_kwargs
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(kw.get("socket_connect_timeout") or SOCKET_TIMEOUT_S):
                host, port = kw.get("host", "localhost"), kw.get("port", 6379)
                _, wire = await loop.create_connection(Wire, host, port)
                try:
                    hello: list[Command] = []
                    if kw.get("password") is not None:
                        user = kw.get("username")
                        hello.append(("AUTH", user, kw["password"]) if user else ("AUTH", kw["password"]))
                    if kw.get("db"):
                        hello.append(("SELECT", kw["db"]))
                    replies = [await f for f in wire.send(hello)] if hello else []
                    for reply in replies:
                        if isinstance(reply, hiredis.ReplyError):
                            raise _error(reply)
                except BaseException:
                    wire.close()
                    raise
        except OSError as exc:
            raise RedisConnectionError(f"cannot connect to Redis: {exc}") from exc
        return wire

    async def calls(self, commands: Sequence[Command]) -> list[Any]:
        """Every command's reply in order (an error reply as its exception, not raised); a
        connection found dead is replaced once and the commands sent again."""
        wire, new = await self._connection()
        try:
            replies = [await f for f in wire.send(commands)]
        except RedisConnectionError:
            if new:
                raise
            wire, _ = await self._connection()
            replies = [await f for f in wire.send(commands)]
        return [_error(r) if isinstance(r, hiredis.ReplyError) else r for r in replies]

    async def call(self, *command: Any) -> Any:
        (reply,) = await self.calls([command])
        if isinstance(reply, ResponseError):
            raise reply
        return reply

    def register_script(self, script: Any) -> Any:
        return FastScript(self, script)

    def pipeline(self, transaction: bool = True, shard_hint: Any = None) -> Any:
        if transaction:
            return super().pipeline(transaction, shard_hint)
        return FastPipeline(self)

    async def mget(self, keys: Any, *args: Any) -> Any:
        names = [keys, *args] if isinstance(keys, str | bytes) else [*keys, *args]
        return await self.call("MGET", *names)

    async def hmget(self, name: Any, keys: Any, *args: Any) -> Any:
        fields = [keys, *args] if isinstance(keys, str | bytes) else [*keys, *args]
        return await self.call("HMGET", name, *fields)

    async def ping(self, **kwargs: Any) -> Any:
        """Through the request path's connection: the one the store's health is about."""
        return await self.call("PING") in (b"PONG", "PONG")

    async def aclose(self, close_connection_pool: bool | None = None) -> None:
        if self._wire is not None:
            self._wire.close()
        await super().aclose(close_connection_pool)


class FastScript:
    """redis-py's `AsyncScript` over the `Wire`: EVALSHA, and the script loaded again when
    the server does not have it (a new or restarted master)."""

    def __init__(self, client: FastRedis, script: str | bytes) -> None:
        self.client = client
        self.script = script
        self.sha = hashlib.sha1(script.encode() if isinstance(script, str) else script).hexdigest()

    async def __call__(self, keys: Sequence[Any] = (), args: Sequence[Any] = (), client: Any = None) -> Any:
        if isinstance(client, FastPipeline):
            client.scripts.append(self)
            return client.evalsha(self.sha, len(keys), *keys, *args)
        try:
            return await self.client.call("EVALSHA", self.sha, len(keys), *keys, *args)
        except NoScriptError:
            await self.client.call("SCRIPT", "LOAD", self.script)
            return await self.client.call("EVALSHA", self.sha, len(keys), *keys, *args)


class FastPipeline:
    """A non-transactional pipeline of the commands the stores send together: one write,
    the replies in order. A script of the pipeline the server lacks is loaded and the whole
    pipeline sent once more (the request path's scripts are idempotent by request token)."""

    def __init__(self, client: FastRedis) -> None:
        self.client = client
        self.commands: list[Command] = []
        self.scripts: list[FastScript] = []

    async def __aenter__(self) -> FastPipeline:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.commands.clear()
        self.scripts.clear()

    def _add(self, *command: Any) -> FastPipeline:
        self.commands.append(command)
        return self

    def evalsha(self, sha: str, numkeys: int, *keys_and_args: Any) -> FastPipeline:
        return self._add("EVALSHA", sha, numkeys, *keys_and_args)

    def sadd(self, name: str, *values: Any) -> FastPipeline:
        return self._add("SADD", name, *values)

    def pexpire(self, name: str, ms: int, nx: bool = False, xx: bool = False, gt: bool = False,
                lt: bool = False) -> FastPipeline:
        flags = [flag for flag, on in (("NX", nx), ("XX", xx), ("GT", gt), ("LT", lt)) if on]
        return self._add("PEXPIRE", name, ms, *flags)

    def publish(self, channel: str, message: Any) -> FastPipeline:
        return self._add("PUBLISH", channel, message)

    async def execute(self, raise_on_error: bool = True) -> list[Any]:
        commands, self.commands = self.commands, []
        if not commands:
            return []
        replies = await self.client.calls(commands)
        if self.scripts and any(isinstance(r, NoScriptError) for r in replies):
            for script in self.scripts:
                await self.client.call("SCRIPT", "LOAD", script.script)
            replies = await self.client.calls(commands)
        if raise_on_error:
            for reply in replies:
                if isinstance(reply, ResponseError):
                    raise reply
        return replies
