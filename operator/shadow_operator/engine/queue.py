"""A work queue of object keys: de-duplicated, one reconcile per key at a time, requeue with backoff.

Watch events of several kinds map to the same key; the queue folds them into one level-based reconcile. A key
added while it is being reconciled is marked dirty and runs once more afterwards (never concurrently). Failures
are retried with a per-key exponential backoff that resets on success. Workers wait for `start_processing`
(the caches are synced) before taking the first key. The queue lives on the event loop; not thread-safe.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from shadow_operator.clients.kube import ApiError
from shadow_operator.engine import metrics
from shadow_operator.engine.errors import PermanentError, RequeueAfter

Key = tuple[str, str]
# A reconcile returns the seconds after which it wants to run again, or None.
ReconcileFunc = Callable[[Key], Awaitable[float | None]]


class Backoff:
    """Per-key exponential backoff: base * 2**(failures-1), capped."""

    def __init__(self, base: float = 0.05, cap: float = 30.0) -> None:
        self.base = base
        self.cap = cap
        self._failures: dict[Key, int] = {}

    def next_delay(self, key: Key) -> float:
        count = self._failures.get(key, 0) + 1
        self._failures[key] = count
        return float(min(self.base * 2 ** (count - 1), self.cap))

    def failures(self, key: Key) -> int:
        return self._failures.get(key, 0)

    def forget(self, key: Key) -> None:
        self._failures.pop(key, None)


class WorkQueue:
    CONFLICT_DELAY = 0.02

    def __init__(
        self, name: str, reconcile: ReconcileFunc, *, workers: int = 4, backoff: Backoff | None = None
    ) -> None:
        self.name = name
        self._reconcile = reconcile
        self._workers = workers
        self._backoff = backoff or Backoff()
        self._ready: asyncio.Queue[Key] = asyncio.Queue()
        self._queued: set[Key] = set()
        self._active: set[Key] = set()
        self._dirty: set[Key] = set()
        self._timers: dict[Key, asyncio.TimerHandle] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._processing = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._log = logging.getLogger(f"shadow_operator.{name.lower()}")

    # ------------------------------------------------------------------------------------------- input
    def add(self, key: Key, delay: float = 0.0) -> None:
        """Reconcile `key` now, or after `delay` seconds (an earlier pending timer wins)."""
        if delay > 0:
            loop = asyncio.get_running_loop()
            due = loop.time() + delay
            timer = self._timers.get(key)
            if timer is not None:
                if timer.when() <= due:
                    return
                timer.cancel()
            self._timers[key] = loop.call_at(due, self._fire, key)
            return
        if key in self._active:
            self._dirty.add(key)
        elif key not in self._queued:
            self._queued.add(key)
            self._idle.clear()
            self._ready.put_nowait(key)

    def _fire(self, key: Key) -> None:
        self._timers.pop(key, None)
        self.add(key)

    def __len__(self) -> int:
        return len(self._queued)

    # ------------------------------------------------------------------------------------------ control
    def start(self) -> None:
        self._tasks = [
            asyncio.create_task(self._work(), name=f"{self.name}-worker-{i}") for i in range(self._workers)
        ]

    def start_processing(self) -> None:
        self._processing.set()

    async def stop(self) -> None:
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []

    async def wait_idle(self) -> None:
        """Until nothing is queued or running (timers may still be pending): for tests."""
        await self._idle.wait()

    # ------------------------------------------------------------------------------------------ workers
    async def _work(self) -> None:
        await self._processing.wait()
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
                    self.add(key)
                elif not self._queued and not self._active:
                    self._idle.set()

    async def _run(self, key: Key) -> None:
        started = time.monotonic()
        metrics.RECONCILES.labels(self.name).inc()
        try:
            again = await self._reconcile(key)
        except RequeueAfter as exc:
            self._backoff.forget(key)
            self.add(key, delay=max(exc.delay, 0.001))
        except PermanentError as exc:
            metrics.RECONCILE_ERRORS.labels(self.name, "permanent").inc()
            self._log.error("%s %s/%s: %s (not retried until the object changes)", self.name, *key, exc)
        except ApiError as exc:
            if exc.conflict and not exc.already_exists:
                # Someone changed the object since we read it: retry soon, from the cache's newer copy.
                metrics.RECONCILE_ERRORS.labels(self.name, "conflict").inc()
                self.add(key, delay=self.CONFLICT_DELAY)
            else:
                metrics.RECONCILE_ERRORS.labels(self.name, f"http_{exc.status}").inc()
                self._retry(key, exc)
        except Exception as exc:
            metrics.RECONCILE_ERRORS.labels(self.name, type(exc).__name__).inc()
            self._retry(key, exc)
        else:
            self._backoff.forget(key)
            if again is not None:
                self.add(key, delay=max(again, 0.001))
        finally:
            metrics.RECONCILE_DURATION.labels(self.name).observe(time.monotonic() - started)

    def _retry(self, key: Key, exc: BaseException) -> None:
        delay = self._backoff.next_delay(key)
        attempt = self._backoff.failures(key)
        log = self._log.warning if attempt > 1 else self._log.info
        log(
            "%s %s/%s failed (attempt %d), retrying in %.2fs: %s",
            self.name,
            *key,
            attempt,
            delay,
            exc,
            exc_info=attempt > 3,
        )
        self.add(key, delay=delay)
