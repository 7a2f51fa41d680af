"""Proof that the integration harness is a real Kubernetes: admission, scheduling, GC, and kopf."""

from __future__ import annotations

import contextlib
import uuid
from typing import Any

import kopf
import pytest
from kopf.testing import KopfRunner
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tests.support.controlplane import absent, wait_for

pytestmark = pytest.mark.integration

GROUP = "harness.shadow.dev"


def _crd(plural: str) -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {"plural": plural, "singular": plural[:-1], "kind": plural[:-1].capitalize()},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "properties": {
                                "spec": {
                                    "type": "object",
                                    "required": ["size"],
                                    "properties": {"size": {"type": "integer", "minimum": 1}},
                                    "x-kubernetes-validations": [
                                        {"rule": "self.size <= 10", "message": "size must be at most 10"}
                                    ],
                                },
                                "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
                            },
                        }
                    },
                }
            ],
        },
    }


@pytest.fixture(scope="module")
def widgets_crd(k8s_api: client.ApiClient) -> str:
    ext = client.ApiextensionsV1Api(k8s_api)
    plural = "widgets"
    try:
        ext.create_custom_resource_definition(_crd(plural))
    except ApiException as e:
        if e.status != 409:
            raise

    def established() -> bool:
        crd = ext.read_custom_resource_definition(f"{plural}.{GROUP}")
        return any(c.type == "Established" and c.status == "True" for c in crd.status.conditions or [])

    wait_for(established, timeout=30, what="the widgets CRD to be Established")
    return plural


def test_invalid_custom_object_rejected_with_validation_message(
    k8s_api: client.ApiClient, namespace: str, widgets_crd: str
) -> None:
    custom = client.CustomObjectsApi(k8s_api)
    body = {
        "apiVersion": f"{GROUP}/v1",
        "kind": "Widget",
        "metadata": {"name": "too-big"},
        "spec": {"size": 11},
    }
    with pytest.raises(ApiException) as err:
        custom.create_namespaced_custom_object(GROUP, "v1", namespace, widgets_crd, body)
    assert err.value.status == 422
    assert "size must be at most 10" in err.value.body

    body["spec"] = {"size": 0}
    with pytest.raises(ApiException) as err:
        custom.create_namespaced_custom_object(GROUP, "v1", namespace, widgets_crd, body)
    assert "should be greater than or equal to 1" in err.value.body

    body["spec"] = {"size": 3}
    created = custom.create_namespaced_custom_object(GROUP, "v1", namespace, widgets_crd, body)
    assert created["spec"]["size"] == 3


def test_pod_is_scheduled_and_becomes_ready(k8s_api: client.ApiClient, namespace: str) -> None:
    core = client.CoreV1Api(k8s_api)
    pod = client.V1Pod(
        metadata=client.V1ObjectMeta(name="hello"),
        spec=client.V1PodSpec(containers=[client.V1Container(name="main", image="busybox")]),
    )
    core.create_namespaced_pod(namespace, pod)

    def ready() -> bool:
        p = core.read_namespaced_pod("hello", namespace)
        conditions = {c.type: c.status for c in p.status.conditions or []}
        return p.status.phase == "Running" and conditions.get("Ready") == "True" and bool(p.status.pod_ip)

    wait_for(ready, timeout=60, what="pod hello to be Running and Ready")
    assert core.read_namespaced_pod("hello", namespace).spec.node_name.startswith("kwok-node-")


def test_garbage_collector_removes_dependents(k8s_api: client.ApiClient, namespace: str) -> None:
    core = client.CoreV1Api(k8s_api)
    owner = core.create_namespaced_config_map(
        namespace, client.V1ConfigMap(metadata=client.V1ObjectMeta(name="owner"))
    )
    ref = client.V1OwnerReference(api_version="v1", kind="ConfigMap", name="owner", uid=owner.metadata.uid)
    core.create_namespaced_secret(
        namespace, client.V1Secret(metadata=client.V1ObjectMeta(name="dependent", owner_references=[ref]))
    )
    core.delete_namespaced_config_map("owner", namespace)

    wait_for(
        lambda: absent(lambda: core.read_namespaced_secret("dependent", namespace)),
        timeout=60,
        what="the garbage collector to delete the dependent secret",
    )


def test_kopf_handler_runs_against_the_cluster(
    k8s_api: client.ApiClient, namespace: str, widgets_crd: str
) -> None:
    registry = kopf.OperatorRegistry()
    marker = uuid.uuid4().hex

    # A private registry has none of kopf's default handlers, login included. kopf's own kubeconfig reader
    # looks at KUBECONFIG when called (the client library's reader fixed its default path at import time).
    @kopf.on.login(registry=registry)
    def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
        return kopf.login_with_kubeconfig(**kwargs)

    @kopf.on.create(GROUP, "v1", widgets_crd, registry=registry)
    def on_create(spec: kopf.Spec, patch: kopf.Patch, **_: Any) -> None:
        patch.status["doubled"] = spec["size"] * 2
        patch.status["marker"] = marker

    custom = client.CustomObjectsApi(k8s_api)
    args = ["run", "--standalone", "--namespace", namespace, "--verbose"]
    # `kopf run` with an explicit registry makes it the process-wide default; give the default back so the
    # operator's own handlers (registered at import) are what later in-process runs see.
    previous_default = kopf.get_default_registry()
    with contextlib.ExitStack() as restore:
        restore.callback(kopf.set_default_registry, previous_default)
        runner = restore.enter_context(KopfRunner(args, registry=registry, timeout=60))
        body = {"apiVersion": f"{GROUP}/v1", "kind": "Widget", "metadata": {"name": "w"}, "spec": {"size": 4}}
        custom.create_namespaced_custom_object(GROUP, "v1", namespace, widgets_crd, body)

        def handled() -> bool:
            obj = custom.get_namespaced_custom_object(GROUP, "v1", namespace, widgets_crd, "w")
            return obj.get("status", {}).get("marker") == marker

        wait_for(handled, timeout=60, what="the kopf handler to patch the widget's status")
        obj = custom.get_namespaced_custom_object(GROUP, "v1", namespace, widgets_crd, "w")
        assert obj["status"]["doubled"] == 8
        custom.delete_namespaced_custom_object(GROUP, "v1", namespace, widgets_crd, "w")
    assert kopf.get_default_registry() is previous_default
    assert runner.exit_code == 0, runner.output
    assert runner.exception is None
