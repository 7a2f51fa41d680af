"""Bearer-token auth and request-size limits as plain ASGI middleware (cheap on every request)."""

from __future__ import annotations

import hmac
import json

from starlette.types import ASGIApp, Message, Receive, Scope, Send

# Health endpoints stay open: kubelet probes and load balancers carry no token.
OPEN_PATHS = frozenset({"/", "/healthz", "/v1/health"})
# The API server's pod proxy authenticates its caller with `Authorization` and strips it, so a client that
# reaches the runtime through `pods/NAME:PORT/proxy` sends the runtime's token in this header instead.
TOKEN_HEADER = b"x-sandbox-runtime-token"


async def _json_error(
    send: Send, status: int, code: str, message: str, extra: list[tuple[bytes, bytes]]
) -> None:
    body = json.dumps({"code": code, "message": message, "detail": message}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()), *extra]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class AuthMiddleware:
    def __init__(self, app: ASGIApp, token: str | None) -> None:
        self.app = app
        self.expected = f"Bearer {token}".encode() if token else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.expected is None or scope["type"] not in ("http", "websocket") or scope["path"] in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        if any(hmac.compare_digest(got, self.expected) for got in _presented(scope)):
            await self.app(scope, receive, send)
            return
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 4401})
            return
        await _json_error(
            send,
            401,
            "UNAUTHENTICATED",
            "missing or invalid bearer token",
            [(b"www-authenticate", b"Bearer")],
        )


def _presented(scope: Scope) -> list[bytes]:
    """Every credential the request carries, each in the `Bearer <token>` form."""
    got: list[bytes] = []
    for k, v in scope["headers"]:
        if k == b"authorization":
            got.append(v)
        elif k == TOKEN_HEADER:
            got.append(b"Bearer " + v)
        elif k == b"sec-websocket-protocol" and scope["type"] == "websocket":
            # Browsers cannot set headers on WebSockets; accept the token as a subprotocol "bearer.<token>".
            for proto in v.split(b","):
                proto = proto.strip()
                if proto.startswith(b"bearer."):
                    got.append(b"Bearer " + proto[len(b"bearer.") :])
    return got


class BodyLimitMiddleware:
    """Caps request bodies except on the routes that stream to disk."""

    def __init__(self, app: ASGIApp, limit: int, streaming_prefixes: tuple[str, ...]) -> None:
        self.app = app
        self.limit = limit
        self.streaming = streaming_prefixes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD"):
            await self.app(scope, receive, send)
            return
        path: str = scope["path"]
        if any(path.startswith(p) for p in self.streaming) and scope["method"] in ("PUT", "POST"):
            await self.app(scope, receive, send)
            return
        for k, v in scope["headers"]:
            if k == b"content-length" and v.isdigit() and int(v) > self.limit:
                await _json_error(
                    send, 413, "RESOURCE_EXHAUSTED", f"request body larger than {self.limit} bytes", []
                )
                return
        seen = 0
        limit = self.limit

        async def limited() -> Message:
            nonlocal seen
            msg = await receive()
            if msg["type"] == "http.request":
                seen += len(msg.get("body", b""))
                if seen > limit:
                    raise BodyTooLarge()
            return msg

        try:
            await self.app(scope, limited, send)
        except BodyTooLarge:
            await _json_error(send, 413, "RESOURCE_EXHAUSTED", f"request body larger than {limit} bytes", [])


class BodyTooLarge(Exception):
    pass
