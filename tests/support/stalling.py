"""A TCP server that stands in for a stalled peer (a Gitea its tenant slowed to a trickle): it accepts every
connection and answers a byte every `period` seconds, for ever, never a whole answer.

    with StallingServer(period=10) as stall:
        ...  # point the operator at stall.url
        assert stall.connections >= 4

Each byte is the next of an HTTP answer whose header never ends, so a client that times out per read (httpx) is
kept reading as long as the period is shorter than its read timeout; only a deadline in total ends the call.
"""

from __future__ import annotations

import contextlib
import itertools
import socket
import threading
from types import TracebackType

# The start of an HTTP answer, then one header line that never ends.
_ANSWER = b"HTTP/1.1 200 OK\r\nX-Stalled: "


class StallingServer:
    def __init__(self, period: float = 10.0) -> None:
        self.period = period
        self.connections = 0
        self._stop = threading.Event()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.2)
        self._threads: list[threading.Thread] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._listener.getsockname()[1]}"

    def __enter__(self) -> StallingServer:
        self._start(self._accept)
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=5)
        self._listener.close()

    def _start(self, target: object, *args: object) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)  # type: ignore[arg-type]
        self._threads.append(thread)
        thread.start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                continue
            self.connections += 1
            self._start(self._trickle, conn)

    def _trickle(self, conn: socket.socket) -> None:
        """Read whatever the client sends (never answered), and write one byte per period."""
        conn.setblocking(False)
        answer = itertools.chain(_ANSWER, itertools.repeat(ord("a")))
        with conn:
            while not self._stop.wait(self.period):
                with contextlib.suppress(BlockingIOError):
                    if conn.recv(65536) == b"":
                        return  # the client gave up and closed
                try:
                    conn.sendall(bytes([next(answer)]))
                except OSError:
                    return
