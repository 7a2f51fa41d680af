"""`/v1/health` reports how long the runtime has been idle: health probes do not count, requests do, a request
in flight keeps it busy, and so do an open terminal and a process started through the API until it exits (what
the operator reads to suspend an idle Sandbox, spec.autoSuspendPolicy)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import httpx
import pytest
from websockets.sync.client import connect

from tests.runtime.conftest import Server, wait_until

pytestmark = pytest.mark.unit


def idle(client: httpx.Client) -> int:
    return int(client.get("/v1/health").json()["idle_seconds"])


def test_idle_seconds_count_from_the_last_request(launch: Callable[..., Server]) -> None:
    srv = launch()
    client = srv.client()
    time.sleep(1.2)
    assert idle(client) >= 1  # the probes themselves are not activity
    assert client.post("/v1/exec", json={"argv": ["true"]}).status_code == 200
    assert idle(client) == 0

    # A long command keeps the runtime busy while it runs.
    done = threading.Event()

    def slow() -> None:
        srv.client().post("/v1/exec", json={"argv": ["sleep", "2"]}, timeout=10)
        done.set()

    threading.Thread(target=slow, daemon=True).start()
    time.sleep(1.5)
    assert idle(client) == 0
    assert done.wait(5)
    time.sleep(1.1)
    assert idle(client) >= 1


def test_a_background_process_keeps_the_runtime_busy_until_it_exits(launch: Callable[..., Server]) -> None:
    srv = launch()
    client = srv.client()
    started = client.post("/v1/processes", json={"argv": ["sleep", "3"]})
    assert started.status_code in (200, 201), started.text
    # The request that started it ended long ago; the process still runs: not idle.
    time.sleep(1.5)
    assert idle(client) == 0
    pid = started.json()["id"]
    wait_until(lambda: client.get(f"/v1/processes/{pid}").json()["state"] == "exited", timeout=10)
    # Idle time counts from its exit.
    time.sleep(1.2)
    assert 1 <= idle(client) <= 3


def test_an_open_terminal_keeps_the_runtime_busy(launch: Callable[..., Server]) -> None:
    srv = launch()
    client = srv.client()
    url = srv.url.replace("http://", "ws://") + "/v1/pty?shell=/bin/sh"
    with connect(url, open_timeout=10) as ws:
        ws.send(b"echo open\n")
        out = b""
        while b"open" not in out:
            out += ws.recv(timeout=10)  # type: ignore[operator]
        time.sleep(1.5)  # nobody types
        assert idle(client) == 0
        ws.send(b"exit\n")
    wait_until(lambda: idle(client) >= 1, timeout=10)
