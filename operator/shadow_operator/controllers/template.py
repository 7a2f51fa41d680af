"""SandboxTemplate reconciler: the managed NetworkPolicy shared by the template's sandboxes."""

from __future__ import annotations

from shadow_operator.api import constants as c
from shadow_operator.api import naming
from shadow_operator.api.kinds import NETWORK_POLICY, SANDBOX_TEMPLATE
from shadow_operator.api.models import SandboxTemplate
from shadow_operator.engine import Cached, NotOwned, Reconciler
from shadow_operator.resources import networkpolicy
from shadow_operator.resources.metadata import controller_uid


class TemplateReconciler(Reconciler[SandboxTemplate]):
    kind = SANDBOX_TEMPLATE
    owns = (NETWORK_POLICY,)
    cached = (Cached(NETWORK_POLICY, c.MANAGED_BY_SELECTOR),)
    workers = 2

    async def reconcile(self, template: SandboxTemplate) -> float | None:
        name = naming.network_policy_name(template.name)
        existing = self.cache.store(NETWORK_POLICY).get(template.namespace, name)
        if template.spec.network_policy_management == "Unmanaged":
            if existing is not None and controller_uid(existing) == template.metadata.uid:
                await self.client.delete(
                    NETWORK_POLICY, template.namespace, name, uid=existing["metadata"]["uid"]
                )
            return None
        desired = networkpolicy.build_network_policy(
            template.body,
            self.config.ingress_namespaces,
            self.config.cluster_cidrs,
            gateway_namespace=self.config.operator_namespace,
        )
        try:
            await self.client.apply(NETWORK_POLICY, desired, owner=template.body)
        except NotOwned:
            self.recorder.warn(
                template.body, reason="NetworkPolicyConflict", message=f"NetworkPolicy {name} is not ours"
            )
            return None
        if existing is None:
            self.recorder.info(
                template.body, reason="NetworkPolicyCreated", message=f"Created NetworkPolicy {name}"
            )
        return None
