"""The sandbox runtime's native API (`/v1/...`), written once for the operator and the SDK, without I/O.

Each operation is a generator that yields `Request`s and is sent back `Answer`s: the operator drives them on its
async httpx client straight to the Pod (`clients.runtime`), the SDK on its sync or async client through the API
server's pod proxy (`sdk.runtime`, `sdk.kube`). Neither side reads an answer whole: a runtime is the tenant's,
and whatever runs in the workspace can answer in its place. `BoundedRead` is the one reader both transports
feed: it refuses compressed answers (their size on the wire says nothing about what they expand to) and an
answer past its limit, after at most that many bytes; `Lines` does the same for NDJSON streams, per line.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Generator, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar
from urllib.parse import quote

from pydantic import BaseModel

T = TypeVar("T")

# What the operator reads of one answer by default (SHADOW_RUNTIME_MAX_ANSWER_BYTES).
DEFAULT_MAX_ANSWER_BYTES = 4 << 20
# What the SDK reads of one answer: a whole file (`read_file`) or a command's output, which the runtime caps at
# 10 MiB a stream unless asked otherwise. Larger files stream (`read_into`, archives) and are never held.
CLIENT_MAX_ANSWER_BYTES = 64 << 20
# What an error answer may contribute to a message.
ERROR_DETAIL_BYTES = 300
# Objects and arrays an answer may hold where the caller expects a handful (an exec result): `[{},{},...]`
# would cost ~20 times its size in Python objects, so a hostile answer of nothing else is refused unparsed.
MAX_JSON_CONTAINERS = 1024
_JSON_STRING = re.compile(rb'"(?:[^"\\]++|\\.)*+"')


class AnswerRefused(Exception):
    """An answer the client does not read: too large, compressed or malformed. Each side maps it to its own
    error type, with `status` (the HTTP status it came with) and the call's method and path."""


class AnswerTooLarge(AnswerRefused):
    def __init__(self, limit: int) -> None:
        super().__init__(f"larger than {limit} bytes")
        self.limit = limit


class AnswerEncoded(AnswerRefused):
    def __init__(self, encoding: str) -> None:
        super().__init__(f"Content-Encoding {encoding}")
        self.encoding = encoding


class AnswerMalformed(AnswerRefused):
    pass


# ------------------------------------------------------------------------------------------- reading
class BoundedRead:
    """At most `limit` bytes of an answer, fed as they arrive: past them, `cut` keeps the first `limit` and
    reading stops, else `AnswerTooLarge`. `start()` checks the headers before the body is read."""

    def __init__(self, limit: int, *, cut: bool = False) -> None:
        self.limit = limit
        self.cut = cut
        self._content = bytearray()

    def start(self, headers: Mapping[str, str]) -> None:
        refuse_encoded(headers)
        length = str(headers.get("content-length", ""))
        if not self.cut and length.isdigit() and int(length) > self.limit:
            raise AnswerTooLarge(self.limit)

    def feed(self, chunk: bytes) -> bool:
        """Take a chunk; False once nothing more is wanted (the limit reached with `cut`)."""
        self._content += chunk
        if len(self._content) <= self.limit:
            return True
        if not self.cut:
            raise AnswerTooLarge(self.limit)
        del self._content[self.limit :]
        return False

    @property
    def content(self) -> bytes:
        return bytes(self._content)


def refuse_encoded(headers: Mapping[str, str]) -> None:
    """Answers are counted as they arrive on the wire: a compressed one is refused unread."""
    encoding = str(headers.get("content-encoding", "identity")).strip().lower()
    if encoding not in ("", "identity"):
        raise AnswerEncoded(encoding)


class Lines:
    """NDJSON lines of a stream, each at most `limit` bytes (a line that never ends fails at the limit)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._pending = bytearray()

    def feed(self, chunk: bytes) -> list[Any]:
        # Only the new chunk is searched: a long line costs its length once, not once per chunk.
        if b"\n" not in chunk:
            self._pending += chunk
            if len(self._pending) > self.limit:
                raise AnswerTooLarge(self.limit)
            return []
        head, *lines, rest = chunk.split(b"\n")
        if len(self._pending) + len(head) > self.limit or len(rest) > self.limit:
            raise AnswerTooLarge(self.limit)
        lines.insert(0, bytes(self._pending + head))
        self._pending = bytearray(rest)
        return [_json_line(line) for line in lines if line.strip()]

    def end(self) -> list[Any]:
        rest, self._pending = bytes(self._pending), bytearray()
        return [_json_line(rest)] if rest.strip() else []


def _json_line(line: bytes | bytearray) -> Any:
    try:
        return json.loads(line)
    except (ValueError, RecursionError):
        raise AnswerMalformed("a line that is not JSON") from None


def decode_json(content: bytes, *, max_containers: int | None = None) -> Any:
    """The JSON of an answer (None when empty); `max_containers` refuses an object flood before parsing."""
    if not content:
        return None
    if max_containers is not None:
        outside_strings = _JSON_STRING.sub(b'""', content)
        if outside_strings.count(b"{") + outside_strings.count(b"[") > max_containers:
            raise AnswerMalformed("malformed")
    try:
        return json.loads(content)
    except (ValueError, RecursionError):
        raise AnswerMalformed("something other than JSON") from None


# ------------------------------------------------------------------------------------- requests, answers
@dataclass(frozen=True)
class Request:
    """One HTTP request to the runtime, its path under the runtime's root. `ok`: error statuses the operation
    handles itself (any other fails the call in the driver, with the side's error type)."""

    method: str
    path: str
    what: str
    body: Any = None
    params: Mapping[str, str] | None = None
    # bytes, or chunks: an iterator (either driver) or an async iterator (an async driver only).
    content: Any = None
    content_type: str = "application/json"
    timeout: float | None = None
    ok: tuple[int, ...] = ()
    # Objects and arrays the JSON answer may hold (None: only the byte limit counts).
    max_containers: int | None = None


@dataclass(frozen=True)
class Answer:
    """A runtime's answer, read within the driver's limit."""

    status: int
    content: bytes = b""
    headers: Mapping[str, str] = field(default_factory=dict)
    max_containers: int | None = None

    def json(self) -> Any:
        return decode_json(self.content, max_containers=self.max_containers)

    @property
    def text(self) -> str:
        return self.content.decode(errors="replace")


Op = Generator[Request, Answer, T]


def _object(answer: Answer) -> dict[str, Any]:
    data = answer.json()
    if not isinstance(data, dict):
        raise AnswerMalformed("malformed")
    return data


def file_path(path: str) -> str:
    return "/v1/files/" + quote(path.lstrip("/"))


# ---------------------------------------------------------------------------------------- operations
def health(timeout: float = 10.0) -> Op[dict[str, Any]]:
    answer = yield Request("GET", "/v1/health", "health", timeout=timeout, max_containers=MAX_JSON_CONTAINERS)
    return _object(answer)


def exec_body(
    command: str | list[str],
    *,
    cwd: str = "",
    env: Mapping[str, str] | None = None,
    timeout: float | None = None,
    stdin: str | None = None,
    journal: bool | None = True,
    max_output_bytes: int | None = None,
    tag: str | None = None,
) -> dict[str, Any]:
    """The body of POST /v1/exec: a string runs under `sh -c`, a list without a shell. `journal=None` leaves
    the field out (a stream, or a runtime too old for it)."""
    body: dict[str, Any] = {"argv": command} if isinstance(command, list) else {"command": command}
    body.update(cwd=cwd, env=dict(env or {}))
    optional = {
        "journal": journal,
        "timeout_seconds": timeout,
        "stdin": stdin,
        "max_output_bytes": max_output_bytes,
        "tag": tag,
    }
    body.update({key: value for key, value in optional.items() if value is not None})
    return body


def exec_request(body: Mapping[str, Any], *, stream: bool = False) -> Request:
    wait = float(body.get("timeout_seconds") or 600.0) + 30.0
    path = "/v1/exec/stream" if stream else "/v1/exec"
    return Request("POST", path, "exec", body=dict(body), timeout=wait, max_containers=MAX_JSON_CONTAINERS)


class ExecutionResult(BaseModel):
    """What a command did, for the operator and the SDK alike (the `k8s-agent-sandbox` SDK's name and first
    four fields). `truncated`: output was cut (by the runtime, or by a reader with a smaller limit), so stdout
    and stderr hold only their tails."""

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

    @property
    def output(self) -> str:
        """stdout and stderr together, one line between them, stripped."""
        return (self.stdout + ("\n" if self.stdout and self.stderr else "") + self.stderr).strip()


def run(body: Mapping[str, Any]) -> Op[dict[str, Any]]:
    """POST /v1/exec: the command's result (exit_code, stdout, stderr, timed_out, truncated ...)."""
    return _object((yield exec_request(body)))


def capture_baseline(exclude: list[str] | None = None) -> Op[dict[str, Any]]:
    answer = yield Request("POST", "/v1/baseline", "baseline", body={"exclude": exclude or []}, timeout=600.0)
    return _object(answer)


def has_baseline() -> Op[bool]:
    answer = yield Request("GET", "/v1/baseline", "baseline", timeout=30.0, ok=(404,))
    return answer.status != 404


def read_request(path: str, params: Mapping[str, str] | None = None, timeout: float = 300.0) -> Request:
    """GET /v1/files/{path}: a whole file (or the range in `params`)."""
    return Request("GET", file_path(path), f"read {path}", params=params, timeout=timeout)


def read_file(path: str) -> Op[bytes]:
    return (yield read_request(path)).content


def write_file(path: str, data: bytes, *, mode: int | None = None) -> Op[None]:
    yield Request(
        "PUT",
        file_path(path),
        f"write {path}",
        content=data,
        content_type="application/octet-stream",
        params={"mode": f"{mode:04o}"} if mode is not None else None,
        timeout=300.0,
    )


def delete(
    path: str, *, recursive: bool = False, missing_ok: bool = False, timeout: float | None = None
) -> Op[None]:
    params = {"recursive": "true"} if recursive else None
    yield Request(
        "DELETE",
        file_path(path),
        f"delete {path}",
        params=params,
        timeout=timeout,
        ok=(404,) if missing_ok else (),
    )


def stat(path: str) -> Op[dict[str, Any] | None]:
    """The file's metadata, or None when nothing is at that path."""
    answer = yield Request("GET", "/v1/stat/" + quote(path.lstrip("/")), f"stat {path}", ok=(404,))
    return None if answer.status == 404 else _object(answer)


def tree(path: str, *, depth: int = 1) -> Op[list[dict[str, Any]]]:
    params = {"depth": str(depth)}
    answer = yield Request("GET", "/v1/tree/" + quote(path.strip("/")), f"list {path or '.'}", params=params)
    entries: list[dict[str, Any]] = _object(answer).get("entries") or []
    return entries


def diff(*, paths_only: bool = False) -> Op[dict[str, Any]]:
    params = {"paths_only": str(paths_only).lower()}
    return _object((yield Request("GET", "/v1/diff", "diff", params=params, timeout=300.0)))


def archive_request(path: str, exclude: list[str] | None = None) -> Request:
    """GET /v1/archive/{path}: the directory as tar.gz (stream the answer)."""
    params: Any = {"exclude": exclude} if exclude else None
    return Request("GET", "/v1/archive/" + quote(path.strip("/")), f"download {path or '.'}", params=params)


def import_archive(
    dest: str, chunks: Iterator[bytes] | AsyncIterator[bytes], timeout: float = 300.0
) -> Op[dict[str, Any]]:
    """POST /v1/archive/{dest}: extract a tar.gz stream under a directory of the workspace."""
    answer = yield Request(
        "POST",
        "/v1/archive/" + quote(dest.strip("/")),
        f"upload into {dest or '.'}",
        content=chunks,
        content_type="application/gzip",
        timeout=timeout,
    )
    return _object(answer)


def start_process(body: Mapping[str, Any]) -> Op[dict[str, Any]]:
    """POST /v1/processes: a background process (exec_body's fields); its summary, with the runtime's `id`."""
    answer = yield Request(
        "POST",
        "/v1/processes",
        "start a process",
        body=dict(body),
        timeout=60.0,
        max_containers=MAX_JSON_CONTAINERS,
    )
    return _object(answer)


def process(process_id: str) -> Op[dict[str, Any] | None]:
    """A background process' summary (state, exit_code, timed_out ...), or None when the runtime has none of
    that id (it restarted, or forgot the process)."""
    answer = yield Request(
        "GET",
        "/v1/processes/" + quote(process_id, safe=""),
        "process",
        timeout=30.0,
        ok=(404,),
        max_containers=MAX_JSON_CONTAINERS,
    )
    return None if answer.status == 404 else _object(answer)


def process_logs_request(process_id: str) -> Request:
    """GET /v1/processes/{id}/logs: its kept output as NDJSON events (stream the answer)."""
    return Request("GET", f"/v1/processes/{quote(process_id, safe='')}/logs", "process output", timeout=60.0)


def remove_process(process_id: str) -> Op[None]:
    """Kill (if running) and forget a background process; gone already is fine."""
    yield Request(
        "DELETE", "/v1/processes/" + quote(process_id, safe=""), "remove a process", timeout=30.0, ok=(404,)
    )


def journal_params(since: int, significant: bool) -> dict[str, str]:
    return {"since": str(since), "significant": str(significant).lower()}


def journal(*, since: int = 0, significant: bool = False) -> Op[list[dict[str, Any]]]:
    answer = yield Request("GET", "/v1/journal", "journal", params=journal_params(since, significant))
    entries: list[dict[str, Any]] = _object(answer)["entries"]
    return entries


def journal_follow_request(*, since: int = 0, significant: bool = False) -> Request:
    params = {**journal_params(since, significant), "follow": "true"}
    return Request("GET", "/v1/journal", "journal", params=params)


def decide(text: str, author: str | None = None) -> Op[dict[str, Any]]:
    """Record a decision in the journal (HANDOFF.md's Decision Log, where the runtime keeps one)."""
    body = {"text": text, **({"author": author} if author else {})}
    return _object((yield Request("POST", "/v1/journal/decisions", "record a decision", body=body)))


def handoff() -> Op[str | None]:
    """HANDOFF.md of the workspace, or None when the runtime keeps none."""
    answer = yield Request("GET", file_path("HANDOFF.md"), "read HANDOFF.md", ok=(404,))
    return None if answer.status == 404 else answer.text
