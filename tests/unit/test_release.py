"""hack/release.sh's chart step: a packaged chart whose Chart.yaml and image defaults carry the release's version
and registry, made from a copy (the checked-in chart is never edited), and clear refusals of bad input.
"""

from __future__ import annotations

import subprocess
import tarfile
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.unit.test_chart import CHART, REPO, _helm, documents

pytestmark = pytest.mark.unit

RELEASE = REPO / "hack" / "release.sh"
IMAGES = {
    "operator": ("operator",),
    "workspace": ("workspace",),
    "gitea": ("gitea",),
    "preview-router": ("previewRouter",),
    "egress-gateway": ("egressGateway",),
}


def release(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(RELEASE), *args], capture_output=True, text=True, timeout=180, check=False)


def packaged(tgz: Path, name: str) -> dict[str, Any]:
    with tarfile.open(tgz) as archive:
        member = archive.extractfile(f"shadow-operator/{name}")
        assert member is not None
        loaded: dict[str, Any] = yaml.safe_load(member.read())
        return loaded


def rendered_images(tgz: Path, *values: str) -> set[str]:
    out = subprocess.run(
        [_helm(), "template", "r", str(tgz), "--set=previewRouter.enabled=true", "--set=egressGateway.enabled=true", *values],
        capture_output=True, text=True, check=True, timeout=120,
    ).stdout  # fmt: skip
    images = set()
    for doc in documents(out):
        spec = doc.get("spec", {})
        pod = spec.get("template", spec.get("podTemplate", {})).get("spec", {})
        for container in pod.get("containers", []):
            images.add(container["image"])
            images.update(e["value"] for e in container.get("env", []) if e["name"] == "SHADOW_GITEA_IMAGE")
    return images


@pytest.mark.parametrize(
    ("registry", "host", "prefix"),
    [("registry.example.com:5000/platform/agents", "registry.example.com:5000", "platform/agents/"),
     ("127.0.0.1:5001", "127.0.0.1:5001", "")],
)  # fmt: skip
def test_chart_carries_the_release_version_and_registry(
    tmp_path: Path, registry: str, host: str, prefix: str
) -> None:
    _helm()
    before = {p: p.read_bytes() for p in (CHART / "Chart.yaml", CHART / "values.yaml")}
    result = release("chart", "1.4.0-rc.1", registry, "--skip-push", "--out", str(tmp_path))
    assert result.returncode == 0, result.stderr
    tgz = tmp_path / "shadow-operator-1.4.0-rc.1.tgz"

    chart = packaged(tgz, "Chart.yaml")
    assert (chart["version"], chart["appVersion"]) == ("1.4.0-rc.1", "1.4.0-rc.1")
    values = packaged(tgz, "values.yaml")
    for name, path in IMAGES.items():
        block = values
        for key in path:
            block = block[key]
        image = block["image"]
        assert (image["registry"], image["repository"], image["tag"]) == (host, f"{prefix}{name}", "")
    # What a user gets with no overrides: every image from the release's registry at the release's tag.
    assert rendered_images(tgz) == {f"{registry}/{name}:1.4.0-rc.1" for name in IMAGES}
    # A mirror still replaces only the host (global.imageRegistry), keeping the path.
    assert rendered_images(tgz, "--set=global.imageRegistry=mirror.internal") == {
        f"mirror.internal/{prefix}{name}:1.4.0-rc.1" for name in IMAGES
    }
    assert {p: p.read_bytes() for p in before} == before, "the checked-in chart was edited"
    assert not (tmp_path / ".chart").exists()


def test_pushed_images_are_pinned_by_digest(tmp_path: Path) -> None:
    """A release pins the images it pushed: a node that cached an older image under the same tag (a re-made
    release, a mutable registry) still runs exactly what was released."""
    registry = "registry.example.com:5000/platform"
    digests = {name: f"sha256:{(str(i) * 64)[:64]}" for i, name in enumerate(IMAGES, start=1)}
    (tmp_path / "images.txt").write_text(
        "".join(f"{registry}/{name}:2.0.0@{digest}\n" for name, digest in digests.items())
    )
    result = release("chart", "2.0.0", registry, "--skip-push", "--out", str(tmp_path))
    assert result.returncode == 0, result.stderr
    tgz = tmp_path / "shadow-operator-2.0.0.tgz"
    assert rendered_images(tgz) == {f"{registry}/{name}@{digest}" for name, digest in digests.items()}
    values = packaged(tgz, "values.yaml")
    assert values["operator"]["image"]["digest"] == digests["operator"]
    assert values["previewRouter"]["image"]["digest"] == digests["preview-router"]


@pytest.mark.parametrize(
    ("args", "message"),
    [(["1.2", "ghcr.io/org"], "VERSION must be semver"),
     (["1.2.0+build.5", "ghcr.io/org"], "VERSION must be semver"),
     (["1.2.0", "ghcr.io/My_Org"], "REGISTRY must be host[:port][/path]"),
     (["1.2.0", "ghcr.io/org", "--skip-pushes"], "unknown option '--skip-pushes'")],
)  # fmt: skip
def test_bad_input_is_refused_with_a_message(tmp_path: Path, args: list[str], message: str) -> None:
    result = release("chart", *args, "--skip-push", "--out", str(tmp_path))
    assert result.returncode != 0
    assert message in result.stderr
    assert not list(tmp_path.iterdir())


def test_a_full_release_needs_the_sources_to_say_its_version(tmp_path: Path) -> None:
    """Images and Python distributions are built from the sources: their own version must be the release's."""
    result = release("9.9.9", "ghcr.io/org", "--skip-push", "--skip-images", "--out", str(tmp_path))
    assert result.returncode != 0
    assert "run `hack/release.sh set-version 9.9.9`" in result.stderr
