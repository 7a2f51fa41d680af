"""hack/kind/docker-shim/docker: how kind's docker calls are rewritten where --privileged cannot work.

The real docker is replaced by a recorder script that prints the arguments it receives, one per line.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.support.scripts import argument_recorder

pytestmark = pytest.mark.unit

SHIM = Path(__file__).resolve().parents[2] / "hack" / "kind" / "docker-shim" / "docker"
EXPLICIT = [
    "--cap-add=ALL",
    "--cap-drop=SYS_RESOURCE",
    "--security-opt",
    "seccomp=unconfined",
    "--security-opt",
    "apparmor=unconfined",
    "--security-opt",
    "systempaths=unconfined",
    "--device-cgroup-rule=a *:* rwm",
]


@pytest.fixture
def recorder(tmp_path: Path) -> Path:
    return argument_recorder(tmp_path)


def shim(real: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SHADOW_REAL_DOCKER": str(real)}
    return subprocess.run([str(SHIM), *args], capture_output=True, text=True, env=env, timeout=30)


def test_run_privileged_becomes_the_explicit_capability_set(recorder: Path) -> None:
    result = shim(recorder, "run", "-d", "--privileged", "--name", "node", "image:tag", "/sbin/init")
    assert result.returncode == 0, result.stderr
    args = result.stdout.splitlines()
    assert "--privileged" not in args
    assert args[:3] == ["run", "-d", *EXPLICIT[:1]]
    assert args[2 : 2 + len(EXPLICIT)] == EXPLICIT
    if Path("/dev/kmsg").exists():
        assert "--device=/dev/kmsg" in args
    # Everything else keeps its order, the image and its command last.
    assert args[-4:] == ["--name", "node", "image:tag", "/sbin/init"]


def test_exec_privileged_drops_the_flag(recorder: Path) -> None:
    result = shim(recorder, "exec", "--privileged", "-i", "node", "cat", "/kind/version")
    assert result.stdout.splitlines() == ["exec", "-i", "node", "cat", "/kind/version"]


@pytest.mark.parametrize("args", [["ps", "-a", "--privileged"], ["inspect", "node"], ["run", "image"]])
def test_other_calls_pass_through_unchanged(recorder: Path, args: list[str]) -> None:
    assert shim(recorder, *args).stdout.splitlines() == args


def test_refuses_to_call_itself() -> None:
    result = shim(SHIM, "ps")
    assert result.returncode != 0
    assert "points at the shim" in result.stderr
