"""The operator's own pod security check: what it refuses, what allows it, and how a Sandbox reports it."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from shadow_operator.api import constants as c
from shadow_operator.controllers.config import Config
from shadow_operator.resources import podsecurity
from shadow_operator.resources import sandbox as res
from shadow_operator.resources.podsecurity import PodSecurity

from tests.support.pod_security_cases import ALLOWED, ALLOWED_CONTAINER, CASES, Case, pod_spec

pytestmark = pytest.mark.unit

FLAGS = {
    "allowPrivileged": "allow_privileged",
    "allowHostNamespaces": "allow_host_namespaces",
    "allowHostPath": "allow_host_path",
    "allowServiceAccount": "allow_service_account",
}


def sandbox(spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "agents.x-k8s.io/v1beta1",
        "kind": "Sandbox",
        "metadata": {"name": "sb", "namespace": "ns", "uid": "u1", "generation": 1},
        "spec": {"podTemplate": {"spec": spec}},
    }


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.id)
def test_refused_by_default_with_the_value_that_allows_it(case: Case) -> None:
    # The Pod as the operator builds it (secure defaults, runtime token) is what is checked.
    pod = res.build_pod(sandbox(pod_spec(case.pod, case.container)), token_secret="sb-runtime-token")
    (found,) = podsecurity.violations(pod["spec"], PodSecurity())
    assert case.field in found and f"the chart value podSecurity.{case.value} allows it" in found


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.id)
def test_allowed_when_the_chart_says_so(case: Case) -> None:
    allowed = dataclasses.replace(PodSecurity(), **{FLAGS[case.value]: True})
    assert podsecurity.violations(pod_spec(case.pod, case.container), allowed) == []


def test_the_defaults_spelled_out_and_safe_capabilities_pass() -> None:
    pod = res.build_pod(sandbox(pod_spec(ALLOWED, ALLOWED_CONTAINER)), token_secret="sb-runtime-token")
    assert podsecurity.violations(pod["spec"], PodSecurity()) == []


def test_init_and_every_container_are_checked() -> None:
    spec = pod_spec({}, {})
    spec["initContainers"] = [{"name": "setup", "image": "x", "securityContext": {"privileged": True}}]
    spec["containers"].append({"name": "side", "image": "x", "ports": [{"containerPort": 1, "hostPort": 1}]})
    found = podsecurity.violations(spec, PodSecurity())
    assert [f.split(":")[0] for f in found] == [
        "initContainers[0].securityContext.privileged",
        "containers[1].ports[0].hostPort",
    ]


def test_a_refused_pod_is_a_ready_condition_not_an_error() -> None:
    seen = res.Observed(pod=None, refused="Pod not created: spec.podTemplate.spec.hostPID: ...")
    conditions, _ = res.compute_conditions(sandbox(pod_spec({}, {})), seen)
    ready = next(cond for cond in conditions if cond["type"] == c.COND_READY)
    assert (ready["status"], ready["reason"]) == ("False", "PodSecurityRefused")
    assert ready["message"] == seen.refused


def test_operator_settings_come_from_the_chart(monkeypatch: pytest.MonkeyPatch) -> None:
    assert Config.from_env().pod_security == PodSecurity()
    monkeypatch.setenv("SHADOW_ALLOW_HOST_PATH", "true")
    monkeypatch.setenv("SHADOW_ALLOW_PRIVILEGED", "false")
    assert Config.from_env().pod_security == PodSecurity(allow_host_path=True)
    monkeypatch.setenv("SHADOW_ALLOW_SERVICE_ACCOUNT", "yes")
    with pytest.raises(ValueError, match="SHADOW_ALLOW_SERVICE_ACCOUNT"):
        Config.from_env()
