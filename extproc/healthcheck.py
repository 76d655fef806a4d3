"""`python -m extproc.healthcheck [HOST:PORT] [--service NAME]`: exit 0 when the gRPC server
there answers grpc.health.v1 SERVING, else 1. The container image's HEALTHCHECK; Kubernetes
probes the same service natively (`grpc:` probes)."""

from __future__ import annotations

import argparse
import sys

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m extproc.healthcheck", description=__doc__.split("\n")[0])
    ap.add_argument("address", nargs="?", default="127.0.0.1:50051", help="gRPC HOST:PORT to ask")
    ap.add_argument("--service", default="", help="health service name ('' is the whole server)")
    ap.add_argument("--timeout", type=float, default=2.0, help="seconds to wait for the answer")
    args = ap.parse_args(argv)
    with grpc.insecure_channel(args.address) as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=args.service), timeout=args.timeout
            )
        except grpc.RpcError as exc:
            print(f"{args.address}: {exc.code().name}", file=sys.stderr)
            return 1
    serving = reply.status == health_pb2.HealthCheckResponse.SERVING
    print(f"{args.address}: {health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)}")
    return 0 if serving else 1


if __name__ == "__main__":
    raise SystemExit(main())
