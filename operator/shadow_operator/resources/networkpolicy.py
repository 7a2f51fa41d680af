"""The NetworkPolicy shared by all sandboxes of a SandboxTemplate."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from shadow_operator.api import constants as c
from shadow_operator.api import naming
from shadow_operator.resources.sandbox import owner_reference

Body = Mapping[str, Any]

PRIVATE_V4 = ["10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "169.254.0.0/16", "100.64.0.0/10"]
PRIVATE_V6 = ["fc00::/7", "fe80::/10"]


def default_ingress(namespaces: Sequence[str]) -> list[dict[str, Any]]:
    """Only the given namespaces (the operator's, where the preview router runs too) may connect."""
    peers = [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}}} for ns in namespaces]
    return [{"from": peers}] if peers else []


def default_egress() -> list[dict[str, Any]]:
    """Internet yes, cluster and cloud-metadata ranges no; cluster DNS explicitly allowed."""
    dns_ports = [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]
    return [
        {
            "to": [
                {
                    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
                    "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}},
                }
            ],
            "ports": dns_ports,
        },
        {
            "to": [
                {"ipBlock": {"cidr": "0.0.0.0/0", "except": PRIVATE_V4}},
                {"ipBlock": {"cidr": "::/0", "except": PRIVATE_V6}},
            ]
        },
    ]


def build_network_policy(template: Body, ingress_namespaces: Sequence[str]) -> dict[str, Any]:
    meta = template["metadata"]
    custom = template["spec"].get("networkPolicy")
    if custom is None:
        ingress, egress = default_ingress(ingress_namespaces), default_egress()
    else:
        ingress, egress = list(custom.get("ingress") or []), list(custom.get("egress") or [])
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
