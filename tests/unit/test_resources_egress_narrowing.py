"""The EgressNarrowed condition of a claim or environment: which of its egress rules apply, which were dropped
for widening the template, and why, in a message of bounded length."""

from __future__ import annotations

from typing import Any

import pytest
from shadow_operator.api.models import EgressNarrowing
from shadow_operator.resources.egress_narrowing import MESSAGE_LIMIT, egress_narrowed

pytestmark = pytest.mark.unit


def template(egress: dict[str, Any] | None) -> dict[str, Any]:
    spec: dict[str, Any] = {"podTemplate": {"spec": {"containers": [{"name": "main", "image": "busybox"}]}}}
    if egress is not None:
        spec["egress"] = egress
    return {"metadata": {"name": "tpl", "namespace": "team-a"}, "spec": spec}


def narrowing(*rules: dict[str, Any]) -> EgressNarrowing:
    return EgressNarrowing.model_validate({"rules": list(rules)})


LOCKED = template({"rules": [{"host": "pypi.org", "methods": ["GET"], "paths": ["/simple/"]}]})


def test_no_spec_egress_no_condition() -> None:
    assert egress_narrowed(LOCKED, None) is None


def test_every_rule_narrows() -> None:
    verdict = egress_narrowed(
        LOCKED, narrowing({"host": "pypi.org", "methods": ["GET"], "paths": ["/simple/x/"]})
    )
    assert verdict == (True, "RulesApplied", "all 1 egress rules narrow the template's")


def test_a_template_without_egress_ignores_the_claims() -> None:
    status, reason, message = egress_narrowed(template(None), narrowing({"host": "pypi.org"})) or ()
    assert (status, reason) == (False, "TemplateHasNoEgress")
    assert message.startswith("SandboxTemplate tpl has no spec.egress, so this spec.egress is ignored")


def test_dropped_rules_are_named_with_why_and_the_message_is_bounded() -> None:
    status, reason, message = egress_narrowed(LOCKED, narrowing({"host": "pypi.org", "ports": [8443]})) or ()
    assert (status, reason) == (False, "RulesDropped")
    assert message.endswith(
        "spec.egress.rules[0] (pypi.org:8443 any method any path): port 8443 is beyond it (the template's rule "
        "for pypi.org allows ports 443)"
    )
    many = narrowing(*({"host": f"{'h' * 60}-{i}.example"} for i in range(64)))
    _, _, message = egress_narrowed(LOCKED, many) or ()
    assert len(message) == MESSAGE_LIMIT and message.endswith(" ... (64 rules dropped in all)")
