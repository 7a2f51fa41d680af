"""images/kindnetd: the Go tests of our kindnetd, NetworkPolicy compiled to nftables among them.

As root with nft and ip installed, the Go tests also validate every generated ruleset with `nft -c` and
send real TCP connections through it between network namespaces of their own (never the host's).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

KINDNETD = Path(__file__).resolve().parents[2] / "images" / "kindnetd"
# The official Go tarball installs here, often without putting it on PATH.
GO = shutil.which("go") or next((p for p in ["/usr/local/go/bin/go"] if os.access(p, os.X_OK)), None)


def test_go_tests_pass() -> None:
    if GO is None:
        pytest.fail("no Go toolchain: install Go (https://go.dev/dl/) or put /usr/local/go/bin on PATH")
    env = {**os.environ, "GOFLAGS": "-mod=mod", "CGO_ENABLED": "0"}
    result = subprocess.run(
        [GO, "test", "-count=1", "./..."],
        cwd=KINDNETD,
        capture_output=True,
        text=True,
        env=env,
        timeout=280,
        check=False,
    )
    assert result.returncode == 0, f"go test ./... in {KINDNETD} failed:\n{result.stdout}\n{result.stderr}"
