"""Bounded concurrency for reconcilers that write many objects at once (a pool filling up)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


async def gather_bounded(count: int, make: Callable[[], Awaitable[T]], limit: int) -> list[T]:
    """Await `make()` `count` times, at most `limit` at once. Every call runs to its end; the results of those
    that succeeded come back, and the first error (if any) is raised after all of them finished."""
    gate = asyncio.Semaphore(limit)

    async def one() -> T:
        async with gate:
            return await make()

    outcomes = await asyncio.gather(*(one() for _ in range(count)), return_exceptions=True)
    errors = [o for o in outcomes if isinstance(o, BaseException)]
    if errors:
        raise errors[0]
    return [o for o in outcomes if not isinstance(o, BaseException)]
