"""Command line: `sandbox-runtime --root DIR --host H --port P [--token-file F]`."""

from __future__ import annotations

import argparse
import logging
import os

import uvicorn

from .app import create_app
from .config import Settings, read_token


def parse(argv: list[str] | None = None) -> Settings:
    env = os.environ.get
    p = argparse.ArgumentParser(prog="sandbox-runtime", description="Workspace API for a sandbox pod.")
    p.add_argument("--root", default=env("SANDBOX_RUNTIME_ROOT", "/workspace"), help="workspace root")
    p.add_argument("--host", default=env("SANDBOX_RUNTIME_HOST", "0.0.0.0"))
    p.add_argument("--port", type=int, default=int(env("SANDBOX_RUNTIME_PORT", "8888")))
    p.add_argument(
        "--grpc-port",
        type=int,
        default=int(env("SANDBOX_RUNTIME_GRPC_PORT", "0")),
        help="also serve sandboxd's gRPC ProcessService on this port (needs the `grpc` extra; 0 = off)",
    )
    p.add_argument(
        "--token-file",
        default=env("SANDBOX_RUNTIME_TOKEN_FILE"),
        help="file holding the bearer token (env SANDBOX_RUNTIME_TOKEN_FILE; SANDBOX_RUNTIME_TOKEN wins)",
    )
    p.add_argument(
        "--state-dir", default=env("SANDBOX_RUNTIME_STATE_DIR"), help="default <root>/.sandbox-runtime"
    )
    p.add_argument("--max-processes", type=int, default=64)
    p.add_argument("--exec-timeout", type=float, default=600.0, help="default timeout of a command, seconds")
    p.add_argument("--max-output", type=int, default=10 * 1024 * 1024, help="bytes kept per stream per exec")
    p.add_argument("--max-upload", type=int, default=None, help="largest accepted upload in bytes")
    p.add_argument(
        "--max-archive-members", type=int, default=1_000_000, help="most members an imported archive may have"
    )
    p.add_argument(
        "--max-archive-bytes",
        type=int,
        default=64 << 30,
        help="most bytes an imported archive may expand to (decompressed tar stream)",
    )
    p.add_argument(
        "--max-command-bytes",
        type=int,
        default=2 * 1024 * 1024,
        help="largest command (arguments plus environment) accepted, bytes; Linux's exec limit is 2 MiB",
    )
    p.add_argument(
        "--handoff",
        action="store_true",
        default=env("SANDBOX_RUNTIME_HANDOFF") == "1",
        help="maintain HANDOFF.md in the workspace from the journal",
    )
    p.add_argument(
        "--heartbeat",
        type=float,
        default=float(env("SANDBOX_RUNTIME_HEARTBEAT", "300")),
        help="HANDOFF.md heartbeat interval, seconds (0 disables)",
    )
    p.add_argument(
        "--journal-ignore", default=None, help="comma-separated commands never significant on success"
    )
    p.add_argument("--journal-entry-length", type=int, default=1000)
    p.add_argument(
        "--journal-max-bytes",
        type=int,
        default=8 * 1024 * 1024,
        help="journal.jsonl is rotated past this size (one previous file, journal.jsonl.1, is kept)",
    )
    p.add_argument(
        "--process-log-budget",
        type=int,
        default=32 * 1024 * 1024,
        help="output kept for all exited background processes together, bytes (least recently read dropped)",
    )
    p.add_argument("--log-level", default=env("SANDBOX_RUNTIME_LOG_LEVEL", "info"))
    a = p.parse_args(argv)
    s = Settings(
        root=a.root,
        host=a.host,
        port=a.port,
        grpc_port=a.grpc_port,
        token=read_token(env("SANDBOX_RUNTIME_TOKEN"), a.token_file),
        state_dir=a.state_dir,
        max_processes=a.max_processes,
        exec_timeout=a.exec_timeout,
        max_output=a.max_output,
        max_upload=a.max_upload,
        max_command_bytes=a.max_command_bytes,
        max_archive_members=a.max_archive_members,
        max_archive_bytes=a.max_archive_bytes,
        handoff=a.handoff,
        heartbeat_seconds=a.heartbeat,
        journal_entry_length=a.journal_entry_length,
        journal_max_bytes=a.journal_max_bytes,
        process_log_budget=a.process_log_budget,
        log_level=a.log_level,
    )
    if a.journal_ignore is not None:
        s.journal_ignore = frozenset(x.strip() for x in a.journal_ignore.split(",") if x.strip())
    return s


def tune_malloc() -> None:
    """Keep transfer-sized buffers (up to a few MiB) in the heap.

    glibc serves allocations above its mmap threshold with fresh mmaps, so every 256 KiB-1 MiB body chunk
    costs page faults and zeroing; on loopback uploads that was ~30% of the time. Freed memory beyond
    32 MiB is still returned to the OS. No-op on libcs without mallopt.
    """
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    if not name:
        return
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return
    m_trim_threshold, m_mmap_threshold = -1, -3
    mallopt(m_mmap_threshold, 4 << 20)
    mallopt(m_trim_threshold, 32 << 20)


def main(argv: list[str] | None = None) -> None:
    settings = parse(argv)
    tune_malloc()
    logging.basicConfig(
        level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s"
    )
    app = create_app(settings)
    # access_log off: one log line per exec would dominate the cost of a fast command.
    uvicorn.run(
        app,
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        access_log=False,
        server_header=False,
        ws="websockets-sansio",
    )


if __name__ == "__main__":
    main()
