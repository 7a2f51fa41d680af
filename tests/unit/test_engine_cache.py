"""The informer cache: newest resourceVersion wins, indexes follow changes, listeners see old and new."""

from __future__ import annotations

from typing import Any

import pytest
from shadow_operator.api.kinds import SANDBOX
from shadow_operator.engine.cache import Store

pytestmark = pytest.mark.unit


def body(name: str, rv: str, owner: str | None = None, ns: str = "ns") -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": ns, "resourceVersion": rv}
    if owner:
        meta["ownerReferences"] = [{"uid": owner, "controller": True}]
    return {"metadata": meta}


def owner_index(obj: dict[str, Any]) -> list[str]:
    return [ref["uid"] for ref in obj["metadata"].get("ownerReferences") or ()]


def test_a_late_older_event_never_rolls_back_a_newer_write() -> None:
    store = Store(SANDBOX)
    assert store.upsert(body("a", "10"))
    assert not store.upsert(body("a", "9")), "an older version must be ignored"
    assert not store.upsert(body("a", "10")), "the same version is no change"
    assert store.get("ns", "a") == body("a", "10")
    assert store.upsert(body("a", "11"))
    assert store.get("ns", "a")["metadata"]["resourceVersion"] == "11"  # type: ignore[index]


def test_indexes_follow_changes_and_removals() -> None:
    store = Store(SANDBOX)
    store.add_index("owner", owner_index)
    store.upsert(body("a", "1", owner="pool"))
    store.upsert(body("b", "1", owner="pool"))
    assert sorted(o["metadata"]["name"] for o in store.by_index("owner", "pool")) == ["a", "b"]
    store.upsert(body("a", "2", owner="claim"))  # adopted: moves to another owner
    assert [o["metadata"]["name"] for o in store.by_index("owner", "pool")] == ["b"]
    assert [o["metadata"]["name"] for o in store.by_index("owner", "claim")] == ["a"]
    store.remove("ns", "b")
    assert store.by_index("owner", "pool") == []
    assert store.keys_by_index("owner", "claim") == {("ns", "a")}


def test_an_index_added_late_covers_objects_already_cached() -> None:
    store = Store(SANDBOX)
    store.upsert(body("a", "1", owner="pool"))
    store.add_index("owner", owner_index)
    assert [o["metadata"]["name"] for o in store.by_index("owner", "pool")] == ["a"]
    with pytest.raises(ValueError, match="declared twice"):
        store.add_index("owner", lambda obj: ())


def test_listeners_see_old_and_new_bodies() -> None:
    store = Store(SANDBOX)
    seen: list[tuple[str | None, str | None]] = []
    store.add_listener(
        lambda old, new: seen.append(
            (old and old["metadata"]["resourceVersion"], new and new["metadata"]["resourceVersion"])
        )
    )
    store.upsert(body("a", "1"))
    store.upsert(body("a", "1"))  # no change: no call
    store.upsert(body("a", "2"))
    store.remove("ns", "a")
    store.remove("ns", "a")  # already gone: no call
    assert seen == [(None, "1"), ("1", "2"), ("2", None)]


def test_namespaces_are_separate_and_listing_filters_by_namespace() -> None:
    store = Store(SANDBOX)
    store.upsert(body("a", "1", ns="one"))
    store.upsert(body("a", "1", ns="two"))
    assert len(store) == 2
    assert [o["metadata"]["namespace"] for o in store.list("two")] == ["two"]


def test_non_numeric_resource_versions_fall_back_to_inequality() -> None:
    store = Store(SANDBOX)
    store.upsert(body("a", "x"))
    assert store.upsert(body("a", "y"))
    assert not store.upsert(body("a", "y"))


def test_managed_fields_are_not_kept() -> None:
    store = Store(SANDBOX)
    obj = body("a", "1")
    obj["metadata"]["managedFields"] = [{"manager": "kubectl", "fieldsV1": {"f:spec": {}}}]
    store.upsert(obj)
    assert "managedFields" not in store.get("ns", "a")["metadata"]  # type: ignore[index]
    assert "managedFields" in obj["metadata"], "the caller's body is left alone"
