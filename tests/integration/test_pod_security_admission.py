"""Pod security at admission (the chart's ValidatingAdmissionPolicy, rendered by `helm template` and applied
to a real API server) and in the operator (issue 18, M7).

Every case of tests/support/pod_security_cases.py is refused when a Sandbox or SandboxTemplate asks for it,
with a message naming the chart value that allows it, and admitted once that value allows it. An object that
got in before the policy existed gets no Pod from the operator: Ready=False/PodSecurityRefused.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from shadow_operator.api import constants as c

from tests.support.controlplane import wait_for
from tests.support.pod_security_cases import ALLOWED, ALLOWED_CONTAINER, CASES, Case, pod_spec
from tests.support.sandbox_operator import SANDBOX, TEMPLATE, Objects, install_crds

pytestmark = pytest.mark.integration

CHART = Path(__file__).resolve().parents[2] / "charts" / "shadow-operator"
VALUES = ("allowPrivileged", "allowHostNamespaces", "allowHostPath", "allowServiceAccount")


def helm() -> str:
    cache = Path(os.environ.get("SHADOW_CACHE", Path.home() / ".cache" / "shadow-operator"))
    for candidate in (os.environ.get("HELM", ""), str(cache / "bin" / "helm"), shutil.which("helm") or ""):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    pytest.fail("helm not found: build it with `hack/build-tools.sh helm` (or set HELM)")


def rendered_policy(namespace: str, *values: str) -> list[dict[str, Any]]:
    """The chart's ValidatingAdmissionPolicy and binding, as `helm template` renders them."""
    out = subprocess.run(
        [helm(), "template", "shadow", str(CHART), "--namespace", "shadow-system",
         f"--set=operator.watchNamespaces={{{namespace}}}", *(f"--set=podSecurity.{v}=true" for v in values),
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


def test_each_field_is_refused_with_the_value_that_allows_it(
    k8s_api: client.ApiClient, namespace: str, apply_policy: Callable[..., None]
) -> None:
    objs = Objects(k8s_api, namespace)
    apply_policy()
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
    apply_policy()
    other = next(case for case in CASES if case.value != value)
    wait_until_refused(objs, other)
    apply_policy(value)
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
    assert "podSecurity.allowHostNamespaces" in ready["message"]
    assert objs.pods() == []
    # Fixing the spec heals it: the Pod is created.
    objs.patch(SANDBOX, "sneaky", {"spec": {"podTemplate": {"spec": {"hostPID": False}}}})
    wait_for(lambda: len(objs.pods()) == 1, timeout=30, what="the Pod once the spec is fixed")
