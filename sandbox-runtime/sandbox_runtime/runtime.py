"""The composition root: the process-wide state every front end (HTTP dialects, gRPC, PTY) shares.

No web framework here: the routers and the gRPC service reach this through their own adapters, and
nothing in it imports them back.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import ParamSpec, TypeVar

from .activity import Activity
from .archive import remove_stale_staging
from .baseline import Baselines
from .config import Settings
from .exec_service import ExecService
from .journal import Journal
from .metrics import Metrics
from .paths import Root

log = logging.getLogger("sandbox_runtime")

P = ParamSpec("P")
T = TypeVar("T")


class Runtime:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        try:
            os.makedirs(settings.root, exist_ok=True)
        except OSError as err:
            raise SystemExit(
                f"sandbox-runtime: cannot use workspace root {settings.root}: {err.strerror}"
            ) from None
        self.root = Root(settings.root)
        settings.state_dir = _usable_state_dir(settings)
        remove_stale_staging(settings.state)
        self.metrics = Metrics()
        # Filesystem walks (listings, baseline, diff) run here, off the event loop.
        self.pool = ThreadPoolExecutor(max_workers=settings.max_processes, thread_name_prefix="blocking")
        self.journal = Journal(
            settings.state,
            self.root.real,
            ignore=settings.journal_ignore,
            entry_length=settings.journal_entry_length,
            max_bytes=settings.journal_max_bytes,
            handoff=settings.handoff,
        )
        # Idle time (/v1/health): API requests and gRPC calls in flight, and every process slot held.
        self.activity = Activity()
        self.exec = ExecService(settings, self.root, self.metrics, self.journal, self.activity)
        self.baselines = Baselines(self.root.real, settings.state)
        # One capture or diff at a time: a diff must not read a baseline being replaced.
        self.baseline_lock = asyncio.Lock()
        self.started = time.time()

    async def blocking(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """Run a blocking call (a directory walk, a manifest read) in the runtime's thread pool."""
        return await asyncio.get_running_loop().run_in_executor(
            self.pool, functools.partial(fn, *args, **kwargs)
        )

    async def heartbeat(self) -> None:
        """Refresh HANDOFF.md's heartbeat block until cancelled."""
        while True:
            with contextlib.suppress(OSError):
                self.journal.heartbeat()
            await asyncio.sleep(self.settings.heartbeat_seconds)

    async def shutdown(self) -> None:
        await self.exec.processes.shutdown()
        self.pool.shutdown(wait=False, cancel_futures=True)
        self.journal.close()


def _usable_state_dir(settings: Settings) -> str:
    """The journal and baseline live in the workspace volume so restarts keep them; if that is not
    writable (read-only root, foreign uid) fall back to a per-uid temp dir rather than refusing to start."""
    wanted = settings.state
    try:
        os.makedirs(wanted, exist_ok=True)
        if os.access(wanted, os.W_OK | os.X_OK):
            return wanted
    except OSError:
        pass
    fallback = os.path.join(tempfile.gettempdir(), f"sandbox-runtime-{os.getuid()}")
    os.makedirs(fallback, mode=0o700, exist_ok=True)
    log.warning("state dir %s is not writable; using %s (not kept across restarts)", wanted, fallback)
    return fallback
