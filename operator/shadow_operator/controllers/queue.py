"""A per-kind work queue: kopf watch events enqueue keys, workers reconcile them one key at a time.

kopf delivers watch events of pods, services and sandboxes separately; the queue folds them into one
level-based reconcile per object, never runs the same key twice at once, and retries failures with backoff.
The queue is not thread-safe: handlers that enqueue are `async def`, so kopf runs them on the event loop
(it would run plain `def` handlers in a thread pool).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

import kopf

from shadow_operator.clients.kube import ApiError
from shadow_operator.controllers import metrics

Key = tuple[str, str]
# A reconcile returns the seconds after which it wants to run again, or None.
Reconcile = Callable[[str, str], Awaitable[float | None]]

CONFLICT_RETRY = 0.1
MAX_BACKOFF = 30.0


class WorkQueue:
    def __init__(self, kind: str, reconcile: Reconcile, *, workers: int = 4) -> None:
        self.kind = kind
        self._reconcile = reconcile
        self._workers = workers
        self._ready: asyncio.Queue[Key] = asyncio.Queue()
        self._queued: set[Key] = set()
        self._active: set[Key] = set()
        self._dirty: set[Key] = set()
        self._failures: dict[Key, int] = {}
        self._timers: dict[Key, asyncio.TimerHandle] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._log = logging.getLogger(f"shadow_operator.{kind.lower()}")

    def add(self, namespace: str, name: str, delay: float = 0.0) -> None:
        key = (namespace, name)
        if delay > 0:
            loop = asyncio.get_running_loop()
            timer = self._timers.get(key)
            due = loop.time() + delay
            if timer is not None and timer.when() <= due:
                return
            if timer is not None:
                timer.cancel()
            self._timers[key] = loop.call_at(due, self._fire, key)
            return
        if key in self._active:
            self._dirty.add(key)
        elif key not in self._queued:
            self._queued.add(key)
            self._ready.put_nowait(key)

    def _fire(self, key: Key) -> None:
        self._timers.pop(key, None)
        self.add(*key)

    def start(self) -> None:
        self._tasks = [
            asyncio.create_task(self._work(), name=f"{self.kind}-worker-{i}") for i in range(self._workers)
        ]

    async def stop(self) -> None:
        for timer in self._timers.values():
            timer.cancel()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _work(self) -> None:
        while True:
            key = await self._ready.get()
            self._queued.discard(key)
            self._active.add(key)
            try:
                await self._run(key)
            finally:
                self._active.discard(key)
                if key in self._dirty:
                    self._dirty.discard(key)
                    self.add(*key)

    async def _run(self, key: Key) -> None:
        started = time.monotonic()
        metrics.RECONCILES.labels(self.kind).inc()
        try:
            again = await self._guarded(*key)
        except kopf.TemporaryError as exc:
            metrics.RECONCILE_ERRORS.labels(self.kind, "temporary").inc()
            self._log.info("%s %s/%s: retrying in %.1fs: %s", self.kind, *key, exc.delay or 1.0, exc)
            self.add(*key, delay=float(exc.delay or 1.0))
        except ApiError as exc:
            metrics.RECONCILE_ERRORS.labels(self.kind, f"http_{exc.status}").inc()
            self._retry(key, exc)
        except Exception as exc:
            metrics.RECONCILE_ERRORS.labels(self.kind, type(exc).__name__).inc()
            self._retry(key, exc)
        else:
            self._failures.pop(key, None)
            if again is not None:
                self.add(*key, delay=max(again, 0.01))
        finally:
            metrics.RECONCILE_DURATION.labels(self.kind).observe(time.monotonic() - started)

    async def _guarded(self, namespace: str, name: str) -> float | None:
        """Run the reconcile; a 409 (someone changed the object since we read it) is a quick retry."""
        try:
            return await self._reconcile(namespace, name)
        except ApiError as exc:
            if exc.conflict and not exc.already_exists:
                raise kopf.TemporaryError(f"conflict: {exc.message}", delay=CONFLICT_RETRY) from exc
            raise

    def _retry(self, key: Key, exc: BaseException) -> None:
        count = self._failures.get(key, 0) + 1
        self._failures[key] = count
        delay = min(0.25 * 2**count, MAX_BACKOFF)
        self._log.warning(
            "%s %s/%s failed (attempt %d), retrying in %.1fs: %s", self.kind, *key, count, delay, exc
        )
        self.add(*key, delay=delay)
