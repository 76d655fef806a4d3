"""TLS for the gRPC ports (`server.tls`): the server certificate, and client verification
when a CA bundle is given. None of it is read when `server.tls` is not set."""

from __future__ import annotations

import grpc

from .config import ServerTLS


def server_credentials(tls: ServerTLS | None) -> grpc.ServerCredentials | None:
    if tls is None:
        return None
    key, chain = tls.key_file.read_bytes(), tls.cert_file.read_bytes()
    ca = tls.client_ca_file.read_bytes() if tls.client_ca_file else None
    return grpc.ssl_server_credentials(
        [(key, chain)], root_certificates=ca, require_client_auth=ca is not None
    )


def bind(server: grpc.aio.Server, address: str, tls: ServerTLS | None) -> int:
    """`add_secure_port` with the configured certificate, else `add_insecure_port`; the port."""
    credentials = server_credentials(tls)
    if credentials is None:
        return int(server.add_insecure_port(address))
    return int(server.add_secure_port(address, credentials))
