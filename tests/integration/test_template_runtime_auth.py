"""The operator honours `shadow.dev/runtime-auth: none` on a SandboxTemplate (clients such as Amicable's backend
reach the runtime by the claim's Service, without a token) only where the template's managed NetworkPolicy names
the peers: Amicable's v1alpha1 claim then gets a Pod whose runtime has no token; with open ingress the token
stays and a RuntimeTokenKept Warning says why. (The runtime itself, answering Amicable's requests with and
without the token: tests/runtime/test_template_runtime_auth.py.)
"""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import client
from shadow_operator.api import constants as c

from tests.support.controlplane import wait_for
from tests.support.sandbox_operator import CLAIM, TEMPLATE, Objects, template_body

pytestmark = pytest.mark.integration

AMICABLE_PEER = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "amicable"}}}


def amicable_claim(objs: Objects, name: str, template: str) -> None:
    """Exactly what Amicable's backend creates: a v1alpha1 claim with only the template reference."""
    objs.create(
        CLAIM, {"metadata": {"name": name}, "spec": {"sandboxTemplateRef": {"name": template}}}, "v1alpha1"
    )


def template(objs: Objects, name: str, ingress: list[dict[str, Any]]) -> None:
    body = template_body(name, networkPolicy={"ingress": ingress, "egress": []})
    body["metadata"]["annotations"] = {c.ANNOTATION_RUNTIME_AUTH: c.RUNTIME_AUTH_NONE}
    objs.create(TEMPLATE, body, "v1alpha1")


def runtime_env(objs: Objects, pod: str) -> set[str]:
    def created() -> bool:
        return any(p.metadata.name == pod for p in objs.pods())

    wait_for(created, timeout=60, what=f"Pod {pod}")
    body = objs.core.read_namespaced_pod(pod, objs.namespace)
    return {e.name for e in body.spec.containers[0].env or []}


def warnings(objs: Objects, name: str) -> list[str]:
    events = client.CoreV1Api(objs.api).list_namespaced_event(objs.namespace).items
    return [
        e.message
        for e in events
        if e.involved_object.name == name and e.reason == c.REASON_RUNTIME_TOKEN_KEPT and e.type == "Warning"
    ]


def test_amicables_claim_gets_a_runtime_without_token_behind_named_peers(objs: Objects) -> None:
    template(objs, "amicable-sandbox", [{"from": [AMICABLE_PEER]}])
    amicable_claim(objs, "amicable-1a2b3c4d", "amicable-sandbox")
    assert c.RUNTIME_TOKEN_ENV not in runtime_env(objs, "amicable-1a2b3c4d")
    assert not warnings(objs, "amicable-1a2b3c4d")


def test_open_ingress_keeps_the_token_and_says_why(objs: Objects) -> None:
    template(objs, "open-sandbox", [{}])
    amicable_claim(objs, "amicable-open", "open-sandbox")
    assert c.RUNTIME_TOKEN_ENV in runtime_env(objs, "amicable-open")
    wait_for(lambda: bool(warnings(objs, "amicable-open")), timeout=30, what="a RuntimeTokenKept Warning")
    assert "networkPolicy.ingress[0] has no `from`" in warnings(objs, "amicable-open")[0]


def test_templates_without_the_annotation_keep_the_token(objs: Objects) -> None:
    objs.create(TEMPLATE, template_body("plain"), "v1alpha1")
    amicable_claim(objs, "amicable-plain", "plain")
    assert c.RUNTIME_TOKEN_ENV in runtime_env(objs, "amicable-plain")
