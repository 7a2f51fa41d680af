"""Pod security at admission (the chart's ValidatingAdmissionPolicy, rendered by `helm template` and applied
to a real API server) and in the operator (issues 18 and 28).

At podSecurity.level baseline and restricted, the policy and the operator's check decide as Pod Security
itself does, probe by probe (PROBES of tests/support/pod_security_cases.py). At level privileged, every case of
CASES is refused when a Sandbox or SandboxTemplate asks for it, with a message naming the chart value that
allows it, and admitted once that value allows it. An object that got in before the policy existed gets no Pod
from the operator: Ready=False/PodSecurityRefused.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from shadow_operator.api import constants as c
from shadow_operator.resources import sandbox as res
from shadow_operator.resources.podsecurity import PodSecurity, violations

from tests.support.controlplane import wait_for
from tests.support.pod_security_cases import (
    ALLOWED,
    ALLOWED_CONTAINER,
    CASES,
    PROBES,
    USER_NAMESPACE,
    Case,
    Probe,
    pod_spec,
    probe_template,
)
from tests.support.router import CHART, helm_binary
from tests.support.sandbox_operator import SANDBOX, TEMPLATE, Objects, install_crds

pytestmark = pytest.mark.integration

VALUES = ("allowPrivileged", "allowHostNamespaces", "allowHostPath", "allowServiceAccount")
# The allow* values loosen what the product refuses beyond the level: they mean something at level privileged.
PRIVILEGED = "level=privileged"


def rendered_policy(namespace: str, *settings: str) -> list[dict[str, Any]]:
    """The chart's ValidatingAdmissionPolicy and binding, as `helm template` renders them with `settings`
    (`allowHostPath` for podSecurity.allowHostPath=true, `level=baseline` for podSecurity.level=baseline)."""
    values = [f"--set=podSecurity.{s if '=' in s else s + '=true'}" for s in settings]
    out = subprocess.run(
        [helm_binary(), "template", "shadow", str(CHART), "--namespace", "shadow-system",
         f"--set=operator.watchNamespaces={{{namespace}}}", *values,
         "--show-only", "templates/pod-security-policy.yaml"],
        capture_output=True, text=True, check=True, timeout=120,
    ).stdout  # fmt: skip
    return [doc for doc in yaml.safe_load_all(out) if doc]


@pytest.fixture(scope="module", autouse=True)
def crds(k8s_api: client.ApiClient) -> None:
    install_crds(k8s_api)


@pytest.fixture
def apply_policy(k8s_api: client.ApiClient, namespace: str) -> Iterator[Callable[..., None]]:
    admission = client.AdmissionregistrationV1Api(k8s_api)
    names: set[str] = set()

    def apply(*values: str) -> None:
        for doc in rendered_policy(namespace, *values):
            name = doc["metadata"]["name"]
            names.add(name)
            if doc["kind"] == "ValidatingAdmissionPolicy":
                create, read, replace = (
                    admission.create_validating_admission_policy,
                    admission.read_validating_admission_policy,
                    admission.replace_validating_admission_policy,
                )
            else:
                create, read, replace = (
                    admission.create_validating_admission_policy_binding,
                    admission.read_validating_admission_policy_binding,
                    admission.replace_validating_admission_policy_binding,
                )
            try:
                create(doc)
            except ApiException as exc:
                if exc.status != 409:
                    raise
                doc["metadata"]["resourceVersion"] = read(name).metadata.resource_version
                replace(name, doc)

    yield apply
    for name in names:
        for delete in (
            admission.delete_validating_admission_policy_binding,
            admission.delete_validating_admission_policy,
        ):
            try:
                delete(name)
            except ApiException as exc:
                if exc.status != 404:
                    raise


def sandbox(name: str, case: Case | None) -> dict[str, Any]:
    spec = pod_spec(case.pod, case.container) if case else pod_spec(ALLOWED, ALLOWED_CONTAINER)
    return {"metadata": {"name": name}, "spec": {"podTemplate": {"spec": spec}, "operatingMode": "Suspended"}}


def refusal(create: Callable[[], Any]) -> str | None:
    """The API server's message when it refuses the object, None when it admits it (then deleted)."""
    try:
        create()
    except ApiException as exc:
        assert exc.status in (403, 422), exc.body
        return str(exc.body)
    return None


def wait_until_refused(objs: Objects, case: Case) -> str:
    """The policy is enforced once the API server has loaded it: retry until the case is refused."""
    found: dict[str, str] = {}
    attempt = iter(range(10_000))

    def refused() -> bool:
        name = f"probe-{next(attempt)}"
        message = refusal(lambda: objs.create(SANDBOX, sandbox(name, case)))
        if message is None:
            objs.delete(SANDBOX, name)
            return False
        found["message"] = message
        return True

    wait_for(refused, timeout=30, what=f"the policy to refuse {case.id}", interval=0.2)
    return found["message"]


def wait_until_admitted(objs: Objects, case: Case) -> None:
    attempt = iter(range(10_000))

    def admitted() -> bool:
        return refusal(lambda: objs.create(SANDBOX, sandbox(f"{case.id}-{next(attempt)}", case))) is None

    wait_for(admitted, timeout=30, what=f"the policy to admit {case.id}", interval=0.2)


def test_each_field_is_refused_at_level_privileged_with_the_value_that_allows_it(
    k8s_api: client.ApiClient, namespace: str, apply_policy: Callable[..., None]
) -> None:
    objs = Objects(k8s_api, namespace)
    apply_policy(PRIVILEGED)
    wait_until_refused(objs, CASES[0])
    for case in CASES:
        for kind, body in ((SANDBOX, sandbox(case.id, case)), (TEMPLATE, sandbox(f"t-{case.id}", case))):
            message = refusal(lambda kind=kind, body=body: objs.create(kind, body))
            assert message is not None, f"{case.id} admitted as a {kind[1]}"
            assert case.field in message and f"set podSecurity.{case.value}=true" in message, message
    # What the secure defaults spell out, and baseline capabilities, pass.
    assert refusal(lambda: objs.create(SANDBOX, sandbox("fine", None))) is None
    assert refusal(lambda: objs.create(TEMPLATE, sandbox("fine", None))) is None


@pytest.mark.parametrize("value", VALUES)
def test_the_chart_value_allows_its_fields_and_only_those(
    k8s_api: client.ApiClient, namespace: str, apply_policy: Callable[..., None], value: str
) -> None:
    objs = Objects(k8s_api, namespace)
    apply_policy(PRIVILEGED)
    other = next(case for case in CASES if case.value != value)
    wait_until_refused(objs, other)
    apply_policy(PRIVILEGED, value)
    mine = [case for case in CASES if case.value == value]
    wait_until_admitted(objs, mine[0])
    for case in mine:
        assert refusal(lambda case=case: objs.create(TEMPLATE, sandbox(f"t-{case.id}", case))) is None
    assert refusal(lambda: objs.create(SANDBOX, sandbox("still-refused", other))) is not None


def test_the_operator_refuses_what_got_past_admission(objs: Objects) -> None:
    # No policy binds this namespace: the Sandbox is admitted, and the operator still creates no Pod.
    host_pid = next(case for case in CASES if case.id == "host-pid")
    body = sandbox("sneaky", host_pid)
    body["spec"].pop("operatingMode")
    objs.create(SANDBOX, body)
    found = objs.wait_condition(SANDBOX, "sneaky", "False", c.REASON_POD_SECURITY_REFUSED, timeout=30)
    ready = next(cond for cond in found["status"]["conditions"] if cond["type"] == "Ready")
    assert "spec.podTemplate.spec.hostPID" in ready["message"]
    assert "Pod Security 'restricted' (the chart value podSecurity.level)" in ready["message"]
    assert objs.pods() == []
    # Fixing the spec heals it: the Pod is created.
    objs.patch(SANDBOX, "sneaky", {"spec": {"podTemplate": {"spec": {"hostPID": False}}}})
    wait_for(lambda: len(objs.pods()) == 1, timeout=30, what="the Pod once the spec is fixed")


# ------------------------------------------------------------------------------- parity with Pod Security
ENFORCE = "pod-security.kubernetes.io/enforce"


def probe_sandbox(probe: Probe, namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": "agents.x-k8s.io/v1beta1",
        "kind": "Sandbox",
        "metadata": {"name": "probe", "namespace": namespace, "uid": "00000000-0000-0000-0000-000000000000"},
        "spec": {"podTemplate": probe_template(probe), "operatingMode": "Suspended"},
    }


def dry_run_refusal(call: Callable[[], Any], marker: str) -> str | None:
    """None when the API server admits the (dry-run) request; "refused" when `marker` is in its refusal;
    otherwise the error itself (a probe the API server finds invalid is a broken probe, not a decision)."""
    try:
        call()
    except ApiException as exc:
        body = str(exc.body)
        return "refused" if exc.status in (403, 422) and marker in body else f"{exc.status}: {body[:300]}"
    return None


class PodSecurityAdmission:
    """Pod Security's decision on the Pod the operator builds for a probe, in a namespace enforcing a level."""

    def __init__(self, api: client.ApiClient, namespace: str) -> None:
        self.core = client.CoreV1Api(api)
        self.namespace = namespace
        # Ephemeral containers are never part of a new Pod: they are added to a running one (the
        # pods/ephemeralcontainers subresource, which Pod Security checks too). This one takes them.
        base = res.build_pod(
            probe_sandbox(Probe("base", USER_NAMESPACE, {}, {}), namespace), token_secret="probe-token"
        )
        base["metadata"].update(name="ephemeral-target", ownerReferences=[])
        self.core.create_namespaced_pod(namespace, base)

    def decide(self, probe: Probe) -> str | None:
        pod = res.build_pod(probe_sandbox(probe, self.namespace), token_secret="probe-token")
        pod["metadata"]["ownerReferences"] = []
        ephemeral = pod["spec"].pop("ephemeralContainers", None)
        if ephemeral is None:
            return dry_run_refusal(
                lambda: self.core.create_namespaced_pod(self.namespace, pod, dry_run="All"), "PodSecurity"
            )
        target = self.core.api_client.sanitize_for_serialization(
            self.core.read_namespaced_pod("ephemeral-target", self.namespace)
        )
        target["spec"]["ephemeralContainers"] = ephemeral
        return dry_run_refusal(
            lambda: self.core.replace_namespaced_pod_ephemeralcontainers(
                "ephemeral-target", self.namespace, target, dry_run="All"
            ),
            "PodSecurity",
        )


@pytest.mark.parametrize("level", ["baseline", "restricted"])
def test_the_policy_and_the_operator_decide_as_pod_security(
    k8s_api: client.ApiClient, namespace: str, apply_policy: Callable[..., None], level: str
) -> None:
    core = client.CoreV1Api(k8s_api)
    core.patch_namespace(namespace, {"metadata": {"labels": {ENFORCE: level}}})
    apply_policy(f"level={level}")
    objs = Objects(k8s_api, namespace)
    wait_until_refused(objs, next(case for case in CASES if case.id == "host-pid"))
    kube = PodSecurityAdmission(k8s_api, namespace)
    custom = client.CustomObjectsApi(k8s_api)
    check = PodSecurity(level=level)

    def policy(plural: str, kind: str, group: str, probe: Probe) -> str | None:
        body = {**probe_sandbox(probe, namespace), "kind": kind, "apiVersion": f"{group}/v1beta1"}
        body["metadata"] = {"name": "probe"}
        return dry_run_refusal(
            lambda: custom.create_namespaced_custom_object(
                group, "v1beta1", namespace, plural, body, dry_run="All"
            ),
            "ValidatingAdmissionPolicy",
        )

    decisions: dict[str, dict[str, str | None]] = {}
    for probe in PROBES:
        pod = res.build_pod(probe_sandbox(probe, namespace), token_secret="probe-token")
        found = violations(pod["spec"], check, pod["metadata"].get("annotations"))
        decisions[probe.id] = {
            "Pod Security": kube.decide(probe),
            "Sandbox": policy("sandboxes", "Sandbox", "agents.x-k8s.io", probe),
            "SandboxTemplate": policy(
                "sandboxtemplates", "SandboxTemplate", "extensions.agents.x-k8s.io", probe
            ),
            "operator": "refused" if found else None,
        }
    differ = {probe: seen for probe, seen in decisions.items() if len(set(seen.values())) != 1}
    for probe, seen in differ.items():
        print(f"{level} {probe}: " + "; ".join(f"{who}={what or 'admitted'}" for who, what in seen.items()))
    refused = sum(seen["Pod Security"] == "refused" for seen in decisions.values())
    print(f"{level}: {len(decisions)} probes, {refused} refused by Pod Security, {len(differ)} differ")
    assert not differ, f"{len(differ)} probes decided differently at level {level}: {sorted(differ)}"
    # The corpus asks for both answers.
    assert 0 < refused < len(decisions)


def test_an_update_that_leaves_the_pod_template_alone_is_not_judged_again(
    k8s_api: client.ApiClient, namespace: str, apply_policy: Callable[..., None]
) -> None:
    objs = Objects(k8s_api, namespace)
    unconfined = {"securityContext": {"seccompProfile": {"type": "Unconfined"}}}
    apply_policy(PRIVILEGED)
    wait_until_refused(objs, CASES[0])
    body = sandbox("older", None)
    body["spec"]["podTemplate"]["spec"].update(unconfined)
    objs.create(SANDBOX, body)
    # The level is raised: a new one is refused, the one admitted before may still be suspended or resumed.
    apply_policy("level=baseline")
    wait_until_refused(objs, Case("unconfined", unconfined, {}, "level", "seccompProfile"))
    objs.patch(
        SANDBOX, "older", {"spec": {"operatingMode": "Running"}, "metadata": {"labels": {"team": "a"}}}
    )
    # Changing its pod template is judged: still refused.
    message = refusal(
        lambda: objs.patch(SANDBOX, "older", {"spec": {"podTemplate": {"spec": {"hostname": "renamed"}}}})
    )
    assert message is not None and "seccompProfile" in message, message
