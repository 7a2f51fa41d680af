"""Leader election over a `coordination.k8s.io/v1` Lease, so that several replicas can run and one acts.

The protocol follows client-go's `leaderelection` package:

- A replica may take the Lease when nobody holds it (`holderIdentity` empty: released), when it is its own,
  or when the record has not changed for `leaseDurationSeconds` as timed by the replica's *own* monotonic
  clock since it last saw the record change. Wall-clock timestamps written by other replicas are never
  compared with ours, so clock skew between nodes cannot shorten a lease. The price: a replica that has
  only just started waits one full lease duration before it takes over a lease that is not released.
- Every write is a PUT carrying the `resourceVersion` that was read (or a POST that fails with
  AlreadyExists), so of two replicas racing for the Lease exactly one wins.
- The leader renews every `retry_period`. When no renewal has succeeded for `renew_deadline` (measured from
  when the last successful request was *sent*), or another holder shows up, leadership is lost and
  reported at once: `on_lost` is called and `lost` is set. Since `renew_deadline < lease_duration`, the
  old leader gives up before any standby can consider the lease expired.
- `release()` (graceful shutdown) clears `holderIdentity`, so a standby takes over on its next retry.

`run_with_leadership()` wraps a whole operator: it waits for the Lease while answering liveness probes
itself, runs the operator once leader, and exits the process when leadership is lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import enum
import logging
import os
import random
import secrets
import signal
import socket
import sys
import threading
import time
import urllib.parse
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from datetime import UTC, datetime
from typing import Any, NoReturn

import aiohttp
import aiohttp.web

from shadow_operator.api import constants as c
from shadow_operator.clients.kube import ApiError, Kube, resource_path

logger = logging.getLogger(__name__)

LEASE_API_VERSION = "coordination.k8s.io/v1"
DEFAULT_LEASE_NAME = c.LEADER_LEASE_NAME
DEFAULT_NAMESPACE = "shadow-system"
DEFAULT_LEASE_DURATION = 15
DEFAULT_RENEW_DEADLINE = 10.0
DEFAULT_RETRY_PERIOD = 2.0
# Standbys wait retry_period * [1, 1 + JITTER) between attempts, so they do not poll in lock-step.
JITTER = 0.2
# The exit code of a replica that lost leadership (as controller-runtime's managers exit non-zero).
LOST_EXIT_CODE = 1

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


class LeadershipLost(Exception):
    """Raised by `run_with_leadership` when leadership was lost and `on_lost` returned."""


# --- configuration -----------------------------------------------------------------------------------------


def new_identity(env: Mapping[str, str] | None = None) -> str:
    """`<pod name>_<random suffix>`: unique per process even when a pod restarts under the same name."""
    env = os.environ if env is None else env
    base = env.get("POD_NAME") or socket.gethostname() or "shadow-operator"
    return f"{base}_{secrets.token_hex(5)}"


def parse_bool(value: str, *, name: str) -> bool:
    lowered = value.strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise ValueError(f"{name}={value!r}: expected true or false")


def enabled_from_env(default: bool, env: Mapping[str, str] | None = None) -> bool:
    """SHADOW_LEADER_ELECTION=true|false, else `default`."""
    env = os.environ if env is None else env
    value = env.get("SHADOW_LEADER_ELECTION", "").strip()
    return parse_bool(value, name="SHADOW_LEADER_ELECTION") if value else default


@dataclasses.dataclass(frozen=True)
class LeaderElectionConfig:
    """Which Lease, who we are, and the timings (seconds). Invalid combinations raise ValueError."""

    lease_name: str = DEFAULT_LEASE_NAME
    namespace: str = DEFAULT_NAMESPACE
    identity: str = dataclasses.field(default_factory=new_identity)
    lease_duration: int = DEFAULT_LEASE_DURATION
    renew_deadline: float = DEFAULT_RENEW_DEADLINE
    retry_period: float = DEFAULT_RETRY_PERIOD

    def __post_init__(self) -> None:
        if not self.lease_name or not self.namespace or not self.identity:
            raise ValueError("leader election needs a lease name, a namespace and an identity")
        if self.retry_period <= 0:
            raise ValueError(f"retry period must be positive, got {self.retry_period}")
        if self.lease_duration <= self.renew_deadline:
            raise ValueError(
                f"lease duration ({self.lease_duration}s) must be longer than the renew deadline "
                f"({self.renew_deadline}s): the leader must give up before a standby takes over"
            )
        if self.renew_deadline <= self.retry_period * (1 + JITTER):
            raise ValueError(
                f"renew deadline ({self.renew_deadline}s) must be longer than {1 + JITTER} x the retry "
                f"period ({self.retry_period}s)"
            )

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: Any) -> LeaderElectionConfig:
        """Environment, then `overrides` (None values are ignored: an unset CLI flag).

        SHADOW_LEASE_NAME, SHADOW_LEADER_ELECTION_NAMESPACE (else POD_NAMESPACE, else
        SHADOW_OPERATOR_NAMESPACE, else shadow-system), SHADOW_LEASE_DURATION (integer seconds),
        SHADOW_RENEW_DEADLINE and SHADOW_RETRY_PERIOD (seconds, fractions allowed).
        """
        env = os.environ if env is None else env
        values: dict[str, Any] = {
            "lease_name": env.get("SHADOW_LEASE_NAME") or DEFAULT_LEASE_NAME,
            "namespace": env.get("SHADOW_LEADER_ELECTION_NAMESPACE")
            or env.get("POD_NAMESPACE")
            or env.get("SHADOW_OPERATOR_NAMESPACE")
            or DEFAULT_NAMESPACE,
            "identity": new_identity(env),
        }
        for key, var, kind in (
            ("lease_duration", "SHADOW_LEASE_DURATION", int),
            ("renew_deadline", "SHADOW_RENEW_DEADLINE", float),
            ("retry_period", "SHADOW_RETRY_PERIOD", float),
        ):
            raw = env.get(var, "").strip()
            if raw:
                try:
                    values[key] = kind(raw)
                except ValueError:
                    raise ValueError(f"{var}={raw!r}: expected a number of seconds") from None
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)


# --- the Lease record (pure) -------------------------------------------------------------------------------


def format_microtime(moment: datetime) -> str:
    """A `metav1.MicroTime`: RFC 3339 in UTC with exactly six fractional digits."""
    if moment.tzinfo is None:
        raise ValueError("a MicroTime needs an aware datetime")
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_microtime(text: str) -> datetime:
    return datetime.fromisoformat(text).astimezone(UTC)


@dataclasses.dataclass(frozen=True)
class LeaseRecord:
    """The election-relevant part of a Lease's spec."""

    holder: str = ""
    lease_duration: int = 0
    acquire_time: str | None = None
    renew_time: str | None = None
    transitions: int = 0

    @classmethod
    def of(cls, lease: Mapping[str, Any]) -> LeaseRecord:
        spec = lease.get("spec") or {}
        return cls(
            holder=spec.get("holderIdentity") or "",
            lease_duration=int(spec.get("leaseDurationSeconds") or 0),
            acquire_time=spec.get("acquireTime"),
            renew_time=spec.get("renewTime"),
            transitions=int(spec.get("leaseTransitions") or 0),
        )

    def spec(self) -> dict[str, Any]:
        fields = {
            "holderIdentity": self.holder,
            "leaseDurationSeconds": self.lease_duration,
            "acquireTime": self.acquire_time,
            "renewTime": self.renew_time,
            "leaseTransitions": self.transitions,
        }
        return {key: value for key, value in fields.items() if value is not None}


def claimed_record(
    current: LeaseRecord | None, identity: str, lease_duration: int, now: datetime
) -> LeaseRecord:
    """The record `identity` writes to take or renew the Lease."""
    stamp = format_microtime(now)
    if current is None:
        return LeaseRecord(identity, lease_duration, stamp, stamp, 0)
    if current.holder == identity:
        return dataclasses.replace(current, lease_duration=lease_duration, renew_time=stamp)
    return LeaseRecord(identity, lease_duration, stamp, stamp, current.transitions + 1)


def released_record(current: LeaseRecord, now: datetime) -> LeaseRecord:
    """What a leader writes on graceful shutdown: no holder, so the next attempt of any standby wins."""
    stamp = format_microtime(now)
    return dataclasses.replace(current, holder="", lease_duration=1, acquire_time=stamp, renew_time=stamp)


def lease_body(name: str, namespace: str, record: LeaseRecord) -> dict[str, Any]:
    return {
        "apiVersion": LEASE_API_VERSION,
        "kind": "Lease",
        "metadata": {"name": name, "namespace": namespace},
        "spec": record.spec(),
    }


def with_record(lease: Mapping[str, Any], record: LeaseRecord) -> dict[str, Any]:
    """The Lease as read (metadata with its resourceVersion, other spec fields) carrying `record`."""
    spec = {
        key: value
        for key, value in (lease.get("spec") or {}).items()
        if key
        not in ("holderIdentity", "leaseDurationSeconds", "acquireTime", "renewTime", "leaseTransitions")
    }
    return {**lease, "apiVersion": LEASE_API_VERSION, "kind": "Lease", "spec": {**spec, **record.spec()}}


class Observer:
    """Tracks when the record last changed, on the local monotonic clock, and decides on expiry."""

    def __init__(self, default_duration: int) -> None:
        self.default_duration = default_duration
        self.record: LeaseRecord | None = None
        self.observed_at = 0.0

    def observe(self, record: LeaseRecord, now: float) -> None:
        if record != self.record:
            self.record = record
            self.observed_at = now

    def expires_at(self) -> float:
        """Monotonic time after which the observed holder's lease counts as expired."""
        duration = (self.record.lease_duration if self.record else 0) or self.default_duration
        return self.observed_at + duration

    def held_by_other(self, identity: str, now: float) -> bool:
        """True when someone else holds a lease that has not expired: we may not take it."""
        record = self.record
        if record is None or not record.holder or record.holder == identity:
            return False
        return now < self.expires_at()


# --- the elector -------------------------------------------------------------------------------------------


class Attempt(enum.Enum):
    ACQUIRED = "acquired"
    HELD = "held by another replica"
    CONFLICT = "lost a write race"


class LeaderElector:
    """Campaigns for one Lease. `await acquire()`, then leadership is renewed in the background until
    `release()`, `abandon()`, or loss (`on_lost` is called and `lost` is set)."""

    def __init__(
        self,
        kube: Kube,
        config: LeaderElectionConfig,
        *,
        on_lost: Callable[[], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.kube = kube
        self.config = config
        self.on_lost = on_lost
        self.clock = clock
        self.wall_clock = wall_clock
        self.lost = asyncio.Event()
        self.observer = Observer(config.lease_duration)
        self._lease: dict[str, Any] | None = None
        self._leader = False
        self._renewed_at = 0.0
        self._renewer: asyncio.Task[None] | None = None
        self._collection = resource_path(LEASE_API_VERSION, "leases", config.namespace)
        self._path = resource_path(LEASE_API_VERSION, "leases", config.namespace, config.lease_name)

    @property
    def identity(self) -> str:
        return self.config.identity

    @property
    def is_leader(self) -> bool:
        return self._leader

    @property
    def lease(self) -> str:
        return f"{self.config.namespace}/{self.config.lease_name}"

    async def acquire(self) -> None:
        """Block until this replica leads, then keep renewing in the background."""
        if self._leader:
            return
        logger.info("waiting for leadership of Lease %s as %s", self.lease, self.identity)
        announced: str | None = None
        while True:
            sent = self.clock()
            outcome = await self._attempt(timeout=self.config.renew_deadline)
            if outcome is Attempt.ACQUIRED:
                break
            holder = self.observer.record.holder if self.observer.record else ""
            if outcome is Attempt.HELD and holder != announced:
                logger.info("Lease %s is held by %s; standing by", self.lease, holder)
                announced = holder
            await asyncio.sleep(self.config.retry_period * random.uniform(1, 1 + JITTER))
        self._leader = True
        self._renewed_at = sent
        self.lost.clear()
        record = self.observer.record
        logger.info(
            "became leader of Lease %s as %s (transitions: %s)",
            self.lease,
            self.identity,
            record.transitions if record else 0,
        )
        self._renewer = asyncio.create_task(self._renew_loop(), name=f"renew Lease {self.lease}")

    async def wait_lost(self) -> None:
        await self.lost.wait()

    async def abandon(self) -> None:
        """Stop renewing without touching the Lease: what a crash looks like to the other replicas."""
        await self._stop_renewing()
        self._leader = False

    async def release(self) -> bool:
        """Stop renewing and give the Lease up if we still hold it; True when it was released."""
        await self._stop_renewing()
        if not self._leader:
            return False
        self._leader = False
        lease = self._lease
        for _ in range(3):
            if lease is None or LeaseRecord.of(lease).holder != self.identity:
                return False
            body = with_record(lease, released_record(LeaseRecord.of(lease), self.wall_clock()))
            try:
                self._lease = await asyncio.wait_for(
                    self.kube.replace(self._path, body), self.config.renew_deadline
                )
            except ApiError as exc:
                if not exc.conflict:
                    logger.warning("could not release Lease %s: %s", self.lease, exc)
                    return False
            except (TimeoutError, aiohttp.ClientError, OSError) as exc:
                logger.warning("could not release Lease %s: %r", self.lease, exc)
                return False
            else:
                logger.info("released Lease %s", self.lease)
                return True
            # Someone wrote in between (it can only be a takeover after a pause): look again.
            try:
                lease = await asyncio.wait_for(self.kube.get(self._path), self.config.renew_deadline)
            except (ApiError, TimeoutError, aiohttp.ClientError, OSError) as exc:
                logger.warning("could not release Lease %s: %r", self.lease, exc)
                return False
        return False

    async def _stop_renewing(self) -> None:
        task, self._renewer = self._renewer, None
        if task is not None and task is not asyncio.current_task():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _renew_loop(self) -> None:
        config = self.config
        while True:
            deadline = self._renewed_at + config.renew_deadline
            await asyncio.sleep(max(0.0, min(config.retry_period, deadline - self.clock())))
            remaining = deadline - self.clock()
            if remaining <= 0:
                self._lose(f"no successful renewal within the renew deadline ({config.renew_deadline}s)")
                return
            sent = self.clock()
            outcome = await self._attempt(timeout=remaining)
            if outcome is Attempt.ACQUIRED:
                self._renewed_at = sent
            elif outcome is Attempt.HELD:
                holder = self.observer.record.holder if self.observer.record else "?"
                self._lose(f"the Lease is now held by {holder}")
                return

    def _lose(self, why: str) -> None:
        self._leader = False
        logger.error("lost leadership of Lease %s: %s", self.lease, why)
        self.lost.set()
        if self.on_lost is not None:
            self.on_lost()

    async def _attempt(self, *, timeout: float) -> Attempt | None:
        """One try to acquire or renew; None when the API server could not be reached or refused."""
        try:
            return await asyncio.wait_for(self._try_acquire_or_renew(), timeout)
        except ApiError as exc:
            logger.warning("Lease %s: %s", self.lease, exc)
        except TimeoutError:
            logger.warning("Lease %s: no answer from the API server within %.1fs", self.lease, timeout)
        except (aiohttp.ClientError, OSError) as exc:
            logger.warning("Lease %s: %r", self.lease, exc)
        return None

    async def _try_acquire_or_renew(self) -> Attempt:
        config = self.config
        lease = await self.kube.get(self._path)
        if lease is None:
            record = claimed_record(None, config.identity, config.lease_duration, self.wall_clock())
            try:
                created = await self.kube.create(
                    self._collection, lease_body(config.lease_name, config.namespace, record)
                )
            except ApiError as exc:
                if exc.conflict:
                    return Attempt.CONFLICT
                raise
            return self._won(created)
        current = LeaseRecord.of(lease)
        self.observer.observe(current, self.clock())
        if self.observer.held_by_other(config.identity, self.clock()):
            return Attempt.HELD
        if self._leader and current.holder != config.identity:
            # Our lease ran out as others see it (a long pause) and nobody has taken it yet: still lost.
            return Attempt.HELD
        record = claimed_record(current, config.identity, config.lease_duration, self.wall_clock())
        try:
            updated = await self.kube.replace(self._path, with_record(lease, record))
        except ApiError as exc:
            if exc.conflict:
                return Attempt.CONFLICT
            raise
        return self._won(updated)

    def _won(self, lease: dict[str, Any]) -> Attempt:
        self._lease = lease
        self.observer.observe(LeaseRecord.of(lease), self.clock())
        return Attempt.ACQUIRED


# --- running an operator under leadership --------------------------------------------------------------------


def exit_on_loss() -> NoReturn:
    """Stop acting at once: exit the process (no cleanup) so that nothing runs after leadership is gone."""
    logger.critical("leadership lost: exiting with code %d", LOST_EXIT_CODE)
    for handler in logging.getLogger().handlers:
        with contextlib.suppress(Exception):
            handler.flush()
    with contextlib.suppress(Exception):
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(LOST_EXIT_CODE)


@contextlib.asynccontextmanager
async def standby_health(endpoint: str | None, elector: LeaderElector) -> AsyncIterator[None]:
    """Answer liveness probes on `endpoint` (http://host:port/path) while the replica waits as a standby."""
    if not endpoint:
        yield
        return
    parts = urllib.parse.urlsplit(endpoint)
    if parts.scheme != "http":
        raise ValueError(f"unsupported liveness endpoint {endpoint!r}: only http:// is served")

    async def health(_: aiohttp.web.Request) -> aiohttp.web.Response:
        return aiohttp.web.json_response(
            {"leader": elector.is_leader, "identity": elector.identity, "lease": elector.lease}
        )

    app = aiohttp.web.Application()
    app.router.add_get(parts.path or "/", health)
    runner = aiohttp.web.AppRunner(app, handle_signals=False, access_log=None)
    await runner.setup()
    try:
        await aiohttp.web.TCPSite(runner, parts.hostname or "localhost", parts.port or 80).start()
        yield
    finally:
        # Free the port before the operator's own liveness endpoint binds it.
        await runner.cleanup()


@contextlib.contextmanager
def _on_signals(callback: Callable[[], None]) -> Iterator[None]:
    """SIGTERM/SIGINT call `callback` (main thread only; elsewhere signals are not ours to handle)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    loop = asyncio.get_running_loop()
    installed = []
    for signum in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(signum, callback)
            installed.append(signum)
    try:
        yield
    finally:
        for signum in installed:
            loop.remove_signal_handler(signum)


async def run_with_leadership(
    main: Callable[[], Awaitable[None]],
    config: LeaderElectionConfig,
    *,
    liveness: str | None = None,
    kube: Kube | None = None,
    on_lost: Callable[[], None] = exit_on_loss,
) -> bool:
    """Run `main()` only while this replica holds the Lease.

    Until then, nothing of `main` runs and `liveness` (the operator's liveness URL) is served here.
    SIGTERM/SIGINT while standing by return False without ever calling `main`. Once leader, `main()` runs
    with the Lease renewed alongside; when it returns or raises (e.g. the operator shut down gracefully),
    the Lease is released so a standby takes over at once, and True is returned (or the error re-raised).
    When leadership is lost, `on_lost()` runs at once (by default: exit the process with code 1); if it
    returns, `main` is cancelled and LeadershipLost raised.

    The elector's tasks are created before `main` starts, so an operator framework that cancels "its"
    stray tasks on exit (kopf does) leaves them alone.
    """
    own_kube = kube is None
    kube = kube if kube is not None else await Kube.connect()
    elector = LeaderElector(kube, config, on_lost=on_lost)
    try:
        stop = asyncio.Event()
        with _on_signals(stop.set):
            async with standby_health(liveness, elector):
                campaign = asyncio.create_task(elector.acquire(), name="leader election")
                stopping = asyncio.create_task(stop.wait(), name="standby stop")
                await asyncio.wait({campaign, stopping}, return_when=asyncio.FIRST_COMPLETED)
                stopping.cancel()
                if not campaign.done():
                    campaign.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await campaign
                    logger.info("stopped while standing by")
                    return False
                campaign.result()

        running = asyncio.create_task(_as_coroutine(main), name="leader work")
        watching = asyncio.create_task(elector.wait_lost(), name="leadership watch")

        # A framework that handles signals itself (kopf) replaces these handlers; otherwise they stop `main`.
        def stop_main() -> None:
            running.cancel()

        with _on_signals(stop_main):
            await asyncio.wait({running, watching}, return_when=asyncio.FIRST_COMPLETED)
        if not running.done():
            running.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await running
            raise LeadershipLost(f"lost leadership of Lease {elector.lease}")
        watching.cancel()
        await elector.release()
        if not running.cancelled():
            running.result()
        return True
    finally:
        await elector.abandon()
        if own_kube:
            await kube.close()


async def _as_coroutine(main: Callable[[], Awaitable[None]]) -> None:
    await main()
