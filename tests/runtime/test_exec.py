"""Native exec: buffered, streamed, background processes, timeouts that reach grandchildren."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import httpx
import pytest

from tests.runtime.conftest import Server, wait_until

pytestmark = pytest.mark.unit


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0); it is dead for our purposes.
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(") ", 1)[1][0] != "Z"
    except FileNotFoundError:
        return False


def test_exec_argv_cwd_env_stdin(client: httpx.Client, server: Server) -> None:
    (server.root / "sub").mkdir(exist_ok=True)
    r = client.post(
        "/v1/exec",
        json={
            "argv": ["sh", "-c", 'pwd; echo "$GREETING"; cat'],
            "cwd": "sub",
            "env": {"GREETING": "hi"},
            "stdin": "from stdin",
        },
    )
    body = r.json()
    assert r.status_code == 200, body
    assert body["stdout"] == f"{(server.root / 'sub').resolve()}\nhi\nfrom stdin"
    assert body["exit_code"] == 0 and body["timed_out"] is False and body["truncated"] is False


def test_exec_never_leaks_the_token(launch: object, tmp_path: Path) -> None:
    srv = launch(env={"SANDBOX_RUNTIME_TOKEN": "s3cret-token"}, token="s3cret-token")  # type: ignore[operator]
    body = srv.client().post("/v1/exec", json={"argv": ["env"]}).json()
    assert "s3cret-token" not in body["stdout"]


def test_exec_output_cap_sets_truncated(client: httpx.Client) -> None:
    body = client.post(
        "/v1/exec", json={"argv": ["sh", "-c", "head -c 100000 /dev/zero"], "max_output_bytes": 1000}
    ).json()
    assert len(body["stdout"]) == 1000 and body["truncated"] is True and body["exit_code"] == 0


def test_exec_requires_exactly_one_of_argv_command(client: httpx.Client) -> None:
    for payload in ({}, {"argv": ["true"], "command": "true"}):
        r = client.post("/v1/exec", json=payload)
        assert r.status_code == 400 and r.json()["code"] == "INVALID_ARGUMENT"


def test_timeout_kills_grandchildren(client: httpx.Client, server: Server) -> None:
    # The child starts a grandchild that ignores the pipe (writes its pid, then sleeps).
    script = "sleep 300 & echo $! > grandchild.pid; sh -c 'sleep 300' & wait"
    body = client.post("/v1/exec", json={"command": script, "timeout_seconds": 1}).json()
    assert body["timed_out"] is True and body["exit_code"] == 124
    pid = int((server.root / "grandchild.pid").read_text())
    wait_until(lambda: not alive(pid), 5, f"grandchild {pid} to die")


def test_background_child_holding_pipes_does_not_hang(client: httpx.Client) -> None:
    start = time.monotonic()
    body = client.post("/v1/exec", json={"command": "sleep 30 & echo started", "timeout_seconds": 20}).json()
    assert body["stdout"] == "started\n" and body["timed_out"] is False
    assert time.monotonic() - start < 10


def test_streaming_exec_ndjson(client: httpx.Client) -> None:
    events = []
    with client.stream(
        "POST",
        "/v1/exec/stream",
        json={"argv": ["sh", "-c", "echo one; echo two >&2; sleep 0.2; echo three"]},
    ) as r:
        assert r.headers["content-type"].startswith("application/x-ndjson")
        for line in r.iter_lines():
            events.append(json.loads(line))
            if len(events) == 2:
                # Output arrives before the command finishes.
                assert events[-1]["type"] in ("stdout", "stderr")
    assert events[0]["type"] == "start"
    out = "".join(e["data"] for e in events if e["type"] == "stdout")
    err = "".join(e["data"] for e in events if e["type"] == "stderr")
    assert out == "one\nthree\n" and err == "two\n"
    assert events[-1] == {"type": "exit", "exit_code": 0, "signal": None, "timed_out": False}


def test_streaming_exec_timeout(client: httpx.Client) -> None:
    with client.stream(
        "POST", "/v1/exec/stream", json={"argv": ["sleep", "30"], "timeout_seconds": 0.5}
    ) as r:
        last = [json.loads(line) for line in r.iter_lines()][-1]
    assert last["type"] == "exit" and last["timed_out"] is True


def test_background_process_lifecycle(client: httpx.Client) -> None:
    r = client.post(
        "/v1/processes",
        json={
            "argv": ["sh", "-c", 'echo ready; while read line; do echo "got $line"; done'],
            "tag": "echoer",
        },
    )
    assert r.status_code == 201, r.text
    proc = r.json()
    pid = proc["id"]
    assert proc["state"] == "running" and proc["tag"] == "echoer"
    assert any(p["id"] == pid for p in client.get("/v1/processes").json()["processes"])

    client.post(f"/v1/processes/{pid}/stdin", json={"data": "hello\n"})
    wait_until(lambda: client.get(f"/v1/processes/{pid}").json()["stdout_bytes"] >= len("ready\ngot hello\n"))
    logs = [json.loads(x) for x in client.get(f"/v1/processes/{pid}/logs").text.splitlines()]
    assert "".join(e["data"] for e in logs if e["type"] == "stdout") == "ready\ngot hello\n"

    # Follow from the current end, then end the input: the stream ends with the exit event.
    since = len(logs)
    with client.stream("GET", f"/v1/processes/{pid}/logs", params={"follow": True, "since": since}) as stream:
        client.post(f"/v1/processes/{pid}/stdin", json={"data": "bye\n", "eof": True})
        followed = [json.loads(x) for x in stream.iter_lines()]
    assert followed[0] == {"type": "stdout", "offset": len("ready\ngot hello\n"), "data": "got bye\n"}
    assert followed[-1]["type"] == "exit" and followed[-1]["exit_code"] == 0
    assert client.get(f"/v1/processes/{pid}").json()["state"] == "exited"
    assert client.delete(f"/v1/processes/{pid}").status_code == 204
    assert client.get(f"/v1/processes/{pid}").status_code == 404


def test_signal_reaches_process_group(client: httpx.Client, server: Server) -> None:
    proc = client.post(
        "/v1/processes", json={"command": "sleep 300 & echo $! > bg.pid; wait", "cwd": ""}
    ).json()
    wait_until(
        lambda: (server.root / "bg.pid").exists() and (server.root / "bg.pid").read_text().strip() != ""
    )
    grandchild = int((server.root / "bg.pid").read_text())
    r = client.post(f"/v1/processes/{proc['id']}/signal", json={"signal": "TERM"})
    assert r.status_code == 200
    wait_until(lambda: client.get(f"/v1/processes/{proc['id']}").json()["state"] == "exited")
    wait_until(lambda: not alive(grandchild), 5, "grandchild to get the signal")
    assert client.get(f"/v1/processes/{proc['id']}").json()["signal"] == 15
    assert client.post(f"/v1/processes/{proc['id']}/signal", json={"signal": "NOPE"}).status_code == 400


def test_process_cap_answers_429(launch: object) -> None:
    srv = launch("--max-processes", "1")  # type: ignore[operator]
    c = srv.client()
    first = c.post("/v1/processes", json={"argv": ["sleep", "30"]}).json()
    r = c.post("/v1/exec", json={"argv": ["true"]})
    assert r.status_code == 429 and r.json()["code"] == "RESOURCE_EXHAUSTED"
    c.delete(f"/v1/processes/{first['id']}")
    assert c.post("/v1/exec", json={"argv": ["true"]}).json()["exit_code"] == 0


def test_streaming_exec_client_disconnect_kills_the_command(server: Server) -> None:
    with (
        httpx.Client(base_url=server.url, timeout=20) as c,
        c.stream("POST", "/v1/exec/stream", json={"command": "echo $$ > stream.pid; exec sleep 300"}) as r,
    ):
        # Keep the line iterator referenced: dropping it after one line finalizes httpx's stream
        # generators, which closes the connection, i.e. the client leaves before the first check.
        lines = r.iter_lines()
        first = json.loads(next(lines))
        assert first["type"] == "start"
        pid = first["pid"]
        wait_until(lambda: alive(pid), 5, "the streamed command to start")
    wait_until(lambda: not alive(pid), 10, "the streamed command to be killed after the client left")


def test_exec_can_stay_out_of_the_journal(client: httpx.Client) -> None:
    """An orchestrator's own commands (the operator's copy-in and checks) are not the agent's work."""
    marker = f"plumbing-{time.monotonic_ns()}"
    hidden = client.post("/v1/exec", json={"argv": ["echo", marker, "hidden"], "journal": False})
    shown = client.post("/v1/exec", json={"argv": ["echo", marker, "shown"]})
    assert hidden.status_code == shown.status_code == 200
    entries = json.dumps(client.get("/v1/journal").json()["entries"])
    assert f"{marker} shown" in entries or f'"{marker}", "shown"' in entries
    assert "hidden" not in entries
