"""The runtime client (common.runtimeapi) as the operator drives it (clients.runtime) and as the SDK does
(sdk.runtime), against runtimes that answer too much.

A runtime is the tenant's: the real one is asked to cap command output, and a hostile one (whatever the
workspace code starts in its place; here a real HTTP server on loopback answering what an attacker would)
is read with a byte limit. Either way the operator's memory stays bounded and the caller gets a clear error
or output cut to its tail, marked truncated.
"""

from __future__ import annotations

import asyncio
import gzip
import io
import json
import subprocess
import tarfile
import threading
import tracemalloc
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from shadow_operator.clients.runtime import (
    ExecutionResult,
    Runtime,
    RuntimeAnswerTooLarge,
    RuntimeRefused,
)
from shadow_operator.common.runtimeapi import CLIENT_MAX_ANSWER_BYTES
from shadow_operator.sdk import errors, kube
from shadow_operator.sdk import runtime as sdk_runtime

from tests.runtime.conftest import Server

pytestmark = pytest.mark.unit

MiB = 1 << 20
# 10 MiB of \x01: 60 MiB of JSON escapes from a runtime that does not cap it.
CONTROL_FLOOD = "head -c 10485760 /dev/zero | tr '\\000' '\\001'; echo; echo last line"


def peak_of(call: Callable[[], Any]) -> tuple[Any, int]:
    """The call's result (or exception) and the peak of Python memory allocated while it ran."""
    tracemalloc.start()
    try:
        try:
            result = call()
        except Exception as exc:  # returned to the test, which asserts on it
            result = exc
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return result, peak


async def _sh(url: str, token: str | None, script: str, **kw: Any) -> ExecutionResult:
    async with Runtime(url, token, **kw) as runtime:
        return await runtime.sh(script, timeout=120, tag="test")


def test_a_control_character_flood_is_capped_with_its_tail_marked(server: Server) -> None:
    result, peak = peak_of(lambda: asyncio.run(_sh(server.url, server.token, CONTROL_FLOOD)))
    assert isinstance(result, ExecutionResult), result
    assert result.exit_code == 0 and result.truncated
    # The runtime keeps the head of what it was asked to cap; the client never holds more than the limit.
    assert len(result.stdout) <= (4 * MiB) // 16 and set(result.stdout) == {"\x01"}
    # Measured: 305 MiB of RSS growth before the cap (the whole 60 MiB answer, then its parse); now ~6 MiB.
    assert peak < 24 * MiB, f"client peak {peak / MiB:.1f} MiB"


def test_ordinary_output_passes_whole(server: Server) -> None:
    result = asyncio.run(_sh(server.url, server.token, "printf 'a\\nb\\n'; echo oops >&2; exit 3"))
    assert (result.exit_code, result.stdout, result.stderr, result.truncated) == (
        3,
        "a\nb\n",
        "oops\n",
        False,
    )


# ------------------------------------------------------------------------------- a runtime that lies
class Hostile(BaseHTTPRequestHandler):
    """Answers every POST with what `self.server.answer` says (a real HTTP server, bytes on the wire)."""

    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length") or 0))
        kind, payload = self.server.answer  # type: ignore[attr-defined]
        self.send_response(200)
        self.send_header("content-type", "application/json")
        if kind == "endless":
            self.send_header("transfer-encoding", "chunked")
            self.end_headers()
            chunk = b"\\u0001" * 10922
            try:
                for _ in range(100_000):  # ~6 GiB unless the client hangs up, which it must
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            except (BrokenPipeError, ConnectionResetError):
                return
            return
        if kind == "chunked":
            self.send_header("transfer-encoding", "chunked")
            self.end_headers()
            try:
                for start in range(0, len(payload), 1 << 20):
                    piece = payload[start : start + (1 << 20)]
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                self.wfile.write(b"0\r\n\r\n")
            except (BrokenPipeError, ConnectionResetError):
                return
            return
        if kind == "gzip":
            self.send_header("content-encoding", "gzip")
            payload = gzip.compress(payload)
        self.send_header("content-length", str(len(payload)) if kind != "claims-huge" else str(1 << 40))
        self.end_headers()
        try:
            self.wfile.write(payload)
        except (BrokenPipeError, ConnectionResetError):
            return

    do_GET = do_POST

    def log_message(self, *_: Any) -> None:
        return


@pytest.fixture
def hostile() -> Iterator[Callable[[str, bytes], str]]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Hostile)
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()

    def answer(kind: str, payload: bytes = b"") -> str:
        httpd.answer = (kind, payload)  # type: ignore[attr-defined]
        return f"http://127.0.0.1:{httpd.server_address[1]}"

    yield answer
    httpd.shutdown()
    httpd.server_close()


def exec_answer(stdout: str, **extra: Any) -> bytes:
    body = {
        "argv": ["sh"],
        "exit_code": 1,
        "signal": None,
        "stdout": stdout,
        "stderr": "",
        "timed_out": False,
    }
    body.update(truncated=False, duration_seconds=0.1, **extra)
    return json.dumps(body).encode()


def test_an_endless_answer_fails_at_the_limit(hostile: Callable[..., str]) -> None:
    url = hostile("endless")
    error, peak = peak_of(lambda: asyncio.run(_sh(url, None, "true", max_answer_bytes=MiB)))
    assert isinstance(error, RuntimeAnswerTooLarge)
    assert "larger than 1048576 bytes" in str(error) and "operator.runtimeMaxAnswerBytes" in str(error)
    assert peak < 8 * MiB, f"client peak {peak / MiB:.1f} MiB"


def test_an_answer_announcing_too_much_is_not_read(hostile: Callable[..., str]) -> None:
    url = hostile("claims-huge", exec_answer("x"))
    with pytest.raises(RuntimeAnswerTooLarge):
        asyncio.run(_sh(url, None, "true"))


def test_output_fields_past_the_cap_keep_their_tail(hostile: Callable[..., str]) -> None:
    # A runtime that ignores max_output_bytes but stays under the answer limit: 3 MiB of stdout.
    url = hostile("plain", exec_answer("x" * (3 * MiB) + "the end"))
    result = asyncio.run(_sh(url, None, "true"))
    assert result.truncated and len(result.stdout) == (4 * MiB) // 16
    assert result.stdout.endswith("xthe end")


def test_compressed_answers_are_refused(hostile: Callable[..., str]) -> None:
    # Their size on the wire says nothing about what they expand to.
    url = hostile("gzip", exec_answer("z" * MiB))
    with pytest.raises(RuntimeRefused, match="Content-Encoding gzip"):
        asyncio.run(_sh(url, None, "true"))


@pytest.mark.parametrize(
    "payload",
    [
        b"[" + b"{}," * 1_000_000 + b"{}]",  # ~60 MiB of Python objects from 3 MiB of JSON
        b"[" * 100_000,
        b"not json",
        json.dumps({"exit_code": "one"}).encode(),
    ],
    ids=["object-flood", "deep", "not-json", "wrong-shape"],
)
def test_malformed_answers_are_refused(hostile: Callable[..., str], payload: bytes) -> None:
    url = hostile("plain", payload)
    error, peak = peak_of(lambda: asyncio.run(_sh(url, None, "true")))
    assert isinstance(error, RuntimeRefused) and not isinstance(error, RuntimeAnswerTooLarge), error
    assert peak < 24 * MiB, f"client peak {peak / MiB:.1f} MiB"


# ----------------------------------------------------------------------------------- the SDK's reads
def sdk_exec(url: str, driver: str) -> sdk_runtime.ExecutionResult:
    op = sdk_runtime.run_command(sdk_runtime.RuntimeEndpoint(url, {}), "true")
    if driver == "sync":
        with httpx.Client(timeout=60) as http:
            return kube.run(http, op)

    async def drive() -> sdk_runtime.ExecutionResult:
        async with httpx.AsyncClient(timeout=60) as http:
            return await kube.arun(http, op)

    return asyncio.run(drive())


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_the_sdk_fails_an_oversized_answer_at_its_limit(hostile: Callable[..., str], driver: str) -> None:
    # 80 MiB of output, chunked (no length to refuse it by): before the SDK's reads were bounded it held all
    # of it and its parse (a few hundred MiB), and returned it.
    url = hostile("chunked", exec_answer("x" * (80 * MiB)))
    error, peak = peak_of(lambda: sdk_exec(url, driver))
    assert isinstance(error, errors.RuntimeRefused), error
    assert f"larger than {CLIENT_MAX_ANSWER_BYTES} bytes" in str(error)
    assert peak < CLIENT_MAX_ANSWER_BYTES + 16 * MiB, f"client peak {peak / MiB:.1f} MiB"


def test_the_sdk_does_not_read_an_answer_announcing_too_much(hostile: Callable[..., str]) -> None:
    url = hostile("claims-huge", exec_answer("x"))
    with pytest.raises(errors.RuntimeRefused, match="larger than"):
        sdk_exec(url, "sync")


def test_the_sdk_refuses_compressed_answers(hostile: Callable[..., str]) -> None:
    url = hostile("gzip", exec_answer("z" * MiB))
    with pytest.raises(errors.RuntimeRefused, match="Content-Encoding gzip"):
        sdk_exec(url, "async")


def test_the_sdk_fails_a_stream_line_that_never_ends(hostile: Callable[..., str]) -> None:
    # journal follow and exec/stream read NDJSON: one line without an end is held only up to the limit.
    url = hostile("endless")
    call = sdk_runtime.journal_follow_call(sdk_runtime.RuntimeEndpoint(url, {}))

    def follow() -> list[dict[str, Any]]:
        with httpx.Client(timeout=60) as http:
            return list(sdk_runtime.stream_events(http, call))

    error, peak = peak_of(follow)
    assert isinstance(error, errors.RuntimeRefused), error
    assert f"larger than {CLIENT_MAX_ANSWER_BYTES} bytes" in str(error)
    assert peak < CLIENT_MAX_ANSWER_BYTES + 16 * MiB, f"client peak {peak / MiB:.1f} MiB"


def test_stream_lines_are_whole_wherever_the_chunks_end() -> None:
    from shadow_operator.common.runtimeapi import AnswerTooLarge, Lines

    lines = Lines(limit=12)
    got = [*lines.feed(b'{"a":'), *lines.feed(b'1}\n{"b"'), *lines.feed(b":2}\n\n"), *lines.feed(b'{"c":3}')]
    assert [*got, *lines.end()] == [{"a": 1}, {"b": 2}, {"c": 3}]
    with pytest.raises(AnswerTooLarge):
        Lines(limit=12).feed(b'{"a":"' + b"x" * 20 + b'"}\n')


async def _idle(url: str) -> float:
    async with Runtime(url, None) as runtime:
        return await runtime.idle_seconds()


@pytest.mark.parametrize(
    "answer",
    [
        b'{"idle_seconds": "soon"}',
        b'{"idle_seconds": NaN}',
        b'{"idle_seconds": -5}',
        b'{"idle_seconds": 1e400}',
    ],
)
def test_idle_seconds_refuses_what_is_not_a_number_of_seconds(
    hostile: Callable[..., str], answer: bytes
) -> None:
    """The idle clock comes from the workspace's own runtime: an answer it could use to crash the operator's
    pass (a string, NaN, infinity) is refused, and the sandbox is then not taken for idle."""
    with pytest.raises(RuntimeRefused):
        asyncio.run(_idle(hostile("json", answer)))
    assert asyncio.run(_idle(hostile("json", b'{"status": "ok", "idle_seconds": 42}'))) == 42.0


def test_the_operators_background_checks_stay_out_of_the_journal(server: Server) -> None:
    """A verify check runs as a background process (issue 27); like `sh`, it is the operator's plumbing, not the
    agent's work: not in the journal or HANDOFF.md. Before, the runtime journaled every background process when
    it exited, and a source environment's diff showed HANDOFF.md modified after its verification."""

    async def go() -> list[str]:
        async with Runtime(server.url, server.token) as rt:
            quiet = await rt.start("echo operator-check-1f3a", timeout=30, tag="verify")
            while await rt.running(quiet):
                await asyncio.sleep(0.05)
            result = await rt.result(quiet)
            assert result is not None and result.ok and result.stdout == "operator-check-1f3a\n"
        # An agent's background process is journaled as before.
        agent = server.client().post("/v1/processes", json={"command": "echo agent-job-1f3a"}).json()["id"]
        while server.client().get(f"/v1/processes/{agent}").json()["state"] == "running":
            await asyncio.sleep(0.05)
        entries = server.client().get("/v1/journal").json()["entries"]
        return [json.dumps(entry) for entry in entries]

    journaled = asyncio.run(go())
    assert any("agent-job-1f3a" in entry for entry in journaled)
    assert not any("operator-check-1f3a" in entry for entry in journaled)


# The last runtime without the `journal` field: a workspace image pinned by its template may still run it.
OLDER_RUNTIME = "6b44d29^"
REPO_ROOT = Path(__file__).resolve().parents[2]


def test_an_older_runtime_still_runs_the_operators_commands(
    tmp_path: Path, launch: Callable[..., Server]
) -> None:
    """A runtime from before `journal` (refused as an unknown field, 422) still runs the operator's commands and
    background checks, journaled: the client asks once, then stops asking. Run against that runtime's own code,
    taken from the repository's history."""
    old = tmp_path / "older-runtime"
    old.mkdir()
    got = subprocess.run(
        ["git", "archive", OLDER_RUNTIME, "sandbox-runtime/sandbox_runtime"],
        cwd=REPO_ROOT,
        capture_output=True,
    )
    if got.returncode != 0:  # a shallow clone: the history is not there
        pytest.skip(f"{OLDER_RUNTIME} is not in this checkout: {got.stderr.decode(errors='replace').strip()}")
    archive = got.stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(old, filter="data")
    server = launch(env={"PYTHONPATH": str(old / "sandbox-runtime")})
    # It is that runtime: it refuses the field.
    refused = server.client().post("/v1/exec", json={"command": "true", "journal": False})
    assert refused.status_code == 422 and "journal" in refused.text

    async def go() -> tuple[ExecutionResult, ExecutionResult | None, bool]:
        async with Runtime(server.url, server.token) as rt:
            ran = await rt.sh("echo older-sh-7c2e", timeout=30, tag="copy-in")
            check = await rt.start("echo older-check-7c2e", timeout=30, tag="verify")
            while await rt.running(check):
                await asyncio.sleep(0.05)
            return ran, await rt.result(check), rt._journal_flag

    ran, checked, still_asking = asyncio.run(go())
    assert ran.ok and ran.stdout == "older-sh-7c2e\n"
    assert checked is not None and checked.ok and checked.stdout == "older-check-7c2e\n"
    assert still_asking is False
