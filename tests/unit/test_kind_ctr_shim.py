"""images/kind-base/files/usr/local/bin/ctr: kind's ctr calls adapted to Debian's containerd 1.6.

The real ctr is replaced by a recorder script that prints the arguments it receives, one per line.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.support.scripts import argument_recorder

pytestmark = pytest.mark.unit

SHIM = (
    Path(__file__).resolve().parents[2] / "images" / "kind-base" / "files" / "usr" / "local" / "bin" / "ctr"
)
HOSTS = ["--hosts-dir", "/etc/containerd/certs.d"]


@pytest.fixture
def recorder(tmp_path: Path) -> Path:
    return argument_recorder(tmp_path)


def ctr(real: Path, *args: str) -> list[str]:
    env = {**os.environ, "SHADOW_REAL_CTR": str(real)}
    result = subprocess.run(
        [str(SHIM), *args], capture_output=True, text=True, env=env, timeout=30, check=True
    )
    return result.stdout.splitlines()


def test_content_fetch_resolves_through_the_mirrors(recorder: Path) -> None:
    args = [
        "--namespace=k8s.io",
        "content",
        "fetch",
        "--platform=linux/amd64",
        "registry.k8s.io/pause:3.10.1",
    ]
    assert ctr(recorder, *args) == [*args[:3], *HOSTS, *args[3:]]


@pytest.mark.parametrize("verb", ["images", "image", "i"])
def test_image_pull_resolves_through_the_mirrors(recorder: Path, verb: str) -> None:
    assert ctr(recorder, "-n", "k8s.io", verb, "pull", "docker.io/x:1") == [
        "-n",
        "k8s.io",
        verb,
        "pull",
        *HOSTS,
        "docker.io/x:1",
    ]


def test_info_is_answered_by_version(recorder: Path) -> None:
    assert ctr(recorder, "info") == ["version"]
    assert ctr(recorder, "--address", "/run/c.sock", "info") == ["--address", "/run/c.sock", "version"]


def test_import_label_is_dropped_for_containerd_1_6(recorder: Path) -> None:
    args = [
        "--namespace=k8s.io",
        "images",
        "import",
        "--label=io.cri-containerd.pinned=pinned",
        "--all-platforms",
        "-",
    ]
    assert ctr(recorder, *args) == ["--namespace=k8s.io", "images", "import", "--all-platforms", "-"]


@pytest.mark.parametrize(
    "args",
    [
        ["--namespace=k8s.io", "images", "list", "-q"],
        ["--namespace=k8s.io", "images", "tag", "--force", "a:1", "b:1"],
        [
            "--namespace=k8s.io",
            "images",
            "import",
            "--all-platforms",
            "--digests",
            "--snapshotter=overlayfs",
            "-",
        ],
    ],
)
def test_other_calls_pass_through(recorder: Path, args: list[str]) -> None:
    assert ctr(recorder, *args) == args
