"""`shadowctl shell` opens its WebSocket again when the first opening handshake got no answer (an API server
or kubelet that stalled for a moment), never when the server refused: real WebSocket servers on loopback."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from shadow_operator.cli import terminal
from websockets.exceptions import InvalidStatus
from websockets.sync.server import Server, ServerConnection, serve

pytestmark = pytest.mark.unit


class Stalling:
    """Answers the opening handshake after `stall` seconds for the first `stalls` connections, then at once;
    or refuses every one with 403 (`refuse`)."""

    def __init__(self, stalls: int, stall: float, refuse: bool = False) -> None:
        self.stalls, self.stall, self.refuse, self.seen = stalls, stall, refuse, 0

    def process_request(self, connection: ServerConnection, request: Any) -> Any:
        self.seen += 1
        if self.refuse:
            return connection.respond(403, "no\n")
        if self.seen <= self.stalls:
            time.sleep(self.stall)
        return None


@pytest.fixture
def server(request: pytest.FixtureRequest) -> Iterator[tuple[Server, Stalling]]:
    behaviour: Stalling = request.param

    def echo(ws: ServerConnection) -> None:
        for message in ws:
            ws.send(message)

    with serve(echo, "127.0.0.1", 0, process_request=behaviour.process_request) as srv:
        thread = threading.Thread(target=srv.serve_forever, daemon=True)
        thread.start()
        try:
            yield srv, behaviour
        finally:
            srv.shutdown()
            thread.join(5)


def url(srv: Server) -> str:
    host, port = srv.socket.getsockname()[:2]
    return f"ws://{host}:{port}/v1/pty"


@pytest.mark.parametrize("server", [Stalling(stalls=1, stall=1.0)], indirect=True)
def test_a_handshake_that_timed_out_is_tried_again(
    server: tuple[Server, Stalling], monkeypatch: pytest.MonkeyPatch
) -> None:
    srv, behaviour = server
    monkeypatch.setattr(terminal, "OPEN_TIMEOUT", 0.3)
    with terminal.open_websocket(url(srv)) as ws:
        ws.send("hello")
        assert ws.recv(timeout=5) == "hello"
    assert behaviour.seen == 2


@pytest.mark.parametrize("server", [Stalling(stalls=5, stall=1.0)], indirect=True)
def test_it_gives_up_after_the_last_attempt(
    server: tuple[Server, Stalling], monkeypatch: pytest.MonkeyPatch
) -> None:
    srv, behaviour = server
    monkeypatch.setattr(terminal, "OPEN_TIMEOUT", 0.3)
    with pytest.raises(TimeoutError):
        terminal.open_websocket(url(srv))
    assert behaviour.seen == terminal.OPEN_ATTEMPTS


@pytest.mark.parametrize("server", [Stalling(stalls=0, stall=0, refuse=True)], indirect=True)
def test_a_refusal_is_final(server: tuple[Server, Stalling]) -> None:
    srv, behaviour = server
    with pytest.raises(InvalidStatus):
        terminal.open_websocket(url(srv))
    assert behaviour.seen == 1
