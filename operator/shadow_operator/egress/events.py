"""The decision log a tenant can read: the gateway's decisions as Kubernetes Events on their Sandbox.

One Event per (sandbox, allowed or refused, method, host, rule), created the first time and then counted in
its `series`; `kubectl describe sandbox NAME`, `kubectl get events` and `shadowctl egress log` show them with
the namespace's ordinary read access. Nothing is written on the request path: a decision only counts, in
memory, and a writer thread flushes what changed, each Event at most once per `every` seconds.

Every byte of a host, path or method came from a sandbox, so the gateway bounds what it writes: text is
escaped and cut, a sandbox has at most `per_sandbox` destinations recorded one by one at a time (the rest are
counted on one overflow Event, until some go quiet for `idle` seconds), and one token bucket caps the writes of
the whole gateway. When the bucket runs dry, what is due is written namespace by namespace in turn, new
Events before updates: a tenant's flood delays its own log, never another tenant's.
"""

from __future__ import annotations

import json
import logging
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from itertools import zip_longest
from typing import Any, Protocol

from shadow_operator.api import kinds
from shadow_operator.common import egress
from shadow_operator.egress.table import PolicyTable

log = logging.getLogger(__name__)

HOST_CHARS, PATH_CHARS, METHOD_CHARS = 253, 200, 16
# events.k8s.io/v1 refuses a note over 1 kB.
NOTE_BYTES = 1024


class Writer(Protocol):
    """Creates an Event, or merge-patches one: returns False when the Event is gone (expired), else True."""

    def create(self, namespace: str, body: dict[str, Any]) -> None: ...

    def patch(self, namespace: str, name: str, body: dict[str, Any]) -> bool: ...


@dataclass
class Bucket:
    """A token bucket: `rate` writes a second, `burst` at once."""

    rate: float
    burst: float
    clock: Callable[[], float] = time.monotonic
    tokens: float = field(init=False)
    at: float = field(init=False)

    def __post_init__(self) -> None:
        self.tokens, self.at = self.burst, self.clock()

    def take(self) -> bool:
        now = self.clock()
        self.tokens = min(self.burst, self.tokens + (now - self.at) * self.rate)
        self.at = now
        if self.tokens < 1:
            return False
        self.tokens -= 1
        return True


@dataclass(frozen=True)
class Seen:
    """One decision as the gateway made it (every string as the sandbox sent it)."""

    sandbox: str
    decision: egress.Decision
    rule: egress.Rule | None
    host: str
    port: int
    method: str
    path: str


@dataclass
class Tally:
    """One Event: what it says (fixed at creation: events.k8s.io lets only its series change) and its count."""

    name: str
    namespace: str
    sandbox: str
    reason: str
    note: str
    detail: dict[str, object]
    first: float
    last: float
    count: int = 1
    written: int = 0  # the count the API server has; 0: not created yet
    flushed: float = 0.0


# (allowed, method, host, rule); None: the sandbox's overflow Event.
Key = tuple[bool, str, str, int | None] | None


def _time(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class EventLog:
    """The decision Events of every sandbox the gateway serves: counted by `record`, written by `flush`."""

    def __init__(
        self,
        table: PolicyTable,
        writer: Writer,
        instance: str,
        every: float = 5.0,
        per_sandbox: int = 32,
        idle: float = 600.0,
        rate: float = 10.0,
        burst: float = 50.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.table, self.writer, self.clock = table, writer, clock
        self.every, self.per_sandbox, self.idle = every, per_sandbox, idle
        self.instance = egress.printable(instance, 128) or "egress-gateway"
        self.bucket = Bucket(rate, burst)
        self.tallies: dict[str, dict[Key, Tally]] = {}  # sandbox key -> its Events
        self.lock = threading.Lock()
        self.serial = 0
        self.prefix = secrets.token_hex(3)  # a restarted gateway never takes over an earlier one's Events
        self.last_namespace = ""  # written last: the next round starts after it
        self.failures, self.warned = 0, 0.0

    # ------------------------------------------------------------------------------- on the request path
    def record(
        self,
        sandbox: str,
        decision: egress.Decision,
        rule: egress.Rule | None,
        host: str,
        port: int,
        method: str,
        path: str,
    ) -> None:
        """Count one decision (memory only, O(1)): the writer thread turns it into an Event."""
        now = self.clock()
        seen = Seen(sandbox, decision, rule, host, port, method, path)
        wanted: Key = (decision.allowed, method[:METHOD_CHARS], host[:HOST_CHARS], decision.rule)
        with self.lock:
            tallies = self.tallies.setdefault(sandbox, {})
            tally = tallies.get(wanted)
            if tally is None:
                if len(tallies) - (None in tallies) >= self.per_sandbox:
                    self._drop_quiet(tallies, now)  # at most per_sandbox + 1 to look at
                if len(tallies) - (None in tallies) < self.per_sandbox:
                    tallies[wanted] = self._tally(seen, now)
                    return
                tally = tallies.get(None)
                if tally is None:
                    tallies[None] = self._overflow(self._tally(seen, now), now)
                    return
            tally.count += 1
            tally.last = now

    def _name(self, sandbox: str) -> str:
        self.serial += 1
        return f"{sandbox.split('/', 1)[1]}.egress-{self.prefix}{self.serial:x}"

    def _tally(self, seen: Seen, now: float) -> Tally:
        sandbox, decision, rule, port = seen.sandbox, seen.decision, seen.rule, seen.port
        host = egress.printable(seen.host, HOST_CHARS)
        method = egress.printable(seen.method, METHOD_CHARS)
        path = egress.printable(seen.path.split("?", 1)[0], PATH_CHARS) if method != "CONNECT" else ""
        where = f"{host}{'' if port in egress.DEFAULT_PORTS else f':{port}'}{path}"
        hint = egress.printable(decision.hint, HOST_CHARS + PATH_CHARS + 32) if decision.hint else ""
        described = egress.printable(rule.describe(), 512) if rule is not None else ""
        if decision.allowed:
            note = f"allowed {method} {where} by rule {decision.rule_label} ({described})"
        else:
            note = f"refused {method} {where}: {egress.printable(decision.reason, NOTE_BYTES)}"
            note += f" (add: --allow '{hint}')" if hint else ""
        detail: dict[str, object] = {
            "decision": "allowed" if decision.allowed else "refused",
            "method": method,
            "host": host,
            "port": port,
            "path": path,
            "rule": described,
            "hint": hint,
        }
        namespace = sandbox.split("/", 1)[0]
        reason = egress.REASON_ALLOWED if decision.allowed else egress.REASON_REFUSED
        return Tally(self._name(sandbox), namespace, sandbox, reason, _cut(note), detail, now, now)

    def _overflow(self, first: Tally, now: float) -> Tally:
        note = _cut(
            f"more than {self.per_sandbox} distinct egress destinations at once: further decisions are only "
            f"counted here until some go quiet for {self.idle:.0f} s; the first of them: {first.note}"
        )
        detail = {**first.detail, "overflow": True}
        return Tally(
            first.name, first.namespace, first.sandbox, egress.REASON_OVERFLOW, note, detail, now, now
        )

    # ------------------------------------------------------------------------------------- the writer
    def due(self, now: float) -> list[Tally]:
        """What to write now, fairly ordered: namespaces take turns, and within one, new Events come first."""
        by_namespace: dict[str, list[Tally]] = {}
        with self.lock:
            for tallies in self.tallies.values():
                for tally in tallies.values():
                    if tally.count > tally.written and (
                        not tally.flushed or now - tally.flushed >= self.every
                    ):
                        by_namespace.setdefault(tally.namespace, []).append(tally)
        # Starting after the namespace written last: the turn passes with each write, however many rounds the
        # bucket left empty in between.
        names = sorted(by_namespace)
        start = next((i for i, name in enumerate(names) if name > self.last_namespace), 0)
        queues = [
            sorted(by_namespace[name], key=lambda t: (t.written > 0, t.first))
            for name in names[start:] + names[:start]
        ]
        return [tally for row in zip_longest(*queues) for tally in row if tally is not None]

    def flush(self) -> int:
        """Write what is due while the bucket allows; the rest waits for the next round. Returns the writes."""
        now, writes = self.clock(), 0
        self._forget(now)
        for tally in self.due(now):
            if not self.bucket.take():
                break
            with self.lock:
                count, last = tally.count, tally.last
            try:
                if tally.written and self.writer.patch(tally.namespace, tally.name, _series(count, last)):
                    pass
                else:
                    self.writer.create(tally.namespace, self._body(tally, count, last))
            except Exception as error:  # an API error must not stop the log of every other sandbox
                self._failed(tally, error, now)
            else:
                tally.written = count
            tally.flushed, self.last_namespace = now, tally.namespace
            writes += 1
        return writes

    def _failed(self, tally: Tally, error: Exception, now: float) -> None:
        """Logged at most once a minute (an API server that refuses every write must not flood the log);
        the Event is tried again after `every` seconds."""
        self.failures += 1
        if now - self.warned >= 60:
            log.warning(
                "egress events not written (%d since the last warning), e.g. %s/%s: %s",
                self.failures, tally.namespace, tally.name, error,
            )  # fmt: skip
            self.failures, self.warned = 0, now

    def _forget(self, now: float) -> None:
        """Sandboxes gone, and destinations quiet for `idle` seconds whose counts are written."""
        with self.lock:
            for sandbox in set(self.tallies) - set(self.table.sandboxes):
                del self.tallies[sandbox]
            for tallies in self.tallies.values():
                self._drop_quiet(tallies, now)

    def _drop_quiet(self, tallies: dict[Key, Tally], now: float) -> None:
        for key in [k for k, t in tallies.items() if t.written == t.count and now - t.last > self.idle]:
            del tallies[key]

    def _body(self, tally: Tally, count: int, last: float) -> dict[str, Any]:
        namespace, name = tally.sandbox.split("/", 1)
        entry = self.table.sandboxes.get(tally.sandbox)
        regarding = {
            "apiVersion": kinds.SANDBOX.api_version,
            "kind": kinds.SANDBOX.kind,
            "namespace": namespace,
            "name": name,
            **({"uid": entry.uid} if entry is not None and entry.uid else {}),
        }
        body: dict[str, Any] = {
            "apiVersion": "events.k8s.io/v1",
            "kind": "Event",
            "metadata": {
                "name": tally.name,
                "namespace": namespace,
                "labels": {egress.EVENT_LABEL_SANDBOX: name},
                "annotations": {egress.EVENT_ANNOTATION: json.dumps(tally.detail, sort_keys=True)},
            },
            "eventTime": _time(tally.first),
            "reportingController": egress.EVENT_CONTROLLER,
            "reportingInstance": self.instance,
            "action": "Connect" if tally.detail.get("method") == "CONNECT" else "Request",
            "reason": tally.reason,
            "type": "Normal" if tally.reason == egress.REASON_ALLOWED else "Warning",
            "regarding": regarding,
            "note": tally.note,
        }
        if count > 1:  # a series counts two occurrences or more
            body |= _series(count, last)
        return body

    def run(self, tick: float = 0.5) -> None:
        """The writer thread: a new Event is written within `tick` seconds (bucket allowing)."""
        while True:
            try:
                self.flush()
            except Exception:
                log.exception("flushing egress events")
            time.sleep(tick)

    def start(self) -> None:
        threading.Thread(target=self.run, name="egress-events", daemon=True).start()


def _series(count: int, last: float) -> dict[str, Any]:
    return {"series": {"count": count, "lastObservedTime": _time(last)}}


def _cut(note: str) -> str:
    return note if len(note) <= NOTE_BYTES else note[: NOTE_BYTES - 3] + "..."
