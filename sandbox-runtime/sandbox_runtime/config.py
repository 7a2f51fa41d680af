"""Runtime settings, from the command line and the environment."""

from __future__ import annotations

import os
from dataclasses import dataclass, field


@dataclass
class Settings:
    root: str = "/workspace"
    host: str = "0.0.0.0"
    port: int = 8888
    grpc_port: int = 0  # sandboxd's gRPC ProcessService (9090 upstream); 0 = off
    token: str | None = None
    state_dir: str | None = None  # default: <root>/.sandbox-runtime (a volume, so restarts keep it)
    max_processes: int = 64
    exec_timeout: float = 600.0
    max_output: int = 10 * 1024 * 1024
    max_json_body: int = 64 * 1024 * 1024
    max_upload: int | None = None
    max_command_bytes: int = 2 * 1024 * 1024
    max_archive_members: int = 1_000_000
    max_archive_bytes: int = 64 << 30
    process_log_budget: int = 32 * 1024 * 1024
    journal_max_bytes: int = 8 * 1024 * 1024
    handoff: bool = False
    heartbeat_seconds: float = 0.0
    journal_ignore: frozenset[str] = field(
        default_factory=lambda: frozenset(
            {
                "ls",
                "cd",
                "pwd",
                "clear",
                "exit",
                "cat",
                "head",
                "tail",
                "less",
                "more",
                "echo",
                "printf",
                "true",
            }
        )
    )
    journal_entry_length: int = 1000
    log_level: str = "info"

    @property
    def state(self) -> str:
        return self.state_dir or os.path.join(self.root, ".sandbox-runtime")


def read_token(token: str | None, token_file: str | None) -> str | None:
    """Token precedence: explicit value, then the file (the operator mounts a Secret there)."""
    if token:
        return token.strip() or None
    if token_file:
        try:
            with open(token_file, encoding="utf-8") as fh:
                value = fh.read().strip()
        except OSError as err:
            raise SystemExit(
                f"sandbox-runtime: cannot read token file {token_file}: {err.strerror}"
            ) from None
        if not value:
            raise SystemExit(f"sandbox-runtime: token file {token_file} is empty")
        return value
    return None
