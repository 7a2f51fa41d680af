"""Operations (engine/operations.py): long work off the workers, under per-namespace and shared slots; the key
woken when one ends; an id this process does not know is told as such (an operator that took over)."""

from __future__ import annotations

import asyncio

import pytest
from shadow_operator.engine import RUNNING, Operations, Outcome

pytestmark = pytest.mark.unit


async def test_an_operation_runs_off_the_caller_and_wakes_its_key_when_it_ends() -> None:
    woken: list[tuple[tuple[str, str], float]] = []
    ops = Operations(lambda key, delay: woken.append((key, delay)), total=2, per_namespace=1)
    release = asyncio.Event()

    async def work() -> str:
        await release.wait()
        return "copied"

    key = ("a", "env")
    op = ops.start(key, "CopyIn", work, timeout=10)
    await asyncio.sleep(0)
    assert ops.look(key, "CopyIn", op) is RUNNING and woken == []
    release.set()
    await ops.settled()
    seen = ops.look(key, "CopyIn", op)
    assert isinstance(seen, Outcome) and seen.result() == "copied"
    assert woken == [(key, 0.0)]
    # Another operator's id, or one forgotten: unknown here.
    assert ops.look(key, "CopyIn", "elsewhere") is None
    ops.forget(key)
    assert ops.look(key, "CopyIn", op) is None


async def test_one_namespace_waits_on_its_share_while_another_is_served() -> None:
    ops = Operations(lambda key, delay: None, total=3, per_namespace=2)
    release = asyncio.Event()
    started: list[str] = []

    def work(name: str):  # type: ignore[no-untyped-def]
        async def run() -> None:
            started.append(name)
            await release.wait()

        return run

    for i in range(4):
        ops.start(("a", f"a{i}"), "CopyIn", work(f"a{i}"), timeout=10)
    ops.start(("b", "b0"), "CopyIn", work("b0"), timeout=10)
    for _ in range(5):
        await asyncio.sleep(0)
    assert sorted(started) == ["a0", "a1", "b0"]
    assert ops.waiting(("a", "a2"), "CopyIn") and not ops.waiting(("b", "b0"), "CopyIn")
    release.set()
    await ops.settled()
    assert sorted(started) == ["a0", "a1", "a2", "a3", "b0"] and ops.under_way() == 0


async def test_an_operation_past_its_deadline_ends_with_a_timeout_and_stop_cancels() -> None:
    ops = Operations(lambda key, delay: None)
    op = ops.start(("a", "slow"), "CloneCopy", lambda: asyncio.sleep(5), timeout=0.05)
    await ops.settled()
    seen = ops.look(("a", "slow"), "CloneCopy", op)
    assert isinstance(seen, Outcome) and isinstance(seen.error, TimeoutError)
    with pytest.raises(TimeoutError):
        seen.result()
    ops.start(("a", "other"), "CloneCopy", lambda: asyncio.sleep(60), timeout=120)
    await asyncio.wait_for(ops.stop(), 5)
    assert ops.under_way() == 0


async def test_an_operation_without_a_slot_runs_while_every_slot_is_held() -> None:
    """Gitea's setup takes no slot (its deadline bounds it): a namespace whose slots are all held, by its own
    stalled work, still gets it run, and it ends at its deadline."""
    ops = Operations(lambda key, delay: None, total=1, per_namespace=1)
    release = asyncio.Event()
    ops.start(("a", "busy"), "CopyIn", release.wait, timeout=10)
    ran: list[str] = []

    async def setup() -> None:
        ran.append("setup")
        await asyncio.Event().wait()  # a peer that never answers

    op = ops.start(("a", "env"), "GiteaSetup", setup, timeout=0.05, slot=False)
    assert not ops.waiting(("a", "env"), "GiteaSetup")
    for _ in range(3):
        await asyncio.sleep(0)
    assert ran == ["setup"]
    release.set()
    await ops.settled()
    seen = ops.look(("a", "env"), "GiteaSetup", op)
    assert isinstance(seen, Outcome) and isinstance(seen.error, TimeoutError)
