"""Whether a sandbox's runtime requires the token: always, unless its SandboxTemplate says
`shadow.dev/runtime-auth: none` and the template's managed NetworkPolicy is what protects the runtime instead.

Clients such as Amicable's backend reach the runtime by the claim's Service and send no token. Without the token,
whoever can open a connection to the pod runs commands in it, so the network is the only guard: the template's
NetworkPolicy must be managed, must select the sandbox's pod, and must admit named peers only (no rule without
`from`, no peer that is every namespace, no /0 address block).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from shadow_operator.api import constants as c
from shadow_operator.api import naming

Body = Mapping[str, Any]


def open_ingress(template: Body) -> list[str]:
    """Why the template's managed NetworkPolicy does not limit ingress to named peers ([] when it does)."""
    spec = template["spec"]
    if spec.get("networkPolicyManagement", "Managed") != "Managed":
        return ["networkPolicyManagement is Unmanaged, so no NetworkPolicy of ours guards the runtime"]
    custom = spec.get("networkPolicy")
    if custom is None:
        return []  # the default: only the operator's namespace (operator and router) may connect
    problems = []
    for i, rule in enumerate(custom.get("ingress") or ()):
        peers = rule.get("from") or []
        if not peers:
            problems.append(f"networkPolicy.ingress[{i}] has no `from`, so it admits every peer")
        for j, peer in enumerate(peers):
            where = f"networkPolicy.ingress[{i}].from[{j}]"
            if peer.get("namespaceSelector") == {} and not peer.get("podSelector"):
                problems.append(f"{where} admits every pod of every namespace")
            cidr = (peer.get("ipBlock") or {}).get("cidr", "")
            if cidr.endswith("/0"):
                problems.append(f"{where} admits every address ({cidr})")
    return problems


def token_required(sandbox: Body, template: Body | None) -> tuple[bool, str | None]:
    """(whether the runtime gets the token, why a template's `none` was not honoured, if it was asked for)."""
    if template is None:
        return True, None
    value = (
        (template["metadata"].get("annotations") or {}).get(c.ANNOTATION_RUNTIME_AUTH)
    ) or c.RUNTIME_AUTH_TOKEN
    if value == c.RUNTIME_AUTH_TOKEN:
        return True, None
    name = template["metadata"]["name"]
    if value != c.RUNTIME_AUTH_NONE:
        return (
            True,
            f"{c.ANNOTATION_RUNTIME_AUTH}={value!r} on SandboxTemplate {name} is neither none nor token",
        )
    labels = sandbox["metadata"].get("labels") or {}
    if labels.get(c.LABEL_TEMPLATE_REF_HASH) != naming.name_hash(name):
        return True, f"the pod would not be selected by SandboxTemplate {name}'s NetworkPolicy"
    problems = open_ingress(template)
    if problems:
        return True, f"SandboxTemplate {name} asks for no runtime token, but " + "; ".join(problems)
    return False, None
