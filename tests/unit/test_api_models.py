"""The pydantic models read real-world bodies: upstream v1beta1 and the v1alpha1 form Amicable sends."""

from __future__ import annotations

import pytest
from pydantic import ValidationError
from shadow_operator.api import models as m

pytestmark = pytest.mark.unit


def test_amicable_v1alpha1_claim() -> None:
    claim = m.SandboxClaim.model_validate({"spec": {"sandboxTemplateRef": {"name": "amicable-sandbox"}}})
    assert claim.spec.sandbox_template_ref is not None
    assert claim.spec.sandbox_template_ref.name == "amicable-sandbox"
    assert claim.spec.warm_pool_ref is None


def test_v1beta1_claim_with_lifecycle() -> None:
    claim = m.SandboxClaim.model_validate(
        {
            "spec": {
                "warmPoolRef": {"name": "pool"},
                "lifecycle": {"shutdownTime": "2030-01-01T00:00:00Z", "shutdownPolicy": "DeleteForeground"},
                "env": [{"name": "A", "value": "1", "containerName": "main"}],
            }
        }
    )
    assert claim.spec.lifecycle is not None and claim.spec.lifecycle.shutdown_policy == "DeleteForeground"
    assert claim.model_dump(by_alias=True, exclude_none=True)["spec"]["warmPoolRef"] == {"name": "pool"}


def test_sandbox_defaults_and_unknown_pod_fields_survive() -> None:
    body = {
        "spec": {
            "podTemplate": {
                "spec": {
                    "containers": [
                        {"name": "c", "image": "i", "readinessProbe": {"tcpSocket": {"port": 8888}}}
                    ]
                }
            }
        }
    }
    sandbox = m.Sandbox.model_validate(body)
    assert sandbox.spec.operating_mode == "Running"
    assert sandbox.spec.shutdown_policy == "Retain"
    dumped = sandbox.model_dump(by_alias=True, exclude_none=True)
    assert dumped["spec"]["podTemplate"]["spec"]["containers"][0]["readinessProbe"] == {
        "tcpSocket": {"port": 8888}
    }


def test_invalid_bodies_are_rejected() -> None:
    with pytest.raises(ValidationError):
        m.Sandbox.model_validate({"spec": {"podTemplate": {"spec": {"containers": []}}}})
    with pytest.raises(ValidationError):
        m.SandboxWarmPool.model_validate({"spec": {"replicas": -1, "sandboxTemplateRef": {"name": "t"}}})
    with pytest.raises(ValidationError):
        m.Sandbox.model_validate(
            {"spec": {"operatingMode": "Paused", "podTemplate": {"spec": {"containers": [{"name": "c"}]}}}}
        )
