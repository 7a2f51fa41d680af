"""A hostile tenant's commands must not freeze the runtime: huge arguments are split in linear time off the
event loop, bounded by `--max-command-bytes` (413 beyond), and /healthz keeps answering meanwhile."""

from __future__ import annotations

import shlex
import statistics
import threading
import time
from collections.abc import Callable

import httpx
import pytest
from sandbox_runtime.execution import split_command

from .conftest import Server

pytestmark = pytest.mark.unit

ONE_MIB = 1 << 20


def healthz_under_load(srv: Server, seconds: float, clients: int = 4) -> list[float]:
    """Latencies of /healthz polled while `clients` threads send 1 MiB-argument execs (both dialects)."""
    stop = threading.Event()
    errors: list[str] = []

    def hammer(i: int) -> None:
        with httpx.Client(base_url=srv.url, timeout=120) as c:
            while not stop.is_set():
                try:
                    if i % 2:
                        r = c.post("/execute", json={"command": "echo 'a b' " + "x" * ONE_MIB})
                    else:
                        r = c.post("/v1/exec", json={"argv": ["echo", "y" * ONE_MIB]})
                except httpx.TimeoutException:
                    continue
                if r.status_code != 200:
                    errors.append(r.text[:200])

    threads = [threading.Thread(target=hammer, args=(i,), daemon=True) for i in range(clients)]
    for t in threads:
        t.start()
    latencies: list[float] = []
    deadline = time.monotonic() + seconds
    with httpx.Client(base_url=srv.url) as probe:
        while time.monotonic() < deadline:
            t0 = time.monotonic()
            try:
                probe.get("/healthz", timeout=5).raise_for_status()
                latencies.append(time.monotonic() - t0)
            except httpx.TimeoutException:
                latencies.append(5.0)
            time.sleep(0.02)
    stop.set()
    assert not errors, errors[:3]
    return latencies


def p99(values: list[float]) -> float:
    return statistics.quantiles(values, n=100)[98] if len(values) >= 2 else values[0]


def test_healthz_stays_responsive_while_four_clients_send_1mib_arguments(
    launch: Callable[..., Server],
) -> None:
    srv = launch()
    latencies = healthz_under_load(srv, 6.0)
    print(
        f"healthz under load: n={len(latencies)} p50={statistics.median(latencies) * 1000:.1f} ms "
        f"p99={p99(latencies) * 1000:.1f} ms max={max(latencies) * 1000:.1f} ms"
    )
    # Measured well under 200 ms here (BENCHMARKS.md); the bound is loose so a loaded CI machine passes.
    assert p99(latencies) < 1.0
    # The journal keeps a bounded record of such commands, not megabytes per entry.
    entries = srv.client().get("/v1/journal").json()["entries"]
    assert entries and max(len(e["command"]) for e in entries) < 4096


def test_commands_beyond_the_limit_are_refused_with_413(launch: Callable[..., Server]) -> None:
    srv = launch("--max-command-bytes", "65536")
    c = srv.client()
    for path, body in [
        ("/execute", {"command": "echo " + "x" * 70000}),
        ("/exec", {"command": "echo " + "x" * 70000}),
        ("/v1/exec", {"argv": ["echo", "x" * 70000]}),
        ("/v1/exec", {"command": "echo " + "x" * 70000}),
        ("/v1/exec", {"argv": ["env"], "env": {"BIG": "x" * 70000}}),
        ("/v1/processes", {"argv": ["echo", "x" * 70000]}),
    ]:
        r = c.post(path, json=body)
        assert r.status_code == 413, (path, r.text[:200])
        assert r.json()["code"] == "RESOURCE_EXHAUSTED" and "--max-command-bytes" in r.json()["message"]
    ok = c.post("/execute", json={"command": "echo " + "x" * 60000})
    assert ok.status_code == 200 and ok.json()["stdout"] == "x" * 60000 + "\n"


WORDS = [
    "plain",
    "a b",
    "'single quoted'",
    '"double \\" quoted"',
    "back\\ slash",
    "''",
    '""',
    "mix'ed'\"up\"\\x",
    '"\\\\ and \\n"',
    "tab\there",
    "new\nline",
    "'",
    '"',
    "\\",
    "ünïcødé",
    "\x0b\x0c",
    "\\\n",
]


def test_split_command_matches_shlex_on_every_combination() -> None:
    import itertools

    for n in (1, 2, 3):
        for combo in itertools.product(WORDS, repeat=n):
            for sep in (" ", "", "\t\n "):
                text = sep.join(combo)
                try:
                    want: list[str] | None = shlex.split(text)
                except ValueError:
                    want = None
                try:
                    got: list[str] | None = split_command(text)
                except Exception:
                    got = None
                if want == []:
                    continue  # an empty command is refused by split_command (400)
                assert got == want, repr(text)


def test_split_command_is_linear() -> None:
    t0 = time.monotonic()
    argv = split_command("echo " + "x" * (16 * ONE_MIB) + " '" + "y" * ONE_MIB + "'")
    assert [len(a) for a in argv] == [4, 16 * ONE_MIB, ONE_MIB]
    assert time.monotonic() - t0 < 2.0
