"""How long nobody has used the runtime: what an orchestrator reads to suspend an idle workspace.

Every API request (HTTP or WebSocket) counts, except health probes and metrics scrapes; a request in flight
(a long command, an open terminal) keeps the runtime busy until it ends.
"""

from __future__ import annotations

import time

from starlette.types import ASGIApp, Receive, Scope, Send

PASSIVE_PATHS = frozenset({"/", "/healthz", "/v1/health", "/metrics"})


class Activity:
    def __init__(self) -> None:
        self.in_flight = 0
        self.last = time.monotonic()

    def idle_seconds(self) -> float:
        return 0.0 if self.in_flight else time.monotonic() - self.last


class ActivityMiddleware:
    def __init__(self, app: ASGIApp, activity: Activity) -> None:
        self.app = app
        self.activity = activity

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket") or scope.get("path") in PASSIVE_PATHS:
            await self.app(scope, receive, send)
            return
        activity = self.activity
        activity.in_flight += 1
        try:
            await self.app(scope, receive, send)
        finally:
            activity.in_flight -= 1
            activity.last = time.monotonic()
