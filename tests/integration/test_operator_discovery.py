"""The CLI and SDK find the operator of a release with any name in any namespace, leader election on or off,
on a real API server: the chart's discovery ConfigMaps and status Role as `helm template` renders them for
release `x-…` in namespace `y-…`, a tenant who has only `edit` in their own namespace, and what the operator
leaves for clients to read (its leader Lease, or its Deployment, made available by the controller manager on
kwok nodes). Before, every client looked for a release `shadow-operator` in `shadow-system`."""

from __future__ import annotations

import base64
import datetime as dt
import json
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client, utils
from shadow_operator.common.tokens import KeyRing
from shadow_operator.resources.previewkeys import link_keys_secret
from shadow_operator.sdk import kube, preview_link
from shadow_operator.sdk.preview import PreviewKeysUnavailable

from tests.support.controlplane import wait_for
from tests.support.pki import CertificateAuthority
from tests.support.router import CHART, helm_binary
from tests.support.sandbox_operator import SANDBOX, Objects, install_crds
from tests.support.shadowctl import run, write_kubeconfig

pytestmark = pytest.mark.integration

KEY = b"k" * 32


def render(release: str, namespace: str, tenants: list[str], *values: str) -> list[dict[str, Any]]:
    out = subprocess.run(
        [helm_binary(), "template", release, str(CHART), "--namespace", namespace,
         f"--set=tenants.namespaces={{{','.join(tenants)}}}", *(f"--set={v}" for v in values),
         "--show-only=templates/discovery.yaml", "--show-only=templates/tenant-rbac.yaml",
         "--show-only=templates/serviceaccount.yaml", "--show-only=templates/deployment.yaml"],
        capture_output=True, text=True, check=True, timeout=120,
    ).stdout  # fmt: skip
    return [doc for doc in yaml.safe_load_all(out) if doc]


class Release:
    def __init__(self, api: client.ApiClient, name: str, namespace: str, tenant: str, config: str) -> None:
        self.api, self.name, self.namespace, self.tenant, self.config = api, name, namespace, tenant, config
        self.fullname = f"{name}-shadow-operator"

    def lease(self, renewed: dt.datetime) -> None:
        """The leader Lease as the operator keeps it (named like the release, in its namespace)."""
        body = {
            "metadata": {"name": self.fullname},
            "spec": {
                "holderIdentity": "pod-0",
                "leaseDurationSeconds": 15,
                "renewTime": renewed.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
            },
        }
        leases = client.CoordinationV1Api(self.api)
        try:
            leases.create_namespaced_lease(self.namespace, body)
        except client.exceptions.ApiException as exc:
            if exc.status != 409:
                raise
            leases.patch_namespaced_lease(self.fullname, self.namespace, {"spec": body["spec"]})

    def doctor(self) -> dict[str, Any]:
        result = run(self.config, "doctor", "-o", "json")
        checks = {c["check"]: c for c in json.loads(result.stdout)}
        return dict(checks["operator"])


@pytest.fixture
def release(
    k8s_api: client.ApiClient, kubeconfig: str, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[Release]:
    """Release `x-…` in `y-…` (leader election as the test's parameter says), tenant `erin` with `edit` in
    `team-…` only; a kubeconfig for erin whose context's namespace is team-…."""
    election = getattr(request, "param", True)
    core, rbac = client.CoreV1Api(k8s_api), client.RbacAuthorizationV1Api(k8s_api)
    suffix = uuid.uuid4().hex[:6]
    name, namespace, tenant, user = f"x-{suffix}", f"y-{suffix}", f"team-{suffix}", f"erin-{suffix}"
    for ns in (namespace, tenant):
        core.create_namespace({"metadata": {"name": ns}})
    install_crds(k8s_api)
    values = [
        f"operator.leaderElection.enabled={str(election).lower()}",
        *([] if election else ["operator.replicas=1"]),
    ]
    docs = render(name, namespace, [tenant], *values)
    cluster_wide = [d for d in docs if d["kind"] in ("ClusterRole", "ClusterRoleBinding")]
    try:
        utils.create_from_yaml(k8s_api, yaml_objects=docs)
        rbac.create_namespaced_role_binding(
            tenant,
            {
                "metadata": {"name": "erin-edit"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "edit"},
                "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
            },
        )
        pair = CertificateAuthority.load(Path(kubeconfig).parent / "pki").issue(user, user)
        creds = {"client-certificate": str(pair.cert), "client-key": str(pair.key)}
        config = write_kubeconfig(tmp_path / "erin", kubeconfig, {user: creds}, {"erin": (user, tenant)})
        yield Release(k8s_api, name, namespace, tenant, config)
    finally:
        for doc in cluster_wide:
            delete = {
                "ClusterRole": rbac.delete_cluster_role,
                "ClusterRoleBinding": rbac.delete_cluster_role_binding,
            }
            delete[doc["kind"]](doc["metadata"]["name"])
        for ns in (namespace, tenant):
            core.delete_namespace(ns, propagation_policy="Background")


def test_doctor_finds_a_leader_elected_release_anywhere(release: Release) -> None:
    release.lease(dt.datetime.now(dt.UTC))
    check = release.doctor()
    assert check["state"] == "ok", check
    assert f"release {release.name} in {release.namespace}" in check["detail"]
    assert f"ConfigMap {release.tenant}/shadow-operator-discovery" in check["detail"]

    release.lease(dt.datetime.now(dt.UTC) - dt.timedelta(minutes=10))
    check = release.doctor()
    assert check["state"] == "failed" and "stale" in check["detail"], check
    assert f"kubectl -n {release.namespace} logs deploy/{release.fullname}" in check["fix"]


@pytest.mark.parametrize("release", [False], indirect=True)
def test_doctor_with_leader_election_off(release: Release) -> None:
    """No Lease at all: the Deployment as rendered, available once kwok runs its pod."""
    apps = client.AppsV1Api(release.api)

    def available() -> bool:
        deployment = apps.read_namespaced_deployment(release.fullname, release.namespace)
        return bool((deployment.status.available_replicas or 0) >= 1)

    wait_for(available, timeout=90, what=f"Deployment {release.namespace}/{release.fullname} available")
    check = release.doctor()
    assert check["state"] == "ok", check
    assert "leader election off" in check["detail"] and release.name in check["detail"]

    apps.patch_namespaced_deployment_scale(release.fullname, release.namespace, {"spec": {"replicas": 0}})
    wait_for(lambda: not available(), timeout=90, what="the Deployment scaled to nothing")
    check = release.doctor()
    assert check["state"] == "failed" and "no available replica" in check["detail"], check


def test_preview_keys_of_the_release(release: Release, kubeconfig: str) -> None:
    """The SDK signs with the link keys of the sandbox's namespace (the Secret the operator writes there, derived
    from the release's keys Secret): a tenant with `edit` there signs for it; the release's keys Secret itself
    is not the tenant's to read, and the refusal names it."""
    core = client.CoreV1Api(release.api)
    root_name = f"{release.fullname}-preview-keys"
    root = {"k1": base64.b64encode(KEY).decode()}
    core.create_namespaced_secret(release.namespace, {"metadata": {"name": root_name}, "data": root})
    # What the operator writes (controllers/previewkeys.py; tests/integration/test_router.py runs it).
    core.create_namespaced_secret(
        release.tenant, link_keys_secret(release.tenant, KeyRing.from_secret_data(root))
    )
    sandbox = Objects(release.api, release.tenant).create(
        SANDBOX,
        {
            "metadata": {"name": "box"},
            "spec": {"podTemplate": {"spec": {"containers": [{"name": "c", "image": "i"}]}}},
        },
    )
    client.CustomObjectsApi(release.api).patch_namespaced_custom_object_status(
        SANDBOX[0],
        "v1beta1",
        release.tenant,
        SANDBOX[1],
        "box",
        {"status": {"previewURL": "https://box.preview.example/"}},
    )
    tenant_keys = KeyRing({"k1": KEY}).for_namespace(release.tenant)
    for config in (
        kubeconfig,
        release.config,
    ):  # the administrator, and erin, who has `edit` in the namespace
        with kube.connect(kubeconfig=config) as http:
            link = preview_link("box", release.tenant, http=http)
        claims = tenant_keys.verify(link.split("shadow_token=")[1])
        assert (claims.namespace, claims.sandbox, claims.uid) == (
            release.tenant,
            "box",
            sandbox["metadata"]["uid"],
        )

    with kube.connect(kubeconfig=release.config) as erin, pytest.raises(PreviewKeysUnavailable) as refused:
        preview_link(
            "box", release.tenant, keys_secret=root_name, keys_namespace=release.namespace, http=erin
        )
    assert f"{release.namespace}/{root_name}" in refused.value.hint
