"""What a sandbox's pod may ask of its node: the operator's own check, beside the chart's admission policy.

Two layers, both named by chart values:

- `podSecurity.level`, a Pod Security Standards level (privileged, baseline, restricted). The chart labels the
  tenant namespaces to enforce it, so Kubernetes itself refuses a Pod asking for more; this check and the
  chart's ValidatingAdmissionPolicy (templates/pod-security-policy.yaml) decide as Pod Security does, field by
  field, so that a Sandbox is refused when it is created rather than its Pod later.
- `podSecurity.allow*`: what the product refuses beyond the level. A service account always (the standards
  do not cover it); at level privileged, where the standards refuse nothing, also the privileged and host
  fields, unless a platform team allows them on purpose.

The operator checks the Pod it is about to create (defence in depth: a cluster without the policy, an object
admitted before it existed) and refuses to create it. Both name the chart value that decides.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from shadow_operator.common.podsecurity import LABEL_PREFIX, LEVELS

# Pod Security Standards "baseline": the capabilities a container may add without being privileged.
SAFE_CAPABILITIES = frozenset(
    {
        "AUDIT_WRITE",
        "CHOWN",
        "DAC_OVERRIDE",
        "FOWNER",
        "FSETID",
        "KILL",
        "MKNOD",
        "NET_BIND_SERVICE",
        "SETFCAP",
        "SETGID",
        "SETPCAP",
        "SETUID",
        "SYS_CHROOT",
    }
)
# Baseline: the sysctls a pod may set (namespaced, isolated from other pods), as of Kubernetes 1.32.
SAFE_SYSCTLS = frozenset(
    {
        "kernel.shm_rmid_forced",
        "net.ipv4.ip_local_port_range",
        "net.ipv4.ip_unprivileged_port_start",
        "net.ipv4.tcp_syncookies",
        "net.ipv4.ping_group_range",
        "net.ipv4.ip_local_reserved_ports",
        "net.ipv4.tcp_keepalive_time",
        "net.ipv4.tcp_fin_timeout",
        "net.ipv4.tcp_keepalive_intvl",
        "net.ipv4.tcp_keepalive_probes",
        "net.ipv4.tcp_rmem",
        "net.ipv4.tcp_wmem",
    }
)
# Baseline: SELinux types a pod or container may ask for ("" is the runtime's default).
SAFE_SELINUX_TYPES = frozenset(
    {"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"}
)
CONFINED_PROFILES = frozenset({"RuntimeDefault", "Localhost"})
APPARMOR_ANNOTATION = "container.apparmor.security.beta.kubernetes.io/"
# Restricted: the volume types a pod may use (everything else reaches the node or a remote server directly).
RESTRICTED_VOLUMES = frozenset(
    {
        "configMap",
        "csi",
        "downwardAPI",
        "emptyDir",
        "ephemeral",
        "persistentVolumeClaim",
        "projected",
        "secret",
    }
)
CONTAINER_LISTS = ("initContainers", "containers", "ephemeralContainers")
HOST_NAMESPACES = ("hostNetwork", "hostPID", "hostIPC")


@dataclass(frozen=True)
class PodSecurity:
    """What the chart allows (values podSecurity.*; SHADOW_POD_SECURITY_LEVEL, SHADOW_ALLOW_* for the operator)."""

    level: str = "restricted"
    allow_privileged: bool = False
    allow_host_namespaces: bool = False
    allow_host_path: bool = False
    allow_service_account: bool = False

    def __post_init__(self) -> None:
        if self.level not in LEVELS:
            raise ValueError(f"pod security level {self.level!r} is not one of {', '.join(LEVELS)}")
        loosened = [
            value
            for value, allowed in (
                ("allowPrivileged", self.allow_privileged),
                ("allowHostNamespaces", self.allow_host_namespaces),
                ("allowHostPath", self.allow_host_path),
            )
            if allowed
        ]
        if loosened and self.level != "privileged":
            raise ValueError(
                f"podSecurity.{loosened[0]} needs podSecurity.level=privileged: Pod Security {self.level!r} on "
                "the tenant namespaces would refuse the pods it allows"
            )

    @property
    def baseline(self) -> bool:
        return self.level != "privileged"

    @property
    def restricted(self) -> bool:
        return self.level == "restricted"


def _refused(path: str, what: str, value: str) -> str:
    return f"{path}: {what} is not allowed (the chart value podSecurity.{value} allows it)"


class _Found:
    """Refusals in the order the fields are met, each `<path>: <why> (<the chart value that decides>)`."""

    def __init__(self, allowed: PodSecurity) -> None:
        self.allowed = allowed
        self.items: list[str] = []

    def value(self, path: str, what: str, value: str) -> None:
        """Refused unless podSecurity.<value> allows it (at level privileged; above it, the level decides)."""
        if self.allowed.baseline:
            self.level(path, what)
        else:
            self.items.append(_refused(path, what, value))

    def level(self, path: str, what: str) -> None:
        self.items.append(
            f"{path}: {what} is not allowed by Pod Security {self.allowed.level!r} "
            "(the chart value podSecurity.level)"
        )


def violations(
    pod_spec: Mapping[str, Any], allowed: PodSecurity, annotations: Mapping[str, str] | None = None
) -> list[str]:
    """Every field of `pod_spec` (and the pod's `annotations`) that asks for more than `allowed`, as
    `<path>: <why>`, the path from the pod template (`spec.hostPID`, `metadata.annotations[…]`); empty: none."""
    found = _Found(allowed)
    if not allowed.allow_host_namespaces:
        for field in HOST_NAMESPACES:
            if pod_spec.get(field) is True:
                found.value(field, "sharing the node's namespaces", "allowHostNamespaces")
    for index, volume in enumerate(pod_spec.get("volumes") or ()):
        _volume(found, f"volumes[{index}]", volume)
    if not allowed.allow_service_account:
        for field in ("serviceAccountName", "serviceAccount"):
            if pod_spec.get(field) not in (None, "", "default"):
                found.items.append(_refused(field, "a service account", "allowServiceAccount"))
        if pod_spec.get("automountServiceAccountToken") is True:
            found.items.append(
                _refused(
                    "automountServiceAccountToken", "mounting a service account token", "allowServiceAccount"
                )
            )
    pod_security = pod_spec.get("securityContext") or {}
    if allowed.baseline:
        _context(found, "securityContext", pod_security)
        for index, sysctl in enumerate(pod_security.get("sysctls") or ()):
            if sysctl.get("name") not in SAFE_SYSCTLS:
                found.level(f"securityContext.sysctls[{index}].name", f"the sysctl {sysctl.get('name')}")
        for key, profile in (annotations or {}).items():
            if key.startswith(APPARMOR_ANNOTATION) and not (
                profile == "runtime/default" or profile.startswith("localhost/")
            ):
                found.level(f"metadata.annotations[{key}]", f"the AppArmor profile {profile!r}")
    if allowed.restricted and pod_security.get("runAsNonRoot") is False:
        found.level("securityContext.runAsNonRoot", "false")
    for key in CONTAINER_LISTS:
        for index, container in enumerate(pod_spec.get(key) or ()):
            _container(found, f"{key}[{index}]", container, pod_security)
    return [item if item.startswith("metadata.") else f"spec.{item}" for item in found.items]


def _volume(found: _Found, path: str, volume: Mapping[str, Any]) -> None:
    allowed = found.allowed
    if "hostPath" in volume and not allowed.allow_host_path:
        found.value(f"{path}.hostPath", "a hostPath volume", "allowHostPath")
    elif allowed.restricted:
        for kind in sorted(set(volume) - RESTRICTED_VOLUMES - {"name"}):
            found.level(f"{path}.{kind}", f"a {kind} volume")
    if not allowed.allow_service_account:
        sources = (volume.get("projected") or {}).get("sources") or ()
        if any("serviceAccountToken" in source for source in sources):
            found.items.append(
                _refused(f"{path}.projected", "a service account token volume", "allowServiceAccount")
            )


def _context(found: _Found, path: str, security: Mapping[str, Any]) -> None:
    """Baseline: the fields a pod's and a container's securityContext share."""
    if (security.get("windowsOptions") or {}).get("hostProcess") is True:
        found.level(f"{path}.windowsOptions.hostProcess", "a Windows host process")
    for field in ("seccompProfile", "appArmorProfile"):
        kind = (security.get(field) or {}).get("type")
        if kind is not None and kind not in CONFINED_PROFILES:
            found.level(f"{path}.{field}.type", f"the profile {kind}")
    selinux = security.get("seLinuxOptions") or {}
    if selinux.get("type", "") not in SAFE_SELINUX_TYPES:
        found.level(f"{path}.seLinuxOptions.type", f"the SELinux type {selinux['type']}")
    for field in ("user", "role"):
        if selinux.get(field, ""):
            found.level(f"{path}.seLinuxOptions.{field}", f"an SELinux {field}")
    if found.allowed.restricted and security.get("runAsUser") == 0:
        found.level(f"{path}.runAsUser", "running as root (0)")


def _container(
    found: _Found, path: str, container: Mapping[str, Any], pod_security: Mapping[str, Any]
) -> None:
    allowed = found.allowed
    if not allowed.allow_host_namespaces:
        for index, port in enumerate(container.get("ports") or ()):
            if port.get("hostPort"):
                found.value(f"{path}.ports[{index}].hostPort", "a host port", "allowHostNamespaces")
    security = container.get("securityContext") or {}
    path = f"{path}.securityContext"
    if not allowed.allow_privileged:
        if security.get("privileged") is True:
            found.value(f"{path}.privileged", "a privileged container", "allowPrivileged")
        if not allowed.baseline and security.get("allowPrivilegeEscalation") is True:
            found.value(f"{path}.allowPrivilegeEscalation", "privilege escalation", "allowPrivileged")
        capabilities = security.get("capabilities") or {}
        unsafe = _beyond(capabilities.get("add"), SAFE_CAPABILITIES)
        if unsafe:
            found.value(
                f"{path}.capabilities.add",
                f"adding {', '.join(unsafe)} (beyond Pod Security baseline's set)",
                "allowPrivileged",
            )
    if not allowed.baseline:
        return
    _context(found, path, security)
    if security.get("procMount", "Default") != "Default":
        found.level(f"{path}.procMount", f"the /proc mount {security['procMount']}")
    if not allowed.restricted:
        return
    if security.get("allowPrivilegeEscalation") is not False:
        found.level(f"{path}.allowPrivilegeEscalation", "anything but false")
    # Unset here, the pod's own value counts; a pod that asks for root or no confinement is refused already.
    if security.get("runAsNonRoot") is False or (
        "runAsNonRoot" not in security and "runAsNonRoot" not in pod_security
    ):
        found.level(
            f"{path}.runAsNonRoot", "running as root (runAsNonRoot unset or false here and in the pod)"
        )
    if "seccompProfile" not in security and "seccompProfile" not in pod_security:
        found.level(f"{path}.seccompProfile", "no seccomp profile (here or in the pod)")
    capabilities = security.get("capabilities") or {}
    if "ALL" not in (capabilities.get("drop") or ()):
        found.level(f"{path}.capabilities.drop", "keeping capabilities (drop must list ALL)")
    beyond = _beyond(capabilities.get("add"), {"NET_BIND_SERVICE"})
    if beyond and not _beyond(capabilities.get("add"), SAFE_CAPABILITIES):
        found.level(f"{path}.capabilities.add", f"adding {', '.join(beyond)} (only NET_BIND_SERVICE)")


def _beyond(names: Iterable[object] | None, safe: Iterable[str]) -> list[str]:
    allowed = set(safe)
    return [str(name) for name in names or () if name not in allowed]


def namespace_labels(name: str, enforce: str, warn: str, audit: str) -> dict[str, Any]:
    """The fields the operator applies to a tenant namespace: Pod Security's label for each mode."""
    return {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {
            "name": name,
            "labels": {
                f"{LABEL_PREFIX}{mode}": level
                for mode, level in (("enforce", enforce), ("warn", warn), ("audit", audit))
            },
        },
    }
