"""The egress allowlist's CRD rules on a real API server: what cannot work is refused with a clear message."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tests.support.sandbox_operator import CLAIM, TEMPLATE, Objects, install_crds

pytestmark = pytest.mark.integration

POD = {"spec": {"containers": [{"name": "main", "image": "busybox"}]}}


@pytest.fixture(scope="module", autouse=True)
def crds(k8s_api: client.ApiClient) -> None:
    install_crds(k8s_api)


@pytest.fixture
def objs(k8s_api: client.ApiClient, namespace: str) -> Iterator[Objects]:
    yield Objects(k8s_api, namespace)


def template(name: str, **spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {"podTemplate": POD, **spec}}


def rejected(objs: Objects, body: dict[str, Any]) -> str:
    with pytest.raises(ApiException) as info:
        objs.create(TEMPLATE, body)
    assert info.value.status == 422, info.value.body
    return str(info.value.body)


def test_a_policy_with_every_kind_of_rule_is_accepted(objs: Objects) -> None:
    rules = [
        {"host": "pypi.org", "methods": ["GET", "HEAD"], "paths": ["/simple/"]},
        {"host": "*.pythonhosted.org", "ports": [443, 80]},
        {
            "host": "api.model.example",
            "credential": {
                "secretName": "model-key",
                "key": "token",
                "header": "Authorization",
                "prefix": "Bearer ",
            },
        },
        {
            "host": "git.example",
            "credential": {"secretName": "git", "key": "t", "placeholder": "SHADOW-PLACEHOLDER"},
        },
    ]
    created = objs.create(TEMPLATE, template("ok", egress={"rules": rules}))
    assert created["spec"]["egress"]["rules"][2]["credential"]["prefix"] == "Bearer "
    claim = {
        "warmPoolRef": {"name": "p"},
        "egress": {"rules": [{"host": "pypi.org", "paths": ["/simple/x/"]}]},
    }
    assert objs.create(CLAIM, {"metadata": {"name": "narrow"}, "spec": claim})["spec"]["egress"]


@pytest.mark.parametrize(
    ("rule", "message"),
    [
        ({"host": "https://pypi.org"}, "host must be a lower-case DNS name such as api.example.com"),
        ({"host": "PyPI.org"}, "host must be a lower-case DNS name"),
        ({"host": "pypi.org:443"}, "without a scheme, port or path"),
        ({"host": "10.0.0.1"}, "host must be a name, not an IP address"),
        ({"host": "pypi.org", "paths": ["simple/"]}, "each path is a prefix starting with `/`"),
        ({"host": "pypi.org", "paths": ["/a/../b"]}, "without `..` segments"),
        (
            {"host": "a.example", "credential": {"secretName": "s", "key": "k"}},
            "set exactly one of header (the gateway sets that header) or placeholder",
        ),
        ({"host": "a.example", "ports": [0]}, "ports"),
        ({"host": "a.example", "methods": ["CONNECT"]}, "methods"),
    ],
)
def test_rules_that_cannot_work_are_refused(objs: Objects, rule: dict[str, Any], message: str) -> None:
    assert message in rejected(objs, template("bad", egress={"rules": [rule]}))


def test_the_allowlist_needs_the_managed_network_policy_and_no_address_rules(objs: Objects) -> None:
    egress = {"rules": [{"host": "pypi.org"}]}
    message = rejected(objs, template("unmanaged", egress=egress, networkPolicyManagement="Unmanaged"))
    assert "spec.egress needs networkPolicyManagement: Managed" in message
    both = template(
        "both", egress=egress, networkPolicy={"egress": [{"to": [{"ipBlock": {"cidr": "0.0.0.0/0"}}]}]}
    )
    assert "set either spec.egress (allowlist by host, method and path" in rejected(objs, both)


def test_a_claim_cannot_name_a_credential(objs: Objects) -> None:
    rule = {"host": "a.example", "credential": {"secretName": "s", "key": "k", "header": "Authorization"}}
    created = objs.create(
        CLAIM,
        {"metadata": {"name": "cred"}, "spec": {"warmPoolRef": {"name": "p"}, "egress": {"rules": [rule]}}},
    )
    # Not in the claim's schema: the API server prunes it, so a tenant's claim never names a Secret.
    assert "credential" not in created["spec"]["egress"]["rules"][0]
