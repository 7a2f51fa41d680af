"""The work queue: de-duplication, one reconcile per key at a time, backoff, requeue, permanent errors."""

from __future__ import annotations

import asyncio
import itertools
from collections import Counter

import pytest
from shadow_operator.engine.errors import PermanentError, RequeueAfter
from shadow_operator.engine.queue import Backoff, Key, WorkQueue

pytestmark = pytest.mark.unit

KEY = ("ns", "a")


async def settle(queue: WorkQueue, seconds: float = 0.05) -> None:
    await asyncio.sleep(seconds)
    await asyncio.wait_for(queue.wait_idle(), timeout=5)


def test_backoff_doubles_up_to_its_cap_and_resets() -> None:
    backoff = Backoff(base=0.1, cap=0.5)
    assert [backoff.next_delay(KEY) for _ in range(5)] == [0.1, 0.2, 0.4, 0.5, 0.5]
    assert backoff.failures(KEY) == 5
    backoff.forget(KEY)
    assert backoff.next_delay(KEY) == 0.1


async def test_keys_added_while_queued_run_once() -> None:
    runs: Counter[Key] = Counter()

    async def reconcile(key: Key) -> None:
        runs[key] += 1

    queue = WorkQueue("Test", reconcile, workers=2)
    for _ in range(10):
        queue.add(KEY)
    queue.add(("ns", "b"))
    queue.start()
    queue.start_processing()
    await settle(queue)
    await queue.stop()
    assert runs == {KEY: 1, ("ns", "b"): 1}


async def test_a_key_never_runs_twice_at_once_and_reruns_when_dirtied() -> None:
    active = 0
    most = 0
    runs = 0
    release = asyncio.Event()

    async def reconcile(key: Key) -> None:
        nonlocal active, most, runs
        active += 1
        most = max(most, active)
        runs += 1
        if runs == 1:
            await release.wait()
        active -= 1

    queue = WorkQueue("Test", reconcile, workers=4)
    queue.start()
    queue.start_processing()
    queue.add(KEY)
    await asyncio.sleep(0.01)
    for _ in range(5):
        queue.add(KEY)  # while the first pass runs: marks the key dirty, no second worker takes it
    await asyncio.sleep(0.01)
    assert runs == 1
    release.set()
    await settle(queue)
    await queue.stop()
    assert most == 1
    assert runs == 2, "one more pass after the change seen while running, not one per add"


async def test_failures_are_retried_with_backoff_until_success() -> None:
    attempts: list[float] = []
    loop = asyncio.get_running_loop()

    async def reconcile(key: Key) -> None:
        attempts.append(loop.time())
        if len(attempts) < 4:
            raise RuntimeError("API unavailable")

    queue = WorkQueue("Test", reconcile, workers=1, backoff=Backoff(base=0.02, cap=1))
    queue.start()
    queue.start_processing()
    queue.add(KEY)
    await asyncio.sleep(0.4)
    await queue.stop()
    assert len(attempts) == 4
    gaps = [b - a for a, b in itertools.pairwise(attempts)]
    assert gaps[0] >= 0.018 and gaps[1] >= 0.038 and gaps[2] >= 0.078, gaps


async def test_requeue_after_and_returned_delays_run_the_key_again() -> None:
    runs = 0

    async def reconcile(key: Key) -> float | None:
        nonlocal runs
        runs += 1
        if runs == 1:
            raise RequeueAfter(0.02)
        if runs == 2:
            return 0.02
        return None

    queue = WorkQueue("Test", reconcile, workers=1)
    queue.start()
    queue.start_processing()
    queue.add(KEY)
    await asyncio.sleep(0.2)
    await queue.stop()
    assert runs == 3


async def test_permanent_errors_are_not_retried() -> None:
    runs = 0

    async def reconcile(key: Key) -> None:
        nonlocal runs
        runs += 1
        raise PermanentError("spec can never work")

    queue = WorkQueue("Test", reconcile, workers=1, backoff=Backoff(base=0.01))
    queue.start()
    queue.start_processing()
    queue.add(KEY)
    await asyncio.sleep(0.15)
    await queue.stop()
    assert runs == 1


async def test_workers_wait_until_processing_starts() -> None:
    runs = 0

    async def reconcile(key: Key) -> None:
        nonlocal runs
        runs += 1

    queue = WorkQueue("Test", reconcile, workers=2)
    queue.start()
    queue.add(KEY)
    await asyncio.sleep(0.05)
    assert runs == 0, "no reconcile before the caches are synced"
    queue.start_processing()
    await settle(queue)
    await queue.stop()
    assert runs == 1


async def test_an_earlier_timer_wins_over_a_later_one() -> None:
    runs: list[float] = []
    loop = asyncio.get_running_loop()

    async def reconcile(key: Key) -> None:
        runs.append(loop.time())

    queue = WorkQueue("Test", reconcile, workers=1)
    queue.start()
    queue.start_processing()
    start = loop.time()
    queue.add(KEY, delay=0.5)
    queue.add(KEY, delay=0.02)
    queue.add(KEY, delay=0.3)
    await asyncio.sleep(0.1)
    await queue.stop()
    assert len(runs) == 1 and runs[0] - start < 0.1


async def test_a_409_conflict_is_retried_at_once_without_backoff() -> None:
    from shadow_operator.clients.kube import ApiError

    attempts: list[float] = []
    loop = asyncio.get_running_loop()

    async def reconcile(key: Key) -> None:
        attempts.append(loop.time())
        if len(attempts) < 3:
            raise ApiError(409, "Conflict", "the object has been modified")

    queue = WorkQueue("Test", reconcile, workers=1, backoff=Backoff(base=5.0))
    queue.start()
    queue.start_processing()
    queue.add(KEY)
    await asyncio.sleep(0.3)
    await queue.stop()
    assert len(attempts) == 3, "conflicts do not wait for the 5 s backoff"


async def test_namespaces_are_served_in_turn_so_a_busy_tenant_never_goes_first_by_volume() -> None:
    order: list[Key] = []

    async def reconcile(key: Key) -> None:
        order.append(key)

    queue = WorkQueue("Test", reconcile, workers=1)
    for i in range(500):
        queue.add(("tenant-a", f"env-{i}"))
    queue.add(("tenant-b", "only"))
    queue.add(("tenant-c", "only"))
    queue.start()
    queue.start_processing()
    await settle(queue)
    await queue.stop()
    assert len(order) == 502
    assert order.index(("tenant-b", "only")) == 1, "tenant-b's one key waited behind tenant-a's 500"
    assert order.index(("tenant-c", "only")) == 2
    assert [key for key in order if key[0] == "tenant-a"] == [("tenant-a", f"env-{i}") for i in range(500)]


async def test_a_tenant_whose_reconciles_hang_never_holds_every_worker() -> None:
    hung = asyncio.Event()  # never set while the other tenant is served
    served = asyncio.Event()
    held: Counter[str] = Counter()

    async def reconcile(key: Key) -> None:
        if key[0] == "attacker":
            held["attacker"] += 1
            await hung.wait()
        else:
            served.set()

    queue = WorkQueue("Test", reconcile, workers=4)
    queue.start()
    queue.start_processing()
    for i in range(20):
        queue.add(("attacker", f"sleep-{i}"))
    await asyncio.sleep(0.05)
    queue.add(("victim", "env"))
    await asyncio.wait_for(served.wait(), timeout=5)
    assert held["attacker"] == 3, "the attacker holds all but one worker"
    hung.set()
    await settle(queue)
    await queue.stop()
    assert held["attacker"] == 20, "the attacker's keys still all run once workers free up"


async def test_one_namespace_alone_uses_its_share_and_the_rest_waits_its_turn() -> None:
    running = 0
    most = 0

    async def reconcile(key: Key) -> None:
        nonlocal running, most
        running += 1
        most = max(most, running)
        await asyncio.sleep(0.01)
        running -= 1

    queue = WorkQueue("Test", reconcile, workers=4, namespace_share=2)
    for i in range(12):
        queue.add(("solo", str(i)))
    queue.start()
    queue.start_processing()
    await settle(queue, 0.2)
    await queue.stop()
    assert most == 2
    assert len(queue) == 0
