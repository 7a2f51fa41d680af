"""Platform limits on counts are Kubernetes' own ResourceQuota: object-count quotas on our kinds hold.

What the chart README tells platform teams, tried on a real API server (with its quota admission plugin and the
controller manager's quota controller): a tenant namespace limited to two claims, two Sandboxes and one
ShadowEnvironment gets exactly that, the next create is refused with the API server's own message naming the
quota, and the operator's own Sandboxes for claims count against the tenant's Sandbox quota (so a tenant cannot
raise its Sandbox count by going through claims).
"""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from tests.support.controlplane import wait_for
from tests.support.sandbox_operator import (
    CLAIM,
    ENVIRONMENT,
    SANDBOX,
    TEMPLATE,
    Objects,
    sandbox_body,
    template_body,
)

pytestmark = pytest.mark.integration

HARD = {
    "count/sandboxclaims.extensions.agents.x-k8s.io": "2",
    "count/sandboxes.agents.x-k8s.io": "2",
    "count/shadowenvironments.shadow.dev": "1",
}


def quota(objs: Objects) -> dict[str, Any]:
    core = objs.core
    core.create_namespaced_resource_quota(
        objs.namespace,
        client.V1ResourceQuota(metadata=client.V1ObjectMeta(name="tenant-limits"), spec={"hard": HARD}),
    )

    def counted() -> bool:
        # Admission refuses everything a quota covers ("status unknown for quota") until the quota controller
        # has counted it: for a CRD installed moments ago, after its discovery finds the kind (30 s) and the
        # next re-count (the harness's --resource-quota-sync-period).
        status = core.read_namespaced_resource_quota("tenant-limits", objs.namespace).status
        return bool(status and status.used and set(status.used) == set(HARD))

    wait_for(counted, timeout=150, what="the quota controller to count the namespace")
    return HARD


def refused(create: Any) -> str:
    with pytest.raises(ApiException) as caught:
        create()
    assert caught.value.status == 403, caught.value.body
    return str(caught.value.body)


def claim(name: str) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {"sandboxTemplateRef": {"name": "quota-template"}}}


def test_object_count_quotas_limit_a_tenants_claims_sandboxes_and_environments(objs: Objects) -> None:
    quota(objs)
    objs.create(TEMPLATE, template_body("quota-template"))
    objs.create(CLAIM, claim("first"))
    objs.create(CLAIM, claim("second"))
    message = refused(lambda: objs.create(CLAIM, claim("third")))
    assert "exceeded quota: tenant-limits" in message
    assert "count/sandboxclaims.extensions.agents.x-k8s.io" in message

    # The operator made a Sandbox for each claim: they are what the Sandbox quota counted.
    wait_for(lambda: len(objs.list(SANDBOX)) == 2, timeout=60, what="a Sandbox for each claim")
    message = refused(lambda: objs.create(SANDBOX, sandbox_body("direct")))
    assert "count/sandboxes.agents.x-k8s.io" in message

    env = {
        "metadata": {"name": "env"},
        "spec": {"sources": [{"name": "core", "repo": "core", "upload": {}}], "workspace": {"size": "1Gi"}},
    }
    objs.create(ENVIRONMENT, env, version="v1alpha1")
    second = {**env, "metadata": {"name": "env-2"}}
    message = refused(lambda: objs.create(ENVIRONMENT, second, version="v1alpha1"))
    assert "count/shadowenvironments.shadow.dev" in message
