"""The generated CRDs on a real API server: invalid objects are rejected with a clear message."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tests.support.sandbox_operator import CLAIM, POOL, SANDBOX, Objects, install_crds, sandbox_body

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module", autouse=True)
def crds(k8s_api: client.ApiClient) -> None:
    install_crds(k8s_api)


@pytest.fixture
def objs(k8s_api: client.ApiClient, namespace: str) -> Iterator[Objects]:
    yield Objects(k8s_api, namespace)


def rejected(call: Any) -> str:
    with pytest.raises(ApiException) as info:
        call()
    assert info.value.status == 422, info.value.body
    return str(info.value.body)


def test_claim_needs_exactly_one_reference(objs: Objects) -> None:
    message = rejected(lambda: objs.create(CLAIM, {"metadata": {"name": "none"}, "spec": {}}))
    assert (
        "set exactly one of spec.warmPoolRef.name (v1beta1) or spec.sandboxTemplateRef.name (v1alpha1)"
        in message
    )
    both = {"warmPoolRef": {"name": "p"}, "sandboxTemplateRef": {"name": "t"}}
    assert "exactly one" in rejected(lambda: objs.create(CLAIM, {"metadata": {"name": "both"}, "spec": both}))


def test_both_claim_forms_are_accepted_and_visible_in_both_versions(objs: Objects) -> None:
    objs.create(
        CLAIM, {"metadata": {"name": "old"}, "spec": {"sandboxTemplateRef": {"name": "t"}}}, "v1alpha1"
    )
    objs.create(CLAIM, {"metadata": {"name": "new"}, "spec": {"warmPoolRef": {"name": "p"}}})
    old_as_beta = objs.get(CLAIM, "old", "v1beta1")
    new_as_alpha = objs.get(CLAIM, "new", "v1alpha1")
    assert old_as_beta is not None and old_as_beta["spec"]["sandboxTemplateRef"] == {"name": "t"}
    assert new_as_alpha is not None and new_as_alpha["spec"]["warmPoolRef"] == {"name": "p"}
    # Defaults from the schema apply (upstream: lifecycle.shutdownPolicy defaults to Retain).
    with_lifecycle = objs.create(
        CLAIM, {"metadata": {"name": "life"}, "spec": {"warmPoolRef": {"name": "p"}, "lifecycle": {}}}
    )
    assert with_lifecycle["spec"]["lifecycle"]["shutdownPolicy"] == "Retain"


def test_enums_and_bounds(objs: Objects) -> None:
    bad_mode = sandbox_body("bad-mode", operatingMode="Paused")
    assert "operatingMode" in rejected(lambda: objs.create(SANDBOX, bad_mode))
    no_containers = {"metadata": {"name": "empty"}, "spec": {"podTemplate": {"spec": {"containers": []}}}}
    assert "containers" in rejected(lambda: objs.create(SANDBOX, no_containers))
    pool = {"metadata": {"name": "neg"}, "spec": {"replicas": -1, "sandboxTemplateRef": {"name": "t"}}}
    assert "replicas" in rejected(lambda: objs.create(POOL, pool))
    label = {"warmPoolRef": {"name": "p"}, "additionalPodMetadata": {"labels": {"k": "v" * 64}}}
    message = rejected(lambda: objs.create(CLAIM, {"metadata": {"name": "long-label"}, "spec": label}))
    assert "additionalPodMetadata label values must be at most 63 characters" in message


def test_volume_claim_templates_are_immutable(objs: Objects) -> None:
    vct = [{"metadata": {"name": "work"}, "spec": {"accessModes": ["ReadWriteOnce"]}}]
    created = objs.create(SANDBOX, sandbox_body("vols", volumeClaimTemplates=vct, operatingMode="Suspended"))
    assert created["spec"]["shutdownPolicy"] == "Retain"
    changed = [{"metadata": {"name": "other"}, "spec": {"accessModes": ["ReadWriteOnce"]}}]
    message = rejected(lambda: objs.patch(SANDBOX, "vols", {"spec": {"volumeClaimTemplates": changed}}))
    assert "spec.volumeClaimTemplates is immutable" in message
    # Other fields stay editable.
    objs.patch(SANDBOX, "vols", {"spec": {"operatingMode": "Running"}})


def test_unknown_pod_fields_are_preserved(objs: Objects) -> None:
    created = objs.create(SANDBOX, sandbox_body("keep", operatingMode="Suspended"))
    container = created["spec"]["podTemplate"]["spec"]["containers"][0]
    assert container["readinessProbe"] == {"tcpSocket": {"port": 8888}}


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="needs kubectl")
def test_kubectl_columns_short_names_and_explain(objs: Objects, kubeconfig: str) -> None:
    objs.create(SANDBOX, sandbox_body("shown", operatingMode="Suspended"))
    env = {**os.environ, "KUBECONFIG": kubeconfig}

    def kubectl(*args: str) -> str:
        return subprocess.run(["kubectl", *args], env=env, check=True, capture_output=True, text=True).stdout

    header = kubectl("get", "sbx", "-n", objs.namespace).splitlines()[0].split()
    assert header == ["NAME", "READY", "REASON", "AGE"]
    assert kubectl("get", "sandbox", "-n", objs.namespace, "-o", "name").split() == [
        "sandbox.agents.x-k8s.io/shown"
    ]
    assert kubectl("get", "sandbox", "shown", "-n", objs.namespace, "-o", "name").strip() == (
        "sandbox.agents.x-k8s.io/shown"
    )
    explained = kubectl("explain", "sandboxclaims.spec.sandboxTemplateRef")
    assert "v1alpha1 form" in explained
    categories = kubectl("api-resources", "--categories=agent-sandbox", "-o", "name").split()
    assert sorted(categories) == sorted(
        [
            "sandboxes.agents.x-k8s.io",
            "sandboxclaims.extensions.agents.x-k8s.io",
            "sandboxtemplates.extensions.agents.x-k8s.io",
            "sandboxwarmpools.extensions.agents.x-k8s.io",
        ]
    )
