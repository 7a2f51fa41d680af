"""Sandbox controller on the real control plane (kwok nodes run the pods)."""

from __future__ import annotations

import base64
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from kubernetes import client
from shadow_operator.api import constants as c
from shadow_operator.api import naming

from tests.support.controlplane import wait_for
from tests.support.sandbox_operator import SANDBOX, Objects, sandbox_body
from tests.support.volumes import persistent_volume

pytestmark = pytest.mark.integration


def conditions(obj: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {cond["type"]: cond for cond in obj["status"]["conditions"]}


def test_sandbox_becomes_ready_with_children_and_status(objs: Objects) -> None:
    objs.create(SANDBOX, sandbox_body("box"))
    sandbox = objs.wait_condition(SANDBOX, "box", "True", c.REASON_DEPENDENCIES_READY)
    status = sandbox["status"]
    ns = objs.namespace
    assert status["service"] == "box"
    assert status["serviceFQDN"] == f"box.{ns}.svc.cluster.local"
    assert status["runtimeURL"] == f"http://box.{ns}.svc.cluster.local:8888"
    assert status["runtimeTokenSecret"] == "box-runtime-token"
    assert status["selector"] == f"{c.LABEL_SANDBOX_NAME_HASH}={naming.name_hash('box')}"
    assert status["podIPs"] and status["nodeName"].startswith("kwok-node-")
    ready = conditions(sandbox)["Ready"]
    assert ready["observedGeneration"] == sandbox["metadata"]["generation"]
    assert ready["lastTransitionTime"]
    assert conditions(sandbox)["Suspended"]["reason"] == c.REASON_NOT_SUSPENDED
    assert "previewURL" not in status  # no preview domain configured

    pod = objs.core.read_namespaced_pod("box", ns)
    assert pod.metadata.owner_references[0].uid == sandbox["metadata"]["uid"]
    assert pod.metadata.labels[c.LABEL_SANDBOX_NAME_HASH] == naming.name_hash("box")
    assert pod.spec.automount_service_account_token is False
    runtime = pod.spec.containers[0]
    assert any(m.mount_path == c.RUNTIME_TOKEN_DIR for m in runtime.volume_mounts)
    assert {e.name: e.value for e in runtime.env}[c.RUNTIME_TOKEN_ENV] == c.RUNTIME_TOKEN_PATH
    assert runtime.security_context.allow_privilege_escalation is False
    assert runtime.security_context.capabilities.drop == ["ALL"]

    service = objs.core.read_namespaced_service("box", ns)
    assert service.spec.cluster_ip == "None"
    assert {p.name: p.port for p in service.spec.ports} == {"runtime": 8888, "preview": 3000}

    secret = objs.core.read_namespaced_secret("box-runtime-token", ns)
    token = base64.b64decode(secret.data["token"]).decode()
    assert len(token) >= 32
    assert token not in str(sandbox["status"])
    events = objs.core.list_namespaced_event(ns, field_selector="involvedObject.name=box").items
    assert token not in " ".join(e.message or "" for e in events)
    assert {"PodCreated", c.REASON_DEPENDENCIES_READY} <= {e.reason for e in events}


def test_reserved_labels_are_dropped_and_hash_is_not_overridable(objs: Objects) -> None:
    body = sandbox_body("labels")
    body["spec"]["podTemplate"]["metadata"]["labels"] = {
        "app": "x",
        c.LABEL_SANDBOX_NAME_HASH: "hijacked",
        "extensions.agents.x-k8s.io/evil": "1",
    }
    objs.create(SANDBOX, body)
    objs.wait_condition(SANDBOX, "labels")
    labels = objs.core.read_namespaced_pod("labels", objs.namespace).metadata.labels
    assert labels["app"] == "x"
    assert labels[c.LABEL_SANDBOX_NAME_HASH] == naming.name_hash("labels")
    assert "extensions.agents.x-k8s.io/evil" not in labels


def test_deleted_pod_is_recreated_exactly_once(objs: Objects) -> None:
    objs.create(SANDBOX, sandbox_body("again"))
    first = objs.wait_condition(SANDBOX, "again")
    old_uid = objs.core.read_namespaced_pod("again", objs.namespace).metadata.uid
    objs.core.delete_namespaced_pod("again", objs.namespace, grace_period_seconds=0)

    def new_pod_ready() -> bool:
        pod = objs.core.read_namespaced_pod("again", objs.namespace)  # not found yet: wait_for waits
        return pod.metadata.uid != old_uid and pod.status.phase == "Running"

    wait_for(new_pod_ready, timeout=60, what="a replacement pod")
    objs.wait_condition(SANDBOX, "again")
    owned = [p for p in objs.pods() if p.metadata.owner_references[0].uid == first["metadata"]["uid"]]
    assert len(owned) == 1


@pytest.mark.parametrize("policy", ["Retain", "Delete"])
def test_shutdown_time(objs: Objects, policy: str) -> None:
    name = f"expire-{policy.lower()}"
    objs.create(SANDBOX, sandbox_body(name))
    objs.wait_condition(SANDBOX, name)
    soon = (datetime.now(UTC) + timedelta(seconds=3)).strftime("%Y-%m-%dT%H:%M:%SZ")
    objs.patch(SANDBOX, name, {"spec": {"shutdownTime": soon, "shutdownPolicy": policy}})
    if policy == "Delete":
        objs.wait_gone(SANDBOX, name, timeout=60)
    else:
        sandbox = objs.wait_condition(SANDBOX, name, "False", c.REASON_SANDBOX_EXPIRED, timeout=60)
        assert "podIPs" not in sandbox["status"] and "runtimeURL" not in sandbox["status"]
    wait_for(
        lambda: not objs.pods(f"{c.LABEL_SANDBOX_NAME_HASH}={naming.name_hash(name)}"),
        timeout=60,
        what="pod gone",
    )
    wait_for(
        lambda: (
            not objs.core.list_namespaced_service(
                objs.namespace, field_selector=f"metadata.name={name}"
            ).items
        ),
        timeout=60,
        what="service gone",
    )


def test_expiry_keeps_finished_and_clears_the_live_status(objs: Objects) -> None:
    """After shutdownTime (Retain) the status keeps the conditions, Finished included, and drops what described
    the live children: selector, Service, PodScheduled (upstream's TestSandboxRetainedExpiryPreservesFinished-
    Condition and TestSandboxShutdownTime)."""
    objs.create(SANDBOX, sandbox_body("done"))
    objs.wait_condition(SANDBOX, "done")
    # kwok keeps whatever terminal phase it is given: play the kubelet reporting a completed container.
    objs.core.patch_namespaced_pod_status(
        "done",
        objs.namespace,
        {"status": {"phase": "Succeeded", "conditions": [{"type": "Ready", "status": "False"}]}},
    )
    objs.wait_condition(SANDBOX, "done", "True", c.REASON_POD_SUCCEEDED, type_="Finished")
    soon = (datetime.now(UTC) + timedelta(seconds=2)).strftime("%Y-%m-%dT%H:%M:%SZ")
    objs.patch(SANDBOX, "done", {"spec": {"shutdownTime": soon, "shutdownPolicy": "Retain"}})
    sandbox = objs.wait_condition(SANDBOX, "done", "False", c.REASON_SANDBOX_EXPIRED, timeout=60)
    found = conditions(sandbox)
    assert (found["Finished"]["status"], found["Finished"]["reason"]) == ("True", c.REASON_POD_SUCCEEDED)
    assert found["Ready"]["message"] == "Sandbox has expired"
    assert c.COND_POD_SCHEDULED not in found
    for gone in ("selector", "service", "serviceFQDN", "podIPs", "nodeName", "runtimeURL"):
        assert gone not in sandbox["status"], gone


def test_suspended_sandbox_leaves_an_unowned_pod_of_its_name_alone(objs: Objects) -> None:
    """Suspending cannot complete while a Pod it does not own holds the name: Suspended=False PodNotOwned, the Pod
    untouched (upstream's TestSandboxSuspensionBlockedByUnownedPodConflict; it read Suspended=True before)."""
    ns = objs.namespace
    objs.core.create_namespaced_pod(
        ns, {"metadata": {"name": "held"}, "spec": {"containers": [{"name": "c", "image": "pause"}]}}
    )
    objs.create(SANDBOX, sandbox_body("held", operatingMode="Suspended"))
    sandbox = objs.wait_condition(SANDBOX, "held", "False", c.REASON_POD_NOT_OWNED, type_="Suspended")
    found = conditions(sandbox)
    assert found["Suspended"]["message"] == "Refused to delete pod because it is not owned by this sandbox"
    assert (found["Ready"]["reason"], found["Ready"]["message"]) == (
        c.REASON_SANDBOX_SUSPENDED,
        "Sandbox is suspending",
    )
    assert sandbox["status"]["service"] == "held"
    pod = objs.core.read_namespaced_pod("held", ns)
    assert not pod.metadata.owner_references and not pod.metadata.deletion_timestamp
    # Once the name is free, suspension completes.
    objs.core.delete_namespaced_pod("held", ns, grace_period_seconds=0)
    objs.wait_condition(SANDBOX, "held", "True", c.REASON_POD_TERMINATED, type_="Suspended", timeout=60)


def test_suspend_and_resume_keep_the_volumes(objs: Objects, k8s_api: client.ApiClient) -> None:
    storage_class = f"manual-{uuid.uuid4().hex[:6]}"
    pv_name = f"pv-{objs.namespace}"[:63]
    objs.core.create_persistent_volume(
        persistent_volume(pv_name, "/tmp/shadow-pv", storage_class=storage_class, capacity="1Gi")
    )
    try:
        vct = [
            {
                "metadata": {"name": "work"},
                "spec": {
                    "accessModes": ["ReadWriteOnce"],
                    "storageClassName": storage_class,
                    "resources": {"requests": {"storage": "1Gi"}},
                },
            }
        ]
        objs.create(SANDBOX, sandbox_body("sleepy", volumeClaimTemplates=vct))
        objs.wait_condition(SANDBOX, "sleepy", timeout=90)
        pvc = objs.core.read_namespaced_persistent_volume_claim("work-sleepy", objs.namespace)
        pod = objs.core.read_namespaced_pod("sleepy", objs.namespace)
        assert any(
            v.persistent_volume_claim and v.persistent_volume_claim.claim_name == "work-sleepy"
            for v in pod.spec.volumes
        )

        objs.patch(SANDBOX, "sleepy", {"spec": {"operatingMode": "Suspended"}})
        objs.wait_condition(SANDBOX, "sleepy", "True", c.REASON_POD_TERMINATED, type_="Suspended")
        suspended = objs.wait_condition(SANDBOX, "sleepy", "False", c.REASON_SANDBOX_SUSPENDED)
        assert "podIPs" not in suspended["status"]
        assert not objs.pods(f"{c.LABEL_SANDBOX_NAME_HASH}={naming.name_hash('sleepy')}")
        same = objs.core.read_namespaced_persistent_volume_claim("work-sleepy", objs.namespace)
        assert same.metadata.uid == pvc.metadata.uid

        objs.patch(SANDBOX, "sleepy", {"spec": {"operatingMode": "Running"}})
        objs.wait_condition(SANDBOX, "sleepy", "True", c.REASON_DEPENDENCIES_READY, timeout=90)
        resumed = objs.core.read_namespaced_pod("sleepy", objs.namespace)
        assert resumed.metadata.uid != pod.metadata.uid
        claims = [
            v.persistent_volume_claim.claim_name for v in resumed.spec.volumes if v.persistent_volume_claim
        ]
        assert claims == ["work-sleepy"]
        assert (
            objs.core.read_namespaced_persistent_volume_claim("work-sleepy", objs.namespace).metadata.uid
            == pvc.metadata.uid
        )
    finally:
        objs.core.delete_persistent_volume(pv_name)


def test_v1alpha1_replicas_zero_suspends(objs: Objects) -> None:
    body = sandbox_body("legacy")
    body["spec"]["replicas"] = 0
    objs.create(SANDBOX, body, version="v1alpha1")
    objs.wait_condition(
        SANDBOX, "legacy", "True", c.REASON_POD_TERMINATED, type_="Suspended", version="v1alpha1"
    )


def test_foreign_objects_are_not_taken_over(objs: Objects) -> None:
    ns = objs.namespace
    objs.core.create_namespaced_service(
        ns, {"metadata": {"name": "taken"}, "spec": {"ports": [{"port": 80}], "selector": {"app": "other"}}}
    )
    objs.create(SANDBOX, sandbox_body("taken"))
    sandbox = objs.wait_condition(SANDBOX, "taken", "False", c.REASON_RECONCILER_ERROR)
    ready = next(cond for cond in sandbox["status"]["conditions"] if cond["type"] == "Ready")
    assert ready["message"] == "Error seen: Service 'taken' exists and is not owned by this Sandbox"
    assert objs.core.read_namespaced_service("taken", ns).spec.selector == {"app": "other"}
    # Once the owner of the name removes it, the sandbox recovers by itself.
    objs.core.delete_namespaced_service("taken", ns)
    objs.wait_condition(SANDBOX, "taken", "True", timeout=60)


def test_adoptable_unowned_service_is_adopted(objs: Objects) -> None:
    ns = objs.namespace
    objs.core.create_namespaced_service(
        ns,
        {
            "metadata": {"name": "handover", "labels": {c.LABEL_ADOPTABLE: "true"}},
            "spec": {"clusterIP": "None", "ports": [{"port": 80}], "selector": {"app": "other"}},
        },
    )
    objs.create(SANDBOX, sandbox_body("handover"))
    sandbox = objs.wait_condition(SANDBOX, "handover", "True")
    service = objs.core.read_namespaced_service("handover", ns)
    assert service.metadata.owner_references[0].uid == sandbox["metadata"]["uid"]
    assert service.spec.selector == {c.LABEL_SANDBOX_NAME_HASH: naming.name_hash("handover")}


def test_pod_refused_by_the_api_server_is_reported_not_retried_blindly(objs: Objects) -> None:
    body = sandbox_body("badpod")
    body["spec"]["podTemplate"]["spec"]["containers"][0]["name"] = "Not_A_DNS_Label"
    objs.create(SANDBOX, body)
    sandbox = objs.wait_condition(SANDBOX, "badpod", "False", c.REASON_RECONCILER_ERROR)
    ready = next(cond for cond in sandbox["status"]["conditions"] if cond["type"] == "Ready")
    assert ready["message"].startswith("Error seen: Pod rejected by the API server:")
    assert "Traceback" not in ready["message"]
    events = objs.core.list_namespaced_event(
        objs.namespace, field_selector="involvedObject.name=badpod"
    ).items
    assert [e.reason for e in events].count("InvalidPod") == 1
    # Fixing the spec heals the sandbox.
    fixed = body["spec"]["podTemplate"]
    fixed["spec"]["containers"][0]["name"] = "runtime"
    objs.patch(SANDBOX, "badpod", {"spec": {"podTemplate": fixed}})
    objs.wait_condition(SANDBOX, "badpod", "True", timeout=60)


def test_pod_with_a_runtime_class_the_cluster_lacks_is_reported(objs: Objects) -> None:
    """The API server's RuntimeClass admission refuses the Pod (403): Ready says which class is missing, once as an
    Event, and creating the class heals the sandbox (its Pod then runs with it)."""
    runtime_class = f"sandboxed-{uuid.uuid4().hex[:6]}"
    body = sandbox_body("otherkernel")
    body["spec"]["podTemplate"]["spec"]["runtimeClassName"] = runtime_class
    objs.create(SANDBOX, body)
    sandbox = objs.wait_condition(SANDBOX, "otherkernel", "False", c.REASON_RECONCILER_ERROR)
    ready = conditions(sandbox)["Ready"]
    assert ready["message"].startswith("Error seen: Pod rejected by the API server:"), ready
    assert f'RuntimeClass "{runtime_class}" not found' in ready["message"], ready
    events = objs.core.list_namespaced_event(
        objs.namespace, field_selector="involvedObject.name=otherkernel"
    ).items
    assert [e.reason for e in events].count("InvalidPod") == 1
    node = client.NodeV1Api(objs.api)
    node.create_runtime_class(
        client.V1RuntimeClass(metadata=client.V1ObjectMeta(name=runtime_class), handler="runsc")
    )
    try:
        objs.wait_condition(SANDBOX, "otherkernel", "True", timeout=60)
        pod = objs.core.read_namespaced_pod("otherkernel", objs.namespace)
        assert pod.spec.runtime_class_name == runtime_class
    finally:
        node.delete_runtime_class(runtime_class)
