"""The operator's clients of workspaces and Gitea share one TLS context: a reconcile that opens a client for one
look at a running check must not read the CA bundle again (15-20 ms of CPU each time, 0.4 of a core with 20
environments verifying on kind before this)."""

from __future__ import annotations

import asyncio
import ssl
from typing import Any

import pytest
from shadow_operator.clients.gitea import Gitea
from shadow_operator.clients.runtime import Runtime

pytestmark = pytest.mark.unit


def test_new_runtime_and_gitea_clients_read_no_ca_bundle(monkeypatch: pytest.MonkeyPatch) -> None:
    async def open_and_close(count: int) -> None:
        for _ in range(count):
            async with (
                Runtime("http://127.0.0.1:9", "t"),
                Gitea("http://127.0.0.1:9", username="", token="t"),
            ):
                pass

    asyncio.run(open_and_close(1))  # the first client of the process may make the context
    loads: list[Any] = []
    original = ssl.SSLContext.load_verify_locations

    def counted(self: ssl.SSLContext, *args: Any, **kwargs: Any) -> None:
        loads.append(args or kwargs)
        original(self, *args, **kwargs)

    monkeypatch.setattr(ssl.SSLContext, "load_verify_locations", counted)
    asyncio.run(open_and_close(5))
    assert loads == [], f"{len(loads)} CA bundle loads for 10 new clients"
