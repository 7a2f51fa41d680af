"""Tenants on a real API server: the chart's aggregated ClusterRoles join the built-in `edit` and `view`
(kube-controller-manager's aggregation controller), so a user bound to `edit` in team-a may make every API call
shadowctl and the SDK make for create -> exec -> diff -> promote -> destroy (and forks, plain sandboxes,
cleanup) there, and none in team-b; `view` reads and runs nothing. The calls are the SDK's
(operator/shadow_operator/sdk/*.py): the runtime is reached through the API server's pod proxy with the token
from the sandbox's Secret. The chart's tenant preparation (the default template in each tenant namespace) is
applied against the real CRDs, and a few calls are made for real as the impersonated user.
"""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from kubernetes import client, utils
from kubernetes.client.exceptions import ApiException

from tests.support.controlplane import wait_for
from tests.support.router import CHART, helm_binary
from tests.support.sandbox_operator import install_crds

pytestmark = pytest.mark.integration

AUTHENTICATED = "system:authenticated"
# (verb, group, resource, subresource): every namespaced request of the CLI flow.
TENANT_CALLS = [
    # shadowctl create / get / list / wait (watch), verify and push requests (patch), destroy
    *[(v, "shadow.dev", "shadowenvironments", "") for v in ("create", "get", "list", "watch", "patch", "delete")],
    ("get", "shadow.dev", "shadowenvironments", "status"),
    # create --pool reads the pool; a team keeps its own pools (kubectl apply, kubectl scale)
    *[(v, "shadow.dev", "shadowenvironmentpools", "") for v in ("create", "get", "list", "watch", "patch", "delete")],
    *[(v, "shadow.dev", "shadowenvironmentpools", "scale") for v in ("get", "update", "patch")],
    # exec, diff, promote, upload, shell: the runtime token, then the pod proxy (GET/POST/PUT/DELETE)
    ("get", "", "secrets", ""),
    *[(v, "", "pods", "proxy") for v in ("get", "create", "update", "delete")],
    ("get", "", "pods", ""),
    ("get", "", "pods", "log"),
    # plain sandboxes: claim, wait, find the sandbox, delete
    *[(v, "extensions.agents.x-k8s.io", "sandboxclaims", "") for v in ("create", "get", "list", "watch", "delete")],
    *[(v, "agents.x-k8s.io", "sandboxes", "") for v in ("get", "list", "watch")],
    ("list", "extensions.agents.x-k8s.io", "sandboxtemplates", ""),
    ("get", "extensions.agents.x-k8s.io", "sandboxtemplates", ""),
    # forks: the workspace's claim, the snapshot (created, owned by the forks, waited for, deleted)
    ("get", "", "persistentvolumeclaims", ""),
    *[(v, "snapshot.storage.k8s.io", "volumesnapshots", "")
      for v in ("create", "get", "list", "watch", "patch", "delete")],
    # doctor: is Pod Security enforced where sandboxes run
    ("get", "", "namespaces", ""),
    # egress log: the gateway's decision Events on the workspace's Sandbox (core events: built-in view and edit)
    ("list", "", "events", ""),
    # cleanup: what deleted environments left
    *[(v, "", r, "") for v in ("list", "delete") for r in ("persistentvolumeclaims", "secrets")],
]  # fmt: skip
# Cluster-scoped reads forks and doctor make (granted to every authenticated user by default).
CLUSTER_CALLS = [
    ("get", "storage.k8s.io", "storageclasses"),
    ("list", "snapshot.storage.k8s.io", "volumesnapshotclasses"),
]
# What stays the platform's (or the operator's) even for `edit`.
PLATFORM_CALLS = [
    ("create", "extensions.agents.x-k8s.io", "sandboxtemplates", ""),
    ("update", "extensions.agents.x-k8s.io", "sandboxwarmpools", ""),
    ("create", "agents.x-k8s.io", "sandboxes", ""),
    ("update", "shadow.dev", "shadowenvironments", "status"),
    ("update", "shadow.dev", "shadowenvironmentpools", "status"),
]
VIEW_READS = [c for c in TENANT_CALLS if c[0] in ("get", "list", "watch") and c[2:] not in (("secrets", ""), ("pods", "proxy"))]  # fmt: skip


def render(release: str, tenants: list[str], *show: str) -> list[dict[str, Any]]:
    out = subprocess.run(
        [helm_binary(), "template", release, str(CHART), "--namespace", f"{release}-system",
         f"--set=tenants.namespaces={{{','.join(tenants)}}}", *(f"--show-only={s}" for s in show)],
        capture_output=True, text=True, check=True, timeout=120,
    ).stdout  # fmt: skip
    return [doc for doc in yaml.safe_load_all(out) if doc]


@pytest.fixture
def tenants(k8s_api: client.ApiClient) -> Iterator[dict[str, str]]:
    """team-a (where alice has `edit` and bob `view`) and team-b, with the chart's tenant objects applied."""
    core, rbac = client.CoreV1Api(k8s_api), client.RbacAuthorizationV1Api(k8s_api)
    suffix = uuid.uuid4().hex[:6]
    names = {"release": f"t{suffix}", "a": f"team-a-{suffix}", "b": f"team-b-{suffix}"}
    for ns in (names["a"], names["b"]):
        core.create_namespace({"metadata": {"name": ns}})
    install_crds(k8s_api)
    roles = render(names["release"], [names["a"], names["b"]], "templates/tenant-rbac.yaml")
    templates = render(names["release"], [names["a"], names["b"]], "templates/sandboxtemplate.yaml")
    try:
        utils.create_from_yaml(k8s_api, yaml_objects=roles)
        custom = client.CustomObjectsApi(k8s_api)
        for template in templates:
            ns = template["metadata"]["namespace"]
            if ns in (names["a"], names["b"]):
                custom.create_namespaced_custom_object(
                    "extensions.agents.x-k8s.io", "v1beta1", ns, "sandboxtemplates", template
                )
        for user, role in (("alice", "edit"), ("bob", "view")):
            rbac.create_namespaced_role_binding(
                names["a"],
                {
                    "metadata": {"name": f"{user}-{role}"},
                    "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
                    "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
                },
            )
        yield names
    finally:
        for doc in roles:
            delete = {
                "ClusterRole": rbac.delete_cluster_role,
                "ClusterRoleBinding": rbac.delete_cluster_role_binding,
            }
            delete[doc["kind"]](doc["metadata"]["name"])
        for ns in (names["a"], names["b"]):
            core.delete_namespace(ns)


def allowed(
    api: client.ApiClient, user: str, verb: str, group: str, resource: str, sub: str, ns: str
) -> bool:
    review = client.AuthorizationV1Api(api).create_subject_access_review(
        {
            "spec": {
                "user": user,
                "groups": [AUTHENTICATED],
                "resourceAttributes": {
                    "verb": verb, "group": group, "resource": resource, "subresource": sub, "namespace": ns,
                },
            }
        }
    )  # fmt: skip
    return bool(review.status.allowed)


def as_user(kubeconfig: str, user: str) -> client.ApiClient:
    from kubernetes import config

    api = config.new_client_from_config(config_file=kubeconfig)
    api.set_default_header("Impersonate-User", user)
    api.set_default_header("Impersonate-Group", AUTHENTICATED)
    return api


def test_edit_in_team_a_allows_the_whole_cli_flow_there_and_nothing_in_team_b(
    k8s_api: client.ApiClient, kubeconfig: str, tenants: dict[str, str]
) -> None:
    a, b = tenants["a"], tenants["b"]
    # The aggregation controller fills `edit` asynchronously.
    wait_for(
        lambda: allowed(k8s_api, "alice", "create", "shadow.dev", "shadowenvironments", "", a),
        timeout=30,
        what="the chart's rules to join the edit ClusterRole",
    )
    refused_in_a = [c for c in TENANT_CALLS if not allowed(k8s_api, "alice", *c, a)]
    assert refused_in_a == [], f"edit in {a} lacks: {refused_in_a}"
    allowed_in_b = [c for c in TENANT_CALLS if allowed(k8s_api, "alice", *c, b)]
    assert allowed_in_b == [], f"alice may in {b}: {allowed_in_b}"
    assert [c for c in CLUSTER_CALLS if not allowed(k8s_api, "alice", *c, "", "")] == []
    assert [c for c in PLATFORM_CALLS if allowed(k8s_api, "alice", *c, a)] == []

    wait_for(
        lambda: allowed(k8s_api, "bob", "get", "shadow.dev", "shadowenvironments", "", a),
        timeout=30,
        what="the chart's rules to join the view ClusterRole",
    )
    assert [c for c in VIEW_READS if not allowed(k8s_api, "bob", *c, a)] == []
    view_may = [c for c in TENANT_CALLS if c not in VIEW_READS and allowed(k8s_api, "bob", *c, a)]
    assert view_may == [], f"view in {a} may: {view_may}"

    # For real, as alice: the prepared template is there, an environment is created and deleted in team-a;
    # team-b refuses.
    api = as_user(kubeconfig, "alice")
    try:
        custom = client.CustomObjectsApi(api)
        template = custom.get_namespaced_custom_object("extensions.agents.x-k8s.io", "v1beta1", a, "sandboxtemplates", "workspace")  # fmt: skip
        assert template["spec"]["podTemplate"]["spec"]["containers"][0]["name"] == "runtime"
        env = {"apiVersion": "shadow.dev/v1alpha1", "kind": "ShadowEnvironment", "metadata": {"name": "mine"},
               "spec": {"sources": [{"name": "app", "repo": "team/app", "upload": {}}]}}  # fmt: skip
        custom.create_namespaced_custom_object("shadow.dev", "v1alpha1", a, "shadowenvironments", env)
        custom.delete_namespaced_custom_object("shadow.dev", "v1alpha1", a, "shadowenvironments", "mine")
        for call in (
            lambda: custom.create_namespaced_custom_object(
                "shadow.dev", "v1alpha1", b, "shadowenvironments", env
            ),
            lambda: custom.list_namespaced_custom_object(
                "extensions.agents.x-k8s.io", "v1beta1", b, "sandboxtemplates"
            ),
        ):
            with pytest.raises(ApiException) as refused:
                call()
            assert refused.value.status == 403
    finally:
        api.close()
