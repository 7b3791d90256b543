"""``rttsched pods``: watch our pods in the Kubernetes API and keep the extender's running-apps view in Redis.

Options (flag, else environment variable, else default): ``--api-url`` / ``RTT_PODS_API_URL`` (empty: the
in-cluster API with the pod's service account), ``--token-file`` / ``RTT_PODS_TOKEN_FILE``, ``--ca-file`` /
``RTT_PODS_CA_FILE``, ``--resync`` / ``RTT_PODS_RESYNC_S`` (30, at most a day), ``--ttl`` / ``RTT_PODS_TTL_S``
(3 x resync, at most 3 days); the variables are settings like ``REDIS_URL``, ``RTT_TOPIC_PREFIX`` and
``RTT_METRICS_PORT`` (``rttsched settings``). ``--once`` prints the view it wrote as a table, a row per node and
app: the pods that count and those started; with Redis away it says so in one line naming ``REDIS_URL`` (exit 2),
where the service retries.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

# flag -> the environment variable it overrides (errors name the one the value came from: flag_errors)
FLAGS = {"--api-url": "RTT_PODS_API_URL", "--token-file": "RTT_PODS_TOKEN_FILE", "--ca-file": "RTT_PODS_CA_FILE",
         "--resync": "RTT_PODS_RESYNC_S", "--ttl": "RTT_PODS_TTL_S"}
HELP = "watch pods labelled rttsched.io/app and write the running apps per node to Redis (for the extender)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--api-url", default=None,
                   help="Kubernetes API URL, e.g. http://127.0.0.1:8001 for `kubectl proxy` "
                        "(default RTT_PODS_API_URL; empty: in-cluster service account)")
    p.add_argument("--token-file", default=None, help="bearer token file, re-read on every request "
                   "(default RTT_PODS_TOKEN_FILE; in-cluster: the service account token)")
    p.add_argument("--ca-file", default=None, help="CA bundle for an https API URL (default RTT_PODS_CA_FILE)")
    p.add_argument("--resync", type=float, default=None,
                   help="seconds between renewals of the keys from the pods held while the watch runs "
                        "(with --poll: between lists; default RTT_PODS_RESYNC_S or 30; at most a day)")
    p.add_argument("--ttl", type=float, default=None,
                   help="lifetime of a node's key that no sync confirms (default RTT_PODS_TTL_S or 3 x resync; "
                        "at least resync, at most 3 days)")
    p.add_argument("--poll", action="store_true", help="no watch: only list, every resync period")
    p.add_argument("--once", action="store_true",
                   help="list once, write the view, print it (a row per node and app: pods, started) and exit")


def _options(args: argparse.Namespace, settings: Any) -> Any:
    from app.extender.podwatch import PodWatchOptions

    resync = args.resync if args.resync is not None else settings.pods_resync_s
    ttl = args.ttl if args.ttl is not None else settings.pods_ttl_s
    return PodWatchOptions(resync_s=resync, ttl_s=ttl, watch=not args.poll)


def _access(args: argparse.Namespace, settings: Any) -> Any:
    from app.extender.podwatch_api import KubeAccess

    url = args.api_url if args.api_url is not None else settings.pods_api_url
    token = args.token_file if args.token_file is not None else settings.pods_token_file
    ca = args.ca_file if args.ca_file is not None else settings.pods_ca_file
    if url.strip():
        return KubeAccess.from_url(url, token, ca)
    return KubeAccess.in_cluster(os.environ)


def view_table(written: dict[str, dict[str, int]], started: dict[str, dict[str, int]]) -> list[str]:
    """The view as written: a row per node and app with the pods that count and those started, aligned.

    >>> for line in view_table({"gpu-1": {"gCTF": 2}, "cpu-1": {"upload": 1}}, {"gpu-1": {"gCTF": 1}}):
    ...     print(line)
    NODE   APP     PODS  STARTED
    cpu-1  upload     1        0
    gpu-1  gCTF       2        1
    """
    from app.cli.output import table

    rows = [(node, app, str(n), str(started.get(node, {}).get(app, 0)))
            for node, apps in sorted(written.items()) for app, n in sorted(apps.items())]
    return table(("NODE", "APP", "PODS", "STARTED"), rows, right=frozenset({2, 3}))


def run(args: argparse.Namespace, settings: Any) -> int:
    import asyncio
    import logging
    import signal

    import aiohttp
    from redis.exceptions import RedisError

    from app.errors import ConfigError
    from app.extender.podwatch import PodWatcher, PodWatchMetrics
    from app.extender.podwatch_api import PodsApi
    from app.health import beating, serve_health
    from app.listen import check_listen
    from app.masking import mask_url
    from app.redis_client import check_redis, password_setting, refused_login, settings_redis
    from app.scheduler.cache import CacheKeys

    log = logging.getLogger("app.cli.pods")
    from app.cli.flags import flag_errors

    with flag_errors(args, FLAGS):  # a bad flag is named as typed, before anything else is looked at
        options = _options(args, settings)
        access = _access(args, settings)
        access.ssl_context()  # a CA file that does not load
    if not settings.redis_url:
        raise ConfigError("REDIS_URL", "the pods watcher writes the running-apps view to Redis: set REDIS_URL")
    if not args.once:  # a port taken: one line naming the variable, before the API or Redis is asked
        check_listen(settings.metrics_host, settings.metrics_port, "RTT_METRICS_PORT", "RTT_METRICS_HOST")
    metrics = PodWatchMetrics()

    async def main() -> int:
        if args.once:  # Redis away: one line naming REDIS_URL, before the API is asked (the service retries)
            await check_redis(settings)
        async with aiohttp.ClientSession() as session:
            client = settings_redis(settings)
            watcher = PodWatcher(PodsApi(session, access), client, CacheKeys(settings.topic_prefix), options, metrics)
            try:
                if args.once:
                    try:
                        await watcher.sync()
                    except RedisError as exc:  # gone since the PING, refusing writes (a replica, out of memory),
                        # or the password since (rotated): named as the PING names it
                        where = f"cannot use Redis at {mask_url(settings.redis_url)}: {exc}"
                        if refused_login(exc):
                            raise ConfigError("RTT_REDIS_PASSWORD_FILE",
                                              f"{where} ({password_setting(settings)})") from None
                        raise ConfigError("REDIS_URL", where) from None
                    print("\n".join(view_table(watcher.written, watcher.started)))
                    started = sum(n for apps in watcher.started.values() for n in apps.values())
                    print(f"rttsched pods: {len(watcher.pods)} pods ({started} started) on {len(watcher.written)} "
                          "nodes written", flush=True)
                    return 0
                return await _serve(watcher)
            finally:
                await client.aclose()

    async def _serve(watcher: PodWatcher) -> int:
        # /metrics, and /healthz failing while this event loop is stuck
        heartbeat = serve_health(settings.metrics_port, settings.metrics_host, metrics.registry)
        if heartbeat is not None:
            log.info("metrics on %s:%d/metrics (/healthz)", settings.metrics_host, settings.metrics_port)
        mode = "list only" if not options.watch else "list + watch"
        print(f"rttsched pods: {access.base_url} -> {mask_url(settings.redis_url)} (prefix {settings.topic_prefix!r}), "
              f"{mode}, resync {options.resync_s:g}s", flush=True)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        task = asyncio.ensure_future(watcher.run())
        stopping = asyncio.ensure_future(stop.wait())
        await beating(asyncio.wait([task, stopping], return_when=asyncio.FIRST_COMPLETED), heartbeat)
        stopping.cancel()
        task.cancel()
        await asyncio.gather(task, stopping, return_exceptions=True)
        if not stop.is_set():
            task.result()  # run() only ends by an unexpected error: let main report it
        print("rttsched pods: stopped", flush=True)
        return 0

    return asyncio.run(main())
