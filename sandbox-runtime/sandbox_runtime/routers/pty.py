"""Interactive shell on a PTY over WebSocket (`/v1/pty`).

Protocol: binary frames (or text frames that are not a JSON object) are keystrokes; the text frame
`{"type": "resize", "cols": C, "rows": R}` resizes the terminal. The server sends output as binary
frames and, when the shell exits, a text frame `{"type": "exit", "exit_code": N}` before closing.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
from collections.abc import Callable, Iterator

from fastapi import APIRouter, WebSocket, WebSocketDisconnect

from ..errors import ApiError
from ..execution import killpg
from ..shell_journal import ShellJournal
from ..terminal import Terminal, open_terminal
from .common import RuntimeDep

router = APIRouter()


@router.websocket("/v1/pty")
async def pty_ws(ws: WebSocket, rt: RuntimeDep) -> None:
    q = ws.query_params
    proto = ws.headers.get("sec-websocket-protocol", "")
    subprotocol = next((p.strip() for p in proto.split(",") if p.strip().startswith("bearer.")), None)
    journal_r, journal_w = os.pipe()  # the shell's commands, one by one (shell_journal)
    try:
        spec = rt.exec.terminal_spec(q.get("cwd", ""), q.get("shell"), journal_w)
        cols = max(1, min(1000, int(q.get("cols", "80"))))
        rows = max(1, min(1000, int(q.get("rows", "24"))))
        slot = rt.exec.claim()
    except (ApiError, ValueError) as err:
        os.close(journal_r)
        os.close(journal_w)
        await ws.close(code=4400, reason=str(getattr(err, "message", err))[:120])
        return
    with slot, _reading(journal_r, ShellJournal(rt.journal, spec.argv[0])):
        try:
            await ws.accept(subprotocol=subprotocol)
            term = open_terminal(spec, rows, cols, pass_fds=(journal_w,))
        except OSError as err:
            await ws.send_text(json.dumps({"type": "error", "message": str(err)}))
            await ws.close()
            return
        finally:
            os.close(journal_w)  # the shell holds the only write end: its exit ends the pipe
        await _session(ws, term, rows, cols)


@contextlib.contextmanager
def _reading(fd: int, sink: ShellJournal) -> Iterator[None]:
    """Journal what the shell writes to `fd` while the session lasts; close it after."""
    loop = asyncio.get_running_loop()
    os.set_blocking(fd, False)
    _pump(loop, fd, sink.feed)
    try:
        yield
    finally:
        with contextlib.suppress(OSError, ValueError):
            loop.remove_reader(fd)
        with contextlib.suppress(OSError):
            sink.feed(os.read(fd, 1 << 16))  # the last command, written just before the shell ended
        os.close(fd)


def _pump(loop: asyncio.AbstractEventLoop, fd: int, deliver: Callable[[bytes], object]) -> None:
    """Hand what `fd` gives to `deliver` as it comes; at its end (or an error) b"" once, and stop."""

    def readable() -> None:
        try:
            data = os.read(fd, 1 << 16)
        except OSError:
            data = b""
        if not data:
            loop.remove_reader(fd)
        deliver(data)

    loop.add_reader(fd, readable)


async def _session(ws: WebSocket, term: Terminal, rows: int, cols: int) -> None:
    """Pump keystrokes in and output out until either side ends; the shell's group dies with it."""
    master, proc = term.master, term.proc
    loop = asyncio.get_running_loop()
    out: asyncio.Queue[bytes] = asyncio.Queue()
    _pump(loop, master, out.put_nowait)

    async def pump_out() -> None:
        while data := await out.get():
            await ws.send_bytes(data)

    async def pump_in() -> None:
        while True:
            msg = await ws.receive()
            if msg["type"] == "websocket.disconnect":
                return
            data = msg.get("bytes")
            if data is None and msg.get("text") is not None:
                text = msg["text"]
                try:
                    obj = json.loads(text)
                except ValueError:
                    obj = None
                if isinstance(obj, dict):
                    if obj.get("type") == "resize":
                        term.resize(int(obj.get("rows", rows)), int(obj.get("cols", cols)))
                    elif obj.get("type") == "input":
                        os.write(master, str(obj.get("data", "")).encode())
                    continue
                data = text.encode()
            if data:
                os.write(master, data)

    reader = asyncio.ensure_future(pump_out())
    writer = asyncio.ensure_future(pump_in())
    try:
        await asyncio.wait({reader, writer}, return_when=asyncio.FIRST_COMPLETED)
        if reader.done():
            code = await loop.run_in_executor(None, proc.wait)
            with contextlib.suppress(RuntimeError, WebSocketDisconnect):
                await ws.send_text(json.dumps({"type": "exit", "exit_code": code}))
                await ws.close()
    finally:
        writer.cancel()
        reader.cancel()
        with contextlib.suppress(OSError, ValueError):
            loop.remove_reader(master)
        if proc.poll() is None:
            killpg(proc.pid, signal.SIGHUP)
            killpg(proc.pid)
        await loop.run_in_executor(None, proc.wait)
        os.close(master)
