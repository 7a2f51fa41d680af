"""SandboxTemplate: the managed NetworkPolicy, and the preview URL when a preview domain is configured."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from shadow_operator.api import constants as c
from shadow_operator.api import naming

from tests.support.controlplane import wait_for
from tests.support.sandbox_operator import (
    CLAIM,
    SANDBOX,
    TEMPLATE,
    Objects,
    in_process_operator,
    install_crds,
    template_body,
)

pytestmark = pytest.mark.integration

PREVIEW_DOMAIN = "preview.example.test"


@pytest.fixture(scope="module")
def operator(k8s_api: client.ApiClient) -> Iterator[Any]:
    install_crds(k8s_api)
    with in_process_operator(
        SHADOW_PREVIEW_DOMAIN=PREVIEW_DOMAIN,
        SHADOW_OPERATOR_NAMESPACE="shadow-system",
        # Routable pod and service ranges (as on GKE or an IPv6 cluster): denied beside the non-global ones.
        SHADOW_CLUSTER_CIDRS="34.118.224.0/20,2600:1900:4000:1::/64",
    ) as runner:
        yield runner


def read_policy(objs: Objects, name: str) -> Any:
    try:
        return client.NetworkingV1Api(objs.api).read_namespaced_network_policy(name, objs.namespace)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def test_default_policy_selects_the_templates_sandboxes(objs: Objects) -> None:
    objs.create(TEMPLATE, template_body("web"))
    name = naming.network_policy_name("web")
    wait_for(lambda: read_policy(objs, name) is not None, timeout=30, what="managed NetworkPolicy")
    policy = read_policy(objs, name)
    assert policy.spec.pod_selector.match_labels == {c.LABEL_TEMPLATE_REF_HASH: naming.name_hash("web")}
    assert policy.spec.policy_types == ["Ingress", "Egress"]
    assert policy.spec.ingress[0]._from[0].namespace_selector.match_labels == {
        "kubernetes.io/metadata.name": "shadow-system"
    }
    internet = policy.spec.egress[1].to[0].ip_block
    assert internet.cidr == "0.0.0.0/0" and "10.0.0.0/8" in internet._except
    # The API server accepted every range of both families (each strictly inside its block).
    assert {"127.0.0.0/8", "198.18.0.0/15", "240.0.0.0/4", "34.118.224.0/20"} <= set(internet._except)
    internet6 = policy.spec.egress[1].to[1].ip_block
    assert internet6.cidr == "::/0"
    assert {"::1/128", "64:ff9b::/96", "fe80::/10", "ff00::/8", "2600:1900:4000:1::/64"} <= set(
        internet6._except
    )
    assert policy.metadata.owner_references[0].kind == "SandboxTemplate"

    # A claimed sandbox's pod carries the label the policy selects.
    objs.create(CLAIM, {"metadata": {"name": "user"}, "spec": {"sandboxTemplateRef": {"name": "web"}}})
    objs.wait_condition(CLAIM, "user", "True")
    pod = objs.core.read_namespaced_pod("user", objs.namespace)
    assert pod.metadata.labels[c.LABEL_TEMPLATE_REF_HASH] == naming.name_hash("web")


def test_custom_rules_and_unmanaged(objs: Objects) -> None:
    rules = {"ingress": [], "egress": [{"to": [{"ipBlock": {"cidr": "1.1.1.1/32"}}]}]}
    objs.create(TEMPLATE, template_body("custom", networkPolicy=rules))
    name = naming.network_policy_name("custom")
    wait_for(lambda: read_policy(objs, name) is not None, timeout=30, what="custom NetworkPolicy")
    policy = read_policy(objs, name)
    assert not policy.spec.ingress
    assert policy.spec.egress[0].to[0].ip_block.cidr == "1.1.1.1/32"

    objs.patch(TEMPLATE, "custom", {"spec": {"networkPolicy": {"egress": [], "ingress": []}}})
    wait_for(lambda: not read_policy(objs, name).spec.egress, timeout=30, what="updated rules")
    objs.patch(TEMPLATE, "custom", {"spec": {"networkPolicyManagement": "Unmanaged"}})
    wait_for(lambda: read_policy(objs, name) is None, timeout=30, what="policy removed when Unmanaged")


def test_preview_url_when_a_preview_domain_is_configured(objs: Objects) -> None:
    objs.create(TEMPLATE, template_body("app"))
    objs.create(
        CLAIM, {"metadata": {"name": "amicable-1234abcd"}, "spec": {"sandboxTemplateRef": {"name": "app"}}}
    )
    sandbox = objs.wait_condition(SANDBOX, "amicable-1234abcd", "True")
    assert sandbox["status"]["previewURL"] == f"https://amicable-1234abcd.{PREVIEW_DOMAIN}/"
