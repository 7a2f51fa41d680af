"""`shadow-operator router-auth`: the watches and the HTTP endpoints in one process, beside nginx."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from aiohttp import web
from prometheus_client import CollectorRegistry

from shadow_operator.clients.kube import Kube
from shadow_operator.router import watch
from shadow_operator.router.access import ApiServerAuthorizer
from shadow_operator.router.app import KeyFiles, build_app, build_metrics_app
from shadow_operator.router.decisions import PreviewPolicy, SdkPolicy
from shadow_operator.router.index import Index
from shadow_operator.router.metrics import LogReceiver, RouterMetrics
from shadow_operator.router.secrets import RuntimeTokens
from shadow_operator.router.wake import Activity, WakeMetrics, Waker, kube_annotate


def split_address(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host.strip("[]") or "0.0.0.0", int(port)


async def serve_metrics(
    args: argparse.Namespace, index: Index, registry: CollectorRegistry
) -> Callable[[], Awaitable[None]]:
    """/metrics and the UDP receiver of nginx's access log; returns what stops them."""
    metrics = RouterMetrics(
        registry,
        max_sandboxes=args.metrics_max_sandboxes,
        exists=lambda namespace, name: index.route(namespace, name) is not None,
    )
    loop = asyncio.get_running_loop()
    transport, _ = await loop.create_datagram_endpoint(
        lambda: LogReceiver(metrics), local_addr=split_address(args.access_log_listen)
    )
    runner = web.AppRunner(build_metrics_app(registry), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, *split_address(args.metrics_listen)).start()

    async def stop() -> None:
        transport.close()
        await runner.cleanup()

    return stop


async def serve(args: argparse.Namespace) -> None:
    namespaces = tuple(dict.fromkeys(args.namespace))
    index = Index(default_preview_port=args.preview_port)
    kube = await Kube.connect()
    feeder = watch.Feeder(kube, index, list(namespaces), watch.sources())
    preview = PreviewPolicy(
        index=index,
        domain=args.domain,
        namespaces=namespaces,
        keys=KeyFiles(args.keys_dir),
        default_access=args.default_access,
        secure=args.scheme == "https",
        max_token_seconds=args.max_token_seconds,
    )
    sdk = SdkPolicy(
        index=index,
        namespaces=namespaces if args.sdk else (),
        authorize=ApiServerAuthorizer(kube),
        runtime_tokens=RuntimeTokens(kube),
        mode=args.authz_mode,
        trust_loopback=args.trust_loopback,
        default_access=args.default_access,
    )
    registry = CollectorRegistry()
    annotate = kube_annotate(kube)
    waker = Waker(index, annotate, WakeMetrics(registry), hold_seconds=args.hold_seconds)
    activity = Activity(annotate)
    app = build_app(preview, sdk, ready=feeder.synced, waker=waker, activity=activity)
    host, _, port = args.listen.rpartition(":")
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host or "127.0.0.1", int(port)).start()
    stop_metrics = await serve_metrics(args, index, registry) if args.metrics_listen else None
    logging.getLogger(__name__).info("router-auth listening on %s for %s", args.listen, ", ".join(namespaces))
    try:
        async with asyncio.TaskGroup() as group:
            group.create_task(feeder.run())
            group.create_task(activity.run())
    finally:
        if stop_metrics is not None:
            await stop_metrics()
        await runner.cleanup()
        await kube.close()


def main(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(args))
    return 0
