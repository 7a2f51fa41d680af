"""The operator's half of egress allowlists on a real API server: the template's NetworkPolicy admits only DNS
and the gateway, and a sandbox Pod of such a template gets its own proxy credential and the egress CA; one of a
template without spec.egress gets neither."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client
from shadow_operator.api import naming
from shadow_operator.common.egress import proxy_token

from tests.support.controlplane import wait_for
from tests.support.sandbox_operator import (
    CLAIM,
    TEMPLATE,
    Objects,
    in_process_operator,
    install_crds,
    template_body,
)

pytestmark = pytest.mark.integration

KEY = b"operator-test-key"
PROXY = "shadow-egress.shadow-system.svc:3128"


@pytest.fixture(scope="module")
def operator(k8s_api: client.ApiClient, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    install_crds(k8s_api)
    key = tmp_path_factory.mktemp("egress") / "key"
    key.write_bytes(KEY + b"\n")
    with in_process_operator(SHADOW_EGRESS_PROXY=PROXY, SHADOW_EGRESS_KEY_FILE=str(key)) as runner:
        yield runner


@pytest.fixture
def objs(k8s_api: client.ApiClient, namespace: str, operator: Any) -> Objects:
    return Objects(k8s_api, namespace)


def pod_of_claim(objs: Objects, template: str, name: str) -> dict[str, Any]:
    objs.create(
        CLAIM,
        {"metadata": {"name": name}, "spec": {"sandboxTemplateRef": {"name": template}}},
        version="v1alpha1",
    )
    core = client.CoreV1Api(objs.api)
    pod = wait_for(lambda: core.read_namespaced_pod(name, objs.namespace), timeout=60, what=f"the Pod {name}")
    return objs.api.sanitize_for_serialization(pod)  # type: ignore[no-any-return]


def test_sandboxes_of_a_template_with_egress_go_through_the_gateway_and_only_there(objs: Objects) -> None:
    objs.create(TEMPLATE, template_body("locked", egress={"rules": [{"host": "pypi.org"}]}))
    objs.create(TEMPLATE, template_body("open"))
    pod = pod_of_claim(objs, "locked", "agent")
    env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
    assert env["HTTPS_PROXY"] == f"http://sandbox:{proxy_token(KEY, objs.namespace, 'agent')}@{PROXY}"
    assert env["SSL_CERT_FILE"] == "/etc/shadow-egress/bundle.crt"
    assert any(v.get("configMap", {}).get("name") == "shadow-egress-ca" for v in pod["spec"]["volumes"])

    networking = client.NetworkingV1Api(objs.api)
    policy = wait_for(
        lambda: networking.read_namespaced_network_policy(
            naming.network_policy_name("locked"), objs.namespace
        ),
        timeout=30,
        what="the locked template's NetworkPolicy",
    )
    egress = objs.api.sanitize_for_serialization(policy)["spec"]["egress"]
    assert not any("ipBlock" in peer for rule in egress for peer in rule["to"])
    assert egress[1]["to"][0]["podSelector"] == {"matchLabels": {"shadow.dev/egress-gateway": "true"}}
    assert egress[1]["ports"] == [{"protocol": "TCP", "port": 3128}]

    plain = pod_of_claim(objs, "open", "plain")
    names = {e["name"] for e in plain["spec"]["containers"][0].get("env") or ()}
    assert "HTTPS_PROXY" not in names and "SSL_CERT_FILE" not in names
