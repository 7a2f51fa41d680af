"""A work queue of object keys: de-duplicated, one reconcile per key at a time, requeue with backoff, fair.

Watch events of several kinds map to the same key; the queue folds them into one level-based reconcile. A key
added while it is being reconciled is marked dirty and runs once more afterwards (never concurrently). Failures
are retried with a per-key exponential backoff that resets on success. Workers wait for `start_processing`
(the caches are synced) before taking the first key. The queue lives on the event loop; not thread-safe.

Fairness, in the spirit of the API server's priority and fairness: keys wait in one FIFO per namespace and the
workers serve the namespaces in turn, so a tenant with 500 queued objects is served once per round like a
tenant with one. No namespace holds more than `namespace_share` workers at once (default: all but one), so one
tenant whose reconciles are slow can never occupy every worker while another tenant's key waits.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter, deque
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
        self,
        name: str,
        reconcile: ReconcileFunc,
        *,
        workers: int = 4,
        namespace_share: int | None = None,
        backoff: Backoff | None = None,
    ) -> None:
        self.name = name
        self._reconcile = reconcile
        self._workers = workers
        # How many workers one namespace may hold at once: all but one unless said otherwise, never below one.
        self.namespace_share = max(1, namespace_share if namespace_share is not None else workers - 1)
        self._backoff = backoff or Backoff()
        # Queued keys, one FIFO per namespace; `_turns` holds the namespaces with queued keys in serving order.
        self._pending: dict[str, deque[Key]] = {}
        self._turns: deque[str] = deque()
        self._running: Counter[str] = Counter()
        self._waiters: deque[asyncio.Future[None]] = deque()
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
            namespace = key[0]
            pending = self._pending.get(namespace)
            if pending is None:
                pending = self._pending[namespace] = deque()
                self._turns.append(namespace)
            pending.append(key)
            self._wake_one()

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
    def _wake_one(self) -> None:
        """A key may have become takeable: wake one idle worker to look (it waits again if there is none)."""
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    def _take(self) -> Key | None:
        """The next key in turn from a namespace below its share, or None when every queued key must wait."""
        for _ in range(len(self._turns)):
            namespace = self._turns.popleft()
            if self._running[namespace] >= self.namespace_share:
                self._turns.append(namespace)
                continue
            pending = self._pending[namespace]
            key = pending.popleft()
            if pending:
                self._turns.append(namespace)
            else:
                del self._pending[namespace]
            return key
        return None

    async def _work(self) -> None:
        await self._processing.wait()
        loop = asyncio.get_running_loop()
        while True:
            key = self._take()
            if key is None:
                waiter = loop.create_future()
                self._waiters.append(waiter)
                await waiter
                continue
            namespace = key[0]
            self._queued.discard(key)
            self._active.add(key)
            self._running[namespace] += 1
            try:
                await self._run(key)
            finally:
                self._active.discard(key)
                self._running[namespace] -= 1
                if not self._running[namespace]:
                    del self._running[namespace]
                if namespace in self._pending:
                    self._wake_one()  # this namespace may take a worker again
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
