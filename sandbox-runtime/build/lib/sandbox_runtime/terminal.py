"""Interactive shell on a PTY over WebSocket.

Protocol: binary frames (or text frames that are not a JSON object) are keystrokes; the text frame
`{"type": "resize", "cols": C, "rows": R}` resizes the terminal. The server sends output as binary
frames and, when the shell exits, a text frame `{"type": "exit", "exit_code": N}` before closing.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import signal
import struct
import subprocess
import termios
from typing import TYPE_CHECKING

from fastapi import FastAPI, WebSocket, WebSocketDisconnect

from .errors import ApiError
from .execution import base_env, killpg

if TYPE_CHECKING:
    from .app import Runtime


def _set_size(fd: int, rows: int, cols: int) -> None:
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


def _controlling_tty() -> None:
    # Runs in the child after setsid(): make the PTY its controlling terminal so job control works.
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


def mount_pty(app: FastAPI, rt: Runtime) -> None:
    @app.websocket("/v1/pty")
    async def pty_ws(ws: WebSocket) -> None:
        q = ws.query_params
        proto = ws.headers.get("sec-websocket-protocol", "")
        subprotocol = next((p.strip() for p in proto.split(",") if p.strip().startswith("bearer.")), None)
        try:
            cwd = rt.cwd(q.get("cwd", ""))
            cols = max(1, min(1000, int(q.get("cols", "80"))))
            rows = max(1, min(1000, int(q.get("rows", "24"))))
            rt.limiter.acquire()
        except (ApiError, ValueError) as err:
            await ws.close(code=4400, reason=str(getattr(err, "message", err))[:120])
            return
        await ws.accept(subprotocol=subprotocol)
        shell = q.get("shell") or os.environ.get("SHELL") or "/bin/sh"
        env = base_env()
        env.setdefault("TERM", "xterm-256color")
        master, slave = os.openpty()
        _set_size(master, rows, cols)
        try:
            proc = subprocess.Popen(
                [shell, "-i"] if os.path.basename(shell) in ("sh", "bash", "dash", "zsh") else [shell],
                stdin=slave,
                stdout=slave,
                stderr=slave,
                cwd=cwd,
                env=env,
                start_new_session=True,
                preexec_fn=_controlling_tty,
            )
        except OSError as err:
            os.close(master)
            os.close(slave)
            rt.limiter.release()
            await ws.send_text(json.dumps({"type": "error", "message": str(err)}))
            await ws.close()
            return
        os.close(slave)
        loop = asyncio.get_running_loop()
        out: asyncio.Queue[bytes] = asyncio.Queue()

        def readable() -> None:
            try:
                data = os.read(master, 1 << 16)
            except OSError:
                data = b""
            if not data:
                loop.remove_reader(master)
            out.put_nowait(data)

        loop.add_reader(master, readable)

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
                            _set_size(master, int(obj.get("rows", rows)), int(obj.get("cols", cols)))
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
            rt.limiter.release()
