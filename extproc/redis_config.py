"""`store.redis`: which Redis the gate shares its state through, and how it logs in.

Three topologies, one section:

    store:
      redis:
        mode: single                 # one node (or a managed endpoint): `url`
        url: redis://redis:6379/0
    store:
      redis:
        mode: sentinel               # the master named `master_name`, found by the sentinels
        sentinels: ["10.0.0.1:26379", "10.0.0.2:26379", "10.0.0.3:26379"]
        master_name: gate
    store:
      redis:
        mode: cluster                # Redis Cluster: any few nodes; the rest are discovered
        nodes: ["10.0.0.1:6379", "10.0.0.2:6379"]

Secrets never sit in the config file: the password comes from `password_file` or the
environment variable `password_env` (the sentinels' own from `sentinel_password_file` /
`sentinel_password_env`), and a URL that carries a password is refused. TLS material is
named by path (`tls.ca_file`, `tls.cert_file`, `tls.key_file`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, model_validator


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class RedisTLS(_Strict):
    ca_file: Path | None = None  # PEM bundle that signed the servers' certificates (None: system CAs)
    cert_file: Path | None = None  # client certificate, when the servers ask for one
    key_file: Path | None = None
    check_hostname: bool = True

    @model_validator(mode="after")
    def _pair(self) -> RedisTLS:
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("tls.cert_file and tls.key_file go together")
        return self


def read_secret(file: Path | None, env: str | None, what: str) -> str | None:
    """The secret from `file` (stripped), else from the variable `env`; None when neither is set."""
    if file is not None:
        value = file.read_text(encoding="utf-8").strip()
        if not value:
            raise ValueError(f"{what} file {file} is empty")
        return value
    if env is not None:
        value = os.environ.get(env, "").strip()
        if not value:
            raise ValueError(f"{what}: environment variable {env} is not set")
        return value
    return None


def host_port(address: str) -> tuple[str, int]:
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"{address!r} is not host:port")
    return host.strip("[]"), int(port)


class RedisTopology(_Strict):
    mode: Literal["single", "sentinel", "cluster"] = "single"
    url: str | None = None  # single: redis:// or rediss:// (no password in it)
    sentinels: list[str] = Field(default_factory=list)  # sentinel: host:port of each sentinel
    master_name: str = "gate"
    nodes: list[str] = Field(default_factory=list)  # cluster: seed nodes, host:port
    db: int = Field(default=0, ge=0)  # sentinel (single: the URL's path; a cluster has only db 0)
    username: str | None = None  # ACL user (None: default)
    password_file: Path | None = None
    password_env: str | None = None
    sentinel_username: str | None = None
    sentinel_password_file: Path | None = None
    sentinel_password_env: str | None = None
    tls: RedisTLS | None = None  # None: plaintext (a `rediss://` URL turns TLS on in single mode)

    @model_validator(mode="after")
    def _complete(self) -> RedisTopology:
        if self.mode == "single":
            if not self.url:
                raise ValueError("mode single needs url")
            check_url(self.url)
        elif self.mode == "sentinel":
            if not self.sentinels:
                raise ValueError("mode sentinel needs sentinels (host:port of each)")
            for address in self.sentinels:
                host_port(address)
        else:
            if not self.nodes:
                raise ValueError("mode cluster needs nodes (host:port of one or more nodes)")
            for address in self.nodes:
                host_port(address)
            if self.db:
                raise ValueError("a Redis Cluster has only db 0")
        return self

    def password(self) -> str | None:
        return read_secret(self.password_file, self.password_env, "store.redis.password")

    def sentinel_password(self) -> str | None:
        return read_secret(self.sentinel_password_file, self.sentinel_password_env,
                           "store.redis.sentinel_password")

    def describe(self) -> str:
        """Where the store is, for logs and errors (no secrets)."""
        if self.mode == "single":
            return f"redis {self.url}"
        if self.mode == "sentinel":
            return f"sentinel master {self.master_name!r} via {', '.join(self.sentinels)}"
        return f"cluster via {', '.join(self.nodes)}"


def check_url(url: str) -> None:
    parts = urlsplit(url)
    if parts.scheme not in ("redis", "rediss", "unix"):
        raise ValueError(f"{url!r}: the scheme must be redis://, rediss:// or unix://")
    if parts.password:
        raise ValueError(
            "the Redis URL carries a password: set store.redis.password_file or password_env instead"
        )
