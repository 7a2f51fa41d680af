"""Bounded memory and disk for what a tenant's commands leave behind: the output of exited background
processes (a total budget, least recently read released first) and the command journal (rotated)."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from .conftest import Server, wait_until

pytestmark = pytest.mark.unit

MIB = 1 << 20


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def test_exited_background_processes_keep_output_within_a_budget(launch: Callable[..., Server]) -> None:
    srv = launch()
    c = srv.client()
    c.post("/v1/exec", json={"argv": ["true"]})
    before = rss_mib(srv.pid)
    ids = []
    for _ in range(64):
        r = c.post("/v1/processes", json={"argv": ["sh", "-c", "yes | head -c 4194304"]})
        assert r.status_code == 201, r.text
        ids.append(r.json()["id"])

    def all_exited() -> bool:
        procs = c.get("/v1/processes").json()["processes"]
        return len(procs) == 64 and all(p["state"] == "exited" for p in procs)

    wait_until(all_exited, 120, "64 background processes to exit")
    after = rss_mib(srv.pid)
    print(f"runtime RSS before {before:.0f} MiB, after 64 exited 4 MiB-output processes {after:.0f} MiB")
    assert after - before < 128  # was +281 MiB: every exited process kept its whole 4 MiB log

    kept = 0
    for pid in ids:
        events = [json.loads(line) for line in c.get(f"/v1/processes/{pid}/logs").text.splitlines()]
        assert events[-1] == {"type": "exit", "exit_code": 0, "signal": None, "timed_out": False}
        kept += sum(len(e["data"]) for e in events if e["type"] == "stdout")
        summary = c.get(f"/v1/processes/{pid}").json()
        assert summary["stdout_bytes"] == 4 * MIB  # what was written is still reported
    assert 0 < kept <= 32 * MIB
    # The least recently read lost their output; they say so.
    first = [json.loads(line) for line in c.get(f"/v1/processes/{ids[0]}/logs").text.splitlines()]
    assert first[0]["type"] == "dropped"


def test_a_process_printing_one_byte_at_a_time_cannot_pile_up_chunks(launch: Callable[..., Server]) -> None:
    srv = launch()
    c = srv.client()
    # One byte per write, paced so that the runtime reads (nearly) every one as its own chunk.
    script = "import os, time\nfor _ in range(40000):\n    os.write(1, b'x')\n    time.sleep(0.00005)"
    pid = c.post("/v1/processes", json={"argv": [sys.executable, "-c", script]}).json()["id"]
    wait_until(lambda: c.get(f"/v1/processes/{pid}").json()["state"] == "exited", 120, "the process to exit")
    events = [json.loads(line) for line in c.get(f"/v1/processes/{pid}/logs").text.splitlines()]
    # Each chunk is charged its overhead (200 bytes) as well as its bytes against the 4 MiB log.
    assert len(events) <= 4 * MIB // 200 + 2
    assert c.get(f"/v1/processes/{pid}").json()["stdout_bytes"] == 40000


def test_journal_rotates_and_its_readers_carry_on(launch: Callable[..., Server], tmp_path: Path) -> None:
    root = tmp_path / "journal-ws"
    root.mkdir()
    srv = launch("--journal-max-bytes", "20000", root=root)
    c = srv.client()
    for i in range(60):
        assert c.post("/v1/exec", json={"argv": ["echo", f"{i:04d}" + "x" * 600]}).status_code == 200
    state = root / ".sandbox-runtime"
    files = sorted(p.name for p in state.iterdir() if p.name.startswith("journal"))
    assert files == ["journal.jsonl", "journal.jsonl.1"]
    assert all(os.path.getsize(state / f) <= 20000 for f in files)
    got = c.get("/v1/journal").json()
    assert got["last_seq"] == 60 and [e["seq"] for e in got["entries"]] == list(range(1, 61))

    with c.stream("GET", "/v1/journal", params={"since": 60, "follow": "true"}) as stream:
        c2 = srv.client()
        c2.post("/v1/exec", json={"argv": ["echo", "after rotation"]})
        line = next(stream.iter_lines())
    assert json.loads(line)["seq"] == 61

    srv.stop()
    again = launch("--journal-max-bytes", "20000", root=root)
    c = again.client()
    got = c.get("/v1/journal").json()
    seqs = [e["seq"] for e in got["entries"]]
    assert got["last_seq"] == 61 and seqs == sorted(seqs) and seqs[-1] == 61 and len(seqs) > 10
    assert c.post("/v1/exec", json={"argv": ["echo", "next"]}).status_code == 200
    assert c.get("/v1/journal", params={"since": 61}).json()["entries"][0]["seq"] == 62
