"""Transfers from a workspace end in total, not per read (clients/pacing.py), and one tenant's stalled transfers
never take the push slots of another (issue 27).

The attack: workspace code stops its own runtime (SIGSTOP) in the middle of a transfer, or wakes it for a few bytes
at a time. httpx's timeouts are per read, so before this change a download waited up to its whole timeout (900 s
for a push) per read, holding one of the operator's two push slots all the while; two such pushes blocked every
other tenant's copy-in and `promote --to-branch`. Here the runtimes are real sandbox-runtime processes, stopped
with a real SIGSTOP; the trickling runtime is a real HTTP server on loopback answering as the attacker's would.
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from shadow_operator.clients import gitpush
from shadow_operator.clients.pacing import Pace, Slots
from shadow_operator.clients.runtime import Runtime, RuntimeStalled
from shadow_operator.common.sources import SourcePlan
from shadow_operator.controllers.environment import pushes

from tests.runtime.conftest import Server, start_server
from tests.support.githttp import GitHttpServer
from tests.support.hostile_repo import git

pytestmark = pytest.mark.unit
TOKEN = "s3cret-gitea-token-0123456789"
FAST = Pace(min_rate=256 << 10, window=1.0)  # 256 KiB/s over every second: a stopped runtime ends in ~1 s


@pytest.fixture
def runtime(tmp_path: Path) -> Iterator[Server]:
    srv = start_server(tmp_path / "workspace")
    yield srv
    os.kill(srv.pid, signal.SIGCONT)
    srv.stop()


class Trickle(BaseHTTPRequestHandler):
    """A runtime woken for a moment now and then: the head at once, then one byte every 50 ms, for ever."""

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", str(1 << 30))
        self.end_headers()
        try:
            while not self.server.closing:  # type: ignore[attr-defined]
                self.wfile.write(b"x")
                self.wfile.flush()
                time.sleep(0.05)
        except OSError:
            pass

    def log_message(self, *_: object) -> None:
        pass


@pytest.fixture
def trickle() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Trickle)
    server.closing = False  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.closing = True  # type: ignore[attr-defined]
    server.shutdown()
    server.server_close()


async def download(url: str, token: str | None, dest: Path, *, pace: Pace, timeout: float) -> int:
    async with Runtime(url, token, pace=pace) as rt:
        return await rt.download("big.bin", dest, limit=1 << 30, timeout=timeout)


def test_a_stopped_runtime_ends_the_download_as_stalled(runtime: Server, tmp_path: Path) -> None:
    (runtime.root / "big.bin").write_bytes(b"\0" * (1 << 20))
    os.kill(runtime.pid, signal.SIGSTOP)

    async def go() -> float:
        started = time.monotonic()
        with pytest.raises(RuntimeStalled, match=r"fewer than 262144 bytes in 1s.*runtime looks stopped"):
            # Before: the 600 s timeout was per read, and this waited for all of it.
            await asyncio.wait_for(download(runtime.url, None, tmp_path / "out", pace=FAST, timeout=600), 15)
        return time.monotonic() - started

    assert asyncio.run(go()) < 5


def test_a_runtime_woken_for_a_byte_at_a_time_is_stalled_too(trickle: str, tmp_path: Path) -> None:
    async def go() -> None:
        with pytest.raises(RuntimeStalled, match="runtime looks stopped"):
            # Before: every read got its byte within the per-read timeout, so nothing ever ended it.
            await asyncio.wait_for(download(trickle, None, tmp_path / "out", pace=FAST, timeout=600), 15)

    asyncio.run(go())


def test_the_deadline_is_for_the_whole_transfer(trickle: str, tmp_path: Path) -> None:
    slow_enough = Pace(min_rate=1, window=1.0)  # a byte a second keeps the pace; the total deadline ends it

    async def go() -> None:
        with pytest.raises(RuntimeStalled, match=r"took longer than 2s in total"):
            await asyncio.wait_for(download(trickle, None, tmp_path / "out", pace=slow_enough, timeout=2), 15)

    asyncio.run(go())


def test_an_ordinary_download_keeps_its_pace(runtime: Server, tmp_path: Path) -> None:
    data = os.urandom(8 << 20)
    (runtime.root / "big.bin").write_bytes(data)
    assert asyncio.run(download(runtime.url, None, tmp_path / "out", pace=FAST, timeout=60)) == len(data)
    assert (tmp_path / "out").read_bytes() == data


def snapshot_repo(srv: Server, name: str) -> SourcePlan:
    repo = srv.root / name
    repo.mkdir(parents=True)
    git(repo, "init", "-q", "-b", "main")
    (repo / "app.py").write_text("print('hi')\n")
    git(repo, "add", "-A")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "first")
    return SourcePlan(name, name, "shadow", name, None, None, upload=True)


def test_a_tenants_stalled_pushes_leave_another_tenant_its_slot(tmp_path: Path) -> None:
    """Tenant A stops its runtime in the middle of two pushes; tenant B's push goes through meanwhile."""
    attacker = start_server(tmp_path / "a")
    victim = start_server(tmp_path / "b")
    plan = snapshot_repo(victim, "core")
    (attacker.root / "held.bundle").write_bytes(b"\0" * (1 << 20))
    # Two shared slots, as the chart's default; a long window, so A's pushes stay stalled for the whole test.
    settings = gitpush.PushSettings(slots=Slots(total=2, per_namespace=1), cleanup_seconds=0.5)
    patient = Pace(min_rate=1, window=120.0)
    os.kill(attacker.pid, signal.SIGSTOP)
    try:
        with GitHttpServer(tmp_path / "repos") as gitea:
            url = gitea.repo_url("shadow/core")

            async def go() -> tuple[str, str]:
                async with Runtime(attacker.url, None, pace=patient) as held, Runtime(victim.url, None) as rt:
                    stalls = [
                        asyncio.create_task(
                            gitpush.push_snapshot(
                                held,
                                "held.bundle",
                                remote_url=url,
                                token=TOKEN,
                                branch="main",
                                everything=False,
                                settings=settings,
                                tenant="team-a",
                            )
                        )
                        for _ in range(2)
                    ]
                    await asyncio.sleep(0.5)  # both of A's pushes are under way (or waiting for A's slot)
                    assert settings.slots.busy("team-a") == 2
                    try:
                        # Before: A's two pushes held both slots, and this waited until they timed out.
                        target = pushes.Target(url, url, TOKEN, "team-b")
                        return await asyncio.wait_for(
                            pushes.snapshot_and_push(rt, plan, target, settings), 30
                        )
                    finally:
                        for task in stalls:
                            task.cancel()
                        await asyncio.gather(*stalls, return_exceptions=True)

            commit, branch = asyncio.run(go())
        assert branch == "main"
        assert git(tmp_path / "repos" / "shadow" / "core.git", "rev-parse", "refs/heads/main") == commit
    finally:
        os.kill(attacker.pid, signal.SIGCONT)
        attacker.stop()
        victim.stop()


def test_slots_are_shared_in_turn_between_namespaces() -> None:
    async def go() -> list[str]:
        slots = Slots(total=2, per_namespace=1)
        order: list[str] = []
        release = asyncio.Event()

        async def hold(namespace: str, tag: str) -> None:
            async with slots.hold(namespace):
                order.append(tag)
                await release.wait()

        tasks = [asyncio.create_task(hold("a", f"a{i}")) for i in range(3)]
        tasks.append(asyncio.create_task(hold("b", "b0")))
        await asyncio.sleep(0.1)
        started = list(order)
        release.set()
        await asyncio.gather(*tasks)
        assert slots.busy("a") == slots.busy("b") == 0  # nothing is kept for a namespace gone quiet
        return started

    # One of a's three, and b's one at once, although a asked first three times.
    assert asyncio.run(go()) == ["a0", "b0"]
