"""What a sandbox's pod may ask of its node: the operator's own check, beside the chart's admission policy.

The chart renders a ValidatingAdmissionPolicy (templates/pod-security-policy.yaml) that refuses these fields in
Sandboxes and SandboxTemplates unless a chart value allows them; the operator checks the Pod it is about to
create against the same rules (defence in depth: a cluster without the policy, an object admitted before it
existed) and refuses to create it. Both name the chart value that allows what they refuse.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

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
CONTAINER_LISTS = ("initContainers", "containers", "ephemeralContainers")
HOST_NAMESPACES = ("hostNetwork", "hostPID", "hostIPC")


@dataclass(frozen=True)
class PodSecurity:
    """What the chart allows (values podSecurity.*; SHADOW_ALLOW_* for the operator)."""

    allow_privileged: bool = False
    allow_host_namespaces: bool = False
    allow_host_path: bool = False
    allow_service_account: bool = False


def _refused(path: str, what: str, value: str) -> str:
    return f"{path}: {what} is not allowed (the chart value podSecurity.{value} allows it)"


def _is_safe_capability(name: object) -> bool:
    return isinstance(name, str) and name.removeprefix("CAP_") in SAFE_CAPABILITIES


def violations(pod_spec: Mapping[str, Any], allowed: PodSecurity) -> list[str]:
    """Every field of `pod_spec` that asks for more than `allowed`, as `<path>: <why>` (empty: none)."""
    found: list[str] = []
    if not allowed.allow_host_namespaces:
        found += [
            _refused(field, "sharing the node's namespaces", "allowHostNamespaces")
            for field in HOST_NAMESPACES
            if pod_spec.get(field) is True
        ]
    for index, volume in enumerate(pod_spec.get("volumes") or ()):
        if not allowed.allow_host_path and "hostPath" in volume:
            found.append(_refused(f"volumes[{index}].hostPath", "a hostPath volume", "allowHostPath"))
        if not allowed.allow_service_account:
            sources = (volume.get("projected") or {}).get("sources") or ()
            if any("serviceAccountToken" in source for source in sources):
                found.append(
                    _refused(
                        f"volumes[{index}].projected", "a service account token volume", "allowServiceAccount"
                    )
                )
    if not allowed.allow_service_account:
        for field in ("serviceAccountName", "serviceAccount"):
            if pod_spec.get(field) not in (None, "", "default"):
                found.append(_refused(field, "a service account", "allowServiceAccount"))
        if pod_spec.get("automountServiceAccountToken") is True:
            found.append(
                _refused(
                    "automountServiceAccountToken", "mounting a service account token", "allowServiceAccount"
                )
            )
    for key in CONTAINER_LISTS:
        for index, container in enumerate(pod_spec.get(key) or ()):
            found += _container_violations(f"{key}[{index}]", container, allowed)
    return found


def _container_violations(path: str, container: Mapping[str, Any], allowed: PodSecurity) -> list[str]:
    found: list[str] = []
    if not allowed.allow_host_namespaces:
        found += [
            _refused(f"{path}.ports[{index}].hostPort", "a host port", "allowHostNamespaces")
            for index, port in enumerate(container.get("ports") or ())
            if port.get("hostPort")
        ]
    if allowed.allow_privileged:
        return found
    security = container.get("securityContext") or {}
    if security.get("privileged") is True:
        found.append(
            _refused(f"{path}.securityContext.privileged", "a privileged container", "allowPrivileged")
        )
    if security.get("allowPrivilegeEscalation") is True:
        found.append(
            _refused(
                f"{path}.securityContext.allowPrivilegeEscalation", "privilege escalation", "allowPrivileged"
            )
        )
    added = (security.get("capabilities") or {}).get("add") or ()
    unsafe = [str(name) for name in added if not _is_safe_capability(name)]
    if unsafe:
        found.append(
            _refused(
                f"{path}.securityContext.capabilities.add",
                f"adding {', '.join(unsafe)} (beyond Pod Security baseline's set)",
                "allowPrivileged",
            )
        )
    return found
