"""Typed status: every reconciler reads its object into its model, changes the typed status and conditions of one
pass, and writes the status once, only when it changed.

    seen = StatusPass(sandbox, SandboxStatus)       # the old status, a copy to change, its conditions
    seen.conditions.set(c.COND_READY, True, "DependenciesReady", "Pod is Ready")
    seen.status.node_name = pod_node
    if await seen.write(self.client, SANDBOX):      # False: nothing changed, or the object is gone
        ...

What is written is a JSON merge patch from the status as last read (or written in this pass) to the new one:
the fields that changed, null for those that went. A model dumps only the fields that were read or set, so a
field nobody set is never written (omitted stays omitted), and conditions are compared ignoring their order.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from datetime import UTC, datetime
from typing import Any, Generic, Protocol, TypeVar

from shadow_operator.api.kinds import ResourceKind
from shadow_operator.api.models import ApiModel, Condition, Resource
from shadow_operator.resources.conditions import is_true, make_condition

S = TypeVar("S", bound=ApiModel)
Json = dict[str, Any]
Now = Callable[[], datetime]


def _utcnow() -> datetime:
    return datetime.now(UTC)


class StatusClient(Protocol):
    """The engine client, as far as writing status goes (engine.Client is one)."""

    async def patch_status(
        self, kind: ResourceKind, obj: Mapping[str, Any], status: Mapping[str, Any]
    ) -> Json | None: ...


class Conditions:
    """An object's conditions in one pass (metav1.Condition): one per type, sorted by type, each keeping its
    lastTransitionTime while its status does not change."""

    def __init__(
        self, existing: Iterable[Condition] | None, generation: int | None, now: Now = _utcnow
    ) -> None:
        self.generation = generation
        self.now = now
        self._by_type: dict[str, Condition] = {x.type: x.model_copy() for x in existing or ()}

    def set(self, type_: str, status: bool | str, reason: str, message: str) -> Condition:
        """Set a condition of this object's generation."""
        return self.put(make_condition(type_, status, reason, message, self.generation))

    def put(self, condition: Condition) -> Condition:
        """Set `condition` as given (e.g. one mirrored from another object); its transition time is ours."""
        previous = self._by_type.get(condition.type)
        merged = condition.model_copy()
        if (
            previous is not None
            and previous.status == condition.status
            and previous.last_transition_time is not None
        ):
            merged.last_transition_time = previous.last_transition_time
        else:
            merged.last_transition_time = self.now().astimezone(UTC).replace(microsecond=0)
        self._by_type[condition.type] = merged
        return merged

    def remove(self, *types: str) -> None:
        for type_ in types:
            self._by_type.pop(type_, None)

    def set_or_remove(self, type_: str, verdict: tuple[bool, str, str] | None) -> None:
        """Set the condition from (status, reason, message), or remove it when there is nothing to say."""
        if verdict is None:
            self.remove(type_)
        else:
            self.set(type_, *verdict)

    def find(self, type_: str) -> Condition | None:
        return self._by_type.get(type_)

    def is_true(self, type_: str) -> bool:
        found = self._by_type.get(type_)
        return found is not None and found.status == "True"

    def items(self) -> list[Condition]:
        return [self._by_type[t] for t in sorted(self._by_type)]

    def __iter__(self) -> Iterator[Condition]:
        return iter(self.items())

    def __len__(self) -> int:
        return len(self._by_type)


def dump(status: ApiModel | None) -> Json:
    """The status as stored: by alias, only the fields that were read or set, none that is null."""
    if status is None:
        return {}
    return status.model_dump(by_alias=True, mode="json", exclude_unset=True, exclude_none=True)


def merge_patch(old: Mapping[str, Any], new: Mapping[str, Any]) -> Json:
    """The JSON merge patch (RFC 7386) that turns `old` into `new`: objects recursed into, anything else
    replaced whole, null for a field that went."""
    patch: Json = {key: None for key in old if key not in new}
    for key, value in new.items():
        was = old.get(key)
        if value == was:
            continue
        if isinstance(value, dict) and isinstance(was, dict):
            patch[key] = merge_patch(was, value)
        else:
            patch[key] = value
    return patch


def _same_conditions(old: list[Json] | None, new: list[Json] | None) -> bool:
    """Equal as conditions (a missing message is an empty one), ignoring their order."""

    def key(items: list[Json] | None) -> list[Condition]:
        return sorted((Condition.model_validate(x) for x in items or ()), key=lambda x: x.type)

    return key(old) == key(new)


class StatusPass(Generic[S]):
    """The status of one object in one pass: `old` as read, `status` being changed, `conditions` (when the
    status has them) merged into it when it is written."""

    def __init__(self, obj: Resource, model: type[S], now: Now = _utcnow) -> None:
        self.obj = obj
        old = getattr(obj, "status", None)
        self.old: S = old if isinstance(old, model) else model()
        self.status: S = self.old.model_copy(deep=True)
        self.conditions = Conditions(getattr(self.old, "conditions", None), obj.metadata.generation, now=now)
        self.last: S = self.old  # the status as last read or written

    def became_true(self, type_: str) -> bool:
        """Whether the condition `type_` is True now and was not in the status as read."""
        return self.conditions.is_true(type_) and not is_true(getattr(self.old, "conditions", None), type_)

    def finish(self) -> S:
        """The status to write: the conditions merged in (a status that never had any gets none)."""
        if "conditions" in type(self.status).model_fields and (
            len(self.conditions) or getattr(self.last, "conditions", None) is not None
        ):
            setattr(self.status, "conditions", self.conditions.items())  # noqa: B010 - a field of S
        return self.status

    def changes(self) -> Json:
        """What changed since the status was last read or written, as a merge patch ({}: nothing)."""
        old, new = dump(self.last), dump(self.finish())
        patch = merge_patch(old, new)
        if "conditions" in patch and _same_conditions(old.get("conditions"), new.get("conditions")):
            del patch["conditions"]
        return patch

    async def write(self, client: StatusClient, kind: ResourceKind) -> bool:
        """Write what changed; True when something was written (False: unchanged, or the object is gone)."""
        patch = self.changes()
        if not patch:
            return False
        if await client.patch_status(kind, self.obj.body, patch) is None:
            return False
        self.last = self.status.model_copy(deep=True)
        return True
