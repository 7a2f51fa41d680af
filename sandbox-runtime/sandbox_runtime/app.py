"""The ASGI application: the Runtime, one router per API dialect, error handlers and middleware."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Scope

from . import __version__
from .config import Settings
from .errors import ApiError, bad_request
from .middleware import ActivityMiddleware, MetricsMiddleware
from .paths import map_os_error
from .routers import amicable, legacy, native, pty, sandboxd, workspace
from .runtime import Runtime
from .security import AuthMiddleware, BodyLimitMiddleware

log = logging.getLogger("sandbox_runtime")

# Routes whose bodies stream to disk; every other body is capped at `max_json_body`.
STREAMING_PREFIXES = ("/upload", "/v1/files/", "/v1/archive")
# What the start-up's warming request asks for: a path no route has, so that matching it walks them all.
WARM_PATH = "/.sandbox-runtime/warm"


def create_app(settings: Settings) -> ASGIApp:
    rt = Runtime(settings)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        hb: asyncio.Task[None] | None = None
        if settings.handoff and settings.heartbeat_seconds > 0:
            hb = asyncio.get_running_loop().create_task(rt.heartbeat())
        grpc_server: Any = None
        if settings.grpc_port:
            from .grpc_process import serve  # the `grpc` extra is optional

            grpc_server = await serve(rt, settings.host, settings.grpc_port)
        await warm(app)
        try:
            yield
        finally:
            if grpc_server is not None:
                await grpc_server.stop(grace=1)
            if hb is not None:
                hb.cancel()
            await rt.shutdown()

    app = FastAPI(
        title="sandbox-runtime",
        version=__version__,
        description=(
            "Workspace API inside every shadow-operator sandbox pod. Serves the agent-sandbox legacy runtime, "
            "sandboxd REST and Amicable request shapes, plus a native /v1 API. All paths are relative to the "
            "workspace root; anything escaping it is refused."
        ),
        lifespan=lifespan,
    )
    app.state.runtime = rt  # what routers.common.get_runtime hands to every route
    _add_error_handlers(app)
    for dialect in (legacy, amicable, sandboxd, native, workspace, pty):
        app.include_router(dialect.router)

    wrapped: ASGIApp = BodyLimitMiddleware(app, settings.max_json_body, STREAMING_PREFIXES)
    wrapped = AuthMiddleware(wrapped, settings.token)
    wrapped = ActivityMiddleware(wrapped, rt.activity)
    wrapped = MetricsMiddleware(wrapped, rt.metrics)
    return wrapped


async def warm(app: FastAPI) -> None:
    """Have FastAPI build what it builds on a first request, before the port opens (uvicorn runs the lifespan
    first, and the Pod's readiness probe is that port): every route's validators and serializers, and the
    middleware stack. Done lazily, a warm-pool sandbox's first command paid about 100 ms of CPU for it, at
    the sandbox's small CPU share, while the pool's refill was starting Pods beside it. One request that no
    route answers walks every router; it goes to the bare application (no token, no activity, no metrics)."""
    sent: list[int] = []

    async def receive() -> Message:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Message) -> None:
        if message["type"] == "http.response.start":
            sent.append(message["status"])

    scope: Scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": WARM_PATH,
        "raw_path": WARM_PATH.encode(),
        "root_path": "",
        "query_string": b"",
        "headers": [],
        "client": None,
        "server": None,
    }
    await app(scope, receive, send)
    log.debug("warmed: %s answered %s", WARM_PATH, sent)


def _add_error_handlers(app: FastAPI) -> None:
    """Every error is JSON `{code, message, detail}`, with the sandboxd spec's codes."""

    @app.exception_handler(ApiError)
    async def api_error(_: Request, err: ApiError) -> JSONResponse:
        return JSONResponse(err.body(), status_code=err.status)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, err: StarletteHTTPException) -> JSONResponse:
        codes = {404: "NOT_FOUND", 405: "METHOD_NOT_ALLOWED", 401: "UNAUTHENTICATED"}
        body = {
            "code": codes.get(err.status_code, "ERROR"),
            "message": str(err.detail),
            "detail": str(err.detail),
        }
        return JSONResponse(body, status_code=err.status_code, headers=getattr(err, "headers", None))

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, err: RequestValidationError) -> JSONResponse:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e.get('loc', ()))}: {e.get('msg')}" for e in err.errors()
        )
        body = {
            "code": "INVALID_ARGUMENT",
            "message": problems or "invalid request",
            "errors": _jsonable(err),
        }
        return JSONResponse(body, status_code=422)

    @app.exception_handler(UnicodeError)
    async def unicode_error(_: Request, err: UnicodeError) -> JSONResponse:
        # Lone surrogates in JSON strings cannot become argv, env or file bytes.
        e = bad_request(f"text cannot be encoded: {err}")
        return JSONResponse(e.body(), status_code=e.status)

    @app.exception_handler(OSError)
    async def os_error(_: Request, err: OSError) -> JSONResponse:
        e = map_os_error(err, "request")
        return JSONResponse(e.body(), status_code=e.status)

    @app.exception_handler(Exception)
    async def unexpected(_: Request, err: Exception) -> JSONResponse:
        log.exception("unhandled error")
        return JSONResponse({"code": "INTERNAL", "message": f"internal error: {type(err).__name__}"}, 500)


def _jsonable(err: RequestValidationError) -> list[dict[str, Any]]:
    out = []
    for e in err.errors():
        out.append(
            {"loc": [str(p) for p in e.get("loc", ())], "msg": str(e.get("msg")), "type": str(e.get("type"))}
        )
    return out
