"""The sandbox runtime's native API (sandbox-runtime `/v1/...`), as the operator uses it: exec and baseline.

The operations are `common.runtimeapi`'s, which the SDK drives too; this is their async transport, straight to
the Pod. A runtime is the tenant's: whatever runs in the workspace can answer in its place. So no answer is
ever read whole: each is streamed with a byte limit (`max_answer_bytes`, SHADOW_RUNTIME_MAX_ANSWER_BYTES, 4 MiB
by default) and an answer past it fails its call with `RuntimeAnswerTooLarge` after at most that many bytes.
Command output is asked for capped at a sixteenth of the limit per stream (even escaped control characters,
six bytes of JSON each, then fit) and cut again here, its tail kept and `truncated` set, before it goes
anywhere, should a runtime ignore the cap.

Nor is any transfer bounded only per read (`clients.pacing`): downloads, workspace copies and the bodies of
answers must keep a minimum pace (64 KiB/s over 30 s by default, SHADOW_TRANSFER_MIN_RATE and
SHADOW_TRANSFER_WINDOW) and end within their deadline in total, or fail with `RuntimeStalled`: a runtime stopped
and woken by the workspace's code cannot hold an operator worker or a push slot for ever.
"""

from __future__ import annotations

import functools
import math
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar, cast

import httpx

from shadow_operator.clients.pacing import Meter, Pace, TransferStalled, paced
from shadow_operator.clients.tls import client_context
from shadow_operator.common import runtimeapi
from shadow_operator.common.runtimeapi import DEFAULT_MAX_ANSWER_BYTES, ERROR_DETAIL_BYTES, ExecutionResult

__all__ = [
    "DEFAULT_MAX_ANSWER_BYTES",
    "ExecutionResult",
    "Runtime",
    "RuntimeAnswerTooLarge",
    "RuntimeRefused",
    "RuntimeStalled",
]
T = TypeVar("T")
DEFAULT_PACE = Pace()


class RuntimeUnavailable(Exception):
    """The runtime could not be reached or refused a request."""


class DownloadTooLarge(Exception):
    """A file from the workspace is larger than the operator accepts."""

    def __init__(self, path: str, limit: int) -> None:
        super().__init__(f"{path} is larger than {limit} bytes, the most the operator accepts")
        self.limit = limit


class RuntimeRefused(RuntimeUnavailable):
    """The runtime answered with an error status."""

    def __init__(self, status: int, message: str, detail: str) -> None:
        super().__init__(f"{message}: {detail}")
        self.status = status
        self.detail = detail


class RuntimeStalled(RuntimeUnavailable):
    """A transfer with the runtime fell below its minimum pace or ran past its deadline (the workspace's code
    may have stopped its runtime); the message says which."""


class RuntimeAnswerTooLarge(RuntimeUnavailable):
    """The runtime's answer was longer than the operator reads; it was dropped unread past the limit."""

    def __init__(self, method: str, path: str, limit: int) -> None:
        super().__init__(
            f"the runtime's answer to {method} {path} is larger than {limit} bytes, the most the operator reads "
            "(operator setting SHADOW_RUNTIME_MAX_ANSWER_BYTES, chart value operator.runtimeMaxAnswerBytes)"
        )
        self.limit = limit


def _tail(text: str, limit: int) -> tuple[str, bool]:
    return (text, False) if len(text) <= limit else (text[-limit:], True)


class Runtime:
    def __init__(
        self,
        base_url: str,
        token: str | None,
        *,
        timeout: float = 30.0,
        max_answer_bytes: int = DEFAULT_MAX_ANSWER_BYTES,
        pace: Pace = DEFAULT_PACE,
    ) -> None:
        # Answers are counted as they arrive on the wire: compressed ones (whose size says nothing about what
        # they expand to) are not asked for, and refused.
        headers = {"Accept-Encoding": "identity"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        self._http = httpx.AsyncClient(
            base_url=base_url.rstrip("/"),
            headers=headers,
            timeout=timeout,
            trust_env=False,
            verify=client_context(),
        )
        self.max_answer_bytes = max_answer_bytes
        self.pace = pace
        # Per stream (stdout, stderr): JSON escapes a control character in six bytes, so both fit the limit.
        self.max_output_bytes = max_answer_bytes // 16
        # A command's request body, its output capped at what this client keeps.
        self._exec_body = functools.partial(runtimeapi.exec_body, max_output_bytes=self.max_output_bytes)
        self._journal_flag = True

    async def __aenter__(self) -> Runtime:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self._http.aclose()

    async def _run(self, op: runtimeapi.Op[T]) -> T:
        """Drive a runtime API operation on this client."""
        request = next(op)
        try:
            while True:
                answer = await self._send(request)
                request = op.send(answer)
        except StopIteration as done:
            return cast(T, done.value)
        except runtimeapi.AnswerRefused as exc:
            raise RuntimeRefused(
                answer.status, f"runtime's answer to {request.method} {request.path} is {exc}", ""
            ) from None

    async def _send(self, request: runtimeapi.Request) -> runtimeapi.Answer:
        method, path = request.method, request.path
        args: dict[str, Any] = {"params": request.params}
        if request.body is not None:
            args["json"] = request.body
        elif request.content is not None:
            args.update(content=request.content, headers={"content-type": request.content_type})
        try:
            # The pace is kept from the answer's head on (an exec's comes only when its command ended).
            async with (
                self._http.stream(
                    method,
                    path,
                    timeout=request.timeout if request.timeout is not None else httpx.USE_CLIENT_DEFAULT,
                    **args,
                ) as resp,
                self._paced(f"the answer to {method} {path}", request.timeout) as meter,
            ):
                if resp.status_code >= 400 and resp.status_code not in request.ok:
                    detail = await _read_bounded(resp, ERROR_DETAIL_BYTES, method, path, meter, cut=True)
                    raise RuntimeRefused(
                        resp.status_code,
                        f"runtime answered {resp.status_code} to {method} {path}",
                        detail.decode(errors="replace"),
                    )
                content = await _read_bounded(resp, self.max_answer_bytes, method, path, meter)
        except httpx.HTTPError as exc:
            raise RuntimeUnavailable(f"runtime unreachable: {type(exc).__name__}: {exc}") from None
        return runtimeapi.Answer(resp.status_code, content, resp.headers, request.max_containers)

    @asynccontextmanager
    async def _paced(self, what: str, deadline: float | None) -> AsyncIterator[Meter]:
        try:
            async with paced(what, self.pace, deadline) as meter:
                yield meter
        except TransferStalled as exc:
            raise RuntimeStalled(str(exc)) from None

    async def healthy(self) -> bool:
        try:
            await self._run(runtimeapi.health(timeout=5.0))
        except RuntimeUnavailable:
            return False
        return True

    async def idle_seconds(self) -> float:
        """Seconds since the runtime was last busy (0 while it is); an answer that is no finite, non-negative
        number is refused (the workspace's code controls the runtime)."""
        data = await self._run(runtimeapi.health())
        value = data.get("idle_seconds") or 0
        seconds = float(value) if isinstance(value, int | float) and not isinstance(value, bool) else math.nan
        if not math.isfinite(seconds) or seconds < 0:
            raise RuntimeRefused(200, f"runtime's idle_seconds is not a number of seconds: {value!r:.40}", "")
        return seconds

    async def _unjournaled(
        self,
        op: Callable[[Mapping[str, Any]], runtimeapi.Op[dict[str, Any]]],
        script: str,
        *,
        env: dict[str, str] | None,
        cwd: str,
        timeout: float,
        tag: str,
    ) -> dict[str, Any]:
        """Send a command (run or start) kept out of the journal and HANDOFF.md: the operator's plumbing is not
        the agent's work. A workspace image with an older runtime (a template pinned to it) refuses the field:
        the command then runs anyway, journaled, rather than never at all, and later ones do not ask."""
        journal = False if self._journal_flag else None
        body = self._exec_body(script, env=env, cwd=cwd, timeout=timeout, tag=tag, journal=journal)
        try:
            return await self._run(op(body))
        except RuntimeRefused as exc:
            if not (exc.status == 422 and "journal" in exc.detail and self._journal_flag):
                raise
        self._journal_flag = False
        body.pop("journal")
        return await self._run(op(body))

    async def sh(
        self,
        script: str,
        *,
        env: dict[str, str] | None = None,
        cwd: str = "",
        timeout: float = 600.0,
        tag: str,
    ) -> ExecutionResult:
        """Run a shell program to completion (`sh -c`), its inputs in `env`."""
        data = await self._unjournaled(runtimeapi.run, script, env=env, cwd=cwd, timeout=timeout, tag=tag)
        try:
            stdout, cut_out = _tail(str(data["stdout"]), self.max_output_bytes)
            stderr, cut_err = _tail(str(data["stderr"]), self.max_output_bytes)
            return ExecutionResult(
                exit_code=int(data["exit_code"]),
                stdout=stdout,
                stderr=stderr,
                timed_out=bool(data["timed_out"]),
                truncated=bool(data.get("truncated")) or cut_out or cut_err,
            )
        except (KeyError, TypeError, ValueError, AttributeError):
            raise RuntimeRefused(200, "runtime's answer to POST /v1/exec is malformed", "") from None

    async def start(
        self, script: str, *, env: dict[str, str] | None = None, cwd: str = "", timeout: float, tag: str
    ) -> str:
        """Start a shell program as the runtime's background process (it runs whether or not anyone waits, and
        the runtime ends it after `timeout`): its id, to look in on it with `process` and `result`."""
        # The log keeps max_output_bytes of each stream, its tail.
        data = await self._unjournaled(
            runtimeapi.start_process, script, env=env, cwd=cwd, timeout=timeout, tag=tag
        )
        process_id = data.get("id")
        if not isinstance(process_id, str) or not 0 < len(process_id) <= 128:
            raise RuntimeRefused(200, "runtime's answer to POST /v1/processes is malformed", "no id")
        return process_id

    async def running(self, process_id: str) -> bool | None:
        """Whether the background process runs still; None when the runtime knows no such process."""
        data = await self._run(runtimeapi.process(process_id))
        if data is None:
            return None
        return data.get("state") == "running"

    async def result(self, process_id: str) -> ExecutionResult | None:
        """An exited background process' exit status and the tails of its output (`max_output_bytes` each);
        None when the runtime knows no such process. The exit status is the log's own last event."""
        request = runtimeapi.process_logs_request(process_id)
        data: dict[str, Any] = {}
        tails = {"stdout": bytearray(), "stderr": bytearray()}
        cut = False
        # A line is one chunk of output (64 KiB read at a time, up to six bytes each once escaped); the runtime
        # keeps the last 4 MiB of a process' output, so eight answers' worth covers it escaped. Only the tails
        # are held.
        lines = runtimeapi.Lines(1 << 20)
        limit, read = 8 * self.max_answer_bytes, 0
        try:
            async with (
                self._paced("the output of a process", request.timeout) as meter,
                self._http.stream("GET", request.path, timeout=request.timeout) as resp,
            ):
                if resp.status_code == 404:
                    return None
                if resp.status_code >= 400:
                    raise RuntimeRefused(
                        resp.status_code, f"runtime answered {resp.status_code}", "process output"
                    )
                runtimeapi.refuse_encoded(resp.headers)
                async for chunk in resp.aiter_raw():
                    meter(len(chunk))
                    read += len(chunk)
                    if read > limit:
                        raise RuntimeAnswerTooLarge("GET", request.path, limit)
                    for event in lines.feed(chunk):
                        kind = event.get("type") if isinstance(event, dict) else None
                        if kind in tails and isinstance(event.get("data"), str):
                            tail = tails[kind]
                            tail += event["data"].encode()
                            if len(tail) > self.max_output_bytes:
                                del tail[: len(tail) - self.max_output_bytes]
                                cut = True
                        elif kind == "dropped":
                            cut = True
                        elif kind == "exit":
                            data = event
        except runtimeapi.AnswerTooLarge as exc:
            raise RuntimeAnswerTooLarge("GET", request.path, exc.limit) from None
        except runtimeapi.AnswerRefused as exc:
            raise RuntimeRefused(200, f"runtime's process output is {exc}", "") from None
        except httpx.HTTPError as exc:
            raise RuntimeUnavailable(f"runtime unreachable: {type(exc).__name__}: {exc}") from None
        try:
            return ExecutionResult(
                exit_code=int(data["exit_code"]) if data.get("exit_code") is not None else -1,
                stdout=tails["stdout"].decode(errors="replace"),
                stderr=tails["stderr"].decode(errors="replace"),
                timed_out=bool(data.get("timed_out")),
                truncated=cut,
            )
        except (TypeError, ValueError):
            raise RuntimeRefused(200, "runtime's process exit event is malformed", "") from None

    async def remove(self, process_id: str) -> None:
        """Kill (if it runs) and forget a background process."""
        await self._run(runtimeapi.remove_process(process_id))

    async def capture_baseline(self, exclude: list[str] | None = None) -> dict[str, Any]:
        return await self._run(runtimeapi.capture_baseline(exclude))

    async def has_baseline(self) -> bool:
        return await self._run(runtimeapi.has_baseline())

    async def flush(self) -> None:
        """Write the workspace's dirty pages to its volume (`sync`), e.g. before the volume is snapshotted."""
        result = await self.sh("sync", timeout=120.0, tag="shadow-operator: flush before snapshot")
        if not result.ok:
            raise RuntimeRefused(500, "sync failed in the workspace", result.output[:300])

    async def download(self, path: str, dest: Path, *, limit: int, timeout: float = 600.0) -> int:
        """Stream the workspace file `path` into `dest`, refusing it past `limit` bytes (the workspace decides
        what the file is: never trust its size). Returns the number of bytes written."""
        written = 0
        try:
            request = runtimeapi.read_request(path, timeout=timeout)
            async with (
                self._paced(f"the download of {path}", timeout) as meter,
                self._http.stream("GET", request.path, timeout=timeout) as resp,
            ):
                if resp.status_code >= 400:
                    head = await _read_bounded(resp, ERROR_DETAIL_BYTES, "GET", request.path, meter, cut=True)
                    raise RuntimeRefused(
                        resp.status_code, f"download of {path} refused", head.decode(errors="replace")
                    )
                with dest.open("wb") as out:
                    async for chunk in resp.aiter_raw():
                        meter(len(chunk))
                        written += len(chunk)
                        if written > limit:
                            raise DownloadTooLarge(path, limit)
                        out.write(chunk)
        except httpx.HTTPError as exc:
            raise RuntimeUnavailable(f"download interrupted: {type(exc).__name__}: {exc}") from None
        return written

    async def delete(self, path: str) -> None:
        """Remove a file or directory tree of the workspace (gone already is fine)."""
        await self._run(runtimeapi.delete(path, recursive=True, missing_ok=True, timeout=120.0))

    async def copy_tree_to(self, target: Runtime, path: str = "", *, timeout: float = 600.0) -> int:
        """Stream the directory `path` of this workspace as tar.gz into the same directory of `target`.

        The bytes pass through without being held: the export's body is the import's request body. Returns
        the number of bytes streamed.
        """
        streamed = 0
        try:
            async with (
                self._paced(f"the copy of {path or 'the workspace'}", timeout) as meter,
                self._http.stream(
                    # Uncompressed (gzip level 0): inside the cluster, compressing costs both runtimes more CPU
                    # than it saves on the wire (a mixed 116 MiB tree copied in 6-9 s instead of 15 s on 2 cores).
                    "GET",
                    f"/v1/archive/{path}",
                    params={"level": 0},
                    timeout=timeout,
                ) as resp,
            ):
                if resp.status_code >= 400:
                    detail = (
                        await _read_bounded(resp, ERROR_DETAIL_BYTES, "GET", "/v1/archive", meter, cut=True)
                    ).decode(errors="replace")
                    raise RuntimeRefused(
                        resp.status_code, f"export of {path or 'the workspace'} refused", detail
                    )

                async def body() -> AsyncIterator[bytes]:
                    nonlocal streamed
                    async for chunk in resp.aiter_raw():
                        meter(len(chunk))
                        streamed += len(chunk)
                        yield chunk

                await target._run(runtimeapi.import_archive(path, body(), timeout))
        except httpx.HTTPError as exc:
            raise RuntimeUnavailable(f"copy interrupted: {type(exc).__name__}: {exc}") from None
        return streamed


async def _read_bounded(
    resp: httpx.Response, limit: int, method: str, path: str, meter: Meter, *, cut: bool = False
) -> bytes:
    """At most `limit` bytes of the answer: past them, `cut` keeps the first `limit`, else the call fails."""
    reader = runtimeapi.BoundedRead(limit, cut=cut)
    try:
        reader.start(resp.headers)
        async for chunk in resp.aiter_raw():
            meter(len(chunk))
            if not reader.feed(chunk):
                break
    except runtimeapi.AnswerTooLarge:
        raise RuntimeAnswerTooLarge(method, path, limit) from None
    except runtimeapi.AnswerRefused as exc:
        raise RuntimeRefused(
            resp.status_code, f"runtime answered {method} {path} with {exc}", "not read"
        ) from None
    return reader.content
