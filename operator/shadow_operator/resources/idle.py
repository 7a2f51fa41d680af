"""Idle suspension (spec.autoSuspendPolicy), the pure part: which policy a Sandbox gets, what counts as its last
activity, and when to look at it again.

A template's policy is the default for the Sandboxes of its claims and environments, and its threshold is
their ceiling: a claim or an environment may choose a shorter one, never a longer one (whoever pays for the
cluster writes the template; a tenant writes the claim). Without a policy on the template, the claim's or the
environment's own applies, if any.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from shadow_operator.api.models import AutoSuspendPolicy

Body = Mapping[str, Any]

# Never look again sooner than this (a clock a little behind, a threshold just crossed): no busy loop.
MIN_RECHECK_SECONDS = 1.0
# A runtime that does not answer is asked again this long after (at most; sooner for a short threshold).
UNREACHABLE_RECHECK_SECONDS = 60.0


# How far ahead of the operator's clock a writer's clock may be.
CLOCK_SKEW_SECONDS = 60.0


class PolicyRefused(ValueError):
    """A claim's or environment's policy asks for more than its template allows."""


def policy_of(spec: Body | None) -> AutoSuspendPolicy | None:
    raw = (spec or {}).get("autoSuspendPolicy")
    return AutoSuspendPolicy.model_validate(raw) if raw is not None else None


def effective_policy(
    template_spec: Body | None, override: AutoSuspendPolicy | None, who: str
) -> dict[str, Any] | None:
    """The policy a Sandbox of `who` (e.g. "SandboxClaim app") gets, as it goes into the Sandbox's spec."""
    default = policy_of(template_spec)
    if override is None:
        chosen = default
    elif default is not None and override.suspend_threshold_seconds > default.suspend_threshold_seconds:
        raise PolicyRefused(
            f"{who} asks for autoSuspendPolicy.suspendThresholdSeconds {override.suspend_threshold_seconds}, "
            f"longer than its template's {default.suspend_threshold_seconds}: a claim or environment may only "
            "shorten it"
        )
    else:
        chosen = override
    return chosen.model_dump(by_alias=True) if chosen is not None else None


def parse_activity(value: str | None, now: datetime) -> datetime | None:
    """The annotation shadow.dev/last-activity as a time: None when absent, not RFC 3339, or further in the
    future than clocks disagree (a far-future value would otherwise keep the sandbox awake for ever); never
    later than `now`."""
    if not value:
        return None
    try:
        when = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
    except ValueError:
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    if when > now + timedelta(seconds=CLOCK_SKEW_SECONDS):
        return None
    return min(when, now)


def newest(*times: datetime | None) -> datetime | None:
    known = [t for t in times if t is not None]
    return max(known) if known else None


def ago(now: datetime, seconds: float) -> datetime:
    return now - timedelta(seconds=max(seconds, 0.0))


def idle_since(last_activity: datetime, threshold: int, now: datetime) -> float:
    """Seconds until `threshold` seconds without activity have passed (<= 0: idle now)."""
    return (last_activity + timedelta(seconds=threshold) - now).total_seconds()


def recheck_after(remaining: float) -> float:
    """When to look again, for a sandbox that may become idle in `remaining` seconds."""
    return max(remaining, MIN_RECHECK_SECONDS)
