"""`llm-gate`: the gate, its scheduler, its admin tools and its demo in one command."""

from __future__ import annotations

import argparse
from importlib import metadata
from pathlib import Path

from .config import Config, ConfigError, load_config, load_config_or_report

# Commands whose own module parses the rest of the line (`llm-gate NAME --help` shows its flags).
DELEGATED = (
    ("scheduler", "extproc.scheduler.service", "run the admission scheduler of one pool (one per pool)"),
    ("build-models", "extproc.embed.build", "build the embedding models (ONNX) into the model directory"),
    ("envoy-config", "extproc.envoy_config", "write an Envoy bootstrap, include snippet or Istio filter"),
    ("cache-purge", "extproc.cache.purge", "drop cached answers by tenant, model or x-gate-cache-key"),
    ("blocks", "extproc.ratelimit.admin", "list or lift repeated-prompt blocks"),
    ("breaker", "extproc.breaker.admin", "show or force the latency breaker of each pool"),
    ("calibrate", "extproc.dedup.calibrate", "fit the dedup verifier on labelled pairs and report"),
    ("dedup", "extproc.cache.selfcheck_admin", "show the self-calibration bins (dedup status)"),
    ("sim", "load.vllm_sim", "run the vLLM simulator (an OpenAI-shaped server for tests and demos)"),
    ("demo", "load.demo", "run the whole stack on loopback and show what it does"),
)


def version() -> str:
    try:
        return metadata.version("llm-gate")
    except metadata.PackageNotFoundError:
        from . import __version__

        return __version__


def _load(path: Path | None) -> Config:
    config = load_config_or_report(path)
    if config is None:
        raise SystemExit(2)
    return config


def cmd_serve(args: argparse.Namespace) -> int:
    config = _load(args.config)
    updates = {k: v for k, v in (("port", args.port), ("workers", args.workers)) if v is not None}
    if args.metrics_port is not None:
        updates["metrics_port"] = args.metrics_port or None
    if args.host is not None:
        updates["host"] = args.host
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
    from .checks import (
        DEFAULT_MESSAGE_TIMEOUT_S,
        cross_check,
        envoy_message_timeouts,
        file_problems,
        secret_warnings,
    )

    try:
        config = load_config(args.file)
        timeouts = [args.message_timeout] if args.message_timeout else []
        for envoy_file in args.envoy or []:
            found = envoy_message_timeouts(envoy_file)
            if not found:
                print(f"{envoy_file}: no ext_proc filter with a message_timeout")
                return 1
            timeouts += found
    except ConfigError as exc:
        for problem in exc.problems:
            print(problem)
        print(f"{len(exc.problems)} problem(s) in {args.file}")
        return 1
    except OSError as exc:
        print(f"{exc.filename}: {exc.strerror}")
        return 1
    problems = cross_check(config, min(timeouts, default=DEFAULT_MESSAGE_TIMEOUT_S)) + file_problems(config)
    for warning in secret_warnings(config):
        print(f"{args.file}: warning: {warning}")
    for problem in problems:
        print(f"{args.file}: {problem}")
    if problems:
        print(f"{len(problems)} problem(s) in {args.file}")
        return 1
    print(f"{args.file}: OK")
    return 0


def cmd_lsh_center(args: argparse.Namespace) -> int:
    from .cache.center import command
    from .embed import default_model_dir

    semantic = _load(args.config).cache.semantic
    return command(
        semantic.model_dir or default_model_dir(),
        semantic.build_missing,
        args.embedder or semantic.embedder,
        args.prompts,
        args.out,
    )


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="llm-gate",
        description=__doc__,
        epilog="`llm-gate COMMAND --help` lists each command's flags.",
    )
    p.add_argument("--version", action="version", version=f"llm-gate {version()}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    serve = sub.add_parser("serve", help="run the ext_proc gate", description="Run the ext_proc gate.")
    serve.add_argument("--config", type=Path, help="YAML config (default: built-in defaults)")
    serve.add_argument("--host", help="address the gRPC and metrics ports bind (overrides server.host)")
    serve.add_argument("--port", type=int, help="gRPC port (worker i listens on port + i)")
    serve.add_argument("--workers", type=int, help="gate processes, one port each")
    serve.add_argument("--metrics-port", type=int, help="Prometheus port (worker i: + i; 0 = off)")
    serve.set_defaults(func=cmd_serve)

    check = sub.add_parser(
        "check-config",
        help="validate a config file and cross-check it against Envoy",
        description="Validate a config file, print every problem, and check that its settings fit "
        "together and fit Envoy's ext_proc message_timeout. Exit 0 only when all is well.",
    )
    check.add_argument("file", type=Path, help="the gate's YAML config")
    check.add_argument(
        "--envoy",
        type=Path,
        action="append",
        help="Envoy file with the gate's ext_proc filter (bootstrap, include or EnvoyFilter; repeatable): "
        "its message_timeout is checked against the admission deadlines",
    )
    check.add_argument(
        "--message-timeout",
        type=float,
        help="Envoy's ext_proc message_timeout in seconds (default: what envoy-config writes, 35)",
    )
    check.set_defaults(func=cmd_check_config)

    center = sub.add_parser(
        "lsh-center",
        help="write the LSH centre of some traffic (cache.semantic.lsh_center_file)",
        description="Embed sample prompts with the configured embedder and write the mean of their "
        "embeddings (float32 .npy, and a .json beside it naming the embedder). Point "
        "cache.semantic.lsh_center_file at it when prompts share a long template: the semantic "
        "cache's LSH then hashes around that mean, and capped buckets stop evicting true matches.",
    )
    center.add_argument("--config", type=Path, help="YAML config (default: built-in defaults)")
    center.add_argument(
        "--prompts",
        type=Path,
        required=True,
        metavar="FILE",
        help="sample traffic: one prompt per line, or JSONL of OpenAI request bodies (each one's last "
        "user message, the text the cache embeds)",
    )
    center.add_argument(
        "--out", type=Path, required=True, metavar="FILE", help="the centre to write, e.g. center.npy"
    )
    center.add_argument(
        "--embedder",
        metavar="NAME",
        help="embed with this one (e.g. a profile's) instead of cache.semantic.embedder",
    )
    center.set_defaults(func=cmd_lsh_center)

    for name, target, text in DELEGATED:
        d = sub.add_parser(name, help=text, add_help=False)
        d.set_defaults(func=None, target=target)
    return p


def main(argv: list[str] | None = None) -> int:
    p = parser()
    args, rest = p.parse_known_args(argv)
    if args.func is None:
        module = __import__(args.target, fromlist=["main"])
        return int(module.main(rest) or 0)
    if rest:
        p.error(f"unrecognized arguments: {' '.join(rest)}")
    return int(args.func(args))


if __name__ == "__main__":
    raise SystemExit(main())
