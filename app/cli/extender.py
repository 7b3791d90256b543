"""``rttsched extender``: the kube-scheduler extender on ``RTT_EXTENDER_HOST``:``RTT_EXTENDER_PORT``."""

from __future__ import annotations

import argparse
from typing import Any

# flag -> the environment variable it overrides (errors name the one the value came from: flag_errors)
FLAGS = {"--policy": "RTT_EXTENDER_POLICY_FILE", "--host": "RTT_EXTENDER_HOST", "--port": "RTT_EXTENDER_PORT"}
HELP = "run the kube-scheduler extender (filter/prioritize by predicted RTT; /healthz /readyz /metrics)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host", help="listen address (default: RTT_EXTENDER_HOST)")
    p.add_argument("--port", type=int, help="listen port (default: RTT_EXTENDER_PORT; 0: one the OS picks, printed)")
    p.add_argument("--policy", help="SLA / anti-affinity policy file, YAML or JSON (default: RTT_EXTENDER_POLICY_FILE)")
    p.add_argument("--no-publish", action="store_true", help="do not publish rtt-predictions")
    p.add_argument("--no-redis", action="store_true", help="no warm start / running-apps view from REDIS_URL")


def run(args: argparse.Namespace, settings: Any) -> int:
    import dataclasses

    from app.cli.flags import flag_errors
    from app.errors import ConfigError
    from app.extender.options import ExtenderOptions
    from app.listen import listen_error, listen_on, url_host
    from app.scheduler.policy import load_policy

    if args.port is not None and not 0 <= args.port <= 65535:  # as RTT_EXTENDER_PORT: 0 is a port the OS picks
        raise ConfigError("--port", f"must be a port between 0 and 65535 (got {args.port})")
    options = ExtenderOptions.from_settings(settings)
    overrides = {k: v for k, v in (("host", args.host), ("port", args.port), ("policy_file", args.policy))
                 if v is not None}  # "" and 0 mean what they mean in the settings
    options = dataclasses.replace(options, **overrides)
    with flag_errors(args, FLAGS):  # a bad policy fails here, naming the flag or variable, before the port opens
        policy = load_policy(options.policy_file)
    # bound before the heavy imports: the kernel accepts connections while the rest loads; a port taken or a host
    # not this machine's fails as the worker's and trainer's /metrics port does, naming the variable or the flag
    with flag_errors(args, FLAGS):
        try:
            sock = listen_on(options.host, options.port, backlog=1024)  # "::": IPv6, and IPv4 where the OS allows
        except OSError as exc:  # the port is taken, the address does not exist, ...
            raise listen_error("RTT_EXTENDER_PORT", url_host(options.host), options.port, exc,
                               "RTT_EXTENDER_HOST") from None
    import asyncio

    from app.extender.boot import boot

    try:
        asyncio.run(boot(settings, options, sock, publish=not args.no_publish, redis=not args.no_redis,
                         announce=lambda line: print(line, flush=True), policy=policy))
    finally:
        sock.close()
    return 0
