"""Pure functions that index cached objects (object in, index values out) and the keys they share.

Several reconcilers look objects up the same way; they declare the same function, so the cache builds each
index once. Index values carry the namespace, since one cache spans every watched namespace.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from shadow_operator.api import constants as c
from shadow_operator.resources.metadata import controller_uid

Body = Mapping[str, Any]

# Index names.
BY_CONTROLLER = "controller-uid"  # any kind: the uid of its controller owner
POOL_MEMBER = "pool-member"  # Sandbox: the uid of the warm pool that controls it, unless it is being deleted
CLAIM_WAITS_ON = "waits-on"  # SandboxClaim: "<ns>/pool/<name>" and "<ns>/template/<name>" it depends on
POOL_BY_TEMPLATE = "pool-template"  # SandboxWarmPool: "<ns>/<template>"
FORK_OF = "fork-of"  # ShadowEnvironment: "<ns>/<environment>" it forks (spec.workspace.from.environment)


def by_controller(obj: Body) -> Iterable[str]:
    uid = controller_uid(obj)
    return (uid,) if uid else ()


def is_ready(obj: Body) -> bool:
    """Whether a cached object's Ready condition is True (read from the body: this runs per pool member)."""
    return any(
        cond.get("type") == c.COND_READY and cond.get("status") == "True"
        for cond in (obj.get("status") or {}).get("conditions") or ()
    )


def pool_member(sandbox: Body) -> Iterable[str]:
    meta = sandbox["metadata"]
    if meta.get("deletionTimestamp") or c.LABEL_WARM_POOL not in (meta.get("labels") or {}):
        return ()
    for ref in meta.get("ownerReferences") or ():
        if ref.get("controller") and ref.get("kind") == "SandboxWarmPool":
            return (str(ref["uid"]),)
    return ()


def waits_on(namespace: str, what: str, name: str) -> str:
    return f"{namespace}/{what}/{name}"


def claim_waits_on(claim: Body) -> Iterable[str]:
    """What a claim depends on: its pool, or its template (and a named v1alpha1 pool)."""
    ns, spec = claim["metadata"]["namespace"], claim.get("spec") or {}
    if (spec.get("warmPoolRef") or {}).get("name"):
        return (waits_on(ns, "pool", spec["warmPoolRef"]["name"]),)
    values = []
    if (spec.get("sandboxTemplateRef") or {}).get("name"):
        values.append(waits_on(ns, "template", spec["sandboxTemplateRef"]["name"]))
    policy = spec.get("warmpool")
    if policy and policy not in ("none", "default"):
        values.append(waits_on(ns, "pool", policy))
    return values


def pool_by_template(pool: Body) -> Iterable[str]:
    ref = (pool.get("spec") or {}).get("sandboxTemplateRef") or {}
    return (f"{pool['metadata']['namespace']}/{ref['name']}",) if ref.get("name") else ()


def fork_of(env: Body) -> Iterable[str]:
    source = (((env.get("spec") or {}).get("workspace") or {}).get("from") or {}).get("environment")
    return (f"{env['metadata']['namespace']}/{source}",) if source else ()
