"""Activity and metrics as plain ASGI middleware (cheap on every request; the core stays framework-free)."""

from __future__ import annotations

import time

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .activity import PASSIVE_PATHS, Activity
from .metrics import Metrics


class ActivityMiddleware:
    def __init__(self, app: ASGIApp, activity: Activity) -> None:
        self.app = app
        self.activity = activity

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket") or scope.get("path") in PASSIVE_PATHS:
            await self.app(scope, receive, send)
            return
        with self.activity.busy():
            await self.app(scope, receive, send)


class MetricsMiddleware:
    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = [500]

        async def capture(msg: Message) -> None:
            if msg["type"] == "http.response.start":
                status[0] = msg["status"]
            await send(msg)

        try:
            await self.app(scope, receive, capture)
        finally:
            route = scope.get("route")
            # The route template, not the raw path, keeps label cardinality bounded.
            name = getattr(route, "path", None) or "unmatched"
            self.metrics.requests.labels(scope["method"], name, str(status[0])).observe(
                time.perf_counter() - start
            )
