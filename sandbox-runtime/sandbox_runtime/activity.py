"""How long nobody has used the runtime: what an orchestrator reads to suspend an idle workspace.

Every API request or gRPC call counts, except health probes and metrics scrapes; a request in flight
(a long command, an open terminal) keeps the runtime busy until it ends.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

PASSIVE_PATHS = frozenset({"/", "/healthz", "/v1/health", "/metrics"})


class Activity:
    def __init__(self) -> None:
        self.in_flight = 0
        self.last = time.monotonic()

    def idle_seconds(self) -> float:
        return 0.0 if self.in_flight else time.monotonic() - self.last

    @contextmanager
    def busy(self) -> Iterator[None]:
        """Not idle while the block runs, and idle time counts from its end."""
        self.in_flight += 1
        try:
            yield
        finally:
            self.in_flight -= 1
            self.last = time.monotonic()
