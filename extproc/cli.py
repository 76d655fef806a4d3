"""`llm-gate`: serve, check-config, sim, envoy-config, demo."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .config import Config, ConfigError, load_config


def _load(path: Path | None) -> Config:
    try:
        return load_config(path)
    except ConfigError as exc:
        for problem in exc.problems:
            print(problem, file=sys.stderr)
        raise SystemExit(2) from None


def cmd_serve(args: argparse.Namespace) -> int:
    config = _load(args.config)
    updates = {k: v for k, v in (("port", args.port), ("workers", args.workers)) if v is not None}
    if args.metrics_port is not None:
        updates["metrics_port"] = args.metrics_port or None
    if updates:
        server = config.server.model_copy(update=updates)
        config = config.model_copy(update={"server": server})
    if config.server.workers == 1:
        from .app import run_process

        run_process(config, 0, args.config)
        return 0
    from .workers import supervise

    return supervise(config, args.config)


def cmd_check_config(args: argparse.Namespace) -> int:
    try:
        load_config(args.file)
    except ConfigError as exc:
        for problem in exc.problems:
            print(problem)
        print(f"{len(exc.problems)} problem(s) in {args.file}")
        return 1
    except OSError as exc:
        print(f"{args.file}: {exc.strerror}")
        return 1
    print(f"{args.file}: OK")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="llm-gate", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run the ext_proc gate")
    serve.add_argument("--config", type=Path, help="YAML config (default: built-in defaults)")
    serve.add_argument("--port", type=int, help="gRPC port (worker i listens on port + i)")
    serve.add_argument("--workers", type=int, help="gate processes, one port each")
    serve.add_argument("--metrics-port", type=int, help="Prometheus port (worker i: + i; 0 = off)")
    serve.set_defaults(func=cmd_serve)

    check = sub.add_parser("check-config", help="validate a config file and print every error")
    check.add_argument("file", type=Path)
    check.set_defaults(func=cmd_check_config)

    for name, target, text in (
        ("sim", "load.vllm_sim", "run the vLLM simulator"),
        ("envoy-config", "extproc.envoy_config", "write an Envoy bootstrap for the gate"),
        ("demo", "load.demo", "run the whole stack on loopback and show what it does"),
        ("cache-purge", "extproc.cache.purge", "drop cached answers by tenant, model or x-gate-cache-key"),
        ("blocks", "extproc.ratelimit.admin", "list or lift repeated-prompt blocks"),
        ("calibrate", "extproc.dedup.calibrate", "fit the dedup verifier on labelled pairs and report"),
        ("build-models", "extproc.embed.build", "build the embedding models (ONNX) from installed packages"),
        ("breaker", "extproc.breaker.admin", "show or force the latency breaker of each pool"),
        ("scheduler", "extproc.scheduler.service", "run the admission scheduler of one pool"),
    ):
        p = sub.add_parser(name, help=text, add_help=False)
        p.set_defaults(func=None, target=target)

    args, rest = parser.parse_known_args(argv)
    if args.func is None:
        module = __import__(args.target, fromlist=["main"])
        return int(module.main(rest) or 0)
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    return int(args.func(args))


if __name__ == "__main__":
    raise SystemExit(main())
