"""gather_bounded: how pools create their members (at most `limit` writes in flight, none abandoned)."""

from __future__ import annotations

import asyncio

import pytest
from shadow_operator.engine import gather_bounded

pytestmark = pytest.mark.unit


async def test_at_most_limit_at_once_and_every_result_back() -> None:
    running, peak, made = 0, 0, 0

    async def make() -> int:
        nonlocal running, peak, made
        running += 1
        peak = max(peak, running)
        await asyncio.sleep(0.01)
        running -= 1
        made += 1
        return made

    assert sorted(await gather_bounded(10, make, 3)) == list(range(1, 11))
    assert peak == 3


async def test_the_first_error_is_raised_after_every_call_finished() -> None:
    finished: list[int] = []
    calls = iter(range(5))

    async def make() -> int:
        i = next(calls)
        await asyncio.sleep(0.01 * (5 - i))
        finished.append(i)
        if i in (1, 3):
            raise RuntimeError(f"refused {i}")
        return i

    with pytest.raises(RuntimeError, match="refused 1"):
        await gather_bounded(5, make, 2)
    assert sorted(finished) == [0, 1, 2, 3, 4]
