"""Pod Security on the tenant namespaces the chart prepares (issue 28, N1), on a real API server.

The operator, running as a ServiceAccount with exactly the RBAC `helm template` renders for tenants, labels
each tenant namespace to enforce podSecurity.level (restricted), may patch no other namespace, and leaves a
label a platform team set to another value alone. The product's own pods pass restricted there. A tenant
holding the built-in `edit` role then tries a privileged, a hostPath and a hostPID pod as a Pod, a Deployment
and a Job: the Pods are refused at once; the Deployments and Jobs are admitted with Pod Security's warning and
their controllers are refused every Pod.
"""

from __future__ import annotations

import json
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client, utils
from kubernetes.client.exceptions import ApiException
from shadow_operator.resources import environment as env_res
from shadow_operator.resources import sandbox as res
from shadow_operator.resources.blueprint import sandbox_spec_from_template

from tests.support.controlplane import wait_for
from tests.support.rbac import configuration, render_rbac, token_kubeconfig
from tests.support.router import CHART, helm_binary
from tests.support.sandbox_operator import (
    SANDBOX,
    TEMPLATE,
    Objects,
    OperatorProcess,
    install_crds,
    ready,
    sandbox_body,
    template_body,
)
from tests.support.shadowctl import run
from tests.support.tenant_pods import every_escape_is_refused

pytestmark = pytest.mark.integration

PREFIX = "pod-security.kubernetes.io/"
RESTRICTED = {f"{PREFIX}{mode}": "restricted" for mode in ("enforce", "warn", "audit")}


def labels(core: client.CoreV1Api, name: str) -> dict[str, str]:
    return {
        k: v for k, v in (core.read_namespace(name).metadata.labels or {}).items() if k.startswith(PREFIX)
    }


@pytest.fixture(scope="module")
def prepared(
    k8s_api: client.ApiClient, kubeconfig: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Any]]:
    """A release whose tenants are two new namespaces, its operator running as the chart's ServiceAccount.

    One tenant namespace is new; on the other a platform team already chose `privileged`."""
    install_crds(k8s_api)
    core, rbac = client.CoreV1Api(k8s_api), client.RbacAuthorizationV1Api(k8s_api)
    suffix = uuid.uuid4().hex[:6]
    tenant, chosen, release = f"tenant-{suffix}", f"chosen-{suffix}", f"ps-{suffix}"
    release_ns = f"{release}-system"
    core.create_namespace({"metadata": {"name": tenant}})
    core.create_namespace(
        {"metadata": {"name": chosen, "labels": {f"{PREFIX}enforce": "privileged"}}},
        field_manager="platform-team",
    )
    core.create_namespace({"metadata": {"name": release_ns}})
    docs = render_rbac(release, release_ns, tenant, f"tenants.namespaces={{{tenant},{chosen}}}")
    tmp = tmp_path_factory.mktemp("tenant-pod-security")
    operator = None
    try:
        utils.create_from_yaml(k8s_api, yaml_objects=docs)
        (account,) = [d["metadata"]["name"] for d in docs if d["kind"] == "ServiceAccount"]
        token = core.create_namespaced_service_account_token(
            account, release_ns, {"spec": {"expirationSeconds": 3600}}
        ).status.token
        config = token_kubeconfig(kubeconfig, token, tmp / "operator.kubeconfig")
        log = tmp / "operator.log"
        # The chart's environment for these values (templates/deployment.yaml).
        operator = OperatorProcess(
            config,
            log,
            args=["--namespace", tenant],
            env={
                "SHADOW_POD_SECURITY_LEVEL": "restricted",
                "SHADOW_POD_SECURITY_NAMESPACES": f"{tenant},{chosen}",
            },
        )
        operator.start()
        wait_for(
            lambda: labels(core, tenant) == RESTRICTED, timeout=60, what=f"Pod Security labels on {tenant}"
        )
        yield {
            "tenant": tenant,
            "chosen": chosen,
            "log": log,
            "user": f"system:serviceaccount:{release_ns}:{account}",
        }
    finally:
        if operator is not None:
            operator.stop()
        for doc in docs:
            delete = {
                "ClusterRole": rbac.delete_cluster_role,
                "ClusterRoleBinding": rbac.delete_cluster_role_binding,
            }.get(doc["kind"])
            if delete is not None:
                delete(doc["metadata"]["name"])
        for name in (tenant, chosen, release_ns):
            core.delete_namespace(name, propagation_policy="Background")


def can(api: client.ApiClient, user: str, verb: str, namespace: str) -> bool:
    review = client.AuthorizationV1Api(api).create_subject_access_review(
        {
            "spec": {
                "user": user,
                "resourceAttributes": {"verb": verb, "resource": "namespaces", "name": namespace},
            }
        }
    )
    return bool(review.status.allowed)


def test_the_operator_labels_the_tenant_namespaces_and_may_patch_nothing_else(
    k8s_api: client.ApiClient, prepared: dict[str, Any]
) -> None:
    core = client.CoreV1Api(k8s_api)
    assert labels(core, prepared["tenant"]) == RESTRICTED
    # A platform team's own choice is kept, and the operator says so.
    assert labels(core, prepared["chosen"]) == {f"{PREFIX}enforce": "privileged"}
    wait_for(
        lambda: f"namespace {prepared['chosen']}: Pod Security labels" in prepared["log"].read_text(),
        timeout=30,
        what="the operator's word on the namespace it left alone",
    )
    assert "not applied" in prepared["log"].read_text()
    # Patch, by name, on the tenant namespaces: nothing else.
    user = prepared["user"]
    assert can(k8s_api, user, "patch", prepared["tenant"]) and can(k8s_api, user, "patch", prepared["chosen"])
    for other in ("default", "kube-system"):
        assert not can(k8s_api, user, "patch", other)
    assert not can(k8s_api, user, "update", prepared["tenant"]) and not can(
        k8s_api, user, "delete", prepared["tenant"]
    )


def product_pods(namespace: str) -> dict[str, dict[str, Any]]:
    """The pods the product creates in a tenant namespace, as the operator builds them: a sandbox of the
    chart's default template, an environment's workspace and its Gitea."""
    out = subprocess.run(
        [helm_binary(), "template", "shadow", str(CHART), "--namespace", namespace,
         "--show-only", "templates/sandboxtemplate.yaml"],
        capture_output=True, text=True, check=True, timeout=120,
    ).stdout  # fmt: skip
    (template,) = [doc for doc in yaml.safe_load_all(out) if doc]
    uid = "00000000-0000-0000-0000-000000000000"
    owner = {
        "apiVersion": "v1",
        "kind": "Sandbox",
        "metadata": {"name": "x", "namespace": namespace, "uid": uid},
    }
    sandbox = {**owner, "spec": sandbox_spec_from_template(template)}
    environment = {
        "apiVersion": "shadow.dev/v1alpha1",
        "kind": "ShadowEnvironment",
        "metadata": {"name": "demo", "namespace": namespace, "uid": uid},
        "spec": {},
    }
    workspace = env_res.build_workspace_sandbox(
        environment, template, gitea_base_url="http://demo-gitea:3000"
    )
    workspace["metadata"].update(namespace=namespace, uid=uid)
    workspace.setdefault("apiVersion", "agents.x-k8s.io/v1beta1")
    workspace.setdefault("kind", "Sandbox")
    gitea = env_res.build_gitea_statefulset(environment, image="gitea:1", cluster_domain="cluster.local")
    pods = {
        "default template": res.build_pod(sandbox, token_secret="x-runtime-token"),
        "workspace": res.build_pod(workspace, token_secret="demo-runtime-token"),
        "gitea": {"metadata": {"name": "demo-gitea-0"}, "spec": gitea["spec"]["template"]["spec"]},
    }
    for pod in pods.values():
        pod["metadata"].pop("ownerReferences", None)
    return pods


def test_the_products_own_pods_pass_restricted(k8s_api: client.ApiClient, prepared: dict[str, Any]) -> None:
    tenant = prepared["tenant"]
    core = client.CoreV1Api(k8s_api)
    for what, pod in product_pods(tenant).items():
        _, _, headers = core.create_namespaced_pod_with_http_info(
            tenant, pod, dry_run="All", _return_http_data_only=False
        )
        assert "PodSecurity" not in str(headers.get("Warning", "")), (what, headers.get("Warning"))
    # And for real: the operator serves a sandbox there; its Pod was admitted.
    objs = Objects(k8s_api, tenant)
    objs.create(TEMPLATE, template_body("tpl"))
    objs.create(SANDBOX, sandbox_body("served"))
    objs.wait(SANDBOX, "served", ready, timeout=60, what="the Sandbox Ready in a restricted namespace")
    assert [p.metadata.name for p in objs.pods()] == ["served"]


def test_a_tenant_with_edit_cannot_reach_the_node(
    k8s_api: client.ApiClient, kubeconfig: str, prepared: dict[str, Any], tmp_path: Path
) -> None:
    tenant = prepared["tenant"]
    core = client.CoreV1Api(k8s_api)
    core.create_namespaced_service_account(tenant, {"metadata": {"name": "agent"}})
    client.RbacAuthorizationV1Api(k8s_api).create_namespaced_role_binding(
        tenant,
        {
            "metadata": {"name": "agent-edit"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "edit"},
            "subjects": [{"kind": "ServiceAccount", "name": "agent", "namespace": tenant}],
        },
    )
    token = core.create_namespaced_service_account_token(
        "agent", tenant, {"spec": {"expirationSeconds": 3600}}
    ).status.token
    api = client.ApiClient(configuration(token_kubeconfig(kubeconfig, token, tmp_path / "agent.kubeconfig")))

    # The tenant cannot lift the label.
    with pytest.raises(ApiException) as denied:
        client.CoreV1Api(api).patch_namespace(
            tenant, {"metadata": {"labels": {f"{PREFIX}enforce": "privileged"}}}
        )
    assert denied.value.status == 403

    every_escape_is_refused(api, tenant)


def test_doctor_flags_a_namespace_with_sandboxes_and_no_enforcement(
    k8s_api: client.ApiClient, kubeconfig: str, namespace: str
) -> None:
    install_crds(k8s_api)
    Objects(k8s_api, namespace).create(SANDBOX, sandbox_body("idle", operatingMode="Suspended"))

    def podsecurity() -> dict[str, str]:
        doctor = run(kubeconfig, "doctor", "-n", namespace, "-o", "json")
        return next(c for c in json.loads(doctor.stdout) if c["check"] == "podsecurity")

    check = podsecurity()
    assert check["state"] == "warning" and namespace in check["detail"], check
    assert (
        f"kubectl label namespace {namespace} pod-security.kubernetes.io/enforce=restricted" in check["fix"]
    )
    text = run(kubeconfig, "doctor", "-n", namespace).stdout
    (line,) = [line for line in text.splitlines() if "podsecurity" in line]
    assert "no Pod Security enforced where sandboxes run" in line and namespace in line, text
    # Enforced (any level but privileged): no longer named.
    client.CoreV1Api(k8s_api).patch_namespace(
        namespace, {"metadata": {"labels": {f"{PREFIX}enforce": "baseline"}}}
    )
    assert namespace not in podsecurity()["detail"]
