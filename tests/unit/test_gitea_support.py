"""Gitea plumbing without the Gitea binary: the entrypoint's bootstrap logic against a stub `gitea`, and the
chart handing the Gitea image to the operator. tests/integration/test_gitea_binary.py runs the real binary."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.unit.test_chart import _helm

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
START_SCRIPT = REPO / "images" / "gitea" / "gitea-start.sh"
CHART = REPO / "charts" / "shadow-operator"
PASSWORD = "s3cret-Pa55word"

# Records each call, keeps a fake user table in $GITEA_DATA/users, and stands in for `web` by exiting.
STUB = """#!/bin/sh
data=$GITEA_DATA
while [ $# -gt 0 ]; do
  case $1 in --config|--work-path) shift 2 ;; *) break ;; esac
done
echo "$*" >>"$data/calls"
case "$1 $2" in
  "generate secret") echo "generated-$3" ;;
  "config edit-ini") env | grep '^GITEA__' | sort >"$data/edit-ini.env" ;;
  "admin user")
    if [ "$3" = list ]; then
      printf 'ID   Username Email IsActive IsAdmin 2FA\\n'
      cat "$data/users" 2>/dev/null
    else
      while [ $# -gt 0 ]; do [ "$1" = --username ] && echo "1 $2 x true true false" >>"$data/users"; shift; done
      echo "New user has been successfully created!"
    fi ;;
esac
exit 0
"""


def run_start(tmp_path: Path, port: int) -> subprocess.CompletedProcess[str]:
    stub = tmp_path / "gitea"
    if not stub.exists():
        stub.write_text(STUB)
        stub.chmod(stub.stat().st_mode | stat.S_IXUSR)
        (tmp_path / "share" / "templates").mkdir(parents=True)
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(tmp_path),
        "GITEA_BIN": str(stub),
        "GITEA_DATA": str(tmp_path / "data"),
        "GITEA_STATIC_ROOT": str(tmp_path / "share"),
        "GITEA_HTTP_PORT": str(port),
        "GITEA_ADMIN_USERNAME": "root-admin",
        "GITEA_ADMIN_PASSWORD": PASSWORD,
    }
    return subprocess.run(
        ["/bin/sh", str(START_SCRIPT)], env=env, capture_output=True, text=True, timeout=30, check=True
    )


def test_first_start_writes_config_and_creates_the_admin_once(tmp_path: Path) -> None:
    first = run_start(tmp_path, 3000)
    data = tmp_path / "data"
    config = (data / "conf" / "app.ini").read_text()
    assert stat.S_IMODE((data / "conf" / "app.ini").stat().st_mode) == 0o600
    for line in (
        "INSTALL_LOCK = true",
        "SECRET_KEY = generated-SECRET_KEY",
        "INTERNAL_TOKEN = generated-INTERNAL_TOKEN",
        "JWT_SECRET = generated-JWT_SECRET",
        "DB_TYPE = sqlite3",
        f"PATH = {data}/data/gitea.db",
        f"ROOT = {data}/repositories",
        f"STATIC_ROOT_PATH = {tmp_path}/share",
        "DISABLE_SSH = true",
        "OFFLINE_MODE = true",
        "DISABLE_REGISTRATION = true",
        "REQUIRE_SIGNIN_VIEW = false",
        "DEFAULT_BRANCH = main",
        "PASSWORD_COMPLEXITY = off",
        # Gitea never fetches anything: no migrations (none from local networks), no LFS server.
        "ALLOW_LOCALNETWORKS = false",
        "DISABLE_MIGRATIONS = true",
        "LFS_START_SERVER = false",
    ):
        assert line in config.splitlines(), line
    calls = (data / "calls").read_text().splitlines()
    creates = [c for c in calls if c.startswith("admin user create")]
    assert len(creates) == 1
    assert "--admin --username root-admin" in creates[0]
    assert "--email root-admin@shadow.local --must-change-password=false" in creates[0]
    assert calls[-1] == "web"
    assert PASSWORD not in first.stdout + first.stderr

    # A restart with another port: same secrets, no second admin, the port re-applied to app.ini.
    second = run_start(tmp_path, 3100)
    assert (data / "conf" / "app.ini").read_text() == config
    calls = (data / "calls").read_text().splitlines()
    assert len([c for c in calls if c.startswith("admin user create")]) == 1
    assert "admin user 'root-admin' exists" in second.stderr
    applied = (data / "edit-ini.env").read_text().splitlines()
    assert "GITEA__server__HTTP_PORT=3100" in applied
    assert "GITEA__server__ROOT_URL=http://localhost:3100/" in applied
    # Re-applied on every start, so a data directory from an older image is closed too.
    for setting in (
        "GITEA__repository__DISABLE_MIGRATIONS=true",
        "GITEA__migrations__ALLOW_LOCALNETWORKS=false",
        "GITEA__mirror__ENABLED=false",
        "GITEA__security__DISABLE_WEBHOOKS=true",
    ):
        assert setting in applied, setting
    running_as_root = "true" if os.getuid() == 0 else "false"
    assert f"GITEA____I_AM_BEING_UNSAFE_RUNNING_AS_ROOT={running_as_root}" in applied
    assert PASSWORD not in second.stdout + second.stderr


def test_admin_without_password_is_refused(tmp_path: Path) -> None:
    (tmp_path / "share" / "templates").mkdir(parents=True)
    result = subprocess.run(
        ["/bin/sh", str(START_SCRIPT)],
        env={
            "PATH": os.environ["PATH"],
            "GITEA_BIN": "/bin/true",
            "GITEA_DATA": str(tmp_path / "data"),
            "GITEA_STATIC_ROOT": str(tmp_path / "share"),
            "GITEA_ADMIN_USERNAME": "admin",
        },
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode != 0
    assert "GITEA_ADMIN_PASSWORD is required" in result.stderr
    assert not (tmp_path / "data").exists()


def operator_env(*values: str) -> dict[str, str]:
    out = subprocess.run(
        [_helm(), "template", "shadow", str(CHART), "--namespace", "shadow-system", *values],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    ).stdout
    deployment = next(
        d
        for d in yaml.safe_load_all(out)
        if d and d["kind"] == "Deployment" and "operator" in d["metadata"]["name"]
    )
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    return {e["name"]: e.get("value") for e in container["env"]}


@pytest.mark.parametrize(
    ("values", "image"),
    [
        ([], "ghcr.io/shadow-operator/gitea:{app_version}"),
        (
            ["--set=global.imageRegistry=registry.internal:5000", "--set=gitea.image.tag=0123abcd"],
            "registry.internal:5000/shadow-operator/gitea:0123abcd",
        ),
        (["--set=gitea.image.digest=sha256:" + "b" * 64], "ghcr.io/shadow-operator/gitea@sha256:" + "b" * 64),
    ],
    ids=["defaults", "air-gapped", "digest"],
)
def test_chart_passes_the_gitea_image_to_the_operator(values: list[str], image: str) -> None:
    app_version = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
    env = operator_env(*values)
    assert env["SHADOW_GITEA_IMAGE"] == image.format(app_version=app_version)
    assert env["SHADOW_GITEA_IMAGE_PULL_POLICY"] == "IfNotPresent"
