"""Where the time to Ready goes: an environment records when each phase finished (status.timings), in order,
the SDK and `shadowctl status` read them, and the operator exports a histogram per phase on /metrics.

On the local control plane with a real Gitea binary and a real sandbox-runtime on loopback (kwok plays the
kubelet), like test_environment_push.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from prometheus_client import REGISTRY
from shadow_operator.api import constants as c
from shadow_operator.api.environment import ShadowEnvironment
from shadow_operator.sdk import environment as envops

from tests.runtime.conftest import Server
from tests.support.controlplane import free_port, wait_for
from tests.support.gitea import GiteaServer
from tests.support.hostile_repo import git
from tests.support.sandbox_operator import (
    ENVIRONMENT,
    TEMPLATE,
    Objects,
    gitea_operator,
    template_body,
)
from tests.support.volumes import bind_volumes

pytestmark = pytest.mark.integration
V = "v1alpha1"
GITEA_PORT = free_port()
GITEA_URL = f"http://127.0.0.1:{GITEA_PORT}"
PHASES = ["scheduled", "workspaceReady", "giteaReady", "uploaded", "copiedIn", "ready", "verified"]


@pytest.fixture(scope="module")
def operator(k8s_api: client.ApiClient, runtime: Server) -> Iterator[Any]:
    with gitea_operator(k8s_api, GITEA_URL, SHADOW_RUNTIME_API_URL=runtime.url) as runner:
        yield runner


def observed(namespace: str, phase: str) -> float:
    labels = {"namespace": namespace, "phase": phase}
    return REGISTRY.get_sample_value("shadow_operator_environment_phase_seconds_count", labels) or 0.0


def test_each_phase_is_timed_once_in_order_and_exported(
    objs: Objects, runtime: Server, tmp_path: Path
) -> None:
    objs.create(TEMPLATE, template_body("workspace"))
    volumes = bind_volumes(objs, ["workspace-timed"], tmp_path)
    try:
        objs.create(
            ENVIRONMENT,
            {
                "metadata": {"name": "timed"},
                "spec": {
                    "sources": [{"name": "app", "repo": "shadow/app", "upload": {}}],
                    "workspace": {"size": "1Gi"},
                    "verify": {"install": False, "commands": [{"name": "true", "command": "true"}]},
                },
            },
            version=V,
        )
        wait_for(lambda: objs.get(ENVIRONMENT, "timed", V) is not None, timeout=10, what="the environment")
        wait_for(lambda: objs.secret_exists("timed-gitea-admin"), timeout=30, what="Gitea admin Secret")
        creds = objs.secret_data("timed-gitea-admin")
        with GiteaServer.standing_in(tmp_path / "gitea", creds, GITEA_PORT):
            env = objs.wait_condition(
                ENVIRONMENT,
                "timed",
                "False",
                "WaitingForUpload",
                type_="SourcesReady",
                timeout=120,
                version=V,
            )
            timings = env["status"]["timings"]
            assert {"scheduled", "workspaceReady", "giteaReady"} <= set(timings)
            assert "uploaded" not in timings and "ready" not in timings  # nothing is recorded ahead of time

            app = runtime.root / "app"
            app.mkdir()
            (app / "main.py").write_text("print('timed')\n")
            git(app, "init", "-q", "-b", "main")
            git(app, "add", "-A")
            git(app, "commit", "-q", "-m", "init")
            objs.annotate(ENVIRONMENT, "timed", {c.ANNOTATION_UPLOAD_PREFIX + "app": "sha256:a"}, V)
            env = objs.wait_condition(ENVIRONMENT, "timed", type_="Verified", timeout=120, version=V)

        model = ShadowEnvironment.from_body(env)
        seconds = envops.phase_seconds(model)
        assert set(PHASES) <= set(seconds), seconds
        for before, after in (
            ("workspaceReady", "copiedIn"),
            ("giteaReady", "copiedIn"),
            ("uploaded", "copiedIn"),
            ("scheduled", "workspaceReady"),
            ("copiedIn", "ready"),
            ("ready", "verified"),
        ):
            assert seconds[before] <= seconds[after], (before, after, seconds)
        # Creation has one-second resolution; no phase precedes it by more.
        assert all(value > -1.0 for value in seconds.values()), seconds
        created = datetime.fromisoformat(env["metadata"]["creationTimestamp"].replace("Z", "+00:00"))
        assert datetime.fromisoformat(env["status"]["timings"]["ready"].replace("Z", "+00:00")) >= created

        # One observation per phase of this environment (the operator runs in this process).
        for phase in PHASES:
            assert observed(objs.namespace, phase) == 1.0, phase
    finally:
        for name in volumes:
            objs.core.delete_persistent_volume(name)
