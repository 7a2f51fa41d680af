"""SandboxTemplate controller: the managed NetworkPolicy, and waking claims and pools that wait for it."""

from __future__ import annotations

from typing import Any

import kopf

from shadow_operator.api import constants as c
from shadow_operator.api import naming
from shadow_operator.clients.kube import ApiError, resource_path
from shadow_operator.controllers import claim as claim_controller
from shadow_operator.controllers import events, runtime
from shadow_operator.controllers.claim import pools, templates
from shadow_operator.resources import networkpolicy
from shadow_operator.resources import sandbox as res

KIND = "SandboxTemplate"


def network_policies(namespace: str, name: str | None = None) -> str:
    return resource_path("networking.k8s.io/v1", "networkpolicies", namespace, name)


@kopf.on.event(c.EXTENSIONS_GROUP, c.STORAGE_VERSION, "sandboxtemplates")
async def template_event(namespace: str | None, name: str, **_: Any) -> None:
    if not namespace:
        return
    rt = runtime.current()
    rt.queue(KIND).add(namespace, name)
    for pool in await rt.kube.list(pools(namespace)):
        if pool["spec"]["sandboxTemplateRef"]["name"] == name:
            rt.queue("SandboxWarmPool").add(namespace, pool["metadata"]["name"])
    await claim_controller.enqueue_unready(rt.kube, namespace)


async def reconcile(namespace: str, name: str) -> float | None:
    rt = runtime.current()
    kube = rt.kube
    template = await kube.get(templates(namespace, name))
    if template is None or template["metadata"].get("deletionTimestamp"):
        return None
    path = network_policies(namespace, naming.network_policy_name(name))
    existing = await kube.get(path)
    owned = existing is not None and res.controller_uid(existing) == template["metadata"]["uid"]
    if template["spec"].get("networkPolicyManagement", "Managed") == "Unmanaged":
        if owned:
            await kube.delete(path)
        return None
    desired = networkpolicy.build_network_policy(template, rt.config.ingress_namespaces)
    if existing is None:
        try:
            await kube.create(network_policies(namespace), desired)
        except ApiError as exc:
            if not exc.already_exists:
                raise
            raise kopf.TemporaryError("NetworkPolicy appeared concurrently", delay=0.2) from None
        events.info(
            template,
            reason="NetworkPolicyCreated",
            message=f"Created NetworkPolicy {desired['metadata']['name']}",
        )
    elif not owned:
        events.warn(
            template,
            reason="NetworkPolicyConflict",
            message=f"NetworkPolicy {desired['metadata']['name']} is not ours",
        )
    elif existing["spec"] != desired["spec"]:
        await kube.replace(
            path,
            {
                **desired,
                "metadata": {
                    **desired["metadata"],
                    "resourceVersion": existing["metadata"]["resourceVersion"],
                },
            },
        )
    return None
