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
        "capabilities": {"drop": ["ALL"], "add": ["NET_BIND_SERVICE", "CHOWN"]},
    },
}


def pod_spec(pod: dict[str, Any], container: dict[str, Any]) -> dict[str, Any]:
    return {
        "containers": [{"name": "runtime", "image": "sandbox-runtime:dev", **container}],
        **pod,
    }


# ------------------------------------------------------------------------------------ Pod Security corpus
# Every field the Pod Security Standards name (baseline and restricted), each with values they allow and
# values they refuse, at pod level and in each kind of container. Sent as a Pod to a namespace enforcing a
# level, inside a Sandbox and a SandboxTemplate under the chart's policy at that level, and through the
# operator's check: the decisions must be the same (tests/integration/test_pod_security_admission.py).
CONTAINER_KINDS = ("containers", "initContainers", "ephemeralContainers")
APPARMOR_RUNTIME = "container.apparmor.security.beta.kubernetes.io/runtime"


@dataclass(frozen=True)
class Probe:
    id: str
    # Merged into the pod spec.
    pod: dict[str, Any]
    # The securityContext (merged into) of the probed container, and other fields of that container.
    security: dict[str, Any]
    container: dict[str, Any]
    # Which container is probed: the runtime (containers), an init container or an ephemeral container.
    kind: str = "containers"
    annotations: dict[str, str] | None = None


def _confined(kind: str) -> dict[str, Any]:
    return {"type": kind, **({"localhostProfile": "profiles/sandbox.json"} if kind == "Localhost" else {})}


# Container probes run in a pod with its own user namespace: an unmasked /proc is valid only there (and
# the pod that takes the ephemeral containers has one too).
USER_NAMESPACE: dict[str, Any] = {"hostUsers": False}

# (id, securityContext, other container fields): what a container may ask for.
CONTAINER_FIELDS: list[tuple[str, dict[str, Any], dict[str, Any]]] = [
    ("defaults", {}, {}),
    # (A privileged container must not say allowPrivilegeEscalation: false, which the operator defaults.)
    ("privileged", {"privileged": True, "allowPrivilegeEscalation": True}, {}),
    ("not-privileged", {"privileged": False}, {}),
    ("privilege-escalation", {"allowPrivilegeEscalation": True}, {}),
    ("no-privilege-escalation", {"allowPrivilegeEscalation": False}, {}),
    ("add-net-bind-service", {"capabilities": {"drop": ["ALL"], "add": ["NET_BIND_SERVICE"]}}, {}),
    ("add-chown", {"capabilities": {"drop": ["ALL"], "add": ["CHOWN"]}}, {}),
    ("add-sys-admin", {"capabilities": {"drop": ["ALL"], "add": ["SYS_ADMIN"]}}, {}),
    ("add-cap-prefixed-chown", {"capabilities": {"drop": ["ALL"], "add": ["CAP_CHOWN"]}}, {}),
    ("add-without-drop", {"capabilities": {"add": ["NET_BIND_SERVICE"]}}, {}),
    ("drop-lowercase-all", {"capabilities": {"drop": ["all"]}}, {}),
    ("drop-some", {"capabilities": {"drop": ["NET_RAW"]}}, {}),
    ("empty-capabilities", {"capabilities": {}}, {}),
    *(
        (f"seccomp-{kind.lower()}", {"seccompProfile": _confined(kind)}, {})
        for kind in ("Unconfined", "RuntimeDefault", "Localhost")
    ),
    *(
        (f"apparmor-{kind.lower()}", {"appArmorProfile": _confined(kind)}, {})
        for kind in ("Unconfined", "RuntimeDefault", "Localhost")
    ),
    *(
        (f"selinux-type-{kind.replace('_', '-')}", {"seLinuxOptions": {"type": kind}}, {})
        for kind in ("spc_t", "container_t", "container_init_t", "container_kvm_t", "container_engine_t")
    ),
    ("selinux-user", {"seLinuxOptions": {"user": "system_u"}}, {}),
    ("selinux-role", {"seLinuxOptions": {"role": "system_r"}}, {}),
    ("selinux-level", {"seLinuxOptions": {"level": "s0:c123,c456"}}, {}),
    ("proc-mount-unmasked", {"procMount": "Unmasked"}, {}),
    ("proc-mount-default", {"procMount": "Default"}, {}),
    ("not-host-process", {"windowsOptions": {"hostProcess": False}}, {}),
    ("run-as-root", {"runAsNonRoot": False}, {}),
    ("run-as-non-root", {"runAsNonRoot": True}, {}),
    ("run-as-user-0", {"runAsUser": 0}, {}),
    ("run-as-user-1000", {"runAsUser": 1000}, {}),
    # Ephemeral containers may have no ports: these two are for the others only.
    ("host-port", {}, {"ports": [{"containerPort": 8080, "hostPort": 8080}]}),
    ("host-port-0", {}, {"ports": [{"containerPort": 8080, "hostPort": 0}]}),
]

# (id, pod spec fields, pod annotations).
POD_FIELDS: list[tuple[str, dict[str, Any], dict[str, str] | None]] = [
    *((f"{field.lower()}", {field: True}, None) for field in ("hostNetwork", "hostPID", "hostIPC")),
    *((f"no-{field.lower()}", {field: False}, None) for field in ("hostNetwork", "hostPID", "hostIPC")),
    # A Windows host process needs the host's network: refused for both.
    (
        "host-process",
        {"hostNetwork": True, "securityContext": {"windowsOptions": {"hostProcess": True}}},
        None,
    ),
    ("not-host-process", {"securityContext": {"windowsOptions": {"hostProcess": False}}}, None),
    *(
        (f"seccomp-{kind.lower()}", {"securityContext": {"seccompProfile": _confined(kind)}}, None)
        for kind in ("Unconfined", "RuntimeDefault", "Localhost")
    ),
    *(
        (f"apparmor-{kind.lower()}", {"securityContext": {"appArmorProfile": _confined(kind)}}, None)
        for kind in ("Unconfined", "RuntimeDefault", "Localhost")
    ),
    *(
        (f"apparmor-annotation-{value.split('/')[0]}", {}, {APPARMOR_RUNTIME: value})
        for value in ("unconfined", "runtime/default", "localhost/sandbox")
    ),
    ("selinux-type-spc-t", {"securityContext": {"seLinuxOptions": {"type": "spc_t"}}}, None),
    ("selinux-type-container-t", {"securityContext": {"seLinuxOptions": {"type": "container_t"}}}, None),
    ("selinux-user", {"securityContext": {"seLinuxOptions": {"user": "system_u"}}}, None),
    ("selinux-role", {"securityContext": {"seLinuxOptions": {"role": "system_r"}}}, None),
    ("run-as-root", {"securityContext": {"runAsNonRoot": False}}, None),
    ("run-as-non-root", {"securityContext": {"runAsNonRoot": True}}, None),
    ("run-as-user-0", {"securityContext": {"runAsUser": 0}}, None),
    ("run-as-user-1000", {"securityContext": {"runAsUser": 1000}}, None),
    *(
        (f"sysctl-{name}", {"securityContext": {"sysctls": [{"name": name, "value": value}]}}, None)
        for name, value in (
            ("net.ipv4.ip_local_port_range", "1024 65000"),
            ("net.ipv4.tcp_keepalive_time", "300"),
            ("kernel.shm_rmid_forced", "1"),
            ("kernel.msgmax", "65536"),
            ("net.core.somaxconn", "1024"),
            ("net.ipv4.tcp_rmem", "4096 87380 6291456"),
            ("net.ipv4.tcp_wmem", "4096 16384 4194304"),
        )
    ),
    *(
        (f"volume-{name.lower()}", {"volumes": [{"name": "probe", name: source}]}, None)
        for name, source in (
            ("hostPath", {"path": "/"}),
            ("nfs", {"server": "nfs.example.com", "path": "/export"}),
            ("iscsi", {"targetPortal": "10.0.0.1:3260", "iqn": "iqn.2001-04.com.example:storage", "lun": 0}),
            ("gitRepo", {"repository": "https://example.com/repo.git"}),
            ("cephfs", {"monitors": ["10.0.0.1:6789"]}),
            ("fc", {"targetWWNs": ["500a0982991b8dc5"], "lun": 0}),
            ("flexVolume", {"driver": "example.com/driver"}),
            ("rbd", {"monitors": ["10.0.0.1:6789"], "image": "disk"}),
            ("emptyDir", {}),
            ("configMap", {"name": "settings"}),
            ("secret", {"secretName": "settings"}),
            ("downwardAPI", {"items": [{"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}}]}),
            ("projected", {"sources": [{"configMap": {"name": "settings"}}]}),
            ("persistentVolumeClaim", {"claimName": "data"}),
            ("csi", {"driver": "inline.example.com"}),
            (
                "ephemeral",
                {
                    "volumeClaimTemplate": {
                        "spec": {
                            "accessModes": ["ReadWriteOnce"],
                            "resources": {"requests": {"storage": "1Gi"}},
                        }
                    }
                },
            ),
        )
    ),
    # The pod says root; one container says otherwise: the pod's own false is still refused.
    (
        "run-as-root-but-container-not",
        {
            "securityContext": {"runAsNonRoot": False},
            "containers": [
                {"name": "runtime", "image": "sandbox-runtime:dev", "securityContext": {"runAsNonRoot": True}}
            ],
        },
        None,
    ),
]


def _probes() -> list[Probe]:
    probes = [Probe(f"pod-{name}", pod, {}, {}, annotations=notes) for name, pod, notes in POD_FIELDS]
    for kind in CONTAINER_KINDS:
        for name, security, fields in CONTAINER_FIELDS:
            if kind == "ephemeralContainers" and "ports" in fields:
                continue
            probes.append(Probe(f"{kind}-{name}", USER_NAMESPACE, security, fields, kind))
    return probes


PROBES = _probes()


def probe_template(probe: Probe) -> dict[str, Any]:
    """The pod template (metadata and spec) a Sandbox or SandboxTemplate carries for `probe`."""
    spec: dict[str, Any] = {"containers": [{"name": "runtime", "image": "sandbox-runtime:dev"}], **probe.pod}
    if probe.security or probe.container:
        probed = {"name": "probed", "image": "sandbox-runtime:dev", **probe.container}
        if probe.security:
            probed["securityContext"] = probe.security
        if probe.kind == "containers":
            spec["containers"] = [*spec["containers"], probed]
        else:
            spec[probe.kind] = [probed]
    template: dict[str, Any] = {"spec": spec}
    if probe.annotations:
        template["metadata"] = {"annotations": probe.annotations}
    return template
