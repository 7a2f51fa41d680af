"""The workspace runtime's native API (`/v1/...`) as SDK operations, reached through the API server's pod proxy.

The proxy consumes `Authorization` (the caller's credentials for the API server), which is why the runtime's
token travels in `X-Sandbox-Runtime-Token`. RBAC the caller needs: get secrets (the token), create pods/proxy.
"""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypedDict, TypeVar, cast

import httpx
from pydantic import BaseModel, Field

from shadow_operator.api import constants as c
from shadow_operator.api.kinds import POD, SECRET
from shadow_operator.common import runtimeapi
from shadow_operator.common.runtimeapi import ExecutionResult as ExecutionResult  # the SDK names it here too
from shadow_operator.sdk import kube
from shadow_operator.sdk.errors import RuntimeRefused, ShadowError
from shadow_operator.sdk.kube import Call, Op

T = TypeVar("T")

TOKEN_HEADER = "X-Sandbox-Runtime-Token"
NDJSON = "application/x-ndjson"


class DiffFile(BaseModel):
    path: str
    status: Literal["added", "modified", "deleted"]
    binary: bool = False
    size: int | None = None


class Diff(BaseModel):
    """Changes in the workspace since its baseline (taken once the sources were copied in)."""

    added: list[str] = Field(default_factory=list)
    modified: list[str] = Field(default_factory=list)
    deleted: list[str] = Field(default_factory=list)
    files: list[DiffFile] = Field(default_factory=list)
    patch: str | None = None

    @property
    def empty(self) -> bool:
        """Whether nothing changed."""
        return not (self.added or self.modified or self.deleted)

    def changed_in(self, sources: Sequence[str]) -> list[str]:
        """The changed paths inside the source directories (workspace-relative), sorted: what a source's
        promote would carry, without the rest of the workspace (the runtime's HANDOFF.md, caches, tools)."""
        return sorted(p for p in {*self.added, *self.modified, *self.deleted} if in_sources(p, sources))


def in_sources(path: str, sources: Sequence[str]) -> bool:
    """Whether a workspace-relative path lies in one of the source directories."""
    return any(path.startswith(s.strip("/") + "/") for s in sources)


class JournalEntry(BaseModel):
    """One recorded command (or decision) of the workspace's journal."""

    model_config = {"extra": "allow"}

    seq: int
    kind: str
    time: float
    command: str | None = None
    exit_code: int | None = None
    significant: bool = False
    text: str | None = None


class ImportResult(BaseModel):
    path: str
    files: int
    bytes: int


@dataclass(frozen=True)
class RuntimeEndpoint:
    """A runtime as seen through the API server: the pod proxy's base path and the token header. What it
    reads of one answer is bounded (`max_answer_bytes`): the runtime is the tenant's."""

    base: str
    headers: dict[str, str]
    max_answer_bytes: int = runtimeapi.CLIENT_MAX_ANSWER_BYTES

    def call(self, request: runtimeapi.Request, *, sink: Callable[[bytes], None] | None = None) -> Call:
        """The SDK's call for a request of the runtime API (a `sink` takes a successful answer's body)."""
        return Call(
            request.method,
            self.base + request.path,
            request.what,
            body=request.body,
            params=request.params,
            content=request.content,
            # Counted as it arrives on the wire, so not compressed (refused if it is anyway).
            headers={**self.headers, "Accept-Encoding": "identity"},
            content_type=request.content_type,
            timeout=request.timeout,
            runtime=True,
            ok=request.ok,
            sink=sink,
            limit=self.max_answer_bytes,
        )

    def over(self, op: runtimeapi.Op[T]) -> Op[T]:
        """A runtime API operation as an SDK operation: its requests through the pod proxy, its answers read
        within the limit; an answer it cannot use fails it with RuntimeRefused."""
        try:
            request = next(op)
            while True:
                response = yield self.call(request)
                answer = runtimeapi.Answer(
                    response.status_code, response.content, response.headers, request.max_containers
                )
                try:
                    request = op.send(answer)
                except runtimeapi.AnswerRefused as exc:
                    raise RuntimeRefused(answer.status, f"an answer {exc}", what=request.what) from None
        except StopIteration as done:
            return cast(T, done.value)


def endpoint(namespace: str, pod: str, port: int, token: str) -> RuntimeEndpoint:
    return RuntimeEndpoint(POD.path(namespace, f"{pod}:{port}", "proxy"), {TOKEN_HEADER: token})


def read_token(namespace: str, secret: str) -> Op[str]:
    """The runtime's bearer token from the Secret the operator made for it."""
    body = yield from kube.get(SECRET.path(namespace, secret), f"Secret {namespace}/{secret}")
    encoded = (body.get("data") or {}).get(c.RUNTIME_TOKEN_KEY)
    if not encoded:
        raise ShadowError(
            f"Secret {namespace}/{secret} has no key {c.RUNTIME_TOKEN_KEY!r} (the runtime's token)",
            hint="the operator writes it; is it running? shadowctl doctor",
        )
    return base64.b64decode(encoded).decode().strip()


class ExecOptions(TypedDict, total=False):
    """Where a command runs, for the SDK's `exec` and `commands.run` (sync and async alike)."""

    cwd: str  # the directory, relative to the workspace ("": the workspace)
    env: dict[str, str] | None  # variables added to the command's environment


def exec_body(
    command: str | list[str],
    *,
    cwd: str = "",
    env: dict[str, str] | None = None,
    timeout: float | None = 300.0,
    stdin: str | None = None,
    journal: bool = True,
) -> dict[str, Any]:
    """The body of POST /v1/exec: a string runs under `sh -c`, a list without a shell."""
    return runtimeapi.exec_body(command, cwd=cwd, env=env, timeout=timeout, stdin=stdin, journal=journal)


def exec_call(ep: RuntimeEndpoint, command: str | list[str], *, stream: bool = False, **kw: Any) -> Call:
    """POST /v1/exec (or /v1/exec/stream, which keeps no journal flag)."""
    body = exec_body(command, **kw)
    if stream:
        body.pop("journal")
    return ep.call(runtimeapi.exec_request(body, stream=stream))


def run_command(ep: RuntimeEndpoint, command: str | list[str], **kw: Any) -> Op[ExecutionResult]:
    return ExecutionResult.model_validate((yield from ep.over(runtimeapi.run(exec_body(command, **kw)))))


def read_file(ep: RuntimeEndpoint, path: str) -> Op[bytes]:
    return (yield from ep.over(runtimeapi.read_file(path)))


def read_head(ep: RuntimeEndpoint, path: str, limit: int) -> Op[tuple[bytes, bool]]:
    """At most `limit` bytes from the start of a file, and whether it has more. The runtime is asked for
    `limit + 1` bytes; what it sends beyond that is dropped as it arrives, so a runtime that ignores the
    length still costs no more memory than the limit."""
    kept = bytearray()

    def keep(piece: bytes) -> None:
        kept.extend(piece[: limit + 1 - len(kept)])

    params = {"offset": "0", "length": str(limit + 1)}
    yield ep.call(runtimeapi.read_request(path, params), sink=keep)
    return bytes(kept[:limit]), len(kept) > limit


def tree(ep: RuntimeEndpoint, path: str, *, depth: int = 1) -> Op[list[dict[str, Any]]]:
    """The entries under a directory (name, path, type, size, mode, modified_at), `depth` levels down."""
    return (yield from ep.over(runtimeapi.tree(path, depth=depth)))


def read_into(ep: RuntimeEndpoint, path: str, sink: Callable[[bytes], None]) -> Op[None]:
    """GET a file and hand its bytes to `sink` as they arrive (never whole in memory)."""
    yield ep.call(runtimeapi.read_request(path), sink=sink)


def write_file(ep: RuntimeEndpoint, path: str, data: bytes, *, mode: int | None = None) -> Op[None]:
    yield from ep.over(runtimeapi.write_file(path, data, mode=mode))


def delete_path(ep: RuntimeEndpoint, path: str, *, recursive: bool = False) -> Op[None]:
    yield from ep.over(runtimeapi.delete(path, recursive=recursive))


def stat(ep: RuntimeEndpoint, path: str) -> Op[dict[str, Any] | None]:
    """The file's metadata, or None when nothing is at that path."""
    return (yield from ep.over(runtimeapi.stat(path)))


def diff(ep: RuntimeEndpoint, *, paths_only: bool = False) -> Op[Diff]:
    return Diff.model_validate((yield from ep.over(runtimeapi.diff(paths_only=paths_only))))


def archive_call(ep: RuntimeEndpoint, path: str, exclude: list[str] | None = None) -> Call:
    """GET /v1/archive/{path}: the directory as tar.gz (stream the answer)."""
    return ep.call(runtimeapi.archive_request(path, exclude))


def import_archive(ep: RuntimeEndpoint, dest: str, chunks: Iterator[bytes]) -> Op[ImportResult]:
    """POST /v1/archive/{dest}: extract a tar.gz stream under a directory of the workspace."""
    return ImportResult.model_validate((yield from ep.over(runtimeapi.import_archive(dest, chunks))))


def journal(ep: RuntimeEndpoint, *, since: int = 0, significant: bool = False) -> Op[list[JournalEntry]]:
    entries = yield from ep.over(runtimeapi.journal(since=since, significant=significant))
    return [JournalEntry.model_validate(e) for e in entries]


def decide(ep: RuntimeEndpoint, text: str, author: str | None = None) -> Op[JournalEntry]:
    """Record a decision in the journal (HANDOFF.md's Decision Log, where the runtime keeps one)."""
    if not text.strip():
        raise ShadowError("a decision needs its text", hint='e.g. shadowctl decide NAME "keep the v1 API"')
    return JournalEntry.model_validate((yield from ep.over(runtimeapi.decide(text, author))))


def journal_follow_call(ep: RuntimeEndpoint, *, since: int = 0, significant: bool = False) -> Call:
    return ep.call(runtimeapi.journal_follow_request(since=since, significant=significant))


def handoff(ep: RuntimeEndpoint) -> Op[str | None]:
    """HANDOFF.md of the workspace, or None when the runtime keeps none."""
    return (yield from ep.over(runtimeapi.handoff()))


def stream_events(http: httpx.Client, call: Call) -> Iterator[dict[str, Any]]:
    """The NDJSON events of a streamed call (exec/stream, journal follow), as they come, each line bounded."""
    with http.stream(call.method, call.path, **kube.stream_args(call)) as response:
        if not response.is_success:
            raise kube.error_of(kube.held(call, response, response.iter_raw()), call)
        lines = kube.lines_of(call, response)
        for piece in response.iter_raw():
            yield from kube.events(call, lines, piece)
        yield from kube.events(call, lines, None)


async def astream_events(http: httpx.AsyncClient, call: Call) -> AsyncIterator[dict[str, Any]]:
    """The async twin of stream_events."""
    async with http.stream(call.method, call.path, **kube.stream_args(call)) as response:
        if not response.is_success:
            raise kube.error_of(await kube.aheld(call, response, response.aiter_raw()), call)
        lines = kube.lines_of(call, response)
        async for piece in response.aiter_raw():
            for event in kube.events(call, lines, piece):
                yield event
        for event in kube.events(call, lines, None):
            yield event
