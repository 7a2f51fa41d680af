"""The Kubernetes API calls the SDK makes, and the one driver that runs them on a sync or an async httpx client.

Every SDK operation is written once, as a generator that yields `Call`s (or `Watch`es) and receives the
answers (sans-I/O): `run()` drives it on an `httpx.Client`, `arun()` on an `httpx.AsyncClient`. That is how
`ShadowGateway` and `AsyncShadowGateway` (and the sandbox twins) share every line of their logic.

Credentials come from the kubeconfig as kubectl reads it (`sdk.kubeconfig`: KUBECONFIG lists merged,
contexts, token files, client certificates, proxies), else the Pod's service account. A login with an exec
credential plugin (v1/v1beta1) or an auth provider goes through the `kubernetes` package's loader, imported
only then: it loads the generated API client, most of a second of CPU.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import os
import ssl
import time
import weakref
from collections.abc import AsyncIterator, Callable, Generator, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, Self, TypeVar

import httpx

from shadow_operator import __version__
from shadow_operator.common import runtimeapi
from shadow_operator.sdk import kubeconfig as kubeconfig_file
from shadow_operator.sdk.errors import (
    ApiNotInstalled,
    ClusterUnreachable,
    Conflict,
    Forbidden,
    Invalid,
    KubeError,
    NoCredentials,
    NotFound,
    NotKubernetes,
    RuntimeRefused,
    RuntimeUnreachable,
    ShadowError,
)

Body = dict[str, Any]
T = TypeVar("T")
C = TypeVar("C", bound=httpx.Client | httpx.AsyncClient)
USER_AGENT = f"shadow-operator-sdk/{__version__}"
MERGE_PATCH = "application/merge-patch+json"
WATCH_SECONDS = 60  # one watch request; waits re-watch until their deadline


# ------------------------------------------------------------------------------------------- clients
Login = kubeconfig_file.Login


def kubeconfig_paths(kubeconfig: str | None = None) -> str:
    """The kubeconfig file list kubectl would read: --kubeconfig, else $KUBECONFIG, else ~/.kube/config."""
    return kubeconfig or os.environ.get("KUBECONFIG") or os.path.expanduser("~/.kube/config")


def context_namespace(context: str | None = None, kubeconfig: str | None = None) -> str:
    """The namespace of `context` (the current one if None) as the kubeconfig names it, else the Pod's, else
    "default". Reads the files only: no credential plugin runs, no API call. A kubeconfig that cannot be
    read, or names no such context, is a one-line NoCredentials."""
    return kubeconfig_file.context_namespace(context, kubeconfig)


def login(context: str | None = None, kubeconfig: str | None = None) -> Login:
    """Read the credentials of `context` (the current one if None) from the kubeconfig, or the Pod's.

    Read by `sdk.kubeconfig` unless the login needs what only the `kubernetes` package's loader runs (an exec
    credential plugin, an auth provider): that package is imported only then."""
    if kubeconfig_file.needs_full_loader(context, kubeconfig):
        return _full_login(context, kubeconfig)
    return kubeconfig_file.credentials(context, kubeconfig)


def _full_login(context: str | None, kubeconfig: str | None) -> Login:
    """The `kubernetes` package's loader, for exec credential plugins and auth providers (the files exist and
    name the context: `sdk.kubeconfig` checked)."""
    from kubernetes.client import Configuration
    from kubernetes.config import ConfigException, kube_config

    paths = kubeconfig_paths(kubeconfig)

    def load() -> Any:
        config = Configuration()
        # The loader logs a failing credential plugin and goes on without credentials (a bare 401 later):
        # its complaint is caught here and becomes the error.
        complaints = _Complaints()
        root = logging.getLogger()
        root.addHandler(complaints)
        try:
            kube_config.load_kube_config(
                config_file=paths, context=context, client_configuration=config, persist_config=False
            )
        finally:
            root.removeHandler(complaints)
        if complaints.messages:
            raise NoCredentials(
                f"the kubeconfig's credential plugin failed: {complaints.messages[0]}",
                hint="run the user's exec command from `kubectl config view --minify` to see why",
            )
        return config

    try:
        config = load()
    except ConfigException as exc:
        message = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise NoCredentials(
            f"no usable Kubernetes credentials in the kubeconfig ({paths}) ({message})",
            hint="list the contexts: kubectl config get-contexts",
        ) from None
    except (OSError, KeyError, ValueError, TypeError) as exc:
        raise NoCredentials(
            f"cannot read the Kubernetes credentials from {paths}: {exc}",
            hint="check the file with: kubectl config view",
        ) from None

    def refresh() -> dict[str, str]:
        try:
            return _auth_headers(load())
        except (ConfigException, OSError) as exc:
            raise NoCredentials(f"cannot renew the Kubernetes credentials: {exc}") from None

    return Login(
        server=str(config.host),
        ssl_context=_ssl_context(config),
        headers=_auth_headers(config),
        proxy=config.proxy or None,
        namespace=context_namespace(context, kubeconfig),
        refresh=refresh,
    )


class _Complaints(logging.Handler):
    """Error records logged while the kubeconfig loads, one line each."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(" ".join(record.getMessage().split())[:500])


def _auth_headers(config: Any) -> dict[str, str]:
    token = config.api_key.get("BearerToken") or config.api_key.get("authorization")
    if token:
        return {"Authorization": token if token.startswith("Bearer ") else f"Bearer {token}"}
    if config.username and config.password:
        pair = base64.b64encode(f"{config.username}:{config.password}".encode()).decode()
        return {"Authorization": f"Basic {pair}"}
    return {}


def _ssl_context(config: Any) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=config.ssl_ca_cert or None)
    if not config.verify_ssl:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    if config.cert_file:
        context.load_cert_chain(config.cert_file, config.key_file)
    return context


class _RenewingAuth(httpx.Auth):
    """The login's credentials on every request; a 401 runs the credential source once more (an exec plugin's
    token expires, a token file is rotated) and retries with what it gives."""

    def __init__(self, identity: Login) -> None:
        self._login = identity
        self._headers = dict(identity.headers)

    def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        request.headers.update(self._headers)
        response = yield request
        # A streamed body (an upload) cannot be sent twice: its 401 stands.
        if response.status_code == 401 and self._headers and isinstance(request.stream, httpx.ByteStream):
            self._headers = self._login.refresh()
            request.headers.update(self._headers)
            yield request


def _client_options(timeout: float, context: str | None, kubeconfig: str | None) -> dict[str, Any]:
    identity = login(context, kubeconfig)
    return {
        "base_url": identity.server,
        "verify": identity.ssl_context,
        "auth": _RenewingAuth(identity),
        "headers": {"Accept": "application/json", "User-Agent": USER_AGENT},
        "proxy": identity.proxy,
        "timeout": httpx.Timeout(timeout, connect=10.0),
    }


# Watches go through a sibling of the client, made with the same settings. A watch ends early, once the change it
# waits for has come, and a connection whose answer was left unread cannot carry another request: on the client
# itself, the next request (after a claim turns Ready: the first command's reads) would open a new connection,
# TLS handshake included, on a busy API server. The sibling opens its connection while the awaited change is
# being made, and keeps none (no keep-alive), so it holds nothing open between watches.
_WATCHERS: weakref.WeakKeyDictionary[httpx.Client | httpx.AsyncClient, Any] = weakref.WeakKeyDictionary()
_WATCH_LIMITS = httpx.Limits(max_keepalive_connections=0)


def connect(
    *, timeout: float = 30.0, context: str | None = None, kubeconfig: str | None = None
) -> httpx.Client:
    """An httpx client for the API server of the current kubeconfig context (or the Pod's service account).

    A client on someone's machine acts as them, so their kubeconfig wins over a service account, as with
    kubectl: exec credential plugins (EKS, GKE, AKS, kubelogin), token files, client certificates.
    """
    options = _client_options(timeout, context, kubeconfig)
    client = httpx.Client(**options)
    _WATCHERS[client] = httpx.Client(**options, limits=_WATCH_LIMITS)
    return client


def connect_async(
    *, timeout: float = 30.0, context: str | None = None, kubeconfig: str | None = None
) -> httpx.AsyncClient:
    """The async twin of `connect()`."""
    options = _client_options(timeout, context, kubeconfig)
    client = httpx.AsyncClient(**options)
    _WATCHERS[client] = httpx.AsyncClient(**options, limits=_WATCH_LIMITS)
    return client


class Holder(Generic[C]):
    """An SDK object that talks through one httpx client (`C`: sync or async): the caller's, or its own, made
    by `_connect` and closed with it. The twins below add closing; a class written for both derives from this
    with a type variable and is paired with one of them."""

    def __init__(self, client: C | None) -> None:
        self._own_client = client is None
        self._http: C = client or self._connect()

    def _connect(self) -> C:
        raise NotImplementedError


class ClientHolder(Holder[httpx.Client]):
    """An SDK object that talks through one `httpx.Client`: the caller's, or its own, closed with it (`close()`
    or the end of a `with` block)."""

    def _connect(self) -> httpx.Client:
        return connect()

    def close(self) -> None:
        """Close the httpx client if this object made it (not one the caller passed)."""
        if self._own_client:
            self._http.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncClientHolder(Holder[httpx.AsyncClient]):
    """The async twin of ClientHolder (`aclose()`, `async with`)."""

    def _connect(self) -> httpx.AsyncClient:
        return connect_async()

    async def aclose(self) -> None:
        """Close the httpx client if this object made it (not one the caller passed)."""
        if self._own_client:
            await self._http.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


def documented_as(sync: type) -> Callable[[type[T]], type[T]]:
    """A class decorator for an async twin: each of its public methods and properties without a docstring
    takes the one of the same name in `sync`, so that a method is documented once for both."""

    def decorate(cls: type[T]) -> type[T]:
        for name, member in vars(cls).items():
            twin = getattr(sync, name, None)
            if name.startswith("_") or twin is None or getattr(member, "__doc__", None):
                continue
            if isinstance(member, property):
                setattr(cls, name, property(member.fget, member.fset, member.fdel, twin.__doc__))
            elif callable(member):
                member.__doc__ = twin.__doc__
        return cls

    return decorate


# -------------------------------------------------------------------------------------------- calls
@dataclass(frozen=True)
class Call:
    """One HTTP request of an operation. `runtime` marks calls to a workspace runtime (through the pod
    proxy), whose errors are the runtime's rather than the API server's."""

    method: str
    path: str
    what: str
    body: Any = None
    params: Mapping[str, str] | None = None
    content: bytes | Iterator[bytes] | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    content_type: str = "application/json"
    timeout: float | None = None
    runtime: bool = False
    ok: tuple[int, ...] = ()  # error statuses the operation handles itself
    # Where the body of a successful answer goes, piece by piece, instead of into memory (large downloads).
    sink: Callable[[bytes], None] | None = None
    # Bytes read of the answer at most (a runtime's: the tenant's); past them the call fails unread.
    limit: int | None = None


@dataclass(frozen=True)
class Watch:
    """A watch of a collection: the driver sends each (type, object) into the operation, which yields this
    same Watch again to receive the next event, or anything else to stop watching. `None` is sent when the
    server ends the watch (its timeout); the operation then decides whether to watch on."""

    path: str
    what: str
    params: Mapping[str, str]
    timeout_seconds: int = WATCH_SECONDS


@dataclass(frozen=True)
class Pause:
    """A short wait inside an operation (a runtime that is starting, tried again); the driver sends None."""

    seconds: float


@dataclass(frozen=True)
class Finished:
    """An operation that returned while a watch was streaming (a coroutine may not let StopIteration out)."""

    value: Any


Step = Call | Watch | Pause
Op = Generator[Step, Any, T]


def _resume(op: Op[Any], value: Any) -> Step | Finished:
    """Send the answer (or throw the error) into the operation; errors are raised inside it, so operations
    catch what they can handle (a NotFound that means "deleted", a 410 that means "watch again")."""
    try:
        return op.throw(value) if isinstance(value, ShadowError) else op.send(value)
    except StopIteration as done:
        return Finished(done.value)


def run(client: httpx.Client, op: Op[T]) -> T:
    """Drive an operation on a synchronous client."""
    try:
        step: Step | Finished = next(op)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    while not isinstance(step, Finished):
        if isinstance(step, Watch):
            step = _watch(client, op, step)
        elif isinstance(step, Pause):
            time.sleep(step.seconds)
            step = _resume(op, None)
        else:
            step = _resume(op, _send(client, step))
    return step.value  # type: ignore[no-any-return]


async def arun(client: httpx.AsyncClient, op: Op[T]) -> T:
    """Drive an operation on an asynchronous client."""
    try:
        step: Step | Finished = next(op)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    while not isinstance(step, Finished):
        if isinstance(step, Watch):
            step = await _awatch(client, op, step)
        elif isinstance(step, Pause):
            await asyncio.sleep(step.seconds)
            step = _resume(op, None)
        else:
            step = _resume(op, await _asend(client, step))
    return step.value  # type: ignore[no-any-return]


def _request_args(call: Call) -> dict[str, Any]:
    headers = dict(call.headers)
    content: Any = call.content
    if call.body is not None:
        content = json.dumps(call.body, separators=(",", ":"))
    if content is not None and "Content-Type" not in headers:
        headers["Content-Type"] = call.content_type
    args: dict[str, Any] = {"params": call.params, "content": content, "headers": headers}
    if call.timeout is not None:
        args["timeout"] = httpx.Timeout(call.timeout, connect=10.0)
    return args


def _send(client: httpx.Client, call: Call) -> httpx.Response | ShadowError:
    try:
        if call.sink is None and call.limit is None:
            response = client.request(call.method, call.path, **_request_args(call))
        else:
            with client.stream(call.method, call.path, **_request_args(call)) as response:
                if call.limit is not None and (call.sink is None or not response.is_success):
                    return _checked(call, held(call, response, response.iter_raw()))
                if call.sink is None or not response.is_success:
                    response.read()
                    return _checked(call, response)
                for piece in response.iter_bytes():
                    call.sink(piece)
    except (httpx.TransportError, ShadowError) as exc:
        return _failed(call, exc)
    return _checked(call, response)


async def _asend(client: httpx.AsyncClient, call: Call) -> httpx.Response | ShadowError:
    args = _request_args(call)
    if isinstance(call.content, Iterator):
        args["content"] = _async_chunks(call.content)
    try:
        if call.sink is None and call.limit is None:
            response = await client.request(call.method, call.path, **args)
        else:
            async with client.stream(call.method, call.path, **args) as response:
                if call.limit is not None and (call.sink is None or not response.is_success):
                    return _checked(call, await aheld(call, response, response.aiter_raw()))
                if call.sink is None or not response.is_success:
                    await response.aread()
                    return _checked(call, response)
                async for piece in response.aiter_bytes():
                    call.sink(piece)
    except (httpx.TransportError, ShadowError) as exc:
        return _failed(call, exc)
    return _checked(call, response)


# An error answer's part that goes into the error's message.
ERROR_BYTES = 4096


def _reader(call: Call, response: httpx.Response) -> runtimeapi.BoundedRead:
    """The bounded reader of a streamed answer: an error's first bytes, else the whole answer within the
    call's limit."""
    limit = call.limit or runtimeapi.CLIENT_MAX_ANSWER_BYTES
    reader = (
        runtimeapi.BoundedRead(limit)
        if response.is_success
        else runtimeapi.BoundedRead(ERROR_BYTES, cut=True)
    )
    try:
        reader.start(response.headers)
    except runtimeapi.AnswerRefused as exc:
        raise _refused(call, response, exc) from None
    return reader


def _refused(call: Call, response: httpx.Response, exc: runtimeapi.AnswerRefused) -> ShadowError:
    return RuntimeRefused(response.status_code, f"an answer {exc}, not read", what=call.what)


def _held(response: httpx.Response, content: bytes) -> httpx.Response:
    return httpx.Response(
        response.status_code, headers=response.headers, content=content, request=response.request
    )


def _feed(call: Call, response: httpx.Response, reader: runtimeapi.BoundedRead, piece: bytes) -> bool:
    try:
        return reader.feed(piece)
    except runtimeapi.AnswerRefused as exc:
        raise _refused(call, response, exc) from None


def held(call: Call, response: httpx.Response, chunks: Iterator[bytes]) -> httpx.Response:
    """A streamed answer read within the call's limit, as a response held in memory."""
    reader = _reader(call, response)
    for piece in chunks:
        if not _feed(call, response, reader, piece):
            break
    return _held(response, reader.content)


async def aheld(call: Call, response: httpx.Response, chunks: AsyncIterator[bytes]) -> httpx.Response:
    """The async twin of held."""
    reader = _reader(call, response)
    async for piece in chunks:
        if not _feed(call, response, reader, piece):
            break
    return _held(response, reader.content)


def stream_args(call: Call) -> dict[str, Any]:
    """The arguments of a streamed call (a stream's timeout is the call's, None: none between events)."""
    return {**_request_args(call), "timeout": httpx.Timeout(call.timeout, connect=10.0)}


def lines_of(call: Call, response: httpx.Response) -> runtimeapi.Lines:
    """The bounded NDJSON reader of a streamed answer (each line at most the call's limit)."""
    try:
        runtimeapi.refuse_encoded(response.headers)
    except runtimeapi.AnswerRefused as exc:
        raise _refused(call, response, exc) from None
    return runtimeapi.Lines(call.limit or runtimeapi.CLIENT_MAX_ANSWER_BYTES)


def events(call: Call, lines: runtimeapi.Lines, piece: bytes | None) -> list[Body]:
    """The lines a piece of the stream completes (None: the stream ended)."""
    try:
        return lines.feed(piece) if piece is not None else lines.end()
    except runtimeapi.AnswerRefused as exc:
        raise RuntimeRefused(200, f"a stream {exc}", what=call.what) from None


async def _async_chunks(chunks: Iterator[bytes]) -> AsyncIterator[bytes]:
    """A blocking producer (reading local files) fed to an async upload without blocking the loop."""
    import asyncio  # here, not at the top: a sync client (every shadowctl call) never needs it

    end = object()
    while (piece := await asyncio.to_thread(next, chunks, end)) is not end:
        yield piece  # type: ignore[misc]


def _checked(call: Call, response: httpx.Response) -> httpx.Response | ShadowError:
    if not call.runtime and _is_html(response):
        return _not_kubernetes(call.what, response)
    if response.is_success or response.status_code in call.ok:
        return response
    return error_of(response, call)


def _is_html(response: httpx.Response) -> bool:
    """The API server never answers HTML; a proxy, a login page or a load balancer's error page does."""
    return str(response.headers.get("content-type", "")).split(";")[0].strip().lower() == "text/html"


def _not_kubernetes(what: str, response: httpx.Response) -> ShadowError:
    return NotKubernetes(
        f"{what}: {response.url.host} answered {response.status_code} {response.reason_phrase} with an HTML "
        "page, not the Kubernetes API"
    )


def _failed(call: Call, exc: Exception) -> ShadowError:
    """A call that got no usable answer: the connection failed, or the answer was refused unread."""
    return exc if isinstance(exc, ShadowError) else _transport_error(call, exc)


def _transport_error(call: Call, exc: Exception) -> ShadowError:
    if call.runtime:
        return RuntimeUnreachable(f"{call.what}: cannot reach the workspace runtime ({type(exc).__name__})")
    return ClusterUnreachable(f"{call.what}: cannot reach the API server ({type(exc).__name__}: {exc})")


def _watch(client: httpx.Client, op: Op[Any], watch: Watch) -> Step | Finished:
    query = _watch_params(watch)
    timeout = httpx.Timeout(watch.timeout_seconds + 15.0, connect=10.0)
    call = Call("GET", watch.path, watch.what)
    watcher: httpx.Client = _WATCHERS.get(client, client)
    try:
        with watcher.stream("GET", watch.path, params=query, timeout=timeout) as response:
            if not response.is_success or _is_html(response):
                response.read()
                return _resume(op, error_of(response, call))
            for line in response.iter_lines():
                if line.strip() and (step := _event(op, line, watch)) is not watch:
                    return step
    except httpx.TransportError:
        pass  # a dropped watch ends like a quiet one: the operation reads again and watches on
    return _resume(op, None)


async def _awatch(client: httpx.AsyncClient, op: Op[Any], watch: Watch) -> Step | Finished:
    query = _watch_params(watch)
    timeout = httpx.Timeout(watch.timeout_seconds + 15.0, connect=10.0)
    call = Call("GET", watch.path, watch.what)
    watcher: httpx.AsyncClient = _WATCHERS.get(client, client)
    try:
        async with watcher.stream("GET", watch.path, params=query, timeout=timeout) as response:
            if not response.is_success or _is_html(response):
                await response.aread()
                return _resume(op, error_of(response, call))
            async for line in response.aiter_lines():
                if line.strip() and (step := _event(op, line, watch)) is not watch:
                    return step
    except httpx.TransportError:
        pass
    return _resume(op, None)


def _watch_params(watch: Watch) -> dict[str, str]:
    return {
        **watch.params,
        "watch": "1",
        "allowWatchBookmarks": "true",
        "timeoutSeconds": str(watch.timeout_seconds),
    }


def _event(op: Op[Any], line: str, watch: Watch) -> Step | Finished:
    event = json.loads(line)
    if event["type"] == "ERROR":
        obj = event["object"]
        error = KubeError(
            str(obj.get("message")), status=int(obj.get("code") or 500), reason=str(obj.get("reason"))
        )
        return _resume(op, error)
    return _resume(op, (str(event["type"]), event["object"]))


# ------------------------------------------------------------------------------------------- errors
def error_of(response: httpx.Response, call: Call | None = None) -> ShadowError:
    """The typed error of a non-2xx answer, with the Status's reason and message when there is one."""
    what = call.what if call else f"{response.request.method} {response.request.url.path}"
    if not (call is not None and call.runtime) and _is_html(response):
        return _not_kubernetes(what, response)
    reason, message = response.reason_phrase, " ".join(response.text[:1000].split())
    with contextlib.suppress(ValueError):
        decoded = response.json()
        if isinstance(decoded, dict):
            reason = str(decoded.get("reason") or decoded.get("code") or reason)
            message = str(decoded.get("message") or decoded.get("detail") or message)
    status = response.status_code
    if call is not None and call.runtime:
        if not _from_api_server(response):
            return RuntimeRefused(status, message, what=what)
        if status in (404, 502, 503):  # no such Pod, or the API server cannot reach it
            return RuntimeUnreachable(f"{what}: the API server cannot reach the workspace runtime: {message}")
    if status == 404 and "could not find the requested resource" in message:
        return ApiNotInstalled(
            f"{what}: this API is not installed in the cluster", status=status, reason=reason
        )
    kinds: dict[int, type[KubeError]] = {404: NotFound, 403: Forbidden, 409: Conflict, 422: Invalid}
    return kinds.get(status, KubeError)(f"{what}: {message}", status=status, reason=reason)


def _from_api_server(response: httpx.Response) -> bool:
    """Whether an error answer through the pod proxy is the API server's own (a Status object) rather than
    the runtime's: the runtime answers JSON errors with a `code`, never a `kind: Status`."""
    with contextlib.suppress(ValueError):
        decoded = response.json()
        return isinstance(decoded, dict) and decoded.get("kind") == "Status"
    return False


# -------------------------------------------------------------------------------- operations, reused
def get(path: str, what: str) -> Op[Body]:
    response = yield Call("GET", path, what)
    return decoded(response, what)


def send(call: Call) -> Op[Body]:
    """One JSON call, its decoded answer ({} for an empty body)."""
    response = yield call
    return decoded(response, call.what) if response.content else {}


def decoded(response: httpx.Response, what: str) -> Body:
    """The JSON object of an answer; anything else means something other than the API server answered."""
    try:
        body = response.json()
    except ValueError:
        body = None
    if not isinstance(body, dict):
        kind = str(response.headers.get("content-type") or "no content type")
        raise NotKubernetes(
            f"{what}: {response.url.host} answered {response.status_code} ({kind}), not a Kubernetes object"
        )
    return body


def wait_for(
    collection: str,
    name: str,
    what: str,
    current: Body,
    check: Callable[[Body], T | None],
    deadline: float,
    now: Callable[[], float],
    on_timeout: Callable[[Body], ShadowError],
    on_deleted: Callable[[], ShadowError],
) -> Op[T]:
    """Follow one object with watches until `check(obj)` returns something (or raises), never by polling.

    `current` is the object as last read; its resourceVersion starts the watch, so no change is missed.
    """
    result = check(current)
    obj = current
    while result is None:
        left = deadline - now()
        if left <= 0:
            raise on_timeout(obj)
        version = obj.get("metadata", {}).get("resourceVersion", "")
        watch = Watch(
            collection,
            what,
            {"fieldSelector": f"metadata.name={name}", "resourceVersion": version},
            max(1, min(WATCH_SECONDS, int(left))),
        )
        event = None
        try:
            event = yield watch
            while event is not None:
                kind, body = event
                obj = body if kind in ("ADDED", "MODIFIED") else obj
                if kind == "DELETED":
                    raise on_deleted()
                if kind != "BOOKMARK" and (result := check(obj)) is not None:
                    break
                obj.setdefault("metadata", {})["resourceVersion"] = body.get("metadata", {}).get(
                    "resourceVersion", version
                )
                event = yield watch
        except KubeError as exc:
            if exc.status != 410:
                raise
            obj = {}
        if result is None and (event is None or not obj):
            # The watch ended (its timeout, a drop, or a version too old): read the object and watch on.
            try:
                obj = yield from get(f"{collection}/{name}", what)
            except NotFound:
                raise on_deleted() from None
            result = check(obj)
    return result


def iter_lines(response: httpx.Response) -> Iterator[Body]:
    """Decoded NDJSON lines of a streamed answer."""
    for line in response.iter_lines():
        if line.strip():
            yield json.loads(line)


def request(
    client: httpx.Client,
    method: str,
    path: str,
    *,
    body: Any = None,
    content_type: str = "application/json",
    what: str = "",
) -> Body:
    """One JSON call on a synchronous client; a non-2xx answer raises the typed error."""
    call = Call(method, path, what or f"{method} {path}", body=body, content_type=content_type)
    return run(client, send(call))


def websocket_options(
    context: str | None = None, kubeconfig: str | None = None
) -> tuple[str, ssl.SSLContext, dict[str, str]]:
    """(server URL, SSL context, auth headers) for a WebSocket to the API server (httpx speaks none)."""
    identity = login(context, kubeconfig)
    return identity.server, identity.ssl_context, dict(identity.headers)
