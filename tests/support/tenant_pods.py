"""What a tenant with the built-in `edit` role may try in its namespace to reach the node (issue 28, N1):
a privileged, a hostPath and a hostPID pod, each as a Pod, a Deployment and a Job.

Written against a kubernetes client and a namespace only, so the same attempts run on the local control
plane (tests/integration/test_tenant_pod_security.py) and on a real cluster.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tests.support.controlplane import wait_for

VIOLATION = "violates PodSecurity"
# The words Pod Security's warning uses when a workload's pod template would be refused.
WOULD_VIOLATE = "would violate PodSecurity"

# One container that would own the node with each of these.
ESCAPES: dict[str, dict[str, Any]] = {
    "privileged": {
        "containers": [{"name": "c", "image": "busybox", "securityContext": {"privileged": True}}]
    },
    "hostpath": {
        "containers": [
            {"name": "c", "image": "busybox", "volumeMounts": [{"name": "root", "mountPath": "/host"}]}
        ],
        "volumes": [{"name": "root", "hostPath": {"path": "/"}}],
    },
    "hostpid": {"hostPID": True, "containers": [{"name": "c", "image": "busybox"}]},
}
# And a pod that passes restricted, so that a refusal is not the tenant's role refusing everything.
HARMLESS: dict[str, Any] = {
    "securityContext": {
        "runAsNonRoot": True,
        "runAsUser": 1000,
        "seccompProfile": {"type": "RuntimeDefault"},
    },
    "containers": [
        {
            "name": "c",
            "image": "busybox",
            "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
        }
    ],
}


@dataclass
class Attempt:
    what: str
    # The API server's answer to the create: None (admitted) or its refusal.
    refused: str | None
    # Its warnings (Pod Security warns about a workload whose pods it will refuse).
    warnings: str


def _labels(name: str) -> dict[str, Any]:
    return {"matchLabels": {"attempt": name}}


def _create(call: Any, *args: Any) -> tuple[str | None, str]:
    try:
        _, _, headers = call(*args, _return_http_data_only=False)
    except ApiException as exc:
        return str(exc.body), ""
    return None, str(headers.get("Warning", ""))


def try_pod(api: client.ApiClient, namespace: str, name: str, spec: dict[str, Any]) -> Attempt:
    body = {"metadata": {"name": name}, "spec": {**spec, "restartPolicy": "Never"}}
    refused, warnings = _create(client.CoreV1Api(api).create_namespaced_pod_with_http_info, namespace, body)
    return Attempt(f"Pod {name}", refused, warnings)


def try_deployment(api: client.ApiClient, namespace: str, name: str, spec: dict[str, Any]) -> Attempt:
    body = {
        "metadata": {"name": name},
        "spec": {
            "replicas": 1,
            "selector": _labels(name),
            "template": {"metadata": {"labels": {"attempt": name}}, "spec": spec},
        },
    }
    refused, warnings = _create(
        client.AppsV1Api(api).create_namespaced_deployment_with_http_info, namespace, body
    )
    return Attempt(f"Deployment {name}", refused, warnings)


def try_job(api: client.ApiClient, namespace: str, name: str, spec: dict[str, Any]) -> Attempt:
    body = {
        "metadata": {"name": name},
        "spec": {
            "backoffLimit": 0,
            "template": {
                "metadata": {"labels": {"attempt": name}},
                "spec": {**spec, "restartPolicy": "Never"},
            },
        },
    }
    refused, warnings = _create(client.BatchV1Api(api).create_namespaced_job_with_http_info, namespace, body)
    return Attempt(f"Job {name}", refused, warnings)


def pod_creation_failures(api: client.ApiClient, namespace: str, kind: str, name: str) -> list[str]:
    """The FailedCreate Events the ReplicaSet or Job controller recorded for `kind` `name`: why it made no Pod."""
    events = client.CoreV1Api(api).list_namespaced_event(
        namespace, field_selector=f"involvedObject.kind={kind},involvedObject.name={name},reason=FailedCreate"
    )
    return [str(event.message) for event in events.items]


def replica_set_of(api: client.ApiClient, namespace: str, deployment: str) -> str | None:
    sets = client.AppsV1Api(api).list_namespaced_replica_set(
        namespace, label_selector=f"attempt={deployment}"
    )
    return sets.items[0].metadata.name if sets.items else None


def wait_refused_by_controller(api: client.ApiClient, namespace: str, kind: str, name: str) -> str:
    """Wait until the controller of a Deployment (its ReplicaSet) or Job reports its Pod refused: the message."""
    found: dict[str, str] = {}

    def refused() -> bool:
        owner = replica_set_of(api, namespace, name) if kind == "Deployment" else name
        if owner is None:
            return False
        failures = pod_creation_failures(
            api, namespace, "ReplicaSet" if kind == "Deployment" else "Job", owner
        )
        found["message"] = next((f for f in failures if VIOLATION in f), "")
        return bool(found["message"])

    wait_for(refused, timeout=60, what=f"the {kind} controller to report its Pod refused ({kind} {name})")
    return found["message"]


def every_escape_is_refused(api: client.ApiClient, namespace: str, prefix: str = "") -> None:
    """As the tenant (`api`), try every escape as a Pod, a Deployment and a Job in `namespace`, which enforces
    restricted: the Pods are refused at once, the workloads are admitted with Pod Security's warning and their
    controllers then make no Pod. A pod that passes restricted is admitted, so the role is not what refused."""
    for name, spec in ESCAPES.items():
        pod = try_pod(api, namespace, f"{prefix}pod-{name}", spec)
        assert pod.refused is not None and VIOLATION in pod.refused, pod
        for attempt in (
            try_deployment(api, namespace, f"{prefix}deploy-{name}", spec),
            try_job(api, namespace, f"{prefix}job-{name}", spec),
        ):
            # Admitted (Pod Security does not refuse workloads), with its warning to the tenant.
            assert attempt.refused is None and WOULD_VIOLATE in attempt.warnings, attempt
    for name in ESCAPES:
        for kind, workload in (("Deployment", f"{prefix}deploy-{name}"), ("Job", f"{prefix}job-{name}")):
            message = wait_refused_by_controller(api, namespace, kind, workload)
            assert 'violates PodSecurity "restricted:latest"' in message, message
    assert try_pod(api, namespace, f"{prefix}harmless", HARMLESS).refused is None
    names = [p.metadata.name for p in client.CoreV1Api(api).list_namespaced_pod(namespace).items]
    assert f"{prefix}harmless" in names
    escapes = [n for n in names if any(n.startswith(f"{prefix}{k}-") for k in ("pod", "deploy", "job"))]
    assert not escapes, names
