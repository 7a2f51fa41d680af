"""`python -m shadow_operator.egress`: the egress gateway process (proxy port and admin port)."""

from __future__ import annotations

import argparse
import asyncio
import hmac
import logging
import os
import socket
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from aiohttp import web
from mitmproxy import options
from mitmproxy.addons import core, next_layer, proxyserver
from mitmproxy.master import Master
from prometheus_client import generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from shadow_operator.egress.addon import CertAuthorities, Gate, NamespaceTls
from shadow_operator.egress.audit import Audit
from shadow_operator.egress.events import EventLog
from shadow_operator.egress.table import PolicyTable, SandboxEntry, load_file

log = logging.getLogger("shadow_operator.egress")
# How often the file source is checked for changes: policy changes reach the gateway well within 2 s.
FILE_POLL_SECONDS = 0.25


LogToken = Callable[[SandboxEntry], Awaitable[str | None]]


async def given_log_token(entry: SandboxEntry) -> str | None:
    return entry.log_token


def admin_app(
    table: PolicyTable, audit: Audit, authorities: CertAuthorities, log_token: LogToken = given_log_token
) -> web.Application:
    """/healthz, /metrics, the CA certificate of a namespace (public), and a sandbox's decision log (for
    whoever holds the sandbox's runtime token: who may use the sandbox may read what it tried)."""

    async def healthz(_: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(
            body=generate_latest(audit.registry), headers={"Content-Type": CONTENT_TYPE_LATEST}
        )

    async def decisions(request: web.Request) -> web.Response:
        key = f"{request.match_info['namespace']}/{request.match_info['name']}"
        entry = table.sandboxes.get(key)
        given = request.headers.get("Authorization", "").removeprefix("Bearer ")
        expected = await log_token(entry) if entry is not None else None
        if entry is None or not expected or not given or not hmac.compare_digest(expected, given):
            return web.json_response(
                {"error": f"no egress log readable for {key} with this token"}, status=403
            )
        return web.json_response(
            {"sandbox": key, "dropped": list(entry.dropped), "decisions": audit.read(key)}
        )

    async def ca(request: web.Request) -> web.Response:
        namespace = request.match_info["namespace"]
        if not any(entry.namespace == namespace for entry in table.sandboxes.values()):
            return web.Response(status=404, text="no sandbox of this namespace is under an egress policy\n")
        return web.Response(
            body=authorities.certificate_pem(namespace), content_type="application/x-pem-file"
        )

    app = web.Application()
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/v1/log/{namespace}/{name}", decisions)
    app.router.add_get("/v1/ca/{namespace}", ca)
    return app


async def watch_file(table: PolicyTable, audit: Audit, gate: Gate, path: Path) -> None:
    seen: float | None = None
    while True:
        try:
            mtime = path.stat().st_mtime
            if mtime != seen:
                load_file(table, path)
                audit.forget(set(table.sandboxes))
                gate.policy_changed()
                seen = mtime
                log.info("policy loaded: %d sandboxes", len(table.sandboxes))
        except (OSError, ValueError) as error:
            # Keep the last good table: a half-written file must not open or close everything.
            log.warning("policy file %s not loaded: %s", path, error)
        await asyncio.sleep(FILE_POLL_SECONDS)


def decision_events(api: Any, table: PolicyTable, args: argparse.Namespace) -> EventLog:
    """The decision log its tenants read: Events on their Sandboxes, written by a thread of their own."""
    from shadow_operator.egress.kube import EventWriter

    return EventLog(
        table,
        EventWriter(api),
        os.environ.get("POD_NAME") or socket.gethostname(),
        every=args.events_every,
        per_sandbox=args.events_per_sandbox,
        rate=args.events_per_second,
        burst=args.events_burst,
    )


async def serve(args: argparse.Namespace) -> None:
    table, audit = PolicyTable(), Audit()
    authorities = CertAuthorities(Path(args.ca_dir))
    own = {(address, port) for address in args.own_address for port in (args.port, args.admin_port)}
    gate = Gate(
        table,
        audit,
        own=own,
        own_names=args.own_name,
        own_ports=(args.port, args.admin_port),
        allowed_private=args.allow_private,
        resolve=dict(item.split("=", 1) for item in args.resolve),
    )
    opts = options.Options(
        listen_host=args.listen, listen_port=args.port, confdir=str(Path(args.ca_dir) / ".mitmproxy")
    )
    master = Master(opts)
    server = proxyserver.Proxyserver()

    def close(client_id: str) -> None:
        handler = server.connections.get(client_id)
        # Not when it is closing already (a second policy change before the first close completed).
        if handler is not None and handler.client in handler.transports:
            handler.close_connection(handler.client)

    gate.close = close
    master.addons.add(core.Core(), server, next_layer.NextLayer(), NamespaceTls(gate, authorities), gate)
    master.options.update(
        connection_strategy="lazy",
        ssl_verify_upstream_trusted_ca=args.upstream_ca,
        # mitmproxy's own proxy authentication is not used: the gateway's is per sandbox.
        http2=True,
        websocket=True,
    )
    log_token: LogToken = given_log_token
    tasks = (
        [asyncio.create_task(watch_file(table, audit, gate, Path(args.policy_file)))]
        if args.policy_file
        else []
    )
    if args.key_secret:
        # The cluster source only: the file source runs without a cluster.
        from kubernetes import client, config

        from shadow_operator.egress.kube import KubeSource, ca_keeper, ensure_key

        try:
            config.load_incluster_config()
        except config.ConfigException:
            config.load_kube_config()
        api = client.ApiClient()
        namespace, _, name = args.key_secret.partition("/")
        # The CAs beside the key, in the gateway's own namespace: the same for every replica and restart.
        authorities.keeper = ca_keeper(api, namespace)
        loop = asyncio.get_running_loop()

        def rebuilt() -> None:  # in the source's thread: the connections belong to the event loop
            audit.forget(set(table.sandboxes))
            loop.call_soon_threadsafe(gate.policy_changed)

        source = KubeSource(
            api, table, ensure_key(api, namespace, name), authorities.certificate_pem, on_rebuild=rebuilt
        )
        source.start()
        log_token = source.runtime_token
        audit.events = decision_events(api, table, args)
        audit.events.start()
    runner = web.AppRunner(admin_app(table, audit, authorities, log_token), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, args.listen, args.admin_port).start()
    try:
        await master.run()
    finally:
        for task in tasks:
            task.cancel()
        await runner.cleanup()


def main() -> None:
    parser = argparse.ArgumentParser(prog="shadow-egress", description=__doc__)
    parser.add_argument("--listen", default="0.0.0.0")
    parser.add_argument("--port", type=int, default=3128)
    parser.add_argument("--admin-port", type=int, default=9091)
    parser.add_argument(
        "--ca-dir",
        required=True,
        help="where the namespaces' CAs are kept (with --key-secret, a working copy of the CA Secrets kept "
        "beside the key, one per namespace)",
    )
    parser.add_argument("--policy-file", help="JSON policy source, reloaded on change")
    parser.add_argument(
        "--key-secret",
        help="NAMESPACE/NAME of the Secret with the proxy credentials' key (made when missing): follow the "
        "cluster (in-cluster config or KUBECONFIG)",
    )
    parser.add_argument(
        "--events-every", type=float, default=5.0, help="seconds between two writes of one decision Event"
    )
    parser.add_argument(
        "--events-per-sandbox",
        type=int,
        default=32,
        help="destinations per sandbox recorded one by one at a time (the rest: one overflow Event)",
    )
    parser.add_argument("--events-per-second", type=float, default=10.0, help="Event writes, all sandboxes")
    parser.add_argument("--events-burst", type=float, default=50.0, help="Event writes at once")
    parser.add_argument("--own-address", action="append", default=[], help="the gateway's own addresses")
    parser.add_argument(
        "--own-name",
        action="append",
        default=[],
        help="a name that leads to the gateway (its Service): what it resolves to is refused as a destination",
    )
    parser.add_argument(
        "--allow-private", action="append", default=[], help="a private range sandboxes may reach"
    )
    parser.add_argument("--resolve", action="append", default=[], help="HOST=ADDRESS instead of DNS (tests)")
    parser.add_argument(
        "--upstream-ca", default=None, help="CA bundle for upstream servers (default: the system's)"
    )
    args = parser.parse_args()
    if pod_ip := os.environ.get("POD_IP"):
        args.own_address.append(pod_ip)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    asyncio.run(serve(args))


if __name__ == "__main__":
    main()
