"""The SandboxTemplate reconciler over the engine's client and cache, the API server in memory: the managed
NetworkPolicy is made once, left to someone else when unmanaged, and never taken from another owner."""

from __future__ import annotations

import pytest
from shadow_operator.api import naming
from shadow_operator.api.kinds import NETWORK_POLICY, SANDBOX_TEMPLATE
from shadow_operator.controllers.template import TemplateReconciler

from tests.support.fakes import NAMESPACE, Harness, template

pytestmark = pytest.mark.unit

POLICY = naming.network_policy_name("workspace")


async def test_the_network_policy_is_made_once_and_removed_when_unmanaged() -> None:
    harness = Harness(TemplateReconciler)
    harness.put(SANDBOX_TEMPLATE, template())
    await harness.run(SANDBOX_TEMPLATE, NAMESPACE, "workspace")
    policy = harness.get(NETWORK_POLICY, NAMESPACE, POLICY)
    assert policy["metadata"]["ownerReferences"][0]["uid"] == "uid-workspace"
    assert harness.recorder.reasons() == ["NetworkPolicyCreated"]
    harness.writes()
    await harness.run(SANDBOX_TEMPLATE, NAMESPACE, "workspace")
    assert harness.writes() == [] and harness.recorder.reasons() == ["NetworkPolicyCreated"]

    body = harness.get(SANDBOX_TEMPLATE, NAMESPACE, "workspace")
    body["spec"]["networkPolicyManagement"] = "Unmanaged"
    harness.api.put(SANDBOX_TEMPLATE, body)
    await harness.run(SANDBOX_TEMPLATE, NAMESPACE, "workspace")
    assert harness.api.body(NETWORK_POLICY, NAMESPACE, POLICY) is None


async def test_a_policy_of_another_owner_is_left_alone_with_a_warning() -> None:
    harness = Harness(TemplateReconciler)
    harness.put(NETWORK_POLICY, {"metadata": {"name": POLICY, "namespace": NAMESPACE}, "spec": {}})
    harness.put(SANDBOX_TEMPLATE, template())
    await harness.run(SANDBOX_TEMPLATE, NAMESPACE, "workspace")
    assert harness.get(NETWORK_POLICY, NAMESPACE, POLICY)["spec"] == {}
    assert harness.recorder.reasons() == ["NetworkPolicyConflict"]
