"""`shadowctl shell`: the runtime's PTY (`/v1/pty`, a WebSocket) through the API server's pod proxy.

Bytes both ways; the runtime ends with a text frame `{"type": "exit", "exit_code": N}`. On a terminal, stdin
goes raw and window size changes are sent as `{"type": "resize"}`; from a pipe, end of input sends Ctrl-D.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import sys
import termios
import threading
import tty
from typing import Any
from urllib.parse import urlencode

from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import ClientConnection, connect

from shadow_operator.cli.common import GLOBALS
from shadow_operator.sdk import kube
from shadow_operator.sdk.errors import RuntimeUnreachable
from shadow_operator.sdk.runtime import RuntimeEndpoint


def run_terminal(http: Any, ep: RuntimeEndpoint, cwd: str) -> int:
    server, ssl_context, headers = kube.websocket_options(GLOBALS.context)
    cols, rows = shutil.get_terminal_size()
    query = urlencode({"cwd": cwd, "cols": cols, "rows": rows})
    scheme = "wss" if server.startswith("https") else "ws"
    url = f"{scheme}://{server.split('://', 1)[1].rstrip('/')}{ep.base}/v1/pty?{query}"
    try:
        ws = open_websocket(
            url,
            ssl=ssl_context if scheme == "wss" else None,
            additional_headers={**headers, **ep.headers},
        )
    except (InvalidStatus, OSError) as exc:
        raise RuntimeUnreachable(f"cannot open a terminal in the workspace: {exc}") from None
    with ws:
        return _session(ws)


# Seconds for the WebSocket's opening handshake, and how many times one that timed out is tried: a handshake
# that got no answer sent nothing to the shell yet (the API server, the kubelet or the pod proxy stalled for
# a moment), so trying again is safe; a refusal (an HTTP status) is final.
OPEN_TIMEOUT = 30.0
OPEN_ATTEMPTS = 2


def open_websocket(url: str, **options: Any) -> ClientConnection:
    attempt = 1
    while True:
        try:
            ws: ClientConnection = connect(url, max_size=None, open_timeout=OPEN_TIMEOUT, **options)
        except TimeoutError:
            if attempt >= OPEN_ATTEMPTS:
                raise
            attempt += 1
        else:
            return ws


def _session(ws: ClientConnection) -> int:
    interactive = sys.stdin.isatty()
    saved = termios.tcgetattr(sys.stdin.fileno()) if interactive else None
    if interactive:
        tty.setraw(sys.stdin.fileno())

        def resize(*_: object) -> None:
            cols, rows = shutil.get_terminal_size()
            with contextlib.suppress(ConnectionClosed):
                ws.send(json.dumps({"type": "resize", "cols": cols, "rows": rows}))

        signal.signal(signal.SIGWINCH, resize)
    threading.Thread(target=_pump_stdin, args=(ws, interactive), daemon=True).start()
    code = 0
    try:
        for message in ws:
            if isinstance(message, bytes):
                sys.stdout.buffer.write(message)
                sys.stdout.buffer.flush()
                continue
            event = json.loads(message)
            if event.get("type") == "exit":
                code = int(event.get("exit_code") or 0)
            elif event.get("type") == "error":
                raise RuntimeUnreachable(f"the workspace could not start a shell: {event.get('message')}")
    except ConnectionClosed:
        pass
    finally:
        if saved is not None:
            termios.tcsetattr(sys.stdin.fileno(), termios.TCSADRAIN, saved)
    return code


def _pump_stdin(ws: ClientConnection, interactive: bool) -> None:
    fd = sys.stdin.fileno()
    with contextlib.suppress(ConnectionClosed, OSError):
        while data := os.read(fd, 4096):
            ws.send(data)
        if not interactive:
            ws.send(b"\x04")  # end of piped input: end the shell as a terminal's Ctrl-D would
