"""How long nobody has used the runtime: what an orchestrator reads to suspend an idle workspace.

Every API request or gRPC call counts, except health probes and metrics scrapes; a request in flight
(a long command, an open terminal) keeps the runtime busy until it ends, and so does every process slot held
(a background process started through the API, until it exits; a terminal's shell). Processes the runtime did
not start (the image's own entrypoint, something a command left running in the background) do not count.
"""

from __future__ import annotations

import time

PASSIVE_PATHS = frozenset({"/", "/healthz", "/v1/health", "/metrics"})


class Activity:
    def __init__(self) -> None:
        self.in_flight = 0
        self.last = time.monotonic()

    def idle_seconds(self) -> float:
        return 0.0 if self.in_flight else time.monotonic() - self.last

    def busy(self) -> Activity:
        """`with activity.busy():` not idle while the block runs; idle time counts from its end.
        A plain context manager, not a generator: it wraps every request."""
        return self

    def __enter__(self) -> None:
        self.in_flight += 1

    def __exit__(self, *_: object) -> None:
        self.in_flight -= 1
        self.last = time.monotonic()
