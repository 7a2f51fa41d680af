"""hack/lib.sh `detached`: the daemons hack/docker.sh starts (dockerd, the registry, its forward) hold none of
their caller's files. Before, a dockerd started under `flock LOCK make e2e` kept LOCK for its whole life, and
every later `flock LOCK` waited for ever."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.support.controlplane import wait_for

pytestmark = pytest.mark.unit

LIB = Path(__file__).resolve().parents[2] / "hack" / "lib.sh"


def _lock_free(lock: Path) -> bool:
    return subprocess.run(["flock", "-n", str(lock), "true"]).returncode == 0


@pytest.mark.parametrize("how", ["detached", "plain"])
def test_a_daemon_started_under_a_lock_does_not_keep_it(tmp_path: Path, how: str) -> None:
    lock, pid_file = tmp_path / "kind.lock", tmp_path / "pid"
    start = "detached setsid nohup" if how == "detached" else "setsid nohup"
    script = f'source "{LIB}"; {start} sleep 60 >/dev/null 2>&1 </dev/null & echo $! >"{pid_file}"'
    subprocess.run(["flock", str(lock), "bash", "-c", script], check=True)
    pid = int(pid_file.read_text())
    try:
        # $! is the daemon itself (hack/docker.sh records it to stop the registry later), once setsid and nohup
        # have replaced themselves with it.
        wait_for(
            lambda: Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0] == b"sleep",
            timeout=10,
            what="the daemon to be the process $! names",
        )
        assert _lock_free(lock) is (how == "detached")
    finally:
        subprocess.run(["kill", str(pid)], check=False)
