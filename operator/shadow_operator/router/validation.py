"""What a request may name: a preview Host, or the SDK's X-Sandbox-* headers (the rules of upstream's router).

Pure functions that raise `Invalid` with a message safe to show the caller. nginx already refuses Hosts that
do not look like `<label>.<domain>`; these checks are the second line and the only one for the SDK headers.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

# RFC 1123 label as Kubernetes names use it: lowercase alphanumerics and '-', at most 63 characters.
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
UID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
# Cloud metadata services that are not in the link-local range (AWS's IPv6 endpoint; Alibaba's IPv4 one).
METADATA_ADDRESSES = frozenset(
    {ipaddress.ip_address("fd00:ec2::254"), ipaddress.ip_address("100.100.100.200")}
)


class Invalid(ValueError):
    """A request naming something it may not; the message is meant for the caller."""


@dataclass(frozen=True)
class SdkTarget:
    """A validated SDK request: which sandbox, which of its ports, and optionally which pod IP and uid."""

    namespace: str
    name: str
    port: int
    pod_ip: str | None = None
    uid: str | None = None


def is_dns_label(value: str) -> bool:
    return bool(DNS_LABEL.match(value))


def sandbox_of_host(host: str, domain: str) -> str:
    """The sandbox a preview Host names: exactly one DNS label in front of the preview domain.

    nginx hands over `$host`, already lowercased and without a port; anything else (a port, dots or
    percent signs in the label, an IP, a label too long) is refused here again rather than trusted.
    """
    suffix = "." + domain
    if not host.endswith(suffix):
        raise Invalid("not a preview host")
    label = host[: -len(suffix)]
    if not is_dns_label(label):
        raise Invalid("not a sandbox name")
    return label


def parse_port(value: str) -> int:
    if not value.isascii() or not value.isdigit() or len(value) > 5:
        raise Invalid("X-Sandbox-Port must be a number from 1 to 65535")
    port = int(value)
    if not 1 <= port <= 65535:
        raise Invalid("X-Sandbox-Port must be a number from 1 to 65535")
    return port


def parse_pod_ip(value: str) -> str:
    try:
        address = ipaddress.ip_address(value)
    except ValueError:
        raise Invalid("X-Sandbox-Pod-IP is not an IP address") from None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    if (
        address.is_loopback
        or address.is_link_local
        or address.is_multicast
        or address.is_unspecified
        or address in METADATA_ADDRESSES
    ):
        raise Invalid("X-Sandbox-Pod-IP may not be a loopback, link-local, multicast or metadata address")
    return str(address)


def is_loopback_peer(value: str) -> bool:
    """Whether the address nginx saw the connection come from (`$remote_addr`) is loopback: inside the router's
    pod, which is where `kubectl port-forward` connections arrive (the kubelet dials them in the pod's network
    namespace). Anything that is not one plain address (empty, `unix:`, a list) is not loopback."""
    try:
        address = ipaddress.ip_address(value)
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_loopback


def sdk_target(
    sandbox_id: str | None,
    namespace: str | None,
    port: str | None,
    pod_ip: str | None = None,
    uid: str | None = None,
) -> SdkTarget:
    """Validate the SDK's routing headers (X-Sandbox-ID, -Namespace, -Port, optional -Pod-IP and -UID)."""
    if not sandbox_id:
        raise Invalid("missing X-Sandbox-ID")
    if not is_dns_label(sandbox_id):
        raise Invalid("X-Sandbox-ID must be a DNS-1123 label")
    if not namespace:
        raise Invalid("missing X-Sandbox-Namespace")
    if not is_dns_label(namespace):
        raise Invalid("X-Sandbox-Namespace must be a DNS-1123 label")
    if not port:
        raise Invalid("missing X-Sandbox-Port")
    if uid and not UID.match(uid):
        raise Invalid("X-Sandbox-UID is not a UID")
    return SdkTarget(
        namespace=namespace,
        name=sandbox_id,
        port=parse_port(port),
        pod_ip=parse_pod_ip(pod_ip) if pod_ip else None,
        uid=uid or None,
    )
