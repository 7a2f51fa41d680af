"""Idle suspension (spec.autoSuspendPolicy) on the real control plane: kwok runs the Pods, one real runtime on
loopback answers for every sandbox (SHADOW_RUNTIME_API_URL), so its idle clock is the one the operator reads.

The runtime is shared by the module's tests and nobody calls it: it is idle from the start, and each test
controls activity through the annotation shadow.dev/last-activity and its policy's threshold.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, watch
from kubernetes.client.rest import ApiException
from prometheus_client import REGISTRY
from shadow_operator.api import constants as c
from shadow_operator.api import naming

from tests.runtime.conftest import Server
from tests.support.controlplane import wait_for
from tests.support.sandbox_operator import (
    CLAIM,
    ENVIRONMENT,
    POOL,
    SANDBOX,
    TEMPLATE,
    Objects,
    condition,
    in_process_operator,
    install_crds,
    sandbox_body,
    template_body,
)
from tests.support.volumes import bind_volumes, wait_bound

pytestmark = pytest.mark.integration

THRESHOLD = 10  # the smallest the API takes
IDLE_GRACE = 4  # the grace period of an idle suspension's Pod deletion (the chart's default is 3)


@pytest.fixture(scope="module")
def operator(k8s_api: client.ApiClient, runtime: Server) -> Iterator[Any]:
    install_crds(k8s_api)
    with in_process_operator(
        SHADOW_RUNTIME_API_URL=runtime.url, SHADOW_IDLE_SUSPEND_GRACE_SECONDS=str(IDLE_GRACE)
    ) as runner:
        yield runner


def policy(seconds: int = THRESHOLD) -> dict[str, Any]:
    return {"suspendThresholdSeconds": seconds}


def now_rfc3339() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def pod_of(objs: Objects, name: str) -> Any | None:
    pods = objs.pods(f"{c.LABEL_SANDBOX_NAME_HASH}={naming.name_hash(name)}")
    return pods[0] if pods else None


def wait_idle_suspended(objs: Objects, name: str, timeout: float = 60) -> dict[str, Any]:
    suspended = objs.wait_condition(SANDBOX, name, "True", c.REASON_IDLE, type_="Suspended", timeout=timeout)
    assert condition(suspended, "Ready")["reason"] == c.REASON_SUSPENDED
    return suspended


def metric(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_idle_sandbox_is_suspended_and_resumes_on_a_new_request_value(objs: Objects) -> None:
    ns = objs.namespace
    objs.create(SANDBOX, sandbox_body("nap", autoSuspendPolicy=policy()))
    ready = objs.wait_condition(SANDBOX, "nap", timeout=60)
    became_ready = datetime.fromisoformat(
        condition(ready, "Ready")["lastTransitionTime"].replace("Z", "+00:00")
    )
    suspends = metric("shadow_operator_sandbox_suspends_total", namespace=ns, cause="idle")

    suspended = wait_idle_suspended(objs, "nap", timeout=THRESHOLD + 30)
    idle = suspended["status"]["idle"]
    at = datetime.fromisoformat(idle["suspendedAt"].replace("Z", "+00:00"))
    assert (at - became_ready).total_seconds() >= THRESHOLD - 1  # not before the threshold
    assert f"after {THRESHOLD}s without activity" in condition(suspended, "Suspended")["message"]
    assert suspended["spec"]["operatingMode"] == "Running"  # the spec is never written
    wait_for(lambda: pod_of(objs, "nap") is None, timeout=30, what="the idle sandbox's Pod to go")
    assert objs.secret_exists("nap-runtime-token")
    assert metric("shadow_operator_sandbox_suspends_total", namespace=ns, cause="idle") == suspends + 1
    assert metric("shadow_operator_sandboxes_suspended", namespace=ns, cause="idle") >= 1

    objs.annotate(SANDBOX, "nap", {c.ANNOTATION_RESUME_REQUEST: "first"})
    resumed = objs.wait_condition(SANDBOX, "nap", timeout=60)
    assert resumed["status"]["idle"]["resumeRequest"] == "first"
    assert "suspendedAt" not in resumed["status"]["idle"]
    assert condition(resumed, "Suspended")["status"] == "False"
    assert metric("shadow_operator_sandbox_resumes_total", namespace=ns, cause="annotation") >= 1
    assert metric("shadow_operator_sandbox_resume_seconds_count", namespace=ns) >= 1

    # It goes idle again; the value already acted on does not wake it, a new one does.
    wait_idle_suspended(objs, "nap", timeout=THRESHOLD + 30)
    objs.annotate(SANDBOX, "nap", {c.ANNOTATION_RESUME_REQUEST: "first", "unrelated": "change"})
    wait_for(lambda: pod_of(objs, "nap") is None, timeout=30, what="the Pod to stay gone")
    assert condition(objs.get(SANDBOX, "nap") or {}, "Suspended")["reason"] == c.REASON_IDLE


def test_recent_activity_keeps_the_sandbox_running(objs: Objects) -> None:
    objs.create(SANDBOX, sandbox_body("busy", autoSuspendPolicy=policy()))
    objs.wait_condition(SANDBOX, "busy", timeout=60)
    # The router writes the annotation at most every 30 s; here every 2 s for twice the threshold.
    deadline = datetime.now(UTC).timestamp() + 2 * THRESHOLD
    stop = threading.Event()
    while datetime.now(UTC).timestamp() < deadline:
        objs.annotate(SANDBOX, "busy", {c.ANNOTATION_LAST_ACTIVITY: now_rfc3339()})
        box = objs.get(SANDBOX, "busy") or {}
        assert condition(box, "Suspended")["status"] == "False", box.get("status")
        stop.wait(2)
    # Then nobody: suspended about a threshold after the last request.
    wait_idle_suspended(objs, "busy", timeout=THRESHOLD + 30)


def test_activity_in_the_future_counts_as_now(objs: Objects) -> None:
    """A client (or tenant) writing a far-future time cannot keep a sandbox awake for ever."""
    objs.create(
        SANDBOX,
        {
            **sandbox_body("liar", autoSuspendPolicy=policy()),
            "metadata": {"name": "liar", "annotations": {c.ANNOTATION_LAST_ACTIVITY: "2999-01-01T00:00:00Z"}},
        },
    )
    objs.wait_condition(SANDBOX, "liar", timeout=60)
    wait_idle_suspended(objs, "liar", timeout=THRESHOLD + 30)


def test_fifty_resume_requests_create_one_pod(objs: Objects) -> None:
    objs.create(SANDBOX, sandbox_body("crowd", autoSuspendPolicy=policy()))
    objs.wait_condition(SANDBOX, "crowd", timeout=60)
    wait_idle_suspended(objs, "crowd", timeout=THRESHOLD + 30)
    wait_for(lambda: pod_of(objs, "crowd") is None, timeout=30, what="the Pod to go")
    since = objs.core.list_namespaced_pod(objs.namespace).metadata.resource_version

    for n in range(50):
        objs.annotate(SANDBOX, "crowd", {c.ANNOTATION_RESUME_REQUEST: f"request-{n}"})
    resumed = objs.wait_condition(SANDBOX, "crowd", timeout=60)
    wait_for(
        lambda: (objs.get(SANDBOX, "crowd") or {})["status"]["idle"].get("resumeRequest") == "request-49",
        timeout=30,
        what="the last request to be seen",
    )
    assert resumed["spec"]["operatingMode"] == "Running"

    hash_label = f"{c.LABEL_SANDBOX_NAME_HASH}={naming.name_hash('crowd')}"
    created = {
        pod.metadata.uid
        for kind, pod in pod_events(objs, since, label_selector=hash_label)
        if kind == "ADDED"
    }
    assert len(created) == 1, created


def pod_events(objs: Objects, since: str, **selector: str) -> Iterator[tuple[str, Any]]:
    """(type, Pod) of the namespace's Pod events since the resourceVersion `since`, as a watch sees them."""
    stream = watch.Watch().stream(
        objs.core.list_namespaced_pod, objs.namespace, resource_version=since, timeout_seconds=2, **selector
    )
    for event in stream:
        yield event["type"], event["object"]


def test_resume_request_while_the_pod_goes_down_brings_it_back(objs: Objects) -> None:
    """The request comes the moment the suspension is decided: the Pod is being deleted (kwok removes a Pod's
    finalizers, so it cannot be held in Terminating here; the operator's Pod step waits for a terminating Pod
    to be gone before it creates the next one either way)."""
    objs.create(SANDBOX, sandbox_body("race", autoSuspendPolicy=policy()))
    objs.wait_condition(SANDBOX, "race", timeout=60)
    pod = pod_of(objs, "race")
    assert pod is not None
    objs.wait(
        SANDBOX,
        "race",
        lambda box: bool(((box.get("status") or {}).get("idle") or {}).get("suspendedAt")),
        timeout=THRESHOLD + 30,
        what="the idle suspension",
    )
    objs.annotate(SANDBOX, "race", {c.ANNOTATION_RESUME_REQUEST: "during-shutdown"})
    back = objs.wait(
        SANDBOX,
        "race",
        lambda box: (
            box["status"]["idle"].get("resumeRequest") == "during-shutdown"
            and condition(box, "Ready").get("status") == "True"
        ),
        timeout=60,
        what="the sandbox back, Ready",
    )
    assert "suspendedAt" not in back["status"]["idle"]
    new_pod = pod_of(objs, "race")
    assert new_pod is not None and new_pod.metadata.uid != pod.metadata.uid


def deletion_grace(objs: Objects, name: str, since: str) -> int | None:
    """The grace period the Pod of `name` was deleted with (deletionGracePeriodSeconds as the API server set
    it), from a watch since `since`: kwok then removes the Pod at once, so only the watch sees it."""
    for _, pod in pod_events(objs, since, field_selector=f"metadata.name={name}"):
        meta = pod.metadata
        if meta.deletion_timestamp is not None:
            grace: int | None = meta.deletion_grace_period_seconds
            return grace
    return None


def test_idle_suspension_deletes_the_pod_with_a_short_grace_period(objs: Objects) -> None:
    """A process that ignores SIGTERM (a dev server as PID 1) would hold the Pod, and a wake meanwhile, for
    the Pod's whole grace period (30 s): an idle suspension asks for the operator's setting instead. A
    suspension by the spec keeps the Pod's own."""
    objs.create(SANDBOX, sandbox_body("drowsy", autoSuspendPolicy=policy()))
    objs.wait_condition(SANDBOX, "drowsy", timeout=60)
    pod = pod_of(objs, "drowsy")
    assert pod is not None and pod.spec.termination_grace_period_seconds == 30
    wait_idle_suspended(objs, "drowsy", timeout=THRESHOLD + 30)
    wait_for(lambda: pod_of(objs, "drowsy") is None, timeout=30, what="the idle sandbox's Pod to go")
    assert deletion_grace(objs, "drowsy", pod.metadata.resource_version) == IDLE_GRACE

    objs.annotate(SANDBOX, "drowsy", {c.ANNOTATION_RESUME_REQUEST: "back"})
    objs.wait_condition(SANDBOX, "drowsy", timeout=60)
    pod = pod_of(objs, "drowsy")
    assert pod is not None
    objs.patch(SANDBOX, "drowsy", {"spec": {"operatingMode": "Suspended"}})
    objs.wait_condition(SANDBOX, "drowsy", "False", c.REASON_SANDBOX_SUSPENDED)
    wait_for(lambda: pod_of(objs, "drowsy") is None, timeout=30, what="the scaled-down sandbox's Pod to go")
    assert deletion_grace(objs, "drowsy", pod.metadata.resource_version) == 30


def test_a_pods_own_shorter_grace_period_is_kept_on_idle_suspension(objs: Objects) -> None:
    body = sandbox_body("brief", autoSuspendPolicy=policy())
    body["spec"]["podTemplate"]["spec"]["terminationGracePeriodSeconds"] = 2
    objs.create(SANDBOX, body)
    objs.wait_condition(SANDBOX, "brief", timeout=60)
    pod = pod_of(objs, "brief")
    assert pod is not None
    wait_idle_suspended(objs, "brief", timeout=THRESHOLD + 30)
    wait_for(lambda: pod_of(objs, "brief") is None, timeout=30, what="the idle sandbox's Pod to go")
    assert deletion_grace(objs, "brief", pod.metadata.resource_version) == 2


def test_explicit_scaling_still_suspends_and_resumes_an_idle_sandbox(objs: Objects) -> None:
    objs.create(SANDBOX, sandbox_body("scaled", autoSuspendPolicy=policy()))
    objs.wait_condition(SANDBOX, "scaled", timeout=60)
    wait_idle_suspended(objs, "scaled", timeout=THRESHOLD + 30)
    # A v1beta1 client wakes it the way it wakes any suspended sandbox: Suspended, then Running.
    objs.patch(SANDBOX, "scaled", {"spec": {"operatingMode": "Suspended"}})
    objs.wait_condition(SANDBOX, "scaled", "False", c.REASON_SANDBOX_SUSPENDED)
    objs.patch(SANDBOX, "scaled", {"spec": {"operatingMode": "Running"}})
    objs.wait_condition(SANDBOX, "scaled", timeout=60)


def test_nonsense_thresholds_are_refused_with_a_message(objs: Objects) -> None:
    for bad, words in ((-5, "at least 10"), (3, "at least 10"), (10**9, "at most")):
        with pytest.raises(ApiException) as refused:
            objs.create(SANDBOX, sandbox_body(f"bad-{abs(bad) % 1000}", autoSuspendPolicy=policy(bad)))
        assert refused.value.status == 422
        assert words in refused.value.body and "suspendThresholdSeconds" in refused.value.body
    with pytest.raises(ApiException) as refused_claim:
        objs.create(
            CLAIM,
            {
                "metadata": {"name": "bad-claim"},
                "spec": {"sandboxTemplateRef": {"name": "any"}, "autoSuspendPolicy": policy(0)},
            },
        )
    assert refused_claim.value.status == 422 and "at least 10" in refused_claim.value.body


def test_policy_resolves_from_template_to_claim_to_sandbox(objs: Objects) -> None:
    objs.create(TEMPLATE, template_body("ceiling", autoSuspendPolicy=policy(600)))
    claim = {"sandboxTemplateRef": {"name": "ceiling"}}
    objs.create(CLAIM, {"metadata": {"name": "default"}, "spec": claim})
    objs.create(CLAIM, {"metadata": {"name": "shorter"}, "spec": {**claim, "autoSuspendPolicy": policy(120)}})
    for name, seconds in (("default", 600), ("shorter", 120)):
        box = objs.wait(SANDBOX, name, lambda _: True, what=f"the Sandbox of claim {name}")
        assert box["spec"]["autoSuspendPolicy"] == policy(seconds), name

    # A warm sandbox has no policy while it waits; the claim that adopts it gives it the claim's.
    objs.create(
        POOL,
        {"metadata": {"name": "warm"}, "spec": {"replicas": 1, "sandboxTemplateRef": {"name": "ceiling"}}},
    )
    wait_for(
        lambda: objs.list(SANDBOX, f"{c.LABEL_WARM_POOL}"),
        timeout=60,
        what="a warm sandbox",
    )
    warm = objs.list(SANDBOX, f"{c.LABEL_WARM_POOL}")[0]
    assert "autoSuspendPolicy" not in warm["spec"]
    objs.create(
        CLAIM,
        {
            "metadata": {"name": "adopter"},
            "spec": {"warmPoolRef": {"name": "warm"}, "autoSuspendPolicy": policy(60)},
        },
    )
    adopted = objs.wait_condition(CLAIM, "adopter", timeout=60)
    name = adopted["status"]["sandbox"]["name"]
    assert (objs.get(SANDBOX, name) or {})["spec"]["autoSuspendPolicy"] == policy(60)


def test_a_claim_cannot_widen_its_templates_policy(objs: Objects) -> None:
    """The template's threshold is a ceiling: a tenant's claim asking to stay up longer gets no Sandbox."""
    objs.create(TEMPLATE, template_body("strict", autoSuspendPolicy=policy(300)))
    objs.create(
        CLAIM,
        {
            "metadata": {"name": "greedy"},
            "spec": {"sandboxTemplateRef": {"name": "strict"}, "autoSuspendPolicy": policy(86400)},
        },
    )
    refused = objs.wait_condition(CLAIM, "greedy", "False", c.REASON_AUTO_SUSPEND_POLICY_REFUSED)
    assert (
        "86400" in condition(refused, "Ready")["message"] and "300" in condition(refused, "Ready")["message"]
    )
    assert objs.get(SANDBOX, "greedy") is None


def test_environment_suspends_through_its_sandbox_and_resumes_on_its_annotation(
    objs: Objects, tmp_path: Path
) -> None:
    """One mechanism: the environment gives its workspace Sandbox the policy, reports the Sandbox's idle
    suspension, and its own annotation (shadowctl start) resumes it."""
    objs.create(TEMPLATE, template_body("workspace"))
    volumes = bind_volumes(objs, ["workspace-dozy"], tmp_path)
    try:
        spec = {
            "sources": [{"name": "app", "repo": "shadow/app", "upload": {}}],
            "gitea": {"enabled": False},
            "autoSuspendPolicy": policy(),
        }
        objs.create(ENVIRONMENT, {"metadata": {"name": "dozy"}, "spec": spec}, version="v1alpha1")
        wait_bound(objs, ["workspace-dozy"], timeout=120)
        box = objs.wait_condition(SANDBOX, "dozy", timeout=120)
        assert box["spec"]["autoSuspendPolicy"] == policy()
        claim = objs.core.read_namespaced_persistent_volume_claim("workspace-dozy", objs.namespace)

        wait_idle_suspended(objs, "dozy", timeout=THRESHOLD + 40)
        env = objs.wait(
            ENVIRONMENT,
            "dozy",
            lambda e: condition(e, "WorkspaceReady").get("reason") == "Suspended",
            timeout=30,
            version="v1alpha1",
        )
        assert env["status"]["idle"]["suspendedAt"]
        assert f"after {THRESHOLD}s without activity" in condition(env, "WorkspaceReady")["message"]
        assert (objs.get(SANDBOX, "dozy") or {})["spec"]["operatingMode"] == "Running"

        objs.annotate(ENVIRONMENT, "dozy", {c.ANNOTATION_RESUME_REQUEST: "wake"}, version="v1alpha1")
        objs.wait(
            ENVIRONMENT,
            "dozy",
            lambda e: condition(e, "WorkspaceReady").get("status") == "True",
            timeout=60,
            version="v1alpha1",
        )
        box = objs.get(SANDBOX, "dozy") or {}
        assert box["metadata"]["annotations"][c.ANNOTATION_RESUME_REQUEST] == "wake"
        same = objs.core.read_namespaced_persistent_volume_claim("workspace-dozy", objs.namespace)
        assert same.metadata.uid == claim.metadata.uid
    finally:
        for name in volumes:
            with contextlib.suppress(ApiException):
                objs.core.delete_persistent_volume(name)


def test_an_environment_cannot_widen_its_templates_policy(objs: Objects) -> None:
    objs.create(TEMPLATE, template_body("workspace", autoSuspendPolicy=policy(60)))
    spec = {
        "sources": [{"name": "app", "repo": "shadow/app", "upload": {}}],
        "gitea": {"enabled": False},
        "idleTimeoutSeconds": 3600,
    }
    objs.create(ENVIRONMENT, {"metadata": {"name": "greedy"}, "spec": spec}, version="v1alpha1")
    env = objs.wait(
        ENVIRONMENT,
        "greedy",
        lambda e: (
            ((e.get("status") or {}).get("failure") or {}).get("code") == c.REASON_AUTO_SUSPEND_POLICY_REFUSED
        ),
        timeout=30,
        version="v1alpha1",
    )
    assert "3600" in env["status"]["failure"]["message"]
    assert objs.get(SANDBOX, "greedy") is None
    both = {**spec, "autoSuspendPolicy": policy()}
    with pytest.raises(ApiException) as refused:
        objs.create(ENVIRONMENT, {"metadata": {"name": "both"}, "spec": both}, version="v1alpha1")
    assert refused.value.status == 422 and "not both" in refused.value.body


def test_a_new_resume_value_on_the_claim_resumes_its_sandbox_once(objs: Objects) -> None:
    """A tenant may annotate its claim, not the Sandbox (the chart's role): the operator passes each new value
    of the claim's shadow.dev/resume-requested to the Sandbox, once."""
    objs.create(TEMPLATE, template_body("napper", autoSuspendPolicy=policy()))
    objs.create(CLAIM, {"metadata": {"name": "napper"}, "spec": {"sandboxTemplateRef": {"name": "napper"}}})
    name = objs.wait_condition(CLAIM, "napper", timeout=60)["status"]["sandbox"]["name"]
    wait_idle_suspended(objs, name, timeout=THRESHOLD + 30)

    objs.annotate(CLAIM, "napper", {c.ANNOTATION_RESUME_REQUEST: "from-the-claim"})
    back = objs.wait_condition(SANDBOX, name, timeout=60)
    assert back["status"]["idle"]["resumeRequest"] == "from-the-claim"
    assert back["metadata"]["annotations"][c.ANNOTATION_CLAIM_RESUME_REQUEST] == "from-the-claim"

    # A value the router writes on the Sandbox since is not overwritten by the claim's older one.
    objs.annotate(SANDBOX, name, {c.ANNOTATION_RESUME_REQUEST: "from-the-router"})
    objs.annotate(CLAIM, "napper", {"unrelated": "change"})
    wait_idle_suspended(objs, name, timeout=THRESHOLD + 30)
    box = objs.get(SANDBOX, name) or {}
    assert box["metadata"]["annotations"][c.ANNOTATION_RESUME_REQUEST] == "from-the-router"
