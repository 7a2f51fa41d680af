"""Sandboxes built from templates for claims and warm pools; the NetworkPolicy of a template."""

from __future__ import annotations

from typing import Any

import pytest
from shadow_operator.api import constants as c
from shadow_operator.api import naming
from shadow_operator.resources import blueprint, networkpolicy

pytestmark = pytest.mark.unit


def template(**spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "apiVersion": "extensions.agents.x-k8s.io/v1beta1",
        "kind": "SandboxTemplate",
        "metadata": {"name": "tpl", "namespace": "ns", "uid": "tpl-uid"},
        "spec": {
            "podTemplate": {
                "metadata": {"labels": {"app": "a"}},
                "spec": {
                    "containers": [{"name": "main", "image": "img", "env": [{"name": "MODE", "value": "t"}]}]
                },
            },
            "service": True,
        },
    }
    body["spec"].update(spec)
    return body


def claim(**spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "extensions.agents.x-k8s.io/v1beta1",
        "kind": "SandboxClaim",
        "metadata": {
            "name": "c1",
            "namespace": "ns",
            "uid": "claim-uid",
            "labels": {c.LABEL_CREATED_BY: "sdk"},
        },
        "spec": {"sandboxTemplateRef": {"name": "tpl"}, **spec},
    }


def test_cold_sandbox_is_named_like_the_claim_and_owned_by_it() -> None:
    sandbox = blueprint.build_claimed_sandbox(claim(), template())
    meta = sandbox["metadata"]
    assert meta["name"] == "c1"
    assert meta["ownerReferences"][0]["uid"] == "claim-uid"
    assert meta["labels"][c.LABEL_CLAIM_UID] == "claim-uid"
    assert meta["labels"][c.LABEL_LAUNCH_TYPE] == c.LAUNCH_COLD
    assert meta["labels"][c.LABEL_CREATED_BY] == "sdk"
    assert sandbox["spec"]["service"] is True
    assert sandbox["spec"]["podTemplate"]["spec"]["automountServiceAccountToken"] is False


def test_claim_metadata_never_overrides_the_template() -> None:
    extra = {"labels": {"app": "other", "team": "x"}, "annotations": {"a": "1"}}
    sandbox = blueprint.build_claimed_sandbox(claim(additionalPodMetadata=extra), template())
    meta = sandbox["spec"]["podTemplate"]["metadata"]
    assert meta["labels"] == {"app": "a", "team": "x"}
    assert meta["annotations"] == {"a": "1"}


def test_restricted_metadata_is_rejected() -> None:
    bad = claim(additionalPodMetadata={"labels": {"node.kubernetes.io/x": "1"}})
    with pytest.raises(blueprint.ClaimRejected) as info:
        blueprint.build_claimed_sandbox(bad, template())
    assert info.value.reason == c.REASON_INVALID_METADATA


@pytest.mark.parametrize(
    ("policy", "env", "outcome"),
    [
        ("Disallowed", [{"name": "NEW", "value": "1"}], c.REASON_ENV_INJECTION_REJECTED),
        ("Allowed", [{"name": "MODE", "value": "x"}], c.REASON_ENV_INJECTION_REJECTED),
        ("Allowed", [{"name": "NEW", "value": "1"}], {"MODE": "t", "NEW": "1"}),
        ("Overrides", [{"name": "MODE", "value": "x"}], {"MODE": "x"}),
    ],
)
def test_env_injection_policy(policy: str, env: list[dict[str, str]], outcome: Any) -> None:
    tpl = template(envVarsInjectionPolicy=policy)
    if isinstance(outcome, str):
        with pytest.raises(blueprint.ClaimRejected) as info:
            blueprint.build_claimed_sandbox(claim(env=env), tpl)
        assert info.value.reason == outcome
        return
    container = blueprint.build_claimed_sandbox(claim(env=env), tpl)["spec"]["podTemplate"]["spec"][
        "containers"
    ][0]
    assert {e["name"]: e["value"] for e in container["env"]} == outcome


def test_volume_claim_templates_policy() -> None:
    vct = [{"metadata": {"name": "data"}, "spec": {}}]
    with pytest.raises(blueprint.ClaimRejected):
        blueprint.build_claimed_sandbox(claim(volumeClaimTemplates=vct), template())
    sandbox = blueprint.build_claimed_sandbox(
        claim(volumeClaimTemplates=vct), template(volumeClaimTemplatesPolicy="Allowed")
    )
    assert [t["metadata"]["name"] for t in sandbox["spec"]["volumeClaimTemplates"]] == ["data"]


def test_warm_sandbox_labels_and_hash_follow_the_template() -> None:
    pool = {
        "apiVersion": "extensions.agents.x-k8s.io/v1beta1",
        "kind": "SandboxWarmPool",
        "metadata": {"name": "pool", "namespace": "ns", "uid": "pool-uid"},
    }
    sandbox = blueprint.build_warm_sandbox(pool, template())
    labels = sandbox["metadata"]["labels"]
    assert sandbox["metadata"]["generateName"] == "pool-"
    assert labels[c.LABEL_WARM_POOL] == naming.name_hash("pool")
    assert labels[c.LABEL_TEMPLATE_HASH] == blueprint.template_hash(template())
    changed = template()
    changed["spec"]["podTemplate"]["spec"]["containers"][0]["image"] = "img:2"
    assert blueprint.template_hash(changed) != blueprint.template_hash(template())


def test_adoption_patch_is_guarded_by_resource_version() -> None:
    warm = blueprint.build_warm_sandbox(
        {
            "apiVersion": "x/v1",
            "kind": "SandboxWarmPool",
            "metadata": {"name": "p", "namespace": "ns", "uid": "u"},
        },
        template(),
    )
    warm["metadata"]["resourceVersion"] = "42"
    warm["metadata"]["name"] = "p-x1y2z"  # the API server's, from generateName
    patch = blueprint.adoption_patch(warm, claim(), template())
    assert patch["metadata"]["resourceVersion"] == "42"
    assert patch["metadata"]["ownerReferences"][0]["uid"] == "claim-uid"
    assert patch["metadata"]["labels"][c.LABEL_WARM_POOL] is None
    assert patch["metadata"]["labels"][c.LABEL_CLAIM_UID] == "claim-uid"
    # The Pod's name, before the adopted Sandbox can be seen Ready (as upstream); nothing else.
    assert patch["metadata"]["annotations"] == {c.ANNOTATION_POD_NAME: "p-x1y2z"}


def test_a_claim_chooses_a_private_or_public_preview_for_its_sandbox() -> None:
    private = claim()
    private["metadata"]["annotations"] = {c.ANNOTATION_PREVIEW_ACCESS: "private"}
    cold = blueprint.build_claimed_sandbox(private, template())
    assert cold["metadata"]["annotations"][c.ANNOTATION_PREVIEW_ACCESS] == "private"
    warm = blueprint.build_warm_sandbox(
        {
            "apiVersion": "x/v1",
            "kind": "SandboxWarmPool",
            "metadata": {"name": "p", "namespace": "ns", "uid": "u"},
        },
        template(),
    )
    warm["metadata"]["resourceVersion"] = "7"
    warm["metadata"]["name"] = "p-x1y2z"
    assert blueprint.adoption_patch(warm, private, template())["metadata"]["annotations"] == {
        c.ANNOTATION_POD_NAME: "p-x1y2z",
        c.ANNOTATION_PREVIEW_ACCESS: "private",
    }
    assert (
        c.ANNOTATION_PREVIEW_ACCESS
        not in blueprint.build_claimed_sandbox(claim(), template())["metadata"]["annotations"]
    )


def test_default_network_policy() -> None:
    policy = networkpolicy.build_network_policy(template(), ["shadow-system"])
    spec = policy["spec"]
    assert spec["podSelector"] == {"matchLabels": {c.LABEL_TEMPLATE_REF_HASH: naming.name_hash("tpl")}}
    assert spec["policyTypes"] == ["Ingress", "Egress"]
    assert spec["ingress"][0]["from"][0]["namespaceSelector"]["matchLabels"] == {
        "kubernetes.io/metadata.name": "shadow-system"
    }
    dns, internet = spec["egress"]
    assert {p["port"] for p in dns["ports"]} == {53}
    assert "10.0.0.0/8" in internet["to"][0]["ipBlock"]["except"]
    assert "169.254.0.0/16" in internet["to"][0]["ipBlock"]["except"]


def test_custom_network_policy_rules() -> None:
    rules = {"ingress": [], "egress": [{"to": [{"ipBlock": {"cidr": "1.1.1.1/32"}}]}]}
    spec = networkpolicy.build_network_policy(template(networkPolicy=rules), ["ops"])["spec"]
    assert spec["ingress"] == [] and spec["egress"] == rules["egress"]


def test_default_ingress_lists_every_allowed_namespace() -> None:
    spec = networkpolicy.build_network_policy(template(), ["shadow-system", "preview"])["spec"]
    peers = spec["ingress"][0]["from"]
    assert [p["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"] for p in peers] == [
        "shadow-system",
        "preview",
    ]


def test_a_claims_sandbox_gets_the_claims_policy_within_the_templates() -> None:
    ceiling = template(autoSuspendPolicy={"suspendThresholdSeconds": 600})
    assert "autoSuspendPolicy" not in blueprint.build_claimed_sandbox(claim(), template())["spec"]
    default = blueprint.build_claimed_sandbox(claim(), ceiling)
    assert default["spec"]["autoSuspendPolicy"] == {"suspendThresholdSeconds": 600}
    shorter = claim(autoSuspendPolicy={"suspendThresholdSeconds": 60})
    assert blueprint.build_claimed_sandbox(shorter, ceiling)["spec"]["autoSuspendPolicy"] == {
        "suspendThresholdSeconds": 60
    }
    # Without a template policy, the claim's own; left out, the CRD default (900).
    assert blueprint.build_claimed_sandbox(claim(autoSuspendPolicy={}), template())["spec"][
        "autoSuspendPolicy"
    ] == {"suspendThresholdSeconds": 900}
    longer = claim(autoSuspendPolicy={"suspendThresholdSeconds": 601})
    with pytest.raises(blueprint.ClaimRejected) as refused:
        blueprint.build_claimed_sandbox(longer, ceiling)
    assert refused.value.reason == c.REASON_AUTO_SUSPEND_POLICY_REFUSED
    assert "601" in str(refused.value) and "600" in str(refused.value)
    # A warm sandbox has none; adoption sets the claim's (a merge patch: null removes it).
    warm = blueprint.build_warm_sandbox(
        {
            "apiVersion": "x/v1",
            "kind": "SandboxWarmPool",
            "metadata": {"name": "p", "namespace": "ns", "uid": "u"},
        },
        ceiling,
    )
    assert "autoSuspendPolicy" not in warm["spec"]
    warm["metadata"].update(resourceVersion="1", name="p-abcde")
    assert blueprint.adoption_patch(warm, shorter, ceiling)["spec"]["autoSuspendPolicy"] == {
        "suspendThresholdSeconds": 60
    }
    with pytest.raises(blueprint.ClaimRejected):
        blueprint.adoption_patch(warm, longer, ceiling)
