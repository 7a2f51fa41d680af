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


# The allow* values loosen what the product refuses beyond the level: at level privileged they decide alone.
PRIVILEGED = PodSecurity(level="privileged")


def built(spec: dict[str, Any], annotations: dict[str, str] | None = None) -> dict[str, Any]:
    """The Pod as the operator builds it (secure defaults, runtime token): what is checked."""
    body = sandbox(spec)
    if annotations:
        body["spec"]["podTemplate"]["metadata"] = {"annotations": annotations}
    return res.build_pod(body, token_secret="sb-runtime-token")


def refused(
    spec: dict[str, Any], allowed: PodSecurity, annotations: dict[str, str] | None = None
) -> list[str]:
    pod = built(spec, annotations)
    return podsecurity.violations(pod["spec"], allowed, pod["metadata"]["annotations"])


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.id)
def test_refused_at_level_privileged_with_the_value_that_allows_it(case: Case) -> None:
    (found,) = refused(pod_spec(case.pod, case.container), PRIVILEGED)
    assert case.field in found and f"the chart value podSecurity.{case.value} allows it" in found


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.id)
def test_allowed_at_level_privileged_when_the_chart_says_so(case: Case) -> None:
    allowed = dataclasses.replace(PRIVILEGED, **{FLAGS[case.value]: True})
    assert podsecurity.violations(pod_spec(case.pod, case.container), allowed) == []


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.id)
def test_above_privileged_the_level_refuses_them_and_names_its_value(case: Case) -> None:
    found = refused(pod_spec(case.pod, case.container), PodSecurity())
    assert any(case.field in f for f in found), found
    # A service account is the product's own rule, whatever the level.
    decides = (
        "podSecurity.allowServiceAccount" if case.value == "allowServiceAccount" else "podSecurity.level"
    )
    assert all(decides in f for f in found if case.field in f), found


def test_a_value_that_loosens_what_the_level_refuses_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match=r"podSecurity\.allowHostPath needs podSecurity\.level=privileged"):
        PodSecurity(allow_host_path=True)
    with pytest.raises(ValueError, match="'root' is not one of privileged, baseline, restricted"):
        PodSecurity(level="root")
    # A service account is no Pod Security matter: allowed at any level.
    assert PodSecurity(allow_service_account=True).restricted


def test_the_defaults_spelled_out_and_baseline_capabilities_pass_up_to_baseline() -> None:
    spec = pod_spec(ALLOWED, ALLOWED_CONTAINER)
    assert refused(spec, PRIVILEGED) == refused(spec, PodSecurity(level="baseline")) == []
    # Restricted lets a container add NET_BIND_SERVICE only.
    (found,) = refused(spec, PodSecurity())
    assert found.startswith("spec.containers[0].securityContext.capabilities.add: adding CHOWN")


def test_a_bare_template_passes_restricted_thanks_to_the_secure_defaults() -> None:
    assert refused(pod_spec({}, {}), PodSecurity()) == []
    # Without them it would not: Pod Security restricted needs each of these fields.
    bare = pod_spec({}, {})
    assert [f.split(":")[0] for f in podsecurity.violations(bare, PodSecurity())] == [
        "spec.containers[0].securityContext.allowPrivilegeEscalation",
        "spec.containers[0].securityContext.runAsNonRoot",
        "spec.containers[0].securityContext.seccompProfile",
        "spec.containers[0].securityContext.capabilities.drop",
    ]


@pytest.mark.parametrize(
    ("pod", "container", "annotations", "path"),
    [
        # What baseline refuses that the operator once let through (issue 28, L1).
        (
            {"securityContext": {"seccompProfile": {"type": "Unconfined"}}},
            {},
            None,
            "spec.securityContext.seccompProfile.type",
        ),
        (
            {},
            {"securityContext": {"seccompProfile": {"type": "Unconfined"}}},
            None,
            "spec.containers[0].securityContext.seccompProfile.type",
        ),
        (
            {"securityContext": {"appArmorProfile": {"type": "Unconfined"}}},
            {},
            None,
            "spec.securityContext.appArmorProfile.type",
        ),
        (
            {},
            {},
            {"container.apparmor.security.beta.kubernetes.io/runtime": "unconfined"},
            "metadata.annotations[container.apparmor.security.beta.kubernetes.io/runtime]",
        ),
        (
            {"securityContext": {"seLinuxOptions": {"type": "spc_t"}}},
            {},
            None,
            "spec.securityContext.seLinuxOptions.type",
        ),
        (
            {},
            {"securityContext": {"seLinuxOptions": {"user": "system_u"}}},
            None,
            "spec.containers[0].securityContext.seLinuxOptions.user",
        ),
        (
            {},
            {"securityContext": {"procMount": "Unmasked"}},
            None,
            "spec.containers[0].securityContext.procMount",
        ),
        (
            {"securityContext": {"sysctls": [{"name": "kernel.msgmax", "value": "1"}]}},
            {},
            None,
            "spec.securityContext.sysctls[0].name",
        ),
        (
            {"securityContext": {"windowsOptions": {"hostProcess": True}}},
            {},
            None,
            "spec.securityContext.windowsOptions.hostProcess",
        ),
    ],
)
def test_baseline_refuses_what_once_got_through(
    pod: dict[str, Any], container: dict[str, Any], annotations: dict[str, str] | None, path: str
) -> None:
    for level in ("baseline", "restricted"):
        found = refused(pod_spec(pod, container), PodSecurity(level=level), annotations)
        assert [f.split(": ")[0] for f in found] == [path], found
    assert refused(pod_spec(pod, container), PRIVILEGED, annotations) == []


@pytest.mark.parametrize(
    ("pod", "path"),
    [
        ({"volumes": [{"name": "v", "nfs": {"server": "nfs", "path": "/"}}]}, "spec.volumes[0].nfs"),
        (
            {"volumes": [{"name": "v", "gitRepo": {"repository": "https://example.com/r.git"}}]},
            "spec.volumes[0].gitRepo",
        ),
        ({"securityContext": {"runAsUser": 0}}, "spec.securityContext.runAsUser"),
        ({"securityContext": {"runAsNonRoot": False}}, "spec.securityContext.runAsNonRoot"),
    ],
)
def test_restricted_refuses_more(pod: dict[str, Any], path: str) -> None:
    assert refused(pod_spec(pod, {}), PodSecurity(level="baseline")) == []
    found = refused(pod_spec(pod, {}), PodSecurity())
    assert [f.split(": ")[0] for f in found] == [path], found


def test_init_and_every_container_are_checked() -> None:
    spec = pod_spec({}, {})
    spec["initContainers"] = [{"name": "setup", "image": "x", "securityContext": {"privileged": True}}]
    spec["containers"].append({"name": "side", "image": "x", "ports": [{"containerPort": 1, "hostPort": 1}]})
    spec["ephemeralContainers"] = [
        {"name": "debug", "image": "x", "securityContext": {"capabilities": {"add": ["SYS_PTRACE"]}}}
    ]
    found = podsecurity.violations(spec, PRIVILEGED)
    assert [f.split(":")[0] for f in found] == [
        "spec.initContainers[0].securityContext.privileged",
        "spec.containers[1].ports[0].hostPort",
        "spec.ephemeralContainers[0].securityContext.capabilities.add",
    ]


def test_the_namespace_labels() -> None:
    assert podsecurity.namespace_labels("team-a", "restricted", "restricted", "baseline") == {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {
            "name": "team-a",
            "labels": {
                "pod-security.kubernetes.io/enforce": "restricted",
                "pod-security.kubernetes.io/warn": "restricted",
                "pod-security.kubernetes.io/audit": "baseline",
            },
        },
    }


def test_a_refused_pod_is_a_ready_condition_not_an_error() -> None:
    seen = res.Observed(pod=None, refused="Pod not created: spec.podTemplate.spec.hostPID: ...")
    conditions, _ = res.compute_conditions(sandbox(pod_spec({}, {})), seen)
    ready = next(cond for cond in conditions if cond.type == c.COND_READY)
    assert (ready.status, ready.reason) == ("False", "PodSecurityRefused")
    assert ready.message == seen.refused


def test_operator_settings_come_from_the_chart(monkeypatch: pytest.MonkeyPatch) -> None:
    config = Config.from_env()
    assert config.pod_security == PodSecurity() and config.pod_security.level == "restricted"
    assert config.pod_security_namespaces == ()
    monkeypatch.setenv("SHADOW_ALLOW_HOST_PATH", "true")
    with pytest.raises(ValueError, match=r"needs podSecurity\.level=privileged"):
        Config.from_env()
    monkeypatch.setenv("SHADOW_POD_SECURITY_LEVEL", "privileged")
    monkeypatch.setenv("SHADOW_ALLOW_PRIVILEGED", "false")
    monkeypatch.setenv("SHADOW_POD_SECURITY_NAMESPACES", "team-a, team-b,team-a")
    monkeypatch.setenv("SHADOW_POD_SECURITY_AUDIT", "baseline")
    config = Config.from_env()
    assert config.pod_security == PodSecurity(level="privileged", allow_host_path=True)
    assert config.pod_security_namespaces == ("team-a", "team-b")
    assert (config.pod_security_warn, config.pod_security_audit) == ("restricted", "baseline")
    monkeypatch.setenv("SHADOW_POD_SECURITY_WARN", "strict")
    with pytest.raises(ValueError, match="SHADOW_POD_SECURITY_WARN: 'strict' is not a Pod Security level"):
        Config.from_env()
    monkeypatch.setenv("SHADOW_POD_SECURITY_WARN", "restricted")
    monkeypatch.setenv("SHADOW_ALLOW_SERVICE_ACCOUNT", "yes")
    with pytest.raises(ValueError, match="SHADOW_ALLOW_SERVICE_ACCOUNT"):
        Config.from_env()
