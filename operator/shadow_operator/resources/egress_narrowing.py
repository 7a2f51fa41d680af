"""The EgressNarrowed condition: how a SandboxClaim's or ShadowEnvironment's spec.egress fared against its
template's, where kubectl users look. The gateway applies the same `effective` rules; a rule that would widen
the template is dropped there, and named here with what in it goes beyond the template."""

from __future__ import annotations

from typing import Any

from shadow_operator.api import constants as c
from shadow_operator.api.models import EgressNarrowing, SandboxTemplate
from shadow_operator.common import egress

# Conditions' messages are read in `kubectl describe`: a few rules' worth, then a count.
MESSAGE_LIMIT = 1024


def egress_narrowed(
    template: dict[str, Any], narrowing: EgressNarrowing | None
) -> tuple[bool, str, str] | None:
    """(status, reason, message) of the condition, or None when there is no spec.egress to report on."""
    if narrowing is None:
        return None
    parsed = SandboxTemplate.model_validate(template)
    if parsed.spec.egress is None:
        return (
            False,
            c.REASON_TEMPLATE_HAS_NO_EGRESS,
            f"SandboxTemplate {parsed.metadata.name} has no spec.egress, so this spec.egress is ignored: the "
            "sandbox's egress is not filtered by host (ask for a template with spec.egress)",
        )
    result = egress.effective(parsed.spec.egress, narrowing)
    total = len(narrowing.rules)
    if not result.dropped:
        return True, c.REASON_RULES_APPLIED, f"all {total} egress rules narrow the template's"
    message = f"{len(result.dropped)} of {total} egress rules dropped ({egress.NARROW_ONLY}): " + "; ".join(
        result.dropped
    )
    if len(message) > MESSAGE_LIMIT:
        more = f" ... ({len(result.dropped)} rules dropped in all)"
        message = message[: MESSAGE_LIMIT - len(more)] + more
    return False, c.REASON_RULES_DROPPED, message
