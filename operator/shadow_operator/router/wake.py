"""Waking sleeping sandboxes on the first request, and telling the operator which sandboxes are used.

`Waker.hold`: a request for a sandbox that is asleep (idle-suspended, or its Pod going down) asks the operator
for a resume (a new value of the annotation shadow.dev/resume-requested on the Sandbox) and waits until the
index routes the sandbox again, from the watch (`Index.on_change`), never by polling; at most `hold_seconds`,
then the caller answers 504. One resume per sandbox however many requests wait (single flight per uid): a
request that finds a resume already asked for waits on it, and a resume is asked for again only when the last
one is older than `hold_seconds` (the operator may have missed it, or the sandbox fell asleep again).

`Activity.note`: the router writes shadow.dev/last-activity (RFC 3339 UTC, seconds) on a sandbox it routed a
request to, at most once per `every` seconds per sandbox, from a background task: the request never waits for
the write. Only sandboxes a request was routed to (allowed, in a served namespace) are noted, at most
`max_pending` wait to be written (more are dropped: they are noted again on their next request), and what is
remembered per sandbox is one timestamp, forgotten once older than `every`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime

import aiohttp
from prometheus_client import CollectorRegistry, Counter, Histogram

from shadow_operator.api import constants as c
from shadow_operator.api.kinds import SANDBOX
from shadow_operator.clients.kube import ApiError, Kube
from shadow_operator.router.index import Index

log = logging.getLogger(__name__)

DEFAULT_HOLD_SECONDS = 15.0
ACTIVITY_SECONDS = 30.0
MAX_PENDING = 1024
HOLD_BUCKETS = (0.1, 0.25, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0, 10.0, 15.0, 30.0)
CAUSES = ("preview", "sdk")
# (namespace, name, uid, annotations) -> None: a merge patch of the Sandbox's annotations, with its uid as a
# precondition (a sandbox created again under the same name is not the one the request was routed to).
Annotate = Callable[[str, str, str, Mapping[str, str]], Awaitable[None]]
PATCH_ERRORS = (ApiError, aiohttp.ClientError, TimeoutError)


def kube_annotate(kube: Kube) -> Annotate:
    async def annotate(namespace: str, name: str, uid: str, annotations: Mapping[str, str]) -> None:
        await kube.merge_patch(
            SANDBOX.path(namespace, name), {"metadata": {"uid": uid, "annotations": dict(annotations)}}
        )

    return annotate


def rfc3339(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class WakeMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.held = Counter(
            "shadow_router_requests_held",
            "Requests held while their sandbox woke up, by route.",
            ["route"],
            registry=registry,
        )
        self.hold_seconds = Histogram(
            "shadow_router_hold_seconds",
            "How long a held request waited for its sandbox (to Ready, or to the cap).",
            ["route"],
            buckets=HOLD_BUCKETS,
            registry=registry,
        )
        self.timed_out = Counter(
            "shadow_router_holds_timed_out",
            "Held requests answered 504 because their sandbox was not Ready within the cap, by route.",
            ["route"],
            registry=registry,
        )
        self.resumes = Counter(
            "shadow_router_resumes_requested",
            "Resumes the router asked the operator for, by the request that caused them.",
            ["cause"],
            registry=registry,
        )
        self.resume_errors = Counter(
            "shadow_router_resume_request_errors",
            "Resume requests the API server refused or did not answer.",
            registry=registry,
        )
        for route in CAUSES:
            self.held.labels(route)
            self.timed_out.labels(route)
            self.resumes.labels(route)


@dataclass
class Waker:
    """Holds requests for sleeping sandboxes (see the module). Used from one event loop."""

    index: Index
    annotate: Annotate
    metrics: WakeMetrics
    hold_seconds: float = DEFAULT_HOLD_SECONDS
    _changes: dict[str, asyncio.Future[None]] = field(default_factory=dict, init=False)
    _asked: dict[str, float] = field(default_factory=dict, init=False)  # uid -> when it last asked a resume
    _patches: set[asyncio.Task[None]] = field(default_factory=set, init=False)

    def __post_init__(self) -> None:
        self.index.on_change = self.changed

    def changed(self, uid: str) -> None:
        waiting = self._changes.pop(uid, None)
        if waiting is not None and not waiting.done():
            waiting.set_result(None)

    async def next_change(self, uid: str, timeout: float) -> None:
        """Until the sandbox's entry or Pod changes in the index, at most `timeout` seconds."""
        change = self._changes.get(uid)
        if change is None:
            change = self._changes[uid] = asyncio.get_running_loop().create_future()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(change), timeout)

    def waking(self, uid: str) -> bool:
        """Whether the router asked for this sandbox's resume and has not seen it Ready since."""
        return uid in self._asked

    async def hold(self, namespace: str, name: str, cause: str) -> bool:
        """Wake the sandbox and wait until it is routable, or gone. False when the cap passed first."""
        start = time.monotonic()
        deadline = start + self.hold_seconds
        self.metrics.held.labels(cause).inc()
        try:
            while True:
                route = self.index.route(namespace, name)
                if route is None:
                    return True  # gone: the caller decides again (404)
                if route.ready:
                    self._asked.pop(route.uid, None)
                    return True
                if not route.asleep and not self.waking(route.uid):
                    return True  # neither asleep nor waking (suspended by its spec, say): decide again
                asked = self._asked.get(route.uid)
                if route.asleep and (asked is None or time.monotonic() - asked >= self.hold_seconds):
                    self._ask(namespace, name, route.uid, cause)
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    self.metrics.timed_out.labels(cause).inc()
                    return False
                await self.next_change(route.uid, remaining)
        finally:
            self.metrics.hold_seconds.labels(cause).observe(time.monotonic() - start)

    def _ask(self, namespace: str, name: str, uid: str, cause: str) -> None:
        """One resume patch, in a task of its own: a request that gives up does not cancel it."""
        now = time.monotonic()
        if len(self._asked) >= MAX_PENDING:
            # Asked long ago and never seen Ready (deleted since, say): nothing waits on those any more.
            self._asked = {k: t for k, t in self._asked.items() if now - t < 2 * self.hold_seconds}
        self._asked[uid] = now
        self.metrics.resumes.labels(cause).inc()
        value = f"{rfc3339(time.time())} router {uuid.uuid4().hex[:8]}"
        log.info("sandbox %s/%s is asleep: resume requested (%s request)", namespace, name, cause)
        task = asyncio.create_task(self._patch(namespace, name, uid, value))
        self._patches.add(task)
        task.add_done_callback(self._patches.discard)

    async def _patch(self, namespace: str, name: str, uid: str, value: str) -> None:
        try:
            await self.annotate(namespace, name, uid, {c.ANNOTATION_RESUME_REQUEST: value})
        except PATCH_ERRORS as exc:
            self.metrics.resume_errors.inc()
            log.warning("resume of %s/%s not requested: %s", namespace, name, exc)
            self._asked.pop(uid, None)  # the next request asks again
            self.changed(uid)


class Activity:
    """Writes shadow.dev/last-activity in the background (see the module)."""

    def __init__(
        self,
        annotate: Annotate,
        *,
        every: float = ACTIVITY_SECONDS,
        max_pending: int = MAX_PENDING,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.annotate = annotate
        self.every = every
        self.max_pending = max_pending
        self.clock = clock
        self._written: dict[str, float] = {}  # uid -> when it was last written (or tried)
        self._pending: dict[str, tuple[str, str]] = {}  # uid -> (namespace, name), oldest first
        self._wakeup = asyncio.Event()
        self._prune_at = max_pending

    def note(self, namespace: str, name: str, uid: str) -> None:
        """A request was routed to this sandbox. Never waits, never fails."""
        if not uid or uid in self._pending or len(self._pending) >= self.max_pending:
            return
        written = self._written.get(uid)
        if written is not None and self.clock() - written < self.every:
            return
        self._pending[uid] = (namespace, name)
        self._wakeup.set()

    async def run(self) -> None:
        while True:
            await self._wakeup.wait()
            self._wakeup.clear()
            while self._pending:
                uid = next(iter(self._pending))
                namespace, name = self._pending.pop(uid)
                self._remember(uid)
                try:
                    await self.annotate(
                        namespace, name, uid, {c.ANNOTATION_LAST_ACTIVITY: rfc3339(time.time())}
                    )
                except PATCH_ERRORS as exc:
                    # Not retried before `every` has passed: a failing API server is not hammered.
                    log.debug("activity of %s/%s not written: %s", namespace, name, exc)

    def _remember(self, uid: str) -> None:
        now = self.clock()
        if len(self._written) >= self._prune_at:
            # What is older than `every` decides nothing any more.
            self._written = {k: t for k, t in self._written.items() if now - t < self.every}
            self._prune_at = max(self.max_pending, 2 * len(self._written))
        self._written[uid] = now
