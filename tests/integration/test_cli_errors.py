"""shadowctl's errors as a new user meets them on a real API server where no operator runs: each is one line
and a hint, never a traceback. (No cluster at all and bad flags: tests/unit/test_cli.py.)"""

from __future__ import annotations

import base64
import datetime as dt
import json
import subprocess
from pathlib import Path

import pytest
from kubernetes import client

from tests.support.sandbox_operator import CLAIM, ENVIRONMENT, SANDBOX, Objects, install_crds
from tests.support.shadowctl import run

pytestmark = pytest.mark.integration


def one_error(result: subprocess.CompletedProcess[str], *needles: str) -> str:
    assert result.returncode == 1, (result.returncode, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    # Progress lines may come first; the error is the last line but its hint.
    assert lines[-2].startswith("error: ") and lines[-1].startswith("hint: "), result.stderr
    for needle in needles:
        assert needle in result.stderr, result.stderr
    return result.stderr


@pytest.fixture
def objs(k8s_api: client.ApiClient, namespace: str) -> Objects:
    """CRDs installed, and deliberately no operator."""
    install_crds(k8s_api)
    return Objects(k8s_api, namespace)


def test_operator_not_running(objs: Objects, kubeconfig: str, tmp_path: Path) -> None:
    (tmp_path / "repo").mkdir()
    stderr = one_error(
        run(kubeconfig, "create", "lonely", "-n", objs.namespace, "--git", "https://example.com/o/r.git"),
        "the operator is not running: no fresh shadow-operator Lease",
        "start the operator",
    )
    assert "created ShadowEnvironment" in stderr  # the object was made; nothing acts on it


def test_environment_not_found_and_runtime_unreachable(objs: Objects, kubeconfig: str) -> None:
    ns = objs.namespace
    one_error(run(kubeconfig, "exec", "nope", "-n", ns, "--", "true"), "does not exist", "shadowctl list")
    one_error(run(kubeconfig, "diff", "nope", "-n", ns), "does not exist")

    # An environment whose status says its workspace is ready, but whose Pod is gone.
    objs.create(
        ENVIRONMENT,
        {"metadata": {"name": "ghost"}, "spec": {"sources": [{"name": "s", "repo": "o/s", "upload": {}}]}},
        version="v1alpha1",
    )
    client.CoreV1Api(objs.api).create_namespaced_secret(
        ns,
        client.V1Secret(
            metadata=client.V1ObjectMeta(name="ghost-runtime-token"),
            data={"token": base64.b64encode(b"t").decode()},
        ),
    )
    now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    condition = {
        "type": "WorkspaceReady",
        "status": "True",
        "reason": "Ready",
        "message": "",
        "lastTransitionTime": now,
    }
    objs.custom.patch_namespaced_custom_object_status(
        "shadow.dev",
        "v1alpha1",
        ns,
        "shadowenvironments",
        "ghost",
        {
            "status": {
                "conditions": [condition],
                "sandbox": "ghost",
                "runtimeTokenSecret": "ghost-runtime-token",
            }
        },
    )
    one_error(run(kubeconfig, "exec", "ghost", "-n", ns, "--", "true"), "cannot reach the workspace runtime")
    one_error(run(kubeconfig, "diff", "ghost", "-n", ns), "cannot reach the workspace runtime")


def test_workspace_not_ready_and_bad_input(objs: Objects, kubeconfig: str, tmp_path: Path) -> None:
    ns = objs.namespace
    objs.create(
        ENVIRONMENT,
        {"metadata": {"name": "young"}, "spec": {"sources": [{"name": "s", "repo": "o/s", "upload": {}}]}},
        version="v1alpha1",
    )
    one_error(
        run(kubeconfig, "exec", "young", "-n", ns, "--", "true"), "the workspace is not ready", "wait for it"
    )
    # The API server's own validation, passed on as the user's error.
    one_error(
        run(kubeconfig, "create", "Bad_Name", "-n", ns, "--git", "https://example.com/o/r.git", "--no-wait"),
        "Bad_Name",
    )
    one_error(run(kubeconfig, "cp", "a", "b", "-n", ns), "exactly one side")
    one_error(run(kubeconfig, "sandbox", "claim", "-n", ns), "exactly one of a template or a warm pool")
    doctor = run(kubeconfig, "doctor", "-n", ns, "-o", "json")
    checks = {c["check"]: c for c in json.loads(doctor.stdout)}
    assert doctor.returncode == 1  # the operator check fails
    assert checks["CRDs"]["state"] == "ok" and checks["operator"]["state"] == "failed"
    assert "fix" in checks["operator"]


def test_preview_errors(objs: Objects, kubeconfig: str) -> None:
    ns = objs.namespace
    keys = ["--keys-secret", "keys", "--keys-namespace", ns, "-n", ns]
    one_error(run(kubeconfig, "preview", "nope", *keys), "does not exist", "shadowctl list")
    one_error(
        run(kubeconfig, "sandbox", "preview", "nope", *keys), "does not exist", "shadowctl sandbox list"
    )

    # An environment with no workspace Sandbox yet.
    objs.create(
        ENVIRONMENT,
        {"metadata": {"name": "young"}, "spec": {"sources": [{"name": "s", "repo": "o/s", "upload": {}}]}},
        version="v1alpha1",
    )
    one_error(run(kubeconfig, "preview", "young", *keys), "no workspace Sandbox yet", "wait for it")

    # Its Sandbox exists but has no preview URL (no preview domain configured), then has one.
    objs.custom.patch_namespaced_custom_object_status(
        "shadow.dev", "v1alpha1", ns, "shadowenvironments", "young", {"status": {"sandbox": "young-ws"}}
    )
    one_error(run(kubeconfig, "preview", "young", *keys), f"Sandbox {ns}/young-ws does not exist")
    objs.create(
        SANDBOX,
        {
            "metadata": {"name": "young-ws"},
            "spec": {"podTemplate": {"spec": {"containers": [{"name": "c", "image": "x"}]}}},
        },
    )
    one_error(run(kubeconfig, "preview", "young", *keys), "no status.previewURL", "previewRouter.domain")
    objs.custom.patch_namespaced_custom_object_status(
        "agents.x-k8s.io",
        "v1beta1",
        ns,
        "sandboxes",
        "young-ws",
        {"status": {"previewURL": "http://young-ws.p.test/"}},
    )

    # The keys Secret: missing, then empty, then a key too short to sign with.
    one_error(run(kubeconfig, "preview", "young", *keys), f"Secret {ns}/keys does not exist", "--keys-secret")
    core = client.CoreV1Api(objs.api)
    core.create_namespaced_secret(ns, client.V1Secret(metadata=client.V1ObjectMeta(name="keys")))
    one_error(run(kubeconfig, "preview", "young", *keys), "holds no preview key", "32 bytes")
    core.patch_namespaced_secret("keys", ns, {"data": {"k1": base64.b64encode(b"short").decode()}})
    one_error(run(kubeconfig, "preview", "young", *keys), "shorter than 32 bytes", "token_urlsafe")
    core.patch_namespaced_secret("keys", ns, {"data": {"k1": base64.b64encode(b"k" * 32).decode()}})
    ok = run(kubeconfig, "preview", "young", *keys)
    assert ok.returncode == 0 and ok.stdout.startswith("http://young-ws.p.test/?shadow_token="), ok.stderr
    # Longer than the router accepts (previewRouter.maxTokenSeconds, 24 h by default): not signed.
    one_error(
        run(kubeconfig, "preview", "young", *keys, "--ttl", "86401"), "at most 86400s", "maxTokenSeconds"
    )

    # A claim that is not bound yet.
    objs.create(CLAIM, {"metadata": {"name": "waiting"}, "spec": {"sandboxTemplateRef": {"name": "t"}}})
    one_error(
        run(kubeconfig, "sandbox", "preview", "waiting", *keys), "is not ready", "describe sandboxclaim"
    )
