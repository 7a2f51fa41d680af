"""The NetworkPolicy shared by all sandboxes of a SandboxTemplate."""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from shadow_operator.api import constants as c
from shadow_operator.api import naming
from shadow_operator.resources.metadata import owner_reference

Body = Mapping[str, Any]

# Every IPv4 range that is not globally routable (IANA special-purpose registry): a sandbox reaches the
# internet, never the cluster, the node, the cloud's metadata service or a private network behind them.
NON_GLOBAL_V4 = [
    "0.0.0.0/8",  # "this network"
    "10.0.0.0/8",  # RFC 1918
    "100.64.0.0/10",  # CGNAT (also a common pod range)
    "127.0.0.0/8",  # loopback
    "169.254.0.0/16",  # link-local: cloud metadata services
    "172.16.0.0/12",  # RFC 1918
    "192.0.0.0/24",  # IETF protocol assignments
    "192.0.2.0/24",  # documentation
    "192.88.99.0/24",  # 6to4 relay anycast
    "192.168.0.0/16",  # RFC 1918
    "198.18.0.0/15",  # benchmarking (used by some clouds and VPNs internally)
    "198.51.100.0/24",  # documentation
    "203.0.113.0/24",  # documentation
    "224.0.0.0/4",  # multicast
    "240.0.0.0/4",  # reserved, broadcast
]
# And IPv6: the forms that embed IPv4 (NAT64, 6to4, Teredo) are refused too, since through them an IPv4 range
# above could be reached by a v6 address. IPv4-mapped addresses (::ffff:0:0/96) leave the pod as IPv4 packets,
# which the list above covers (and the API server reads that range as IPv4's 0.0.0.0/0, refusing it here).
NON_GLOBAL_V6 = [
    "::/128",  # unspecified
    "::1/128",  # loopback
    "64:ff9b::/96",  # NAT64, well-known prefix
    "64:ff9b:1::/48",  # NAT64, local use
    "100::/64",  # discard-only
    "2001::/23",  # IETF protocol assignments (Teredo, ORCHID, ...)
    "2001:db8::/32",  # documentation
    "2002::/16",  # 6to4
    "fc00::/7",  # unique local
    "fe80::/10",  # link-local
    "fec0::/10",  # site-local (deprecated)
    "ff00::/8",  # multicast
]


def denied_ranges(cluster_cidrs: Iterable[str] = ()) -> tuple[list[str], list[str]]:
    """(IPv4, IPv6) ranges a sandbox may not reach: the non-global ones plus the cluster's own pod and service
    ranges (`cluster_cidrs`, normalised; they matter where those ranges are globally routable addresses).

    A range inside another is left out, so no two overlap: policy enforcers that compile the list into
    interval sets (nftables) refuse overlapping elements.
    """
    networks = [ipaddress.ip_network(cidr) for cidr in (*NON_GLOBAL_V4, *NON_GLOBAL_V6)]
    for cidr in cluster_cidrs:
        network = ipaddress.ip_network(cidr.strip(), strict=False)
        if network.prefixlen == 0:
            raise ValueError(f"cluster CIDR {cidr!r} covers every address: name the pod and service ranges")
        networks.append(network)
    kept = [
        network
        for network in networks
        if not any(
            other != network and other.version == network.version and network.subnet_of(other)  # type: ignore[arg-type]
            for other in networks
        )
    ]
    ordered = list(dict.fromkeys(str(network) for network in kept))
    return [n for n in ordered if ":" not in n], [n for n in ordered if ":" in n]


def default_ingress(namespaces: Sequence[str]) -> list[dict[str, Any]]:
    """Only the given namespaces (the operator's, where the preview router runs too) may connect."""
    peers = [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}}} for ns in namespaces]
    return [{"from": peers}] if peers else []


DNS_EGRESS: dict[str, Any] = {
    "to": [
        {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
            "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}},
        }
    ],
    "ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}],
}


def gateway_egress(gateway_namespace: str) -> list[dict[str, Any]]:
    """A template with spec.egress: cluster DNS and the egress gateway's proxy port, nothing else. Traffic that
    ignores the proxy variables (raw TCP, UDP, a client that unsets them) has nowhere to go."""
    return [
        DNS_EGRESS,
        {
            "to": [
                {
                    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": gateway_namespace}},
                    "podSelector": {"matchLabels": dict(c.EGRESS_GATEWAY_LABELS)},
                }
            ],
            "ports": [{"protocol": "TCP", "port": c.EGRESS_PROXY_PORT}],
        },
    ]


def default_egress(cluster_cidrs: Iterable[str] = ()) -> list[dict[str, Any]]:
    """Internet yes, cluster and cloud-metadata ranges no; cluster DNS explicitly allowed."""
    v4, v6 = denied_ranges(cluster_cidrs)
    return [
        DNS_EGRESS,
        {
            "to": [
                {"ipBlock": {"cidr": "0.0.0.0/0", "except": v4}},
                {"ipBlock": {"cidr": "::/0", "except": v6}},
            ]
        },
    ]


def build_network_policy(
    template: Body,
    ingress_namespaces: Sequence[str],
    cluster_cidrs: Iterable[str] = (),
    gateway_namespace: str | None = None,
) -> dict[str, Any]:
    """The template's NetworkPolicy. With spec.egress, egress goes to the gateway in `gateway_namespace` only
    (the operator's); spec.networkPolicy.egress cannot be set beside it (the CRD refuses both)."""
    meta = template["metadata"]
    custom = template["spec"].get("networkPolicy")
    if custom is None:
        ingress, egress = default_ingress(ingress_namespaces), default_egress(cluster_cidrs)
    else:
        ingress, egress = list(custom.get("ingress") or []), list(custom.get("egress") or [])
    if template["spec"].get("egress") is not None:
        if gateway_namespace is None:
            raise ValueError("a template with spec.egress needs the egress gateway's namespace")
        egress = gateway_egress(gateway_namespace)
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {
            "name": naming.network_policy_name(meta["name"]),
            "namespace": meta["namespace"],
            "labels": {c.LABEL_MANAGED_BY: c.MANAGED_BY_VALUE},
            "ownerReferences": [owner_reference(template)],
        },
        "spec": {
            "podSelector": {"matchLabels": {c.LABEL_TEMPLATE_REF_HASH: naming.name_hash(meta["name"])}},
            "policyTypes": ["Ingress", "Egress"],
            "ingress": ingress,
            "egress": egress,
        },
    }
