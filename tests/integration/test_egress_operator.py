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
    ENVIRONMENT,
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


def egress_condition(objs: Objects, kind: tuple[str, str], name: str) -> dict[str, Any] | None:
    body = objs.get(kind, name, version="v1alpha1" if kind == ENVIRONMENT else "v1beta1") or {}
    conditions = (body.get("status") or {}).get("conditions") or ()
    return next((x for x in conditions if x["type"] == "EgressNarrowed"), None)


def test_claim_and_environment_rules_that_would_widen_the_template_show_in_their_status(
    objs: Objects,
) -> None:
    pypi = {"host": "pypi.org", "methods": ["GET"], "paths": ["/simple/"]}
    objs.create(TEMPLATE, template_body("narrow", egress={"rules": [pypi]}))
    widening = [
        {"host": "pypi.org", "methods": ["GET"], "paths": ["/simple/numpy/"]},  # narrows: kept
        {"host": "pypi.org", "methods": ["GET", "DELETE"], "paths": ["/simple/"]},
        {"host": "evil.example"},
        # A long rule, many times: the message stays bounded.
        *({"host": "pypi.org", "methods": ["GET"], "paths": [f"/other/{'x' * 200}/{i}/"]} for i in range(20)),
    ]
    objs.create(
        CLAIM,
        {
            "metadata": {"name": "agent"},
            "spec": {"sandboxTemplateRef": {"name": "narrow"}, "egress": {"rules": widening}},
        },
    )
    dropped = wait_for(
        lambda: egress_condition(objs, CLAIM, "agent"),
        timeout=30,
        what="the claim's EgressNarrowed condition",
    )
    assert (dropped["status"], dropped["reason"]) == ("False", "RulesDropped")
    message = dropped["message"]
    assert message.startswith(
        "22 of 23 egress rules dropped (a claim or environment may only narrow its template's"
    )
    assert (
        "spec.egress.rules[1] (pypi.org:443 DELETE,GET /simple/): method DELETE is beyond it (the template's rule "
        "for pypi.org allows GET only)" in message
    )
    assert (
        "spec.egress.rules[2] (evil.example:443 any method any path): no rule of the template covers host evil.example"
        in message
    )
    assert "spec.egress.rules[0]" not in message
    assert len(message) <= 1024 and message.endswith("(22 rules dropped in all)")

    # Narrowed as asked: True. Then the template narrows under the claim's rule: the condition follows it.
    objs.patch(CLAIM, "agent", {"spec": {"egress": {"rules": widening[:1]}}})
    wait_for(
        lambda: (egress_condition(objs, CLAIM, "agent") or {}).get("reason") == "RulesApplied",
        timeout=30,
        what="the claim's rules to apply",
    )
    assert egress_condition(objs, CLAIM, "agent")["status"] == "True"  # type: ignore[index]
    objs.patch(TEMPLATE, "narrow", {"spec": {"egress": {"rules": [{**pypi, "paths": ["/simple/flask/"]}]}}})
    wait_for(
        lambda: (egress_condition(objs, CLAIM, "agent") or {}).get("reason") == "RulesDropped",
        timeout=30,
        what="the template's change to drop the claim's rule",
    )

    # A ShadowEnvironment says the same (its workspace never needs to start for it).
    objs.create(
        ENVIRONMENT,
        {
            "metadata": {"name": "env"},
            "spec": {
                "template": "narrow",
                "sources": [{"name": "app", "repo": "shadow/app", "upload": {}}],
                "gitea": {"enabled": False},
                "verify": {"enabled": False},
                "egress": {"rules": [{"host": "evil.example"}]},
            },
        },
        version="v1alpha1",
    )
    env = wait_for(
        lambda: egress_condition(objs, ENVIRONMENT, "env"), timeout=30, what="the environment's condition"
    )
    assert (env["status"], env["reason"]) == ("False", "RulesDropped")
    assert (
        env["message"].startswith("1 of 1 egress rules dropped")
        and "covers host evil.example" in env["message"]
    )
