"""``rttsched extender``: the kube-scheduler extender on ``RTT_EXTENDER_HOST``:``RTT_EXTENDER_PORT``."""

from __future__ import annotations

import argparse
from typing import Any

HELP = "run the kube-scheduler extender (filter/prioritize by predicted RTT; /healthz /readyz /metrics)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host", help="listen address (default: RTT_EXTENDER_HOST)")
    p.add_argument("--port", type=int, help="listen port (default: RTT_EXTENDER_PORT)")
    p.add_argument("--policy", help="SLA / anti-affinity policy file, YAML or JSON (default: RTT_EXTENDER_POLICY_FILE)")
    p.add_argument("--no-publish", action="store_true", help="do not publish rtt-predictions")
    p.add_argument("--no-redis", action="store_true", help="no warm start / running-apps view from REDIS_URL")


def run(args: argparse.Namespace, settings: Any) -> int:
    import dataclasses

    from aiohttp import web

    from app.extender.options import ExtenderOptions
    from app.extender.server import build_app, tune_gc
    from app.extender.service import ExtenderService
    from app.masking import mask_url

    options = ExtenderOptions.from_settings(settings)
    overrides = {k: v for k, v in (("host", args.host), ("port", args.port), ("policy_file", args.policy)) if v}
    options = dataclasses.replace(options, **overrides)
    service = ExtenderService(settings, options, publish=not args.no_publish, redis=not args.no_redis)
    print(f"rttsched extender: listening on http://{options.host}:{options.port} "
          f"(kafka {settings.bootstrap_servers}, redis {mask_url(settings.redis_url) or 'off'})", flush=True)
    app = build_app(service)
    tune_gc(app)  # fewer young collections per request; everything alive after start is frozen
    web.run_app(app, host=options.host, port=options.port, access_log=None, print=None)
    return 0
