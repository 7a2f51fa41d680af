"""A shell on a pseudo-terminal, in its own session with the PTY as its controlling terminal."""

from __future__ import annotations

import fcntl
import os
import struct
import subprocess
import termios
from dataclasses import dataclass

from .execution import ExecSpec


@dataclass
class Terminal:
    proc: subprocess.Popen[bytes]
    master: int  # our end of the PTY; the shell holds the other

    def resize(self, rows: int, cols: int) -> None:
        set_size(self.master, rows, cols)


def set_size(fd: int, rows: int, cols: int) -> None:
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


def _controlling_tty() -> None:
    # Runs in the child after setsid(): make the PTY its controlling terminal so job control works.
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


def open_terminal(spec: ExecSpec, rows: int, cols: int, pass_fds: tuple[int, ...] = ()) -> Terminal:
    """Spawn `spec` on a new PTY of the given size (OSError if it cannot start); `pass_fds` stay open in
    the shell (the shell journal's pipe)."""
    master, slave = os.openpty()
    try:
        set_size(master, rows, cols)
        proc = subprocess.Popen(
            spec.argv,
            stdin=slave,
            stdout=slave,
            stderr=slave,
            cwd=spec.cwd,
            env=spec.env,
            start_new_session=True,
            preexec_fn=_controlling_tty,
            pass_fds=pass_fds,
        )
    except BaseException:
        os.close(master)
        raise
    finally:
        os.close(slave)
    return Terminal(proc, master)
