"""metav1.Condition helpers over the typed `Condition`: making one, finding one in a list or in an object's
body (the cache holds bodies). Merging them into a status, with stable transition times: engine/status.py."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError

from shadow_operator.api.models import Condition

__all__ = ["Condition", "find", "is_true", "make_condition", "now_rfc3339", "of", "parse_time"]


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
    return Condition.model_validate(
        {
            "type": type_,
            "status": status,
            "reason": reason,
            "message": message,
            "observedGeneration": generation,
        }
    )


def of(body: Mapping[str, Any] | None) -> list[Condition]:
    """The conditions in an object's status (a Pod's, a Sandbox's ...), typed. A Pod's may lack a reason (it
    reads as ""); an item that is no condition at all is left out."""
    status = (body or {}).get("status")
    found = status.get("conditions") if isinstance(status, Mapping) else None
    conditions: list[Condition] = []
    for item in found if isinstance(found, list) else ():
        try:
            conditions.append(Condition.model_validate({"reason": "", **item}))
        except (TypeError, ValidationError):
            continue
    return conditions


def find(conditions: Iterable[Condition] | None, type_: str) -> Condition | None:
    return next((cond for cond in conditions or () if cond.type == type_), None)


def is_true(conditions: Iterable[Condition] | None, type_: str) -> bool:
    cond = find(conditions, type_)
    return cond is not None and cond.status == "True"
