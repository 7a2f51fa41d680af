"""`shadowctl stop` and `start` on the real API server with the operator: spec.suspend removes the workspace
Pod and keeps its volume; start brings the same volume back in a new Pod."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException
from shadow_operator.api import constants as c

from tests.support.sandbox_operator import ENVIRONMENT, SANDBOX, TEMPLATE, Objects, condition, template_body
from tests.support.shadowctl import run
from tests.support.volumes import bind_volumes, wait_bound

pytestmark = pytest.mark.integration
V = "v1alpha1"


def workspace_ready(env: dict[str, Any]) -> bool:
    return condition(env, "WorkspaceReady").get("status") == "True"


def test_stop_keeps_the_volume_and_start_brings_it_back(
    objs: Objects, kubeconfig: str, tmp_path: Path
) -> None:
    ns = objs.namespace
    objs.create(TEMPLATE, template_body("workspace"))
    volumes = bind_volumes(objs, ["workspace-kept"], tmp_path)
    try:
        spec = {"sources": [{"name": "app", "repo": "shadow/app", "upload": {}}], "gitea": {"enabled": False}}
        objs.create(ENVIRONMENT, {"metadata": {"name": "kept"}, "spec": spec}, version=V)
        wait_bound(objs, ["workspace-kept"], timeout=120)
        objs.wait(ENVIRONMENT, "kept", workspace_ready, timeout=120, version=V)
        claim = objs.core.read_namespaced_persistent_volume_claim("workspace-kept", ns)
        pod = objs.core.read_namespaced_pod("kept", ns)

        stopped = run(kubeconfig, "stop", "kept", "-n", ns)
        assert stopped.returncode == 0, stopped.stderr
        env = objs.get(ENVIRONMENT, "kept", V)
        assert env is not None and env["spec"]["suspend"] is True
        ready = condition(env, "WorkspaceReady")
        assert (ready["status"], ready["reason"]) == ("False", "Stopped")
        assert "shadowctl start kept" in ready["message"]
        sandbox = objs.get(SANDBOX, "kept")
        assert sandbox is not None and sandbox["spec"]["operatingMode"] == "Suspended"
        objs.wait_condition(SANDBOX, "kept", "True", c.REASON_POD_TERMINATED, type_="Suspended", timeout=60)
        assert objs.core.read_namespaced_persistent_volume_claim("workspace-kept", ns).metadata.uid == (
            claim.metadata.uid
        )

        # No sources uploaded, so it never gets Ready: start without waiting for that, then watch it come back.
        started = run(kubeconfig, "start", "kept", "-n", ns, "--no-wait")
        assert started.returncode == 0, started.stderr
        env = objs.wait(ENVIRONMENT, "kept", workspace_ready, timeout=120, version=V)
        assert env["spec"]["suspend"] is False and env["metadata"]["annotations"][c.ANNOTATION_RESUME_REQUEST]
        sandbox = objs.get(SANDBOX, "kept")
        assert sandbox is not None and sandbox["spec"]["operatingMode"] == "Running"
        back = objs.core.read_namespaced_pod("kept", ns)
        assert back.metadata.uid != pod.metadata.uid
        assert [
            v.persistent_volume_claim.claim_name for v in back.spec.volumes if v.persistent_volume_claim
        ] == ["workspace-kept"]

        missing = run(kubeconfig, "stop", "nope", "-n", ns)
        assert missing.returncode == 1 and missing.stderr.startswith(
            f"error: ShadowEnvironment {ns}/nope does not exist"
        )
    finally:
        for name in volumes:
            with contextlib.suppress(ApiException):
                objs.core.delete_persistent_volume(name)
