"""`/v1/health` reports how long the runtime has been idle: health probes do not count, requests do, and a
request in flight keeps it busy (what the operator reads to suspend an idle ShadowEnvironment)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import httpx
import pytest

from tests.runtime.conftest import Server

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
