"""TLS for the gRPC ports: the gate's (`server.tls`) and the schedulers' (`admission.scheduler_tls`):
the server certificate, and client verification when a CA bundle is given; and the gates' side of
the connection to a scheduler. Nothing is read when the setting is not there."""

from __future__ import annotations

import ssl
from pathlib import Path
from typing import Protocol

import grpc

from .scheduler.settings import SchedulerTLS


class ServerCertificate(Protocol):
    @property
    def cert_file(self) -> Path: ...
    @property
    def key_file(self) -> Path: ...
    @property
    def client_ca_file(self) -> Path | None: ...


def server_credentials(tls: ServerCertificate | None) -> grpc.ServerCredentials | None:
    if tls is None:
        return None
    key, chain = tls.key_file.read_bytes(), tls.cert_file.read_bytes()
    ca = tls.client_ca_file.read_bytes() if tls.client_ca_file else None
    return grpc.ssl_server_credentials(
        [(key, chain)], root_certificates=ca, require_client_auth=ca is not None
    )


def server_context(tls: ServerCertificate | None) -> ssl.SSLContext | None:
    """The gate's port: HTTP/2 over TLS with the certificate; clients verified when a CA is given."""
    if tls is None:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(tls.cert_file, tls.key_file)
    if tls.client_ca_file is not None:
        context.load_verify_locations(tls.client_ca_file)
        context.verify_mode = ssl.CERT_REQUIRED
    context.set_alpn_protocols(["h2"])
    return context


def bind(server: grpc.aio.Server, address: str, tls: ServerCertificate | None) -> int:
    """`add_secure_port` with the configured certificate, else `add_insecure_port`; the port."""
    credentials = server_credentials(tls)
    if credentials is None:
        return int(server.add_insecure_port(address))
    return int(server.add_secure_port(address, credentials))


def channel_credentials(tls: SchedulerTLS) -> grpc.ChannelCredentials:
    """What a gate uses to reach a scheduler configured with `tls`."""
    ca = tls.ca_file.read_bytes() if tls.ca_file else None
    key = tls.client_key_file.read_bytes() if tls.client_key_file else None
    chain = tls.client_cert_file.read_bytes() if tls.client_cert_file else None
    return grpc.ssl_channel_credentials(ca, key, chain)
