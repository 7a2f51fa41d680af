"""Transfers with a tenant's workspace, bounded in total rather than per read.

httpx's timeouts are per read: a runtime that the workspace's code stops (SIGSTOP) for most of each read timeout
and wakes for a few bytes keeps a transfer going, and the operator-wide slot it holds, for ever. Under `paced`
a transfer has a deadline for the whole of it, and must move `Pace.min_bytes` in every `Pace.window` seconds;
otherwise it ends with `TransferStalled`, whose message says which of the two it broke.

Per-namespace slots (`Slots`) keep one tenant's transfers from taking every operator-wide slot.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

DEFAULT_MIN_RATE = 64 << 10  # bytes per second, averaged over the window
DEFAULT_WINDOW = 30.0


class TransferStalled(Exception):
    """A transfer broke its pace or its deadline; the message is fit for status and events."""


@dataclass(frozen=True)
class Pace:
    """At least `min_rate` bytes per second, counted over every `window` seconds."""

    min_rate: int = DEFAULT_MIN_RATE
    window: float = DEFAULT_WINDOW

    @property
    def min_bytes(self) -> int:
        return max(1, int(self.min_rate * self.window))


class Meter:
    """Counts a transfer's bytes; each time a window's worth arrived, the window starts again from then."""

    def __init__(self, pace: Pace, timer: asyncio.Timeout, end: float) -> None:
        self.pace = pace
        self.total = 0
        self._timer = timer
        self._end = end
        self._window_bytes = 0

    def __call__(self, count: int) -> None:
        self.total += count
        self._window_bytes += count
        if self._window_bytes >= self.pace.min_bytes:
            self._window_bytes = 0
            now = asyncio.get_running_loop().time()
            self._timer.reschedule(min(now + self.pace.window, self._end))


@asynccontextmanager
async def paced(what: str, pace: Pace, deadline: float | None) -> AsyncIterator[Meter]:
    """Run a transfer (`what`, e.g. "download of /x") under `pace` and an overall `deadline` in seconds (None:
    no overall deadline). The body reports every chunk it moves to the meter it gets."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    end = start + deadline if deadline is not None else math.inf
    timer = asyncio.timeout_at(min(start + pace.window, end))
    meter = Meter(pace, timer, end)
    try:
        async with timer:
            yield meter
    except TimeoutError:
        if not timer.expired():
            raise  # not ours
        if loop.time() >= end:
            raise TransferStalled(f"{what} took longer than {deadline:g}s in total") from None
        raise TransferStalled(
            f"{what} moved fewer than {pace.min_bytes} bytes in {pace.window:g}s (at least "
            f"{pace.min_rate} bytes/s is required): the workspace's runtime looks stopped"
        ) from None


@dataclass
class Slots:
    """At most `total` holders at once, and at most `per_namespace` of them from any one namespace.

    A holder takes its namespace's gate before the shared one, so a namespace's queue of waiters never sits on
    shared slots that another namespace could use.
    """

    total: int
    per_namespace: int
    _shared: asyncio.Semaphore = field(init=False, repr=False)
    _gates: dict[str, tuple[asyncio.Semaphore, list[int]]] = field(
        init=False, repr=False, default_factory=dict
    )

    def __post_init__(self) -> None:
        if self.total < 1 or self.per_namespace < 1:
            raise ValueError("slots: total and per_namespace must be at least 1")
        self._shared = asyncio.Semaphore(self.total)

    def busy(self, namespace: str) -> int:
        """How many of `namespace`'s holders hold or wait for a slot."""
        gate = self._gates.get(namespace)
        return gate[1][0] if gate else 0

    @asynccontextmanager
    async def hold(self, namespace: str) -> AsyncIterator[None]:
        gate, users = self._gates.setdefault(namespace, (asyncio.Semaphore(self.per_namespace), [0]))
        users[0] += 1
        try:
            async with gate, self._shared:
                yield
        finally:
            users[0] -= 1
            if not users[0]:
                del self._gates[namespace]  # no per-namespace state is kept for namespaces gone quiet
