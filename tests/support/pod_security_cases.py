"""Pod templates that ask for more than a sandbox may have, each with the chart value that allows it.

Shared by the operator's check (unit tests) and the chart's ValidatingAdmissionPolicy (integration tests on a
real API server), so both refuse the same things with the same value named.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Case:
    id: str
    # Merged into the pod spec (`container` into its first container).
    pod: dict[str, Any]
    container: dict[str, Any]
    # podSecurity.<value> allows it.
    value: str
    # In the refusal message (the operator's and the admission policy's).
    field: str


CASES = [
    Case("privileged", {}, {"securityContext": {"privileged": True}}, "allowPrivileged", "privileged"),
    Case(
        "privilege-escalation",
        {},
        {"securityContext": {"allowPrivilegeEscalation": True}},
        "allowPrivileged",
        "allowPrivilegeEscalation",
    ),
    Case(
        "sys-admin",
        {},
        {"securityContext": {"capabilities": {"add": ["NET_BIND_SERVICE", "SYS_ADMIN"]}}},
        "allowPrivileged",
        "capabilities",
    ),
    Case(
        "cap-prefixed-net-admin",
        {},
        {"securityContext": {"capabilities": {"add": ["CAP_NET_ADMIN"]}}},
        "allowPrivileged",
        "capabilities",
    ),
    Case("host-network", {"hostNetwork": True}, {}, "allowHostNamespaces", "hostNetwork"),
    Case("host-pid", {"hostPID": True}, {}, "allowHostNamespaces", "hostPID"),
    Case("host-ipc", {"hostIPC": True}, {}, "allowHostNamespaces", "hostIPC"),
    Case(
        "host-port",
        {},
        {"ports": [{"name": "runtime", "containerPort": 8888, "hostPort": 8888}]},
        "allowHostNamespaces",
        "hostPort",
    ),
    Case(
        "host-path",
        {"volumes": [{"name": "root", "hostPath": {"path": "/"}}]},
        {},
        "allowHostPath",
        "hostPath",
    ),
    Case(
        "service-account", {"serviceAccountName": "builder"}, {}, "allowServiceAccount", "serviceAccountName"
    ),
    Case(
        "automount-token",
        {"automountServiceAccountToken": True},
        {},
        "allowServiceAccount",
        "automountServiceAccountToken",
    ),
    Case(
        "projected-token",
        {
            "volumes": [
                {"name": "tok", "projected": {"sources": [{"serviceAccountToken": {"path": "token"}}]}}
            ]
        },
        {},
        "allowServiceAccount",
        "projected",
    ),
]

# Fields a template may set without any value: the defaults' own spelling, safe capabilities, named default.
ALLOWED: dict[str, Any] = {
    "serviceAccountName": "default",
    "automountServiceAccountToken": False,
    "hostNetwork": False,
    "volumes": [{"name": "scratch", "emptyDir": {}}],
}
ALLOWED_CONTAINER: dict[str, Any] = {
    "ports": [{"name": "runtime", "containerPort": 8888}],
    "securityContext": {
        "privileged": False,
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"], "add": ["NET_BIND_SERVICE", "CAP_CHOWN"]},
    },
}


def pod_spec(pod: dict[str, Any], container: dict[str, Any]) -> dict[str, Any]:
    return {
        "containers": [{"name": "runtime", "image": "sandbox-runtime:dev", **container}],
        **pod,
    }
