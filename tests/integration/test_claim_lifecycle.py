"""SandboxClaim controller: cold start, the v1alpha1 form Amicable sends, missing referents, expiry."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from kubernetes import watch
from prometheus_client import REGISTRY
from shadow_operator.api import constants as c

from tests.support.controlplane import wait_for
from tests.support.sandbox_operator import (
    CLAIM,
    POOL,
    SANDBOX,
    TEMPLATE,
    Objects,
    ready,
    template_body,
)

pytestmark = pytest.mark.integration


def latency_count(namespace: str) -> float:
    value = REGISTRY.get_sample_value(
        "agent_sandbox_claim_startup_latency_ms_count", {"namespace": namespace, "launch_type": "cold"}
    )
    return value or 0.0


def test_amicable_v1alpha1_claim_gets_a_ready_v1alpha1_sandbox_of_the_same_name(objs: Objects) -> None:
    objs.create(TEMPLATE, template_body("amicable-sandbox"), version="v1alpha1")
    name = "amicable-0a1b2c3d"
    objs.create(
        CLAIM,
        {"metadata": {"name": name}, "spec": {"sandboxTemplateRef": {"name": "amicable-sandbox"}}},
        version="v1alpha1",
    )
    # What Amicable does: watch the agents.x-k8s.io/v1alpha1 Sandbox named like the claim (field selector on
    # the name) until its Ready condition is True.
    sandbox = None
    stream = watch.Watch()
    for event in stream.stream(
        objs.custom.list_namespaced_custom_object,
        "agents.x-k8s.io",
        "v1alpha1",
        objs.namespace,
        "sandboxes",
        field_selector=f"metadata.name={name}",
        timeout_seconds=60,
    ):
        if ready(event["object"]):
            sandbox = event["object"]
            stream.stop()
    assert sandbox is not None, "the v1alpha1 Sandbox never became Ready"
    assert sandbox["apiVersion"] == "agents.x-k8s.io/v1alpha1"
    assert sandbox["status"]["serviceFQDN"] == f"{name}.{objs.namespace}.svc.cluster.local"
    claim = objs.wait_condition(CLAIM, name, "True", version="v1alpha1")
    assert claim["status"]["sandbox"]["name"] == name
    assert claim["status"]["sandbox"]["podIPs"] == sandbox["status"]["podIPs"]
    owner = sandbox["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["uid"], owner["controller"]) == (
        "SandboxClaim",
        claim["metadata"]["uid"],
        True,
    )
    assert sandbox["metadata"]["labels"][c.LABEL_LAUNCH_TYPE] == c.LAUNCH_COLD


def test_v1alpha1_template_without_service_gets_the_headless_service_amicable_dials(objs: Objects) -> None:
    """Amicable's chart declares its v1alpha1 template without `service` and dials <claim>.<ns>.svc:8888."""
    body = template_body("amicable-chart")
    del body["spec"]["service"]
    objs.create(TEMPLATE, body, version="v1alpha1")
    assert (objs.get(TEMPLATE, "amicable-chart") or {})["spec"]["service"] is True, "defaulted at admission"
    v1beta1 = template_body("plain")
    del v1beta1["spec"]["service"]
    objs.create(TEMPLATE, v1beta1)
    assert "service" not in (objs.get(TEMPLATE, "plain") or {})["spec"], "v1beta1 keeps it unset"

    name = "amicable-5e6f7a8b"
    objs.create(
        CLAIM,
        {"metadata": {"name": name}, "spec": {"sandboxTemplateRef": {"name": "amicable-chart"}}},
        version="v1alpha1",
    )
    objs.wait_condition(CLAIM, name, "True")
    service = objs.core.read_namespaced_service(name, objs.namespace)
    assert service.spec.cluster_ip == "None"
    assert [p.port for p in service.spec.ports if p.name == "runtime"] == [8888]


def test_cold_claim_via_warm_pool_ref_with_empty_pool(objs: Objects) -> None:
    objs.create(TEMPLATE, template_body("tpl"))
    objs.create(
        POOL, {"metadata": {"name": "empty"}, "spec": {"replicas": 0, "sandboxTemplateRef": {"name": "tpl"}}}
    )
    before = latency_count(objs.namespace)
    requested = (datetime.now(UTC) - timedelta(seconds=2)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    objs.create(
        CLAIM,
        {
            "metadata": {"name": "cold", "annotations": {c.ANNOTATION_CLIENT_FIRST_REQUESTED: requested}},
            "spec": {"warmPoolRef": {"name": "empty"}, "additionalPodMetadata": {"labels": {"team": "a"}}},
        },
    )
    claim = objs.wait_condition(CLAIM, "cold", "True", c.REASON_DEPENDENCIES_READY)
    assert claim["status"]["sandbox"]["name"] == "cold"
    pod = objs.core.read_namespaced_pod("cold", objs.namespace)
    assert pod.metadata.labels["team"] == "a"
    assert pod.metadata.labels[c.LABEL_CLAIM_UID] == claim["metadata"]["uid"]
    wait_for(lambda: latency_count(objs.namespace) == before + 1, timeout=10, what="startup latency observed")
    total = REGISTRY.get_sample_value(
        "agent_sandbox_claim_startup_latency_ms_sum", {"namespace": objs.namespace, "launch_type": "cold"}
    )
    assert total is not None and total >= 2000  # measured from client-first-requested-at, 2 s in the past


def test_missing_template_recovers_when_it_appears(objs: Objects) -> None:
    objs.create(CLAIM, {"metadata": {"name": "early"}, "spec": {"sandboxTemplateRef": {"name": "later"}}})
    claim = objs.wait_condition(CLAIM, "early", "False", c.REASON_TEMPLATE_NOT_FOUND)
    message = next(cond["message"] for cond in claim["status"]["conditions"] if cond["type"] == "Ready")
    assert message == "SandboxTemplate 'later' not found"
    objs.create(TEMPLATE, template_body("later"))
    objs.wait_condition(CLAIM, "early", "True", timeout=60)


def test_missing_warm_pool_recovers_when_it_appears(objs: Objects) -> None:
    objs.create(TEMPLATE, template_body("tpl"))
    objs.create(CLAIM, {"metadata": {"name": "waiting"}, "spec": {"warmPoolRef": {"name": "pool"}}})
    objs.wait_condition(CLAIM, "waiting", "False", c.REASON_WARM_POOL_NOT_FOUND)
    objs.create(
        POOL, {"metadata": {"name": "pool"}, "spec": {"replicas": 0, "sandboxTemplateRef": {"name": "tpl"}}}
    )
    objs.wait_condition(CLAIM, "waiting", "True", timeout=60)


def test_env_rejected_by_template_policy(objs: Objects) -> None:
    objs.create(TEMPLATE, template_body("strict"))
    spec = {"sandboxTemplateRef": {"name": "strict"}, "env": [{"name": "A", "value": "1"}]}
    objs.create(CLAIM, {"metadata": {"name": "envy"}, "spec": spec})
    objs.wait_condition(CLAIM, "envy", "False", c.REASON_ENV_INJECTION_REJECTED)
    assert objs.get(SANDBOX, "envy") is None


@pytest.mark.parametrize("policy", ["Retain", "Delete", "DeleteForeground"])
def test_claim_expiry(objs: Objects, policy: str) -> None:
    objs.create(TEMPLATE, template_body("tpl"))
    name = f"short-{policy.lower()}"
    objs.create(CLAIM, {"metadata": {"name": name}, "spec": {"sandboxTemplateRef": {"name": "tpl"}}})
    objs.wait_condition(CLAIM, name, "True")
    soon = (datetime.now(UTC) + timedelta(seconds=2)).strftime("%Y-%m-%dT%H:%M:%SZ")
    objs.patch(CLAIM, name, {"spec": {"lifecycle": {"shutdownTime": soon, "shutdownPolicy": policy}}})
    if policy == "Retain":
        objs.wait_condition(CLAIM, name, "False", c.REASON_CLAIM_EXPIRED, timeout=60)
    else:
        objs.wait_gone(CLAIM, name, timeout=60)
    objs.wait_gone(SANDBOX, name, timeout=60)


def test_finished_pod_is_mirrored_and_ttl_deletes_the_claim(objs: Objects) -> None:
    objs.create(TEMPLATE, template_body("job"))
    lifecycle = {"ttlSecondsAfterFinished": 2, "shutdownPolicy": "Delete"}
    spec = {"sandboxTemplateRef": {"name": "job"}, "lifecycle": lifecycle}
    objs.create(CLAIM, {"metadata": {"name": "oneshot"}, "spec": spec})
    objs.wait_condition(CLAIM, "oneshot", "True")
    pod_uid = objs.core.read_namespaced_pod("oneshot", objs.namespace).metadata.uid
    # kwok keeps whatever terminal phase it is given: play the kubelet reporting a completed container.
    objs.core.patch_namespaced_pod_status(
        "oneshot",
        objs.namespace,
        {"status": {"phase": "Succeeded", "conditions": [{"type": "Ready", "status": "False"}]}},
    )
    sandbox = objs.wait_condition(SANDBOX, "oneshot", "True", c.REASON_POD_SUCCEEDED, type_="Finished")
    ready = next(cond for cond in sandbox["status"]["conditions"] if cond["type"] == "Ready")
    assert (ready["status"], ready["reason"]) == ("False", c.REASON_POD_SUCCEEDED)
    # A finished pod is reported, not replaced behind the user's back.
    pod = objs.core.read_namespaced_pod("oneshot", objs.namespace)
    assert (pod.metadata.uid, pod.status.phase) == (pod_uid, "Succeeded")
    objs.wait_condition(CLAIM, "oneshot", "True", c.REASON_POD_SUCCEEDED, type_="Finished")
    objs.wait_gone(CLAIM, "oneshot", timeout=30)


def test_claim_is_stamped_when_the_controller_first_sees_it(objs: Objects) -> None:
    """agents.x-k8s.io/controller-first-observed-at, RFC 3339 with sub-second precision, by the time the claim is
    Ready (upstream's TestSandboxClaimObservabilityAnnotation)."""
    objs.create(TEMPLATE, template_body("tpl"))
    before = datetime.now(UTC)
    objs.create(CLAIM, {"metadata": {"name": "seen"}, "spec": {"sandboxTemplateRef": {"name": "tpl"}}})
    claim = objs.wait_condition(CLAIM, "seen", "True")
    stamp = claim["metadata"]["annotations"][c.ANNOTATION_CONTROLLER_FIRST_OBSERVED]
    observed = datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    assert stamp.endswith("Z") and "." in stamp
    assert before - timedelta(seconds=1) <= observed <= datetime.now(UTC)
    # Stamped once: later passes keep it.
    objs.patch(CLAIM, "seen", {"metadata": {"labels": {"touched": "yes"}}})
    objs.wait(CLAIM, "seen", lambda o: o["metadata"]["labels"].get("touched") == "yes", what="relabelled")
    again = objs.get(CLAIM, "seen")
    assert (
        again is not None
        and again["metadata"]["annotations"][c.ANNOTATION_CONTROLLER_FIRST_OBSERVED] == stamp
    )


def finish_pod(objs: Objects, name: str) -> None:
    """kwok keeps whatever terminal phase it is given: play the kubelet reporting a completed container."""
    wait_for(lambda: objs.core.read_namespaced_pod(name, objs.namespace), timeout=60, what=f"pod {name}")
    objs.core.patch_namespaced_pod_status(
        name,
        objs.namespace,
        {"status": {"phase": "Succeeded", "conditions": [{"type": "Ready", "status": "False"}]}},
    )


def test_ttl_after_finished_with_retain_keeps_the_claim_and_its_finished_condition(objs: Objects) -> None:
    """shutdownPolicy applies to ttlSecondsAfterFinished too: Retain deletes the Sandbox and keeps the claim,
    Ready=False ClaimExpired, Finished kept (upstream's TestSandboxClaimTTLZeroRetainPreservesFinishedCondition-
    DuringCleanup); the claim itself was deleted before."""
    objs.create(TEMPLATE, template_body("job"))
    lifecycle = {"ttlSecondsAfterFinished": 0, "shutdownPolicy": "Retain"}
    objs.create(
        CLAIM,
        {
            "metadata": {"name": "kept"},
            "spec": {"sandboxTemplateRef": {"name": "job"}, "lifecycle": lifecycle},
        },
    )
    objs.wait_condition(CLAIM, "kept", "True")
    finish_pod(objs, "kept")
    objs.wait_gone(SANDBOX, "kept", timeout=60)
    claim = objs.wait_condition(CLAIM, "kept", "False", c.REASON_CLAIM_EXPIRED, timeout=30)
    finished = next(cond for cond in claim["status"]["conditions"] if cond["type"] == c.COND_FINISHED)
    assert (finished["status"], finished["reason"]) == ("True", c.REASON_POD_SUCCEEDED)
    assert claim["metadata"].get("deletionTimestamp") is None


def test_ttl_after_finished_with_delete_foreground_deletes_in_the_foreground(objs: Objects) -> None:
    """DeleteForeground after ttlSecondsAfterFinished: the claim waits for its Sandbox (upstream's
    TestSandboxClaimTTLDeleteForegroundAfterFinished); it was deleted in the background before."""
    objs.create(TEMPLATE, template_body("job"))
    lifecycle = {"ttlSecondsAfterFinished": 1, "shutdownPolicy": "DeleteForeground"}
    objs.create(
        CLAIM,
        {"metadata": {"name": "fg"}, "spec": {"sandboxTemplateRef": {"name": "job"}, "lifecycle": lifecycle}},
    )
    objs.wait_condition(CLAIM, "fg", "True")
    hold = "tests.shadow.dev/hold"
    objs.patch(SANDBOX, "fg", {"metadata": {"finalizers": [hold]}})
    finish_pod(objs, "fg")
    claim = objs.wait(
        CLAIM, "fg", lambda o: bool(o["metadata"].get("deletionTimestamp")), timeout=60, what="claim deleting"
    )
    assert "foregroundDeletion" in claim["metadata"]["finalizers"]
    objs.wait(
        SANDBOX,
        "fg",
        lambda o: bool(o["metadata"].get("deletionTimestamp")),
        timeout=60,
        what="sandbox deleting",
    )
    objs.patch(SANDBOX, "fg", {"metadata": {"finalizers": None}})
    objs.wait_gone(SANDBOX, "fg", timeout=60)
    objs.wait_gone(CLAIM, "fg", timeout=60)


@pytest.mark.parametrize(
    ("names", "message"),
    [
        ([None], "invalid volume claim templates: claim: name at index 0 is empty"),
        (["data", "data"], "invalid volume claim templates: claim: duplicate name 'data'"),
    ],
)
def test_claim_volume_claim_template_without_a_unique_name_is_reported(
    objs: Objects, names: list[str | None], message: str
) -> None:
    """Accepted by the API server and reported on the claim (Ready=False VolumeClaimTemplatesError), as upstream
    does (its TestCreateSandboxClaimVolumeClaimTemplates); an empty name was refused at admission before."""
    objs.create(TEMPLATE, template_body("vols", volumeClaimTemplatesPolicy="Allowed"))
    pvc_spec = {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}
    templates = [{"metadata": {"name": n} if n else {}, "spec": pvc_spec} for n in names]
    spec = {"sandboxTemplateRef": {"name": "vols"}, "volumeClaimTemplates": templates}
    objs.create(CLAIM, {"metadata": {"name": "vct"}, "spec": spec})
    claim = objs.wait_condition(CLAIM, "vct", "False", c.REASON_VOLUME_CLAIM_TEMPLATES_ERROR)
    ready = next(cond for cond in claim["status"]["conditions"] if cond["type"] == "Ready")
    assert ready["message"] == message
    assert objs.get(SANDBOX, "vct") is None
