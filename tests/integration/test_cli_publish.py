"""`shadowctl publish`, from the client side: the CLI uploads a local repository into the workspace through
the real API server's pod proxy, the operator snapshots it there and pushes it into a real Gitea, and the
client reports the commit, never touching the token.

The operator reaches the workspace at SHADOW_RUNTIME_API_URL (kwok plays the kubelet); the client reaches
the same real runtime through the pod proxy, once the workspace Pod's IP is this machine's non-loopback
address (kwok leaves an IP it did not give alone; the API server proxies to no loopback address).
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from shadow_operator.api import constants as c

from tests.runtime.conftest import Server, start_server
from tests.support.controlplane import free_port, wait_for
from tests.support.gitea import GiteaServer
from tests.support.router import outside_address
from tests.support.sandbox_operator import ENVIRONMENT, TEMPLATE, Objects, gitea_operator, template_body
from tests.support.volumes import bind_volumes, wait_bound

pytestmark = pytest.mark.integration
V = "v1alpha1"
GITEA_PORT = free_port()
GITEA_URL = f"http://127.0.0.1:{GITEA_PORT}"
SHADOWCTL = str(Path(sys.executable).parent / "shadowctl")


@pytest.fixture(scope="module")
def runtime(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = start_server(tmp_path_factory.mktemp("workspace"), host=outside_address())
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture(scope="module")
def operator(k8s_api: client.ApiClient, runtime: Server) -> Iterator[Any]:
    with gitea_operator(k8s_api, GITEA_URL, SHADOW_RUNTIME_API_URL=runtime.url) as runner:
        yield runner


def git(cwd: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@example.com", *args],
        cwd=cwd,
        check=True,
        capture_output=True,
        text=True,
    )
    return done.stdout.strip()


def test_publish_from_the_cli(objs: Objects, runtime: Server, kubeconfig: str, tmp_path: Path) -> None:
    ns = objs.namespace
    # The runtime port the client's pod proxy path names is the template's: the real runtime's.
    template = template_body("workspace")
    container = template["spec"]["podTemplate"]["spec"]["containers"][0]
    port = int(runtime.url.rsplit(":", 1)[1])
    container["ports"][0]["containerPort"] = port
    container["readinessProbe"]["tcpSocket"]["port"] = port
    objs.create(TEMPLATE, template)
    volumes = bind_volumes(objs, ["workspace-pub"], tmp_path)
    try:
        spec = {
            "sources": [{"name": "pub", "repo": "shadow/pub", "upload": {}}],
            "verify": {"enabled": False},
        }
        objs.create(ENVIRONMENT, {"metadata": {"name": "pub"}, "spec": spec}, version=V)
        wait_for(lambda: objs.secret_exists("pub-gitea-admin"), timeout=30, what="Gitea admin Secret")
        wait_bound(objs, ["workspace-pub"], timeout=120)
        creds = objs.secret_data("pub-gitea-admin")
        login = {"admin_username": creds["username"], "admin_password": creds["password"], "port": GITEA_PORT}
        with GiteaServer(tmp_path / "gitea", **login) as gitea:
            objs.wait_condition(
                ENVIRONMENT, "pub", "False", "WaitingForUpload", type_="SourcesReady", timeout=120, version=V
            )
            (runtime.root / "pub").mkdir(exist_ok=True)
            (runtime.root / "pub" / "README.md").write_text("pub\n")
            objs.custom.patch_namespaced_custom_object(
                "shadow.dev", V, ns, "shadowenvironments", "pub",
                {"metadata": {"annotations": {c.ANNOTATION_UPLOAD_PREFIX + "pub": "sha256:a"}}},
            )  # fmt: skip
            objs.wait_condition(ENVIRONMENT, "pub", type_="SourcesReady", timeout=120, version=V)
            ip = runtime.url.split("//", 1)[1].rsplit(":", 1)[0]
            replace = [
                {"op": "replace", "path": "/status/podIP", "value": ip},
                {"op": "replace", "path": "/status/podIPs", "value": [{"ip": ip}]},
            ]
            objs.core.patch_namespaced_pod_status("pub", ns, replace)  # a JSON patch: the list replaced whole

            tool = tmp_path / "tool"
            tool.mkdir()
            git(tool, "init", "-q", "-b", "main")
            (tool / "setup.py").write_text("from setuptools import setup\nsetup(name='tool')\n")
            git(tool, "add", "setup.py")
            git(tool, "commit", "-qm", "tool")
            (tool / "setup.py").write_text("from setuptools import setup\nsetup(name='tool', version='2')\n")
            env = {**os.environ, "KUBECONFIG": kubeconfig, "COLUMNS": "200"}
            done = subprocess.run(
                [SHADOWCTL, "publish", "pub", f"{tool}:team/tool", "-n", ns, "-o", "json"],
                env=env, capture_output=True, text=True, timeout=180,
            )  # fmt: skip
            assert done.returncode == 0, done.stderr
            published = json.loads(done.stdout)
            assert published["repo"] == "team/tool" and published["commit"]
            gitea.wait_pushed("team/tool")
            branch = gitea.api("GET", f"repos/team/tool/branches/{published['branch']}")
            assert branch["commit"]["id"] == published["commit"]
            # The uncommitted edit went too; the upload's temporary directory is gone from the workspace.
            raw = gitea.api("GET", f"repos/team/tool/contents/setup.py?ref={published['branch']}")
            assert "version='2'" in base64.b64decode(raw["content"]).decode()
            assert not list((runtime.root / ".sandbox-runtime" / "publish").glob("*"))
    finally:
        for name in volumes:
            with contextlib.suppress(ApiException):
                objs.core.delete_persistent_volume(name)
