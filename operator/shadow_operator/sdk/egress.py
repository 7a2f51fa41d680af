"""A sandbox's egress decision log: the egress gateway's Events on the Sandbox, read back (issue 29).

The gateway records each kind of decision (allowed or refused, method, host, rule) once and counts it; a
refusal names the rule that would allow it. Everything in an Event came from the sandbox, or from whoever may
write Events in the namespace: every string is escaped and bounded here before anyone prints it.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any
from urllib.parse import urlencode

from shadow_operator.api.kinds import SANDBOX, SANDBOX_CLAIM
from shadow_operator.common import egress
from shadow_operator.sdk import environment, kube
from shadow_operator.sdk.errors import NotFound, SandboxNotFoundError
from shadow_operator.sdk.kube import Body, Op

TEXT_CHARS, NOTE_CHARS = 512, 1024


@dataclass(frozen=True)
class EgressDecision:
    """One kind of decision of the gateway for a sandbox, and how often it was made."""

    decision: str  # allowed | refused | overflow
    method: str
    host: str
    port: int
    path: str  # of the first such request (the Event's note is fixed when it is made)
    rule: str  # the rule that allowed it
    hint: str  # for a refusal: the rule that would allow it, as `--allow` takes it
    count: int
    first: str
    last: str
    note: str

    @property
    def refused(self) -> bool:
        """A refusal (or the overflow Event, which counts refusals and allowances alike)."""
        return self.decision != "allowed"

    def to_dict(self) -> dict[str, object]:
        """As JSON-ready data (`shadowctl egress log -o json`)."""
        return asdict(self)


def environment_sandbox(namespace: str, name: str) -> Op[str]:
    """The Sandbox of an environment (EnvironmentNotFound when there is no such environment)."""
    env = yield from environment.get(namespace, name)
    return (env.status.sandbox if env.status is not None else None) or env.name


def claim_sandbox(namespace: str, name: str) -> Op[str]:
    """The Sandbox a claim holds, or the Sandbox of that name."""
    try:
        claim = yield from kube.get(SANDBOX_CLAIM.path(namespace, name), f"SandboxClaim {namespace}/{name}")
    except NotFound:
        pass
    else:
        held = ((claim.get("status") or {}).get("sandbox") or {}).get("name")
        if not held:
            raise SandboxNotFoundError(f"SandboxClaim {namespace}/{name} holds no sandbox yet")
        return str(held)
    try:
        yield from kube.get(SANDBOX.path(namespace, name), f"Sandbox {namespace}/{name}")
    except NotFound:
        raise SandboxNotFoundError(
            f"neither a SandboxClaim nor a Sandbox named {name} exists in namespace {namespace}"
        ) from None
    return name


def log(namespace: str, sandbox: str) -> Op[list[EgressDecision]]:
    """The gateway's decisions for the Sandbox, the most recent last. Read as core/v1 Events, which the
    namespace's `view` role already grants."""
    query = urlencode({"labelSelector": f"{egress.EVENT_LABEL_SANDBOX}={sandbox}"})
    body = yield from kube.get(
        f"/api/v1/namespaces/{namespace}/events?{query}",
        f"list the egress Events of Sandbox {namespace}/{sandbox}",
    )
    decisions = [
        parsed for item in body.get("items") or () if (parsed := from_event(item, sandbox)) is not None
    ]
    return sorted(decisions, key=lambda d: (d.last, d.first))


def from_event(item: Body, sandbox: str) -> EgressDecision | None:
    """A gateway's Event about `sandbox`, or None for any other Event."""
    regarding = item.get("involvedObject") or {}
    if (
        item.get("reportingComponent") != egress.EVENT_CONTROLLER
        or item.get("reason") not in egress.EVENT_REASONS
        or regarding.get("kind") != SANDBOX.kind
        or regarding.get("name") != sandbox
    ):
        return None
    meta = item.get("metadata") or {}
    try:
        detail = json.loads((meta.get("annotations") or {}).get(egress.EVENT_ANNOTATION) or "{}")
    except ValueError:
        detail = {}
    if not isinstance(detail, dict):
        detail = {}
    series = item.get("series") or {}
    first = _text(item.get("eventTime") or item.get("firstTimestamp") or meta.get("creationTimestamp"))
    try:
        port = int(detail.get("port") or 0)
        count = max(1, int(series.get("count") or item.get("count") or 1))
    except (TypeError, ValueError):
        port, count = 0, 1
    return EgressDecision(
        decision="overflow"
        if item.get("reason") == egress.REASON_OVERFLOW
        else "allowed"
        if item.get("reason") == egress.REASON_ALLOWED
        else "refused",
        method=_text(detail.get("method")),
        host=_text(detail.get("host")),
        port=port,
        path=_text(detail.get("path")),
        rule=_text(detail.get("rule")),
        hint=_text(detail.get("hint")),
        count=count,
        first=first,
        last=_text(series.get("lastObservedTime") or item.get("lastTimestamp")) or first,
        note=_text(item.get("message"), NOTE_CHARS),
    )


def _text(value: Any, limit: int = TEXT_CHARS) -> str:
    return egress.printable(str(value), limit) if value is not None else ""
