"""Operations: long work a reconciler starts and then observes, never awaits in one of its workers.

A reconcile starts an operation for an object (`start`: a coroutine run as a task on the event loop), records
the id it is given in the object's status, and returns; when the operation ends, the object's key is woken and
a later pass reads the outcome (`look`). Operations take slots first: at most `total` run at once and at most
`per_namespace` of one namespace (clients/pacing.py's `Slots`, the namespace's gate before the shared one), so a
tenant's long copy-ins wait for each other instead of for every worker, and another tenant's object is served.
An operation that only waits on a peer, bounded by its own deadline (a few small calls to an environment's
Gitea), may run without a slot (`slot=False`): a stalled peer then holds nothing another object needs.

The operations live in this process only. An operator that starts again, or a new leader, finds an id in
status that `look` does not know (`None`): the reconciler then starts an idempotent operation again, and answers
a non-idempotent one as lost instead of running it twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from shadow_operator.clients.pacing import Slots
from shadow_operator.engine.cache import Key

_log = logging.getLogger("shadow_operator.engine.operations")


class Running:
    """`look`'s answer for an operation that has not ended (it may still wait for a slot)."""


RUNNING = Running()


@dataclass
class Outcome:
    """How an operation ended: its value, or the exception it raised (TimeoutError at its deadline)."""

    value: Any = None
    error: BaseException | None = None

    def result(self) -> Any:
        """The value, or the operation's exception raised here."""
        if self.error is not None:
            raise self.error
        return self.value


@dataclass
class _Entry:
    id: str
    task: asyncio.Task[None] | None = None
    outcome: Outcome | None = None
    waiting: bool = False  # for its slot (once its task runs)


@dataclass
class Operations:
    """The operations of one reconciler's objects, by (key, name): one of each name per object at a time."""

    wake: Callable[[Key, float], None]
    total: int = 4
    per_namespace: int = 3
    _slots: Slots = field(init=False, repr=False)
    _entries: dict[tuple[Key, str], _Entry] = field(init=False, repr=False, default_factory=dict)

    def __post_init__(self) -> None:
        self._slots = Slots(total=max(1, self.total), per_namespace=max(1, self.per_namespace))

    def start(
        self,
        key: Key,
        name: str,
        work: Callable[[], Awaitable[Any]],
        *,
        timeout: float,
        operation_id: str | None = None,
        slot: bool = True,
    ) -> str:
        """Run `work()` in the background (at most `timeout` seconds once it holds a slot; without one when not
        `slot`), replacing the object's operation of this name (a running one is cancelled); its id, for status
        (`operation_id`: one taken over from status, else a new one)."""
        self._drop(key, name)
        entry = _Entry(id=operation_id or secrets.token_hex(8))
        self._entries[(key, name)] = entry
        entry.task = asyncio.get_running_loop().create_task(
            self._run(key, name, entry, work, timeout, slot), name=f"operation {name} {key[0]}/{key[1]}"
        )
        return entry.id

    def look(self, key: Key, name: str, operation_id: str) -> Running | Outcome | None:
        """RUNNING, the outcome once it ended, or None when this process knows no such operation (it was
        started by an operator that is gone)."""
        entry = self._entries.get((key, name))
        if entry is None or entry.id != operation_id:
            return None
        return entry.outcome or RUNNING

    def waiting(self, key: Key, name: str) -> bool:
        """Whether the object's operation of this name waits for a slot."""
        entry = self._entries.get((key, name))
        return entry is not None and entry.outcome is None and entry.waiting

    def forget(self, key: Key, name: str | None = None) -> None:
        """Drop the object's operations (of `name`, or all), cancelling those still running."""
        for entry_key in [k for k in self._entries if k[0] == key and name in (None, k[1])]:
            self._drop(*entry_key)

    def under_way(self) -> int:
        """How many operations have not ended (running or waiting for a slot)."""
        return sum(1 for entry in self._entries.values() if entry.outcome is None)

    async def settled(self) -> None:
        """Until every operation started so far has ended: for tests."""
        tasks = [e.task for e in self._entries.values() if e.task is not None]
        await asyncio.gather(*tasks, return_exceptions=True)

    async def stop(self) -> None:
        """Cancel every operation (the operator stops: a successor starts them again from status)."""
        tasks = [e.task for e in self._entries.values() if e.task is not None and not e.task.done()]
        self._entries.clear()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def _drop(self, key: Key, name: str) -> None:
        entry = self._entries.pop((key, name), None)
        if entry is not None and entry.task is not None and not entry.task.done():
            entry.task.cancel()

    async def _run(
        self,
        key: Key,
        name: str,
        entry: _Entry,
        work: Callable[[], Awaitable[Any]],
        timeout: float,
        slot: bool,
    ) -> None:
        outcome = Outcome()
        entry.waiting = slot
        try:
            async with self._slots.hold(key[0]) if slot else contextlib.nullcontext():
                entry.waiting = False
                async with asyncio.timeout(timeout):
                    outcome.value = await work()
        except asyncio.CancelledError:
            raise  # dropped or stopped: nobody reads it
        except Exception as exc:
            outcome.error = exc
            _log.debug("operation %s of %s/%s failed: %s", name, *key, exc)
        entry.outcome = outcome
        if self._entries.get((key, name)) is entry:
            with contextlib.suppress(RuntimeError):  # the queue is gone (the operator stops)
                self.wake(key, 0.0)


__all__ = ["RUNNING", "Operations", "Outcome", "Running"]
