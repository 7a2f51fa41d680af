"""The egress deny-list of sandboxes' managed NetworkPolicy: both families, every non-global range, the
cluster's own pod and service ranges."""

from __future__ import annotations

import ipaddress
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from shadow_operator.controllers.config import Config
from shadow_operator.resources import networkpolicy

pytestmark = pytest.mark.unit

TEMPLATE: dict[str, Any] = {
    "apiVersion": "extensions.agents.x-k8s.io/v1beta1",
    "kind": "SandboxTemplate",
    "metadata": {"name": "tpl", "namespace": "ns", "uid": "tpl-uid"},
    "spec": {"podTemplate": {"spec": {"containers": [{"name": "main", "image": "img"}]}}},
}

# What a hostile workspace would aim at: the node, the cluster, metadata services, private networks, and the
# IPv6 spellings that lead to IPv4 ones.
NON_GLOBAL = [
    "0.1.2.3",
    "10.96.0.1",
    "100.64.0.10",
    "127.0.0.1",
    "169.254.169.254",
    "172.18.0.2",
    "192.0.0.170",
    "192.0.2.1",
    "192.168.1.1",
    "198.18.0.1",
    "198.19.255.254",
    "224.0.0.251",
    "240.0.0.1",
    "255.255.255.255",
    "::",
    "::1",
    "::ffff:10.0.0.1",
    "::ffff:169.254.169.254",
    "64:ff9b::a9fe:a9fe",
    "64:ff9b:1::a00:1",
    "100::1",
    "2001::a9fe:a9fe",
    "2001:db8::1",
    "2002:a9fe:a9fe::1",
    "fd00:ec2::254",
    "fe80::1",
    "fec0::1",
    "ff02::1",
]
PUBLIC = ["1.1.1.1", "8.8.8.8", "151.101.1.69", "2606:4700:4700::1111", "2a00:1450:4001:80b::200e"]


def internet_blocks(cluster_cidrs: tuple[str, ...] = ()) -> dict[int, dict[str, Any]]:
    policy = networkpolicy.build_network_policy(TEMPLATE, ["shadow-system"], cluster_cidrs)
    _, internet = policy["spec"]["egress"]
    blocks = [peer["ipBlock"] for peer in internet["to"]]
    return {ipaddress.ip_network(block["cidr"]).version: block for block in blocks}


def denied(address: str, cluster_cidrs: tuple[str, ...] = ()) -> bool:
    parsed = ipaddress.ip_address(address)
    # An IPv4-mapped address is sent as IPv4 by the kernel: the IPv4 block decides.
    ip = parsed.ipv4_mapped if isinstance(parsed, ipaddress.IPv6Address) and parsed.ipv4_mapped else parsed
    block = internet_blocks(cluster_cidrs)[ip.version]
    assert ip in ipaddress.ip_network(block["cidr"])
    return any(ip in ipaddress.ip_network(cidr) for cidr in block["except"])


@pytest.mark.parametrize("address", NON_GLOBAL)
def test_egress_denies_every_non_global_address(address: str) -> None:
    assert denied(address)


@pytest.mark.parametrize("address", PUBLIC)
def test_egress_allows_the_internet(address: str) -> None:
    assert not denied(address)


@given(st.ip_addresses())
def test_what_python_calls_not_global_is_denied(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> None:
    if not ip.is_global or ip.is_multicast:
        assert denied(str(ip))


def test_every_except_is_a_strict_subnet_of_its_block() -> None:
    # The API server refuses an except that is not strictly inside the block's cidr, or has host bits set.
    for block in internet_blocks(("34.118.224.0/20", "2600:1900:4000::/44")).values():
        network = ipaddress.ip_network(block["cidr"])
        for cidr in block["except"]:
            inner = ipaddress.ip_network(cidr)
            # Go (the API server) parses IPv4-mapped ranges as IPv4: one there is not inside ::/0.
            mapped = ipaddress.ip_network("::ffff:0:0/96")
            assert not (inner.version == 6 and inner.subnet_of(mapped)), cidr  # type: ignore[arg-type]
            assert inner.subnet_of(network) and inner.prefixlen > network.prefixlen  # type: ignore[arg-type]
        assert len(block["except"]) == len(set(block["except"]))


def test_cluster_ranges_that_are_routable_are_denied_too() -> None:
    # GKE's default service range and a routable IPv6 pod range: not private, so not denied by default.
    cidrs = ("34.118.224.0/20", "2600:1900:4000:1::/64")
    assert not denied("34.118.224.10") and not denied("2600:1900:4000:1::5")
    assert denied("34.118.224.10", cidrs) and denied("2600:1900:4000:1::5", cidrs)
    assert not denied("34.118.240.1", cidrs)


def test_cluster_ranges_are_normalised_and_checked() -> None:
    v4, v6 = networkpolicy.denied_ranges([" 34.118.230.7/20", "2600:1900:4000:1::/64"])
    assert "34.118.224.0/20" in v4 and "2600:1900:4000:1::/64" in v6
    # No two ranges overlap (nftables-based enforcers refuse overlapping set elements): one inside another
    # is dropped, whichever of them the cluster named.
    v4, v6 = networkpolicy.denied_ranges(["10.244.0.0/16", "fd00:10:244::/56", "100.0.0.0/9"])
    assert "10.244.0.0/16" not in v4 and "fd00:10:244::/56" not in v6
    assert "100.0.0.0/9" in v4 and "100.64.0.0/10" not in v4
    for family in (v4, v6):
        networks = [ipaddress.ip_network(cidr) for cidr in family]
        assert not [(a, b) for a in networks for b in networks if a != b and a.overlaps(b)]
    with pytest.raises(ValueError, match="does not appear to be an IPv4 or IPv6 network"):
        networkpolicy.denied_ranges(["pods"])
    with pytest.raises(ValueError, match="covers every address"):
        networkpolicy.denied_ranges(["::/0"])


def test_operator_reads_the_cluster_ranges_from_its_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SHADOW_CLUSTER_CIDRS", "34.118.224.0/20, 2600:1900:4000:1::/64")
    assert Config.from_env().cluster_cidrs == ("34.118.224.0/20", "2600:1900:4000:1::/64")
    monkeypatch.setenv("SHADOW_CLUSTER_CIDRS", "10.0.0.0/33")
    with pytest.raises(ValueError, match="SHADOW_CLUSTER_CIDRS"):
        Config.from_env()


def test_a_template_with_an_egress_allowlist_reaches_only_dns_and_the_gateway() -> None:
    template = {**TEMPLATE, "spec": {**TEMPLATE["spec"], "egress": {"rules": [{"host": "pypi.org"}]}}}
    policy = networkpolicy.build_network_policy(
        template, ["shadow-system"], gateway_namespace="shadow-system"
    )
    egress = policy["spec"]["egress"]
    # No ipBlock at all: nothing outside the cluster is reachable except through the gateway.
    assert not any("ipBlock" in peer for rule in egress for peer in rule["to"])
    assert egress[0]["ports"] == [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]
    assert egress[1] == {
        "to": [
            {
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "shadow-system"}},
                "podSelector": {"matchLabels": {"shadow.dev/egress-gateway": "true"}},
            }
        ],
        "ports": [{"protocol": "TCP", "port": 3128}],
    }
    # Ingress is not the allowlist's business.
    assert policy["spec"]["ingress"] == networkpolicy.default_ingress(["shadow-system"])
    with pytest.raises(ValueError, match="needs the egress gateway's namespace"):
        networkpolicy.build_network_policy(template, ["shadow-system"])
