"""shadowctl as a new user meets it: every mistake is one line and a hint, never a traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

SHADOWCTL = str(Path(sys.executable).parent / "shadowctl")


def run(*args: str, kubeconfig: str = "/nonexistent/kubeconfig") -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "KUBECONFIG": kubeconfig, "COLUMNS": "200"}
    return subprocess.run([SHADOWCTL, *args], env=env, capture_output=True, text=True, timeout=60)


def assert_one_error(result: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert lines[0].startswith("error: ") and lines[-1].startswith("hint: "), result.stderr
    for needle in needles:
        assert needle in result.stderr


def test_no_cluster_configured() -> None:
    assert_one_error(run("list"), "kubeconfig", "KUBECONFIG")


def test_create_needs_something_to_copy_in() -> None:
    assert_one_error(run("create", "x"), "nothing to copy in", "--local")


def test_bad_local_path_and_bad_rewrite(tmp_path: Path) -> None:
    assert_one_error(run("create", "x", "--local", str(tmp_path / "missing")), "not a directory")
    assert_one_error(
        run("create", "x", "--local", str(tmp_path), "--rewrite", "https://github.com/x"), "FROM=ORG"
    )


def test_bad_flag_is_refused_by_the_parser() -> None:
    result = run("list", "--no-such-flag")
    assert result.returncode == 2 and "No such option" in result.stderr and "Traceback" not in result.stderr


def test_help_reads_well() -> None:
    result = run("--help")
    assert result.returncode == 0
    for verb in ("create", "list", "status", "exec", "diff", "destroy"):
        assert verb in result.stdout
