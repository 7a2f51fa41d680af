"""The manager: registers the reconcilers' watches with kopf, feeds the caches, runs the work queues.

kopf stays the watch and event layer. For every kind a reconciler names (its own, owned and watched kinds),
the manager registers with kopf

- an index handler whose filter puts each listed or changed object into the cache. kopf runs the indexing
  of the whole initial listing of every indexed kind before it calls any other handler, which is what makes
  the caches complete before the first reconcile (no claim ever decides on a half-filled cache);
- an event handler that drops deleted objects; its filter, which kopf calls for every event only after the
  listings are indexed, lets the work queues start on its first call.

A kind kopf watches under one label selector may be cached under a second one too (`Cached(..., additional=
True)`): the manager lists those objects itself at start-up, before any reconcile, and watches them into the
same store (feeds.py).

Every change of a cached object (watch event or our own write) is mapped to keys: the object's own key for
the reconciler of its kind, its controller's key for reconcilers that own it, and whatever the declared watch
functions return. Mappings see the old and the new object, so a child that changes owner (a warm sandbox
adopted by a claim) wakes both.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import kopf
import pydantic

from shadow_operator.api.kinds import ResourceKind
from shadow_operator.clients.kube import Kube
from shadow_operator.engine import metrics
from shadow_operator.engine.cache import Body, Cache, Key, key_of
from shadow_operator.engine.client import Client
from shadow_operator.engine.errors import PermanentError
from shadow_operator.engine.events import EventRecorder
from shadow_operator.engine.feeds import Feed
from shadow_operator.engine.operations import Operations
from shadow_operator.engine.queue import WorkQueue
from shadow_operator.engine.reconciler import Cached, Deps, MapFunc, Reconciler, controller_keys

_log = logging.getLogger("shadow_operator.engine")


def _selector(kind: ResourceKind) -> tuple[str, str] | tuple[str, str, str]:
    """kopf's resource selector: (group, version, plural), or ("v1", plural) for the core group."""
    return (kind.group, kind.version, kind.plural) if kind.group else (kind.version, kind.plural)


def _never_called(**_: Any) -> None:
    """The body of the cache's index handlers: their filter does the work (`Manager._feeder`)."""


def _own_key(body: Body, _: Cache) -> Iterable[Key]:
    yield key_of(body)


@dataclass(frozen=True)
class Concurrency:
    """A kind's work queue: its workers, and the most of them one namespace holds (None: all but one); its
    operations (operations.py) under way at once, and of one namespace (None: as many as its workers)."""

    workers: int
    namespace_share: int | None
    operations: int | None = None
    operations_per_namespace: int | None = None


@dataclass
class Route:
    queue: WorkQueue
    map: MapFunc
    delay: float = 0.0


@dataclass
class Running:
    """State of one run of the operator (kopf may run several times in one process, e.g. in tests)."""

    kube: Kube
    client: Client
    recorder: EventRecorder
    reconcilers: dict[str, Reconciler[Any]]
    queues: dict[str, WorkQueue]
    operations: list[Operations] = field(default_factory=list)
    routes: dict[ResourceKind, list[Route]] = field(default_factory=dict)
    processing: bool = False
    feeds: list[asyncio.Task[None]] = field(default_factory=list)


class Manager:
    def __init__(
        self,
        reconcilers: Sequence[type[Reconciler[Any]]],
        *,
        load_config: Callable[[], Any],
        configure: Callable[[kopf.OperatorSettings, Any], None] | None = None,
        prepare: Callable[[Client, Any], Awaitable[None]] | None = None,
        concurrency: Callable[[Any, type[Reconciler[Any]]], Concurrency] | None = None,
    ) -> None:
        self.reconciler_types = list(reconcilers)
        self._load_config = load_config
        self._configure = configure
        # Run once at start-up, before any reconciler, with the client and the configuration.
        self._prepare = prepare
        # A kind's workers and namespace share from the configuration (default: the reconciler's own).
        self._concurrency = concurrency or (
            lambda _config, rec: Concurrency(rec.workers, rec.namespace_share)
        )
        self.cache = Cache()
        self.running: Running | None = None
        # (kind, selector) of the additional feeds (engine/feeds.py), in declaration order.
        self.additional: dict[tuple[ResourceKind, str], None] = {}
        # The namespaces the operator watches (kopf's `namespaces`); empty: the whole cluster.
        self.namespaces: tuple[str, ...] = ()
        self.cached = self._cached_kinds()

    # ------------------------------------------------------------------------------------ declarations
    def _cached_kinds(self) -> dict[ResourceKind, str | None]:
        """Every kind to watch and cache, with its server-side label selector (if any)."""
        kinds: dict[ResourceKind, str | None] = {}
        selectors: dict[ResourceKind, str | None] = {}
        for rec in self.reconciler_types:
            for decl in rec.cached:
                if decl.additional:
                    assert decl.label_selector, f"an additional feed of {decl.kind} needs a label selector"
                    kinds.setdefault(decl.kind, None)
                    self.additional[(decl.kind, decl.label_selector)] = None
                    continue
                if decl.kind in selectors and selectors[decl.kind] != decl.label_selector:
                    raise ValueError(f"{decl.kind} is cached with two label selectors")
                selectors[decl.kind] = decl.label_selector
            named = [rec.kind, *rec.owns, *(w.kind for w in rec.watches), *(i.kind for i in rec.indexes)]
            for kind in named:
                kinds.setdefault(kind, None)
        for kind, selector in selectors.items():
            kinds[kind] = selector
        return kinds

    def register(self, registry: kopf.OperatorRegistry | None = None) -> None:
        """Register the cache feeds and the start-up/clean-up with kopf (the default registry if None)."""
        registry = registry or kopf.get_default_registry()
        for kind in self.cached:
            selector = _selector(kind)
            kopf.index(*selector, id=f"cache/{kind.plural}", when=self._feeder(kind), registry=registry)(
                _never_called
            )
            kopf.on.event(*selector, id=f"deleted/{kind.plural}", when=self._synced, registry=registry)(
                self._on_deleted(kind)
            )
        kopf.on.startup(id="engine/startup", registry=registry)(self._startup)
        kopf.on.cleanup(id="engine/cleanup", registry=registry)(self._cleanup)

    def _feeder(self, kind: ResourceKind) -> Callable[..., bool]:
        """The cache feed, as the filter of a kopf index handler that never runs.

        kopf evaluates an index handler's filter for every listed and changed object, in the indexing phase
        that completes before other handlers may run (the cache-sync guarantee). Storing the object right
        there and answering "no" spares kopf the handler invocation and its bookkeeping for every watch event
        (about a tenth of the operator's CPU in the pool-300 benchmark).
        """

        def feed(body: kopf.Body, **_: Any) -> bool:
            # kopf's Body is a view; its top-level values are the raw dicts of the watch event. (The cache is
            # looked up per call: each run of the operator starts with a new one.)
            self.cache.store(kind).upsert({key: body[key] for key in body})
            return False

        return feed

    def _synced(self, type: str | None, **_: Any) -> bool:
        """kopf's filter of the deletion handler, called for every event once all listings are indexed.

        Its first call is therefore the moment the caches are complete: the work queues start. It returns
        True only for deletions, so kopf invokes the handler (its costly part) for those alone.
        """
        running = self.running
        if running is not None and not running.processing:
            running.processing = True
            for queue in running.queues.values():
                queue.start_processing()
        return type == "DELETED"

    def _on_deleted(self, kind: ResourceKind) -> Callable[..., Any]:
        async def on_deleted(body: kopf.Body, **_: Any) -> None:
            meta = body["metadata"]
            self.cache.store(kind).remove(meta.get("namespace") or "", meta["name"])

        return on_deleted

    # ------------------------------------------------------------------------------------------ runtime
    async def _startup(self, settings: kopf.OperatorSettings, **_: Any) -> None:
        config = self._load_config()
        for kind, selector in self.cached.items():
            if selector:
                settings.watching.label_selectors[_selector(kind)] = selector
        if self._configure is not None:
            self._configure(settings, config)

        self.cache = Cache()
        for kind in self.cached:
            store = self.cache.store(kind)
            metrics.CACHED_OBJECTS.labels(kind.kind).set_function(store.__len__)
        kube = await Kube.connect()
        # One feed per watched namespace: with operator.watchNamespaces the permissions are per namespace.
        feeds = [
            Feed(kube, self.cache, kind, labels, namespace)
            for kind, labels in self.additional
            for namespace in self.namespaces or (None,)
        ]
        for feed in feeds:
            await feed.list()  # before any reconcile, like kopf's listings
        client = Client(kube, self.cache)
        if self._prepare is not None:
            await self._prepare(client, config)
        recorder = EventRecorder(kube)
        running = Running(kube=kube, client=client, recorder=recorder, reconcilers={}, queues={})
        for rec_type in self.reconciler_types:
            for index in rec_type.indexes:
                self.cache.store(index.kind).add_index(index.name, index.func)
            tuned = self._concurrency(config, rec_type)
            queue = WorkQueue(
                rec_type.name(),
                self._reconcile_func(running, rec_type),
                workers=tuned.workers,
                namespace_share=tuned.namespace_share,
            )
            operations = Operations(
                queue.add,
                total=tuned.operations or tuned.workers,
                per_namespace=tuned.operations_per_namespace or queue.namespace_share,
            )
            running.operations.append(operations)
            deps = Deps(
                client=client,
                cache=self.cache,
                recorder=recorder,
                config=config,
                enqueue=queue.add,
                operations=operations,
            )
            running.reconcilers[rec_type.name()] = rec_type(deps)
            running.queues[rec_type.name()] = queue
            routes = running.routes
            routes.setdefault(rec_type.kind, []).append(Route(queue, _own_key))
            for owned in rec_type.owns:
                routes.setdefault(owned, []).append(
                    Route(queue, controller_keys(rec_type.kind), rec_type.owns_delay)
                )
            for watch in rec_type.watches:
                routes.setdefault(watch.kind, []).append(Route(queue, watch.map))
        for kind, kind_routes in running.routes.items():
            self.cache.store(kind).add_listener(self._dispatcher(kind_routes))
        for queue in running.queues.values():
            queue.start()
        running.feeds = [asyncio.create_task(feed.run()) for feed in feeds]
        self.running = running

    def _dispatcher(self, routes: list[Route]) -> Callable[[Body | None, Body | None], None]:
        cache = self.cache

        def dispatch(old: Body | None, new: Body | None) -> None:
            for route in routes:
                keys: set[Key] = set()
                for body in (old, new):
                    if body is not None:
                        keys.update(route.map(body, cache))
                for key in keys:
                    route.queue.add(key, route.delay)

        return dispatch

    def _reconcile_func(self, running: Running, rec_type: type[Reconciler[Any]]) -> Callable[[Key], Any]:
        kind = rec_type.kind
        model = kind.model
        assert model is not None and issubclass(model, pydantic.BaseModel), f"{kind} has no model"
        store = self.cache.store(kind)

        async def reconcile(key: Key) -> float | None:
            reconciler = running.reconcilers[rec_type.name()]
            body = store.get(*key)
            if body is None:
                await reconciler.deleted(key)
                return None
            try:
                obj = model.from_body(body)  # type: ignore[attr-defined]
            except pydantic.ValidationError as exc:
                raise PermanentError(f"{kind} {key[0]}/{key[1]} does not match its schema: {exc}") from None
            if (
                obj.deleting
            ):  # on its way out: its children go by garbage collection, nothing to bring in line
                await reconciler.deleted(key)
                return None
            result: float | None = await reconciler.reconcile(obj)
            return result

        return reconcile

    async def _cleanup(self, **_: Any) -> None:
        running, self.running = self.running, None
        if running is None:
            return
        for task in running.feeds:
            task.cancel()
        await asyncio.gather(*running.feeds, return_exceptions=True)
        for queue in running.queues.values():
            await queue.stop()
        for operations in running.operations:
            await operations.stop()
        await running.recorder.drain()
        await running.kube.close()
        _log.info("shadow-operator engine stopped")


__all__ = ["Cached", "Manager"]
