"""NetworkPolicies of an environment's Gitea: each workspace reaches its own Gitea and no other.

Gitea's repositories are public (anonymous read): git in the workspace fetches through the `insteadOf`
rewrites without a credential, which is what `pip install git+https://github.com/...` needs. The boundary is
the network instead:

- `<env>-gitea` selects the environment's Gitea Pod: ingress only from its own workspace Pod and from the
  operator's Pods (bootstrap and pushes), on the HTTP port; no egress at all (Gitea serves, it never calls
  out: no migrations, mirrors, webhooks or DNS).
- `<env>-workspace-to-gitea` selects the environment's workspace Pod and allows egress to its own Gitea
  Pod's HTTP port. NetworkPolicies add up: the template's managed policy refuses private ranges (so other
  environments' Gitea), this one opens exactly the one exception.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from shadow_operator.api import constants as c
from shadow_operator.api import naming
from shadow_operator.api.kinds import NETWORK_POLICY, SERVICE, STATEFUL_SET, ResourceKind
from shadow_operator.resources import environment as res

Body = Mapping[str, Any]
Manifest = dict[str, Any]


def gitea_network_policy_name(env: str) -> str:
    return naming.bounded(f"{env}-gitea", 253)


def workspace_policy_name(env: str) -> str:
    return naming.bounded(f"{env}-workspace-to-gitea", 253)


def workspace_selector(env: Body) -> dict[str, str]:
    """The environment's workspace Pod: the Sandbox named like the environment, labelled with it."""
    name = env["metadata"]["name"]
    return {c.LABEL_SANDBOX_NAME_HASH: naming.name_hash(name), c.LABEL_ENVIRONMENT: name}


def operator_peer(operator_namespace: str) -> dict[str, Any]:
    """The operator's Pods (the chart labels them `app.kubernetes.io/component: operator`), not the rest of
    its namespace (the preview router runs there too)."""
    return {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": operator_namespace}},
        "podSelector": {"matchLabels": {"app.kubernetes.io/component": c.OPERATOR_POD_COMPONENT}},
    }


def _network_policy(env: Body, name: str, component: str, spec: dict[str, Any]) -> Manifest:
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {
            "name": name,
            "namespace": env["metadata"]["namespace"],
            "labels": res.environment_labels(env, component),
        },
        "spec": spec,
    }


def build_gitea_network_policies(env: Body, operator_namespace: str) -> list[Manifest]:
    name = env["metadata"]["name"]
    port = [{"protocol": "TCP", "port": c.GITEA_HTTP_PORT}]
    gitea = _network_policy(
        env,
        gitea_network_policy_name(name),
        c.COMPONENT_GITEA,
        {
            "podSelector": {"matchLabels": res.gitea_selector(env)},
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [
                {
                    "from": [
                        {"podSelector": {"matchLabels": workspace_selector(env)}},
                        operator_peer(operator_namespace),
                    ],
                    "ports": port,
                }
            ],
            # No egress rule under policyTypes Egress: nothing out (an empty list is not stored, so none).
        },
    )
    workspace = _network_policy(
        env,
        workspace_policy_name(name),
        c.COMPONENT_WORKSPACE,
        {
            "podSelector": {"matchLabels": workspace_selector(env)},
            "policyTypes": ["Egress"],
            "egress": [{"to": [{"podSelector": {"matchLabels": res.gitea_selector(env)}}], "ports": port}],
        },
    )
    return [gitea, workspace]


@dataclass(frozen=True)
class GiteaSettings:
    """The operator's settings every Gitea is made with (the chart's gitea.* values)."""

    operator_namespace: str
    image: str
    cluster_domain: str
    pull_policy: str
    resources: Mapping[str, Any]


def build_gitea_children(
    env: Body, settings: GiteaSettings, current: Body | None
) -> list[tuple[ResourceKind, Manifest]]:
    """Gitea's Service, NetworkPolicies and StatefulSet (in the order they are applied) for an environment or
    a pool's instance (`env` names them); `current` is the StatefulSet as it is (None: not made yet)."""
    children: list[tuple[ResourceKind, Manifest]] = [(SERVICE, res.build_gitea_service(env))]
    children += [(NETWORK_POLICY, p) for p in build_gitea_network_policies(env, settings.operator_namespace)]
    sts = res.build_gitea_statefulset(
        env,
        image=settings.image,
        cluster_domain=settings.cluster_domain,
        pull_policy=settings.pull_policy,
        resources=dict(settings.resources),
        on_volume=res.gitea_on_volume(env, current),
    )
    return [*children, (STATEFUL_SET, sts)]
