"""hack/release.sh pushes the chart to a real OCI registry (Debian's docker-registry, the distribution
project's server, on a free loopback port) and a user gets it back with `helm show` / `helm pull`.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tarfile
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.support.controlplane import wait_for
from tests.unit.test_chart import REPO, _helm

pytestmark = pytest.mark.integration

VERSION = "2.3.0-rc.2"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return bool(response.status == 200)
    except OSError:
        return False


@pytest.fixture
def registry(tmp_path: Path) -> Iterator[str]:
    """HOST:PORT of a docker-registry serving from tmp_path, stopped after the test."""
    binary = shutil.which("docker-registry")
    if binary is None:
        pytest.fail("docker-registry not found: apt-get install docker-registry (.ci/run installs it)")
    address = f"127.0.0.1:{free_port()}"
    config = tmp_path / "registry.yml"
    config.write_text(
        yaml.safe_dump(
            {
                "version": 0.1,
                "log": {"level": "warn"},
                "storage": {"filesystem": {"rootdirectory": str(tmp_path / "data")}},
                "http": {"addr": address},
            }
        )
    )
    log = (tmp_path / "registry.log").open("w")
    process = subprocess.Popen([binary, "serve", str(config)], stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: answers(f"http://{address}/v2/"), timeout=30, what="docker-registry to answer")
        yield address
    finally:
        process.terminate()
        process.wait(timeout=10)
        log.close()


@pytest.fixture
def helm_env(tmp_path: Path) -> dict[str, str]:
    """Helm's config, cache and data under tmp_path: nothing of the user's is read or written."""
    env = dict(os.environ)
    for name in ("CONFIG", "CACHE", "DATA"):
        env[f"HELM_{name}_HOME"] = str(tmp_path / f"helm-{name.lower()}")
    return env


@pytest.mark.parametrize("images_from", ["", "registry.example.com:5000"], ids=["same-address", "push-to"])
def test_the_chart_is_pushed_to_an_oci_registry_and_installs_from_there(
    tmp_path: Path, registry: str, helm_env: dict[str, str], images_from: str
) -> None:
    """Pushed where REGISTRY says or, with --push-to, to the address this machine reaches the registry by
    while the chart's image defaults keep REGISTRY (kind's nodes pull from another address)."""
    helm = _helm()
    out = tmp_path / "release"
    args = [f"{registry}/platform"]
    if images_from:
        args = [f"{images_from}/platform", "--push-to", f"{registry}/platform"]
    pushed = subprocess.run(
        [str(REPO / "hack" / "release.sh"), "chart", VERSION, *args, "--out", str(out)],
        capture_output=True, text=True, timeout=180, env=helm_env, check=False,
    )  # fmt: skip
    assert pushed.returncode == 0, pushed.stderr
    reference = f"oci://{registry}/platform/charts/shadow-operator"

    shown = subprocess.run(
        [helm, "show", "chart", reference, "--version", VERSION, "--plain-http"],
        capture_output=True, text=True, timeout=60, env=helm_env, check=True,
    ).stdout  # fmt: skip
    chart = yaml.safe_load(shown)
    assert (chart["name"], chart["version"], chart["appVersion"]) == ("shadow-operator", VERSION, VERSION)

    pulled = tmp_path / "pulled"
    pulled.mkdir()
    subprocess.run(
        [helm, "pull", reference, "--version", VERSION, "--plain-http", "--destination", str(pulled)],
        capture_output=True, text=True, timeout=60, env=helm_env, check=True,
    )  # fmt: skip
    tgz = pulled / f"shadow-operator-{VERSION}.tgz"
    assert tgz.read_bytes() == (out / f"shadow-operator-{VERSION}.tgz").read_bytes()
    with tarfile.open(tgz) as archive:
        values_file = archive.extractfile("shadow-operator/values.yaml")
        assert values_file is not None
        values = yaml.safe_load(values_file.read())
    assert (values["operator"]["image"]["registry"], values["operator"]["image"]["repository"]) == (
        images_from or registry,
        "platform/operator",
    )

    # chart.txt records the digest the registry serves for that tag.
    request = urllib.request.Request(
        f"http://{registry}/v2/platform/charts/shadow-operator/manifests/{VERSION}",
        method="HEAD",
        headers={"Accept": "application/vnd.oci.image.manifest.v1+json"},
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        digest = response.headers["Docker-Content-Digest"]
    assert (out / "chart.txt").read_text().strip() == f"{reference}:{VERSION}@{digest}"
