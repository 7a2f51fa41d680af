"""metav1.Condition helpers: stable transition times, one entry per type."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

Condition = dict[str, Any]


def now_rfc3339(now: datetime | None = None) -> str:
    return (now or datetime.now(UTC)).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(value: str | None) -> datetime | None:
    if not value:
        return None
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def make_condition(
    type_: str, status: bool | str, reason: str, message: str, generation: int | None
) -> Condition:
    if isinstance(status, bool):
        status = "True" if status else "False"
    cond: Condition = {"type": type_, "status": status, "reason": reason, "message": message}
    if generation is not None:
        cond["observedGeneration"] = generation
    return cond


def find(conditions: Iterable[Mapping[str, Any]] | None, type_: str) -> Mapping[str, Any] | None:
    return next((cond for cond in conditions or () if cond.get("type") == type_), None)


def is_true(conditions: Iterable[Mapping[str, Any]] | None, type_: str) -> bool:
    cond = find(conditions, type_)
    return cond is not None and cond.get("status") == "True"


def merge(
    existing: Iterable[Mapping[str, Any]] | None,
    desired: Iterable[Condition],
    *,
    remove: Iterable[str] = (),
    now: datetime | None = None,
) -> list[Condition]:
    """Set `desired` conditions, keeping lastTransitionTime when the status did not change."""
    by_type: dict[str, Condition] = {str(cond["type"]): dict(cond) for cond in existing or ()}
    for type_ in remove:
        by_type.pop(type_, None)
    stamp = now_rfc3339(now)
    for cond in desired:
        previous = by_type.get(cond["type"])
        merged = dict(cond)
        if (
            previous is not None
            and previous.get("status") == cond["status"]
            and previous.get("lastTransitionTime")
        ):
            merged["lastTransitionTime"] = previous["lastTransitionTime"]
        else:
            merged["lastTransitionTime"] = stamp
        by_type[cond["type"]] = merged
    return sorted(by_type.values(), key=lambda cond: str(cond["type"]))


def same(a: Iterable[Mapping[str, Any]] | None, b: Iterable[Mapping[str, Any]] | None) -> bool:
    """Equal ignoring order."""

    def key(conds: Iterable[Mapping[str, Any]] | None) -> list[tuple[Any, ...]]:
        return sorted(
            (
                c.get("type"),
                c.get("status"),
                c.get("reason"),
                c.get("message", ""),
                c.get("observedGeneration"),
                c.get("lastTransitionTime"),
            )
            for c in conds or ()
        )

    return key(a) == key(b)
