"""The chart's RBAC with operator.watchNamespaces, on a real API server (issue 18, M7): the operator, running
as a ServiceAccount with exactly what `helm template` renders, serves its namespace, and that account can
touch nothing namespaced anywhere else.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tests.support.controlplane import wait_for
from tests.support.rbac import applied, configuration, render_rbac, token_kubeconfig
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

pytestmark = pytest.mark.integration


@pytest.fixture
def release(k8s_api: client.ApiClient, namespace: str) -> Iterator[dict[str, str]]:
    """The chart's RBAC and ServiceAccount for a release serving only `namespace`, applied; removed after."""
    name = f"rbac-{uuid.uuid4().hex[:6]}"
    release_ns = f"{name}-system"
    with applied(k8s_api, render_rbac(name, release_ns, namespace), release_ns) as account:
        yield {"name": name, "namespace": release_ns, "account": account}


def test_the_operator_serves_its_namespace_with_the_chart_rbac_and_nothing_else(
    k8s_api: client.ApiClient, kubeconfig: str, namespace: str, release: dict[str, str], tmp_path: Path
) -> None:
    install_crds(k8s_api)
    core = client.CoreV1Api(k8s_api)
    token = core.create_namespaced_service_account_token(
        release["account"], release["namespace"], {"spec": {"expirationSeconds": 3600}}
    ).status.token
    config = token_kubeconfig(kubeconfig, token, tmp_path / "operator.kubeconfig")

    # What the account may do, asked of the API server itself.
    def can(verb: str, resource: str, ns: str | None, group: str = "") -> bool:
        review = client.AuthorizationV1Api(k8s_api).create_subject_access_review(
            {
                "spec": {
                    "user": f"system:serviceaccount:{release['namespace']}:{release['account']}",
                    "resourceAttributes": {
                        "verb": verb,
                        "resource": resource,
                        "namespace": ns or "",
                        "group": group,
                    },
                }
            }
        )
        return bool(review.status.allowed)

    for resource in ("secrets", "pods", "services", "persistentvolumeclaims"):
        assert can("get", resource, namespace) and can("create", resource, namespace)
        assert not can("get", resource, "kube-system"), f"{resource} readable outside the served namespace"
        assert not can("list", resource, None), f"{resource} listable cluster-wide"
    assert not can("list", "statefulsets", None, "apps") and not can(
        "list", "networkpolicies", None, "networking.k8s.io"
    )
    assert can("list", "storageclasses", None, "storage.k8s.io") and not can(
        "create", "storageclasses", None, "storage.k8s.io"
    )

    # And that is enough: the operator, as that account, serves the namespace.
    log = tmp_path / "operator.log"
    operator = OperatorProcess(config, log, args=["--namespace", namespace])
    operator.start()
    try:
        objs = Objects(k8s_api, namespace)
        objs.create(TEMPLATE, template_body("tpl"))
        objs.create(SANDBOX, sandbox_body("served"))
        objs.wait(SANDBOX, "served", ready, timeout=60, what="the Sandbox Ready under the namespaced RBAC")
        wait_for(
            lambda: bool(client.NetworkingV1Api(k8s_api).list_namespaced_network_policy(namespace).items),
            timeout=30,
            what="the template's NetworkPolicy",
        )
        assert [p.metadata.name for p in objs.pods()] == ["served"]
    finally:
        operator.stop()
    text = log.read_text()
    assert "Forbidden" not in text and "Not enough permissions" not in text, text[-3000:]
    with pytest.raises(ApiException) as denied:
        client.CoreV1Api(client.ApiClient(configuration(config))).list_namespaced_secret("kube-system")
    assert denied.value.status == 403
