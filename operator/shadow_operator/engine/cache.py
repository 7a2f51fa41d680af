"""In-memory object caches fed by the watches (an informer cache), with named indexes.

Reconcilers read from here, so the API server sees almost only writes. Each `Store` holds the latest body
of every object of one kind that the operator watches. It is fed from two sides:

- the watch stream (kopf), including the initial listing, which kopf completes for every cached kind before
  any reconcile may run (see `manager.py`);
- our own writes: the API server's answer to a create/patch is stored at once ("write-through"), so the next
  reconcile never acts on a copy older than what it wrote itself.

A body is replaced only by a newer resourceVersion, so a late watch event never rolls back a write-through.
Stores are used from the event loop only; they are not thread-safe.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from shadow_operator.api.kinds import ResourceKind

Body = dict[str, Any]
Key = tuple[str, str]
IndexFunc = Callable[[Body], Iterable[str]]
# Called with (old, new) on every change: old is None for an addition, new is None for a deletion.
Listener = Callable[[Body | None, Body | None], None]


def key_of(body: Body) -> Key:
    meta = body["metadata"]
    return meta.get("namespace") or "", meta["name"]


def _version(body: Body) -> int | None:
    try:
        return int(body["metadata"]["resourceVersion"])
    except (KeyError, TypeError, ValueError):
        return None


def is_newer(new: Body, old: Body) -> bool:
    """Whether `new` should replace `old`. resourceVersions are etcd revisions in practice; when either is
    not a number, the newcomer wins (the watch delivers in order)."""
    a, b = _version(new), _version(old)
    if a is None or b is None:
        return bool(new["metadata"].get("resourceVersion") != old["metadata"].get("resourceVersion"))
    return a > b


class Store:
    """The cached objects of one kind, with secondary indexes (name -> value -> keys)."""

    def __init__(self, kind: ResourceKind) -> None:
        self.kind = kind
        self._objects: dict[Key, Body] = {}
        self._index_funcs: dict[str, IndexFunc] = {}
        self._index: dict[str, dict[str, set[Key]]] = {}
        self._indexed_values: dict[str, dict[Key, tuple[str, ...]]] = {}
        self._listeners: list[Listener] = []

    # ----------------------------------------------------------------------------------------- set-up
    def add_index(self, name: str, func: IndexFunc) -> None:
        if name in self._index_funcs:
            if self._index_funcs[name] is not func:
                raise ValueError(f"{self.kind} index {name!r} is declared twice with different functions")
            return
        self._index_funcs[name] = func
        self._index[name] = {}
        self._indexed_values[name] = {}
        for key, body in self._objects.items():
            self._index_one(name, key, body)

    def add_listener(self, listener: Listener) -> None:
        self._listeners.append(listener)

    # ------------------------------------------------------------------------------------------ reads
    def get(self, namespace: str, name: str) -> Body | None:
        return self._objects.get((namespace, name))

    def by_index(self, index: str, value: str) -> list[Body]:
        return [self._objects[key] for key in self._index[index].get(value, ())]

    def keys_by_index(self, index: str, value: str) -> set[Key]:
        return set(self._index[index].get(value, ()))

    def list(self, namespace: str | None = None) -> list[Body]:
        if namespace is None:
            return list(self._objects.values())
        return [body for (ns, _), body in self._objects.items() if ns == namespace]

    def __len__(self) -> int:
        return len(self._objects)

    # ----------------------------------------------------------------------------------------- writes
    def upsert(self, body: Body) -> bool:
        """Store `body` unless the cache already holds this version or a newer one; True if it changed."""
        key = key_of(body)
        old = self._objects.get(key)
        if old is not None and not is_newer(body, old):
            return False
        meta = body["metadata"]
        if "managedFields" in meta:
            # Server-side apply bookkeeping is often a third of an object and nothing here reads it.
            body = {**body, "metadata": {k: v for k, v in meta.items() if k != "managedFields"}}
        self._objects[key] = body
        for name in self._index_funcs:
            self._index_one(name, key, body)
        for listener in self._listeners:
            listener(old, body)
        return True

    def remove(self, namespace: str, name: str) -> Body | None:
        key = (namespace, name)
        old = self._objects.pop(key, None)
        if old is None:
            return None
        for index in self._index_funcs:
            self._unindex(index, key)
        for listener in self._listeners:
            listener(old, None)
        return old

    def _index_one(self, name: str, key: Key, body: Body) -> None:
        values = tuple(self._index_funcs[name](body))
        if self._indexed_values[name].get(key) == values:
            return
        self._unindex(name, key)
        if values:
            self._indexed_values[name][key] = values
            for value in values:
                self._index[name].setdefault(value, set()).add(key)

    def _unindex(self, name: str, key: Key) -> None:
        for value in self._indexed_values[name].pop(key, ()):
            keys = self._index[name].get(value)
            if keys is not None:
                keys.discard(key)
                if not keys:
                    del self._index[name][value]


class Cache:
    """One `Store` per cached kind."""

    def __init__(self) -> None:
        self._stores: dict[ResourceKind, Store] = {}

    def store(self, kind: ResourceKind) -> Store:
        """The store of `kind`, created on first use (set-up declares every cached kind before start)."""
        store = self._stores.get(kind)
        if store is None:
            store = self._stores[kind] = Store(kind)
        return store

    def has(self, kind: ResourceKind) -> bool:
        return kind in self._stores
