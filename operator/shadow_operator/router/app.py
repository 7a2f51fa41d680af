"""The HTTP endpoints nginx calls, on aiohttp (already a dependency, through kopf and the Kube client).

- `GET /auth/preview`, `GET /auth/sdk`: the `auth_request` subrequests. 200 means "proxy to the upstream in
  `X-Shadow-Upstream`" (plus `X-Shadow-Runtime-Token` for the SDK path to a runtime port); 401 means a token
  is missing; 403 means "refused, ask `/page/...` what to show" (nginx's auth_request only understands 2xx,
  401 and 403; the real status is in `X-Shadow-Status`). Only 200s are cached by nginx. A request for a
  sleeping sandbox is held here (`wake.Waker`) until it is Ready, then allowed; after the cap, 504.
- `GET /auth/preview/retry`, `GET /auth/sdk/retry`: the same, asked again when the upstream nginx was given
  (`X-Shadow-Failed-Upstream`) refused the connection: its Pod is going down, so the request is held while
  the sandbox wakes and then sent to its new Pod instead of failing with 502. A request with a body (which
  nginx does not send twice) is held the same way, then answered by the `.../unreachable` page: 307 to the
  same address once the sandbox is routed to another Pod (clients send it again, body and all).
- `GET /page/preview`, `GET /page/sdk`: the answer a refused request gets, from the same decision: a small
  HTML page for browsers (or the redirect that swaps a link's token for a cookie), JSON `{"detail": ...}` for
  the SDK. `.../unreachable` is what nginx shows when the upstream itself does not answer.
- `GET /healthz` (alive) and `GET /readyz` (every watch has listed once).

`build_metrics_app` is the other listener (not loopback: Prometheus scrapes it): `GET /metrics` only.
"""

from __future__ import annotations

import asyncio
import html
import logging
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from shadow_operator.common.tokens import KeyRing
from shadow_operator.router.decisions import HEADER, Decision, PreviewPolicy, SdkPolicy
from shadow_operator.router.wake import Activity, Waker

log = logging.getLogger(__name__)
# nginx sets this on every request it asks about, from `$remote_addr` (replacing any the client sent): the
# address the connection came from, which decides whether it is a port-forward (loopback).
PEER_HEADER = "X-Shadow-Peer"
SDK_HEADERS = (
    "X-Sandbox-ID",
    "X-Sandbox-Namespace",
    "X-Sandbox-Port",
    "X-Sandbox-Pod-IP",
    "X-Sandbox-UID",
    "Authorization",
    PEER_HEADER,
)
FAILED_UPSTREAM_HEADER = "X-Shadow-Failed-Upstream"
# How long a retry waits for the watch to show why the upstream it was given refused the connection.
SETTLE_SECONDS = 2.0
TITLES = {
    400: "Bad request",
    401: "This preview is private",
    404: "No such preview",
    502: "The preview is not answering",
    503: "The preview is starting",
    504: "The sandbox is waking up",
}


def waking_detail(name: str) -> str:
    return f"Sandbox {name} was asleep and is waking up: retry in a few seconds."


def _waking_page(request: web.Request, name: str) -> web.Response:
    """504 after the hold: a page for browsers, one line of text for anything else."""
    if "text/html" in request.headers.get("Accept", ""):
        return _page(504, waking_detail(name), retry=True)
    headers = {"Cache-Control": "no-store", "Retry-After": "5"}
    return web.Response(status=504, text=waking_detail(name) + "\n", headers=headers)


def _page(status: int, detail: str, *, retry: bool) -> web.Response:
    title = TITLES.get(status, "Preview")
    refresh = '<meta http-equiv="refresh" content="5">' if retry else ""
    body = (
        f'<!doctype html><html lang="en"><head><meta charset="utf-8">{refresh}'
        f"<title>{title}</title><style>body{{font:16px system-ui,sans-serif;margin:15vh auto;max-width:32em;"
        f"color:#222}}h1{{font-size:1.4em}}p{{color:#555}}</style></head><body><h1>{title}</h1>"
        f"<p>{html.escape(detail)}</p></body></html>"
    )
    headers = {"Cache-Control": "no-store"}
    if retry:
        headers["Retry-After"] = "5"
    return web.Response(status=status, text=body, content_type="text/html", headers=headers)


def _json(status: int, detail: str) -> web.Response:
    return web.json_response({"detail": detail}, status=status, headers={"Cache-Control": "no-store"})


def _auth_answer(decision: Decision) -> web.Response:
    if decision.status == 200:
        headers = {"X-Shadow-Upstream": decision.upstream or "", "X-Shadow-Sandbox": decision.sandbox or ""}
        if decision.runtime_token:
            headers["X-Shadow-Runtime-Token"] = decision.runtime_token
        return web.Response(status=200, headers=headers)
    code = 401 if decision.status == 401 else 403
    return web.Response(status=code, headers={"X-Shadow-Status": str(decision.status)})


class KeyFiles:
    """The preview keys of a mounted Secret, read again every few seconds (the kubelet swaps them in place)."""

    def __init__(self, directory: Path | None, *, every: float = 5.0) -> None:
        self.directory = directory
        self.every = every
        self._ring = KeyRing({})
        self._read_at = -every

    def __call__(self) -> KeyRing:
        now = time.monotonic()
        if self.directory is not None and now - self._read_at >= self.every:
            self._read_at = now
            try:
                self._ring = KeyRing.from_directory(self.directory)
            except (OSError, ValueError) as exc:
                log.error("preview keys in %s not loaded, keeping the previous ones: %s", self.directory, exc)
        return self._ring


def build_app(
    preview: PreviewPolicy,
    sdk: SdkPolicy,
    *,
    ready: asyncio.Event,
    waker: Waker | None = None,
    activity: Activity | None = None,
) -> web.Application:

    def sleeping(decision: Decision) -> str | None:
        """The name of the sandbox a refusal is about when it is asleep or waking (a request for it waits)."""
        target = decision.waiting_for
        if waker is None or target is None or not (target.asleep or waker.waking(target.uid)):
            return None
        return target.name

    async def held(
        decide: Callable[[], Awaitable[Decision]], cause: str, failed: str | None = None
    ) -> Decision:
        """The decision, once a sleeping sandbox is awake (or 504 after the cap). `failed`: the upstream that
        refused the connection, when this is a retry."""
        decision = await decide()
        if failed and waker is not None and decision.status == 200 and decision.upstream == failed:
            # nginx could not connect to the Pod the index still routes to: it is going down, and the watch
            # says so in a moment (or it is a dev server that died, and the retry fails the same way).
            await waker.next_change(decision.uid or "", SETTLE_SECONDS)
            decision = await decide()
        target = decision.waiting_for
        if waker is not None and target is not None and sleeping(decision) is not None:
            if not await waker.hold(target.namespace, target.name, cause):
                return Decision(504, waking_detail(target.name))
            decision = await decide()
        if activity is not None and decision.status == 200 and decision.sandbox and decision.uid:
            namespace, _, name = decision.sandbox.partition("/")
            activity.note(namespace, name, decision.uid)
        return decision

    def preview_decision(request: web.Request) -> Decision:
        return preview.decide(
            request.headers.get("X-Original-Host", ""),
            request.headers.get("X-Original-URI", "/"),
            request.headers.get("Cookie", ""),
            request.headers.get(HEADER, ""),
        )

    async def sdk_decision(request: web.Request) -> Decision:
        # nginx keys its cache on one value per header: a repeated routing header is ambiguous, so refused.
        repeated = [h for h in SDK_HEADERS if len(request.headers.getall(h, ())) > 1]
        if repeated:
            return Decision(400, f"{repeated[0]} given more than once")
        return await sdk.decide(request.headers, peer=request.headers.get(PEER_HEADER, ""))

    def failed_upstream(request: web.Request) -> str | None:
        # Read on the retry endpoints only, where nginx sets it (to the upstream it could not connect to).
        return request.headers.get(FAILED_UPSTREAM_HEADER) if request.path.endswith("/retry") else None

    async def auth_preview(request: web.Request) -> web.Response:
        async def decide() -> Decision:
            return preview_decision(request)

        return _auth_answer(await held(decide, "preview", failed_upstream(request)))

    async def page_preview(request: web.Request) -> web.Response:
        decision = preview_decision(request)
        name = sleeping(decision)
        if name is not None:
            return _waking_page(request, name)
        if decision.status == 302:
            return web.Response(status=302, headers=dict(decision.headers))
        if decision.status == 200:
            # Became reachable between the check and this page: try again.
            return web.Response(
                status=307,
                headers={"Location": request.headers.get("X-Original-URI", "/"), "Cache-Control": "no-store"},
            )
        return _page(decision.status, decision.detail, retry=decision.status == 503)

    async def woken_again(request: web.Request, decide: Callable[[], Awaitable[Decision]]) -> bool:
        """Whether a request whose upstream refused the connection, and that nginx does not send twice (it has a
        body), may be sent again by the client: its sandbox is now routed to another Pod (nginx held it while
        the sandbox woke, in the auth subrequest of @shadow_resend)."""
        failed = request.headers.get(FAILED_UPSTREAM_HEADER)
        if not failed:
            return False
        decision = await decide()
        if waker is not None and decision.status == 200 and decision.upstream == failed:
            await waker.next_change(decision.uid or "", SETTLE_SECONDS)  # the watch says why in a moment
            decision = await decide()
        return decision.status == 200 and decision.upstream != failed

    def again(request: web.Request) -> web.Response:
        location = request.headers.get("X-Original-URI") or "/"
        return web.Response(status=307, headers={"Location": location, "Cache-Control": "no-store"})

    async def unreachable_preview(request: web.Request) -> web.Response:
        async def decide() -> Decision:
            return preview_decision(request)

        if await woken_again(request, decide):
            return again(request)
        name = sleeping(preview_decision(request))
        if name is not None:
            return _waking_page(request, name)
        return _page(502, "The sandbox's dev server is not answering yet.", retry=True)

    async def auth_sdk(request: web.Request) -> web.Response:
        async def decide() -> Decision:
            return await sdk_decision(request)

        return _auth_answer(await held(decide, "sdk", failed_upstream(request)))

    async def page_sdk(request: web.Request) -> web.Response:
        decision = await sdk_decision(request)
        name = sleeping(decision)
        if name is not None:
            return _json(504, waking_detail(name))
        if decision.status == 200:
            return _json(502, "sandbox routing changed; retry")
        headers = {"WWW-Authenticate": "Bearer"} if decision.status == 401 else {}
        response = _json(decision.status, decision.detail)
        response.headers.update(headers)
        return response

    async def unreachable_sdk(request: web.Request) -> web.Response:
        if request.headers.get("X-Sandbox-ID"):

            async def decide() -> Decision:
                return await sdk_decision(request)

            if await woken_again(request, decide):
                return again(request)
            name = sleeping(await sdk_decision(request))
            if name is not None:
                return _json(504, waking_detail(name))
        return _json(502, "sandbox unreachable")

    async def healthz(request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def readyz(request: web.Request) -> web.Response:
        if not ready.is_set():
            return web.json_response({"status": "syncing"}, status=503)
        return web.json_response({"status": "ok"})

    app = web.Application()
    app.router.add_get("/auth/preview", auth_preview)
    app.router.add_get("/auth/preview/retry", auth_preview)
    app.router.add_get("/page/preview", page_preview)
    app.router.add_get("/page/preview/unreachable", unreachable_preview)
    app.router.add_get("/auth/sdk", auth_sdk)
    app.router.add_get("/auth/sdk/retry", auth_sdk)
    app.router.add_get("/page/sdk", page_sdk)
    app.router.add_get("/page/sdk/unreachable", unreachable_sdk)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    return app


def build_metrics_app(registry: CollectorRegistry) -> web.Application:
    async def metrics(request: web.Request) -> web.Response:
        response = web.Response(body=generate_latest(registry))
        response.headers["Content-Type"] = CONTENT_TYPE_LATEST
        return response

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    return app
