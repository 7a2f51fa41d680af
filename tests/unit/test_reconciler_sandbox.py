"""The Sandbox reconciler over the engine's client and cache, the API server in memory (tests/support/fakes.py):
which children one pass writes, the status it writes once, and the events it tells once."""

from __future__ import annotations

import copy
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from shadow_operator.api import constants as c
from shadow_operator.api import naming
from shadow_operator.api.kinds import POD, SANDBOX, SECRET, SERVICE
from shadow_operator.controllers.sandbox import SandboxReconciler

from tests.support.fakes import NAMESPACE, Harness

pytestmark = pytest.mark.unit


def sandbox(name: str = "box", labels: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    container = {"name": "main", "image": "runtime", "ports": [{"name": "runtime", "containerPort": 8888}]}
    return {
        "metadata": {"name": name, "namespace": NAMESPACE, "labels": labels or {}},
        "spec": {"podTemplate": {"spec": {"containers": [container]}}, **spec},
    }


def conditions(harness: Harness, name: str = "box") -> dict[str, dict[str, Any]]:
    status = harness.get(SANDBOX, NAMESPACE, name).get("status") or {}
    return {x["type"]: x for x in status.get("conditions") or ()}


def start_pod(harness: Harness, name: str = "box", ip: str = "10.0.0.7") -> None:
    """What the kubelet would do: the Pod scheduled, Running and Ready, with an IP."""
    pod = harness.get(POD, NAMESPACE, name)
    pod["spec"]["nodeName"] = "node-1"
    pod["status"] = {
        "phase": "Running",
        "podIP": ip,
        "podIPs": [{"ip": ip}],
        "conditions": [{"type": "PodScheduled", "status": "True"}, {"type": "Ready", "status": "True"}],
    }
    harness.api.put(POD, pod)


async def test_a_new_sandbox_gets_its_children_and_one_status_write() -> None:
    harness = Harness(SandboxReconciler)
    harness.put(SANDBOX, sandbox(service=True))
    assert await harness.run(SANDBOX, NAMESPACE, "box") is None
    written = harness.writes()
    assert sorted(w.split()[0] + " " + w.rsplit("/", 2)[-2] for w in written) == [
        "create pods",
        "create secrets",
        "create services",
        "status sandboxes",
    ]
    status = harness.get(SANDBOX, NAMESPACE, "box")["status"]
    assert status["selector"] == f"{c.LABEL_SANDBOX_NAME_HASH}={naming.name_hash('box')}"
    assert status["service"] == "box" and status["serviceFQDN"] == f"box.{NAMESPACE}.svc.cluster.local"
    assert status["runtimeTokenSecret"] == naming.token_secret_name("box")
    assert "podIPs" not in status and "nodeName" not in status and "previewURL" not in status
    ready = conditions(harness)[c.COND_READY]
    assert (ready["status"], ready["reason"]) == ("False", c.REASON_DEPENDENCIES_NOT_READY)
    assert ready["observedGeneration"] == 1 and ready["lastTransitionTime"]
    assert c.COND_POD_SCHEDULED in conditions(harness)
    assert harness.recorder.reasons() == ["PodCreated"]

    # Nothing changed: the next pass writes nothing at all.
    await harness.run(SANDBOX, NAMESPACE, "box")
    assert harness.writes() == []


async def test_ready_is_told_once_and_its_transition_time_kept() -> None:
    harness = Harness(SandboxReconciler)
    harness.put(SANDBOX, sandbox())
    await harness.run(SANDBOX, NAMESPACE, "box")
    start_pod(harness)
    harness.writes()
    await harness.run(SANDBOX, NAMESPACE, "box")
    assert harness.writes("status") == [SANDBOX.path(NAMESPACE, "box")]
    status = harness.get(SANDBOX, NAMESPACE, "box")["status"]
    assert status["podIPs"] == ["10.0.0.7"] and status["nodeName"] == "node-1"
    assert status["runtimeURL"] == "http://10.0.0.7:8888"  # no Service: the Pod's IP
    ready = conditions(harness)[c.COND_READY]
    assert (ready["status"], ready["reason"]) == ("True", c.REASON_DEPENDENCIES_READY)
    assert harness.recorder.reasons() == ["PodCreated", c.REASON_DEPENDENCIES_READY]

    await harness.run(SANDBOX, NAMESPACE, "box")
    assert harness.writes() == [] and conditions(harness)[c.COND_READY] == ready
    assert harness.recorder.reasons() == ["PodCreated", c.REASON_DEPENDENCIES_READY]


async def test_a_warm_pool_member_posts_no_normal_events() -> None:
    harness = Harness(SandboxReconciler)
    harness.put(SANDBOX, sandbox(labels={c.LABEL_WARM_POOL: "hash"}))
    await harness.run(SANDBOX, NAMESPACE, "box")
    start_pod(harness)
    await harness.run(SANDBOX, NAMESPACE, "box")
    assert conditions(harness)[c.COND_READY]["status"] == "True"
    assert harness.recorder.events == []


async def test_an_expired_sandbox_loses_its_pod_and_says_so_once() -> None:
    harness = Harness(SandboxReconciler)
    harness.put(SANDBOX, sandbox())
    await harness.run(SANDBOX, NAMESPACE, "box")
    start_pod(harness)
    await harness.run(SANDBOX, NAMESPACE, "box")
    body = harness.get(SANDBOX, NAMESPACE, "box")
    past = (datetime.now(UTC) - timedelta(seconds=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    body["spec"].update(shutdownTime=past, shutdownPolicy="Retain")
    harness.api.put(SANDBOX, body)
    harness.writes()
    assert await harness.run(SANDBOX, NAMESPACE, "box") is None
    assert harness.api.body(POD, NAMESPACE, "box") is None
    status = harness.get(SANDBOX, NAMESPACE, "box")["status"]
    assert "runtimeURL" not in status and "podIPs" not in status
    assert conditions(harness)[c.COND_READY]["reason"] == c.REASON_SANDBOX_EXPIRED
    await harness.run(SANDBOX, NAMESPACE, "box")
    assert harness.recorder.reasons().count(c.REASON_SANDBOX_EXPIRED) == 1
    assert harness.api.body(SECRET, NAMESPACE, naming.token_secret_name("box")) is not None


async def test_two_pods_of_one_sandbox_are_refused_with_one_warning() -> None:
    harness = Harness(SandboxReconciler)
    harness.put(SANDBOX, sandbox())
    await harness.run(SANDBOX, NAMESPACE, "box")
    twin = harness.get(POD, NAMESPACE, "box")
    twin["metadata"] = {**twin["metadata"], "name": "box-twin", "uid": "uid-twin"}
    harness.api.put(POD, twin)
    for _ in range(2):
        await harness.run(SANDBOX, NAMESPACE, "box")
    ready = conditions(harness)[c.COND_READY]
    assert ready["reason"] == c.REASON_MULTIPLE_PODS and "multiple Pods (2)" in ready["message"]
    assert harness.recorder.reasons().count(c.REASON_MULTIPLE_PODS) == 1
    assert harness.api.body(SERVICE, NAMESPACE, "box") is None


async def test_a_service_changed_by_hand_gets_its_selector_and_ports_back() -> None:
    harness = Harness(SandboxReconciler)
    harness.put(SANDBOX, sandbox(service=True))
    await harness.run(SANDBOX, NAMESPACE, "box")
    changed = copy.deepcopy(harness.get(SERVICE, NAMESPACE, "box"))
    wanted = copy.deepcopy(changed["spec"])
    changed["spec"]["selector"] = {**wanted["selector"], "app": "other"}
    changed["spec"]["ports"] = [{"name": "runtime", "port": 9999, "protocol": "TCP", "targetPort": 9999}]
    harness.api.put(SERVICE, changed)
    harness.writes()
    await harness.run(SANDBOX, NAMESPACE, "box")
    assert [w.split()[0] for w in harness.writes() if "/services/" in w] == ["patch"]
    spec = harness.get(SERVICE, NAMESPACE, "box")["spec"]
    assert (spec["selector"], spec["ports"]) == (wanted["selector"], wanted["ports"])


async def test_a_resume_request_while_the_idle_pod_goes_down_brings_it_back_once() -> None:
    """Idle-suspended, its Pod still terminating, a resume request comes: no second Pod while the first is
    going, the suspension is cleared at once, and the next pass after the old Pod is gone creates one Pod;
    more new values change nothing (issue 30)."""
    harness = Harness(SandboxReconciler)
    harness.put(SANDBOX, sandbox(autoSuspendPolicy={"suspendThresholdSeconds": 60}))
    await harness.run(SANDBOX, NAMESPACE, "box")
    start_pod(harness)
    box = harness.get(SANDBOX, NAMESPACE, "box")
    box["status"]["idle"] = {"suspendedAt": "2026-01-01T00:00:00Z"}  # the idle step decided, an earlier pass
    harness.api.put(SANDBOX, box)
    await harness.run(SANDBOX, NAMESPACE, "box")
    assert any(w.startswith("delete ") and "/pods/box" in w for w in harness.writes())
    # Its Pod was still in this pass's cache: suspending; the next pass sees it gone.
    assert conditions(harness)[c.COND_READY]["reason"] == c.REASON_SUSPENDED
    await harness.run(SANDBOX, NAMESPACE, "box")
    assert conditions(harness)[c.COND_SUSPENDED]["reason"] == c.REASON_IDLE

    # The in-memory API server deletes at once; a real Pod terminates for a while: put one back as such.
    pod = {
        "metadata": {
            "name": "box",
            "namespace": NAMESPACE,
            "labels": {c.LABEL_SANDBOX_NAME_HASH: naming.name_hash("box")},
            "deletionTimestamp": "2026-01-01T00:00:01Z",
            "ownerReferences": [
                {
                    "apiVersion": "agents.x-k8s.io/v1beta1",
                    "kind": "Sandbox",
                    "name": "box",
                    "uid": harness.get(SANDBOX, NAMESPACE, "box")["metadata"]["uid"],
                    "controller": True,
                }
            ],
        },
        "spec": {"containers": [{"name": "main"}]},
    }
    harness.api.put(POD, pod)
    for value in ("r1", "r2"):
        box = harness.get(SANDBOX, NAMESPACE, "box")
        box["metadata"].setdefault("annotations", {})[c.ANNOTATION_RESUME_REQUEST] = value
        harness.api.put(SANDBOX, box)
        await harness.run(SANDBOX, NAMESPACE, "box")
        assert not [w for w in harness.writes() if w.startswith("create ") and "/pods/" in w]
    idle = harness.get(SANDBOX, NAMESPACE, "box")["status"]["idle"]
    assert "suspendedAt" not in idle and idle["resumeRequest"] == "r2"
    assert harness.recorder.reasons().count("Resumed") == 1

    del harness.api.objects[POD.path(NAMESPACE, "box")]  # the old Pod is gone
    await harness.run(SANDBOX, NAMESPACE, "box")
    assert [w for w in harness.writes() if w.startswith("create ") and "/pods/" in w] == [
        f"create {POD.path(NAMESPACE, 'box')}"
    ]
