"""The workspace runtime's native API (`/v1/...`) as SDK operations, reached through the API server's pod proxy.

The proxy consumes `Authorization` (the caller's credentials for the API server), which is why the runtime's
token travels in `X-Sandbox-Runtime-Token`. RBAC the caller needs: get secrets (the token), create pods/proxy.
"""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import quote

import httpx
from pydantic import BaseModel, Field

from shadow_operator.api import constants as c
from shadow_operator.api.kinds import POD, SECRET
from shadow_operator.sdk import kube
from shadow_operator.sdk.errors import ShadowError
from shadow_operator.sdk.kube import Call, Op

TOKEN_HEADER = "X-Sandbox-Runtime-Token"
NDJSON = "application/x-ndjson"


class ExecutionResult(BaseModel):
    """What a command did (the `k8s-agent-sandbox` SDK's name and first four fields)."""

    stdout: str = ""
    stderr: str = ""
    exit_code: int = -1
    timed_out: bool = False
    signal: int | None = None
    truncated: bool = False
    duration_seconds: float = 0.0

    @property
    def ok(self) -> bool:
        """Whether the command exited 0 (not killed, not timed out)."""
        return self.exit_code == 0 and not self.timed_out


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
    """A runtime as seen through the API server: the pod proxy's base path and the token header."""

    base: str
    headers: dict[str, str]

    def call(self, method: str, path: str, what: str, **kw: Any) -> Call:
        return Call(
            method,
            self.base + path,
            what,
            headers={**self.headers, **kw.pop("headers", {})},
            runtime=True,
            **kw,
        )


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


def _exec_body(
    command: str | list[str],
    *,
    cwd: str,
    env: dict[str, str] | None,
    timeout: float | None,
    stdin: str | None,
    journal: bool,
) -> dict[str, Any]:
    body: dict[str, Any] = {"argv": command} if isinstance(command, list) else {"command": command}
    body.update(cwd=cwd, env=env or {}, journal=journal)
    if timeout is not None:
        body["timeout_seconds"] = timeout
    if stdin is not None:
        body["stdin"] = stdin
    return body


def exec_call(
    ep: RuntimeEndpoint,
    command: str | list[str],
    *,
    cwd: str = "",
    env: dict[str, str] | None = None,
    timeout: float | None = 300.0,
    stdin: str | None = None,
    journal: bool = True,
    stream: bool = False,
) -> Call:
    """POST /v1/exec (or /v1/exec/stream): a string runs under `sh -c`, a list without a shell."""
    body = _exec_body(command, cwd=cwd, env=env, timeout=timeout, stdin=stdin, journal=journal)
    if stream:
        body.pop("journal")
    wait = (timeout or 600.0) + 30.0
    return ep.call("POST", "/v1/exec/stream" if stream else "/v1/exec", "exec", body=body, timeout=wait)


def run_command(ep: RuntimeEndpoint, command: str | list[str], **kw: Any) -> Op[ExecutionResult]:
    response = yield exec_call(ep, command, **kw)
    return ExecutionResult.model_validate(response.json())


def _file_path(path: str) -> str:
    return "/v1/files/" + quote(path.lstrip("/"))


def read_file(ep: RuntimeEndpoint, path: str) -> Op[bytes]:
    response = yield ep.call("GET", _file_path(path), f"read {path}", timeout=300.0)
    return bytes(response.content)


def read_head(ep: RuntimeEndpoint, path: str, limit: int) -> Op[tuple[bytes, bool]]:
    """At most `limit` bytes from the start of a file, and whether it has more. The runtime is asked for
    `limit + 1` bytes; what it sends beyond that is dropped as it arrives, so a runtime that ignores the
    length still costs no more memory than the limit."""
    kept = bytearray()

    def keep(piece: bytes) -> None:
        kept.extend(piece[: limit + 1 - len(kept)])

    params = {"offset": "0", "length": str(limit + 1)}
    yield ep.call("GET", _file_path(path), f"read {path}", params=params, timeout=300.0, sink=keep)
    return bytes(kept[:limit]), len(kept) > limit


def tree(ep: RuntimeEndpoint, path: str, *, depth: int = 1) -> Op[list[dict[str, Any]]]:
    """The entries under a directory (name, path, type, size, mode, modified_at), `depth` levels down."""
    params = {"depth": str(depth)}
    response = yield ep.call(
        "GET", "/v1/tree/" + quote(path.strip("/")), f"list {path or '.'}", params=params
    )
    entries: list[dict[str, Any]] = response.json().get("entries") or []
    return entries


def read_into(ep: RuntimeEndpoint, path: str, sink: Callable[[bytes], None]) -> Op[None]:
    """GET a file and hand its bytes to `sink` as they arrive (never whole in memory)."""
    yield ep.call("GET", _file_path(path), f"read {path}", timeout=300.0, sink=sink)


def write_file(ep: RuntimeEndpoint, path: str, data: bytes, *, mode: int | None = None) -> Op[None]:
    yield ep.call(
        "PUT",
        _file_path(path),
        f"write {path}",
        content=data,
        content_type="application/octet-stream",
        params={"mode": f"{mode:04o}"} if mode is not None else None,
        timeout=300.0,
    )


def delete_path(ep: RuntimeEndpoint, path: str, *, recursive: bool = False) -> Op[None]:
    params = {"recursive": "true"} if recursive else None
    yield ep.call("DELETE", _file_path(path), f"delete {path}", params=params)


def stat(ep: RuntimeEndpoint, path: str) -> Op[dict[str, Any] | None]:
    """The file's metadata, or None when nothing is at that path."""
    response = yield ep.call("GET", "/v1/stat/" + quote(path.lstrip("/")), f"stat {path}", ok=(404,))
    if response.status_code == 404:
        return None
    info: dict[str, Any] = response.json()
    return info


def diff(ep: RuntimeEndpoint, *, paths_only: bool = False) -> Op[Diff]:
    params = {"paths_only": str(paths_only).lower()}
    response = yield ep.call("GET", "/v1/diff", "diff", params=params, timeout=300.0)
    return Diff.model_validate(response.json())


def archive_call(ep: RuntimeEndpoint, path: str, exclude: list[str] | None = None) -> Call:
    """GET /v1/archive/{path}: the directory as tar.gz (stream the answer)."""
    params = {"exclude": exclude} if exclude else None
    return ep.call("GET", "/v1/archive/" + quote(path.strip("/")), f"download {path or '.'}", params=params)


def import_archive(ep: RuntimeEndpoint, dest: str, chunks: Iterator[bytes]) -> Op[ImportResult]:
    """POST /v1/archive/{dest}: extract a tar.gz stream under a directory of the workspace."""
    response = yield ep.call(
        "POST",
        "/v1/archive/" + quote(dest.strip("/")),
        f"upload into {dest or '.'}",
        content=chunks,
        content_type="application/gzip",
        timeout=300.0,
    )
    return ImportResult.model_validate(response.json())


def journal(ep: RuntimeEndpoint, *, since: int = 0, significant: bool = False) -> Op[list[JournalEntry]]:
    params = {"since": str(since), "significant": str(significant).lower()}
    response = yield ep.call("GET", "/v1/journal", "journal", params=params)
    return [JournalEntry.model_validate(e) for e in response.json()["entries"]]


def decide(ep: RuntimeEndpoint, text: str, author: str | None = None) -> Op[JournalEntry]:
    """Record a decision in the journal (HANDOFF.md's Decision Log, where the runtime keeps one)."""
    if not text.strip():
        raise ShadowError("a decision needs its text", hint='e.g. shadowctl decide NAME "keep the v1 API"')
    body = {"text": text, **({"author": author} if author else {})}
    response = yield ep.call("POST", "/v1/journal/decisions", "record a decision", body=body)
    return JournalEntry.model_validate(response.json())


def journal_follow_call(ep: RuntimeEndpoint, *, since: int = 0, significant: bool = False) -> Call:
    params = {"since": str(since), "significant": str(significant).lower(), "follow": "true"}
    return ep.call("GET", "/v1/journal", "journal", params=params)


def handoff(ep: RuntimeEndpoint) -> Op[str | None]:
    """HANDOFF.md of the workspace, or None when the runtime keeps none."""
    response = yield ep.call("GET", _file_path("HANDOFF.md"), "read HANDOFF.md", ok=(404,))
    return None if response.status_code == 404 else response.text


def stream_events(http: httpx.Client, call: Call) -> Iterator[dict[str, Any]]:
    """The NDJSON events of a streamed call (exec/stream, journal follow), as they come."""
    timeout = httpx.Timeout(call.timeout, connect=10.0)
    with http.stream(
        call.method,
        call.path,
        json=call.body,
        params=call.params,
        headers=dict(call.headers),
        timeout=timeout,
    ) as response:
        if not response.is_success:
            response.read()
            raise kube.error_of(response, call)
        yield from kube.iter_lines(response)


async def astream_events(http: httpx.AsyncClient, call: Call) -> AsyncIterator[dict[str, Any]]:
    """The async twin of stream_events."""
    timeout = httpx.Timeout(call.timeout, connect=10.0)
    async with http.stream(
        call.method,
        call.path,
        json=call.body,
        params=call.params,
        headers=dict(call.headers),
        timeout=timeout,
    ) as response:
        if not response.is_success:
            await response.aread()
            raise kube.error_of(response, call)
        async for line in response.aiter_lines():
            if line.strip():
                yield json.loads(line)
