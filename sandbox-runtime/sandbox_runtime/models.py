"""Request and response models; they are also the OpenAPI schema at /openapi.json."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class Error(BaseModel):
    code: str
    message: str
    detail: str | None = None


class LegacyExecRequest(BaseModel):
    """agent-sandbox legacy runtime and Amicable: one string, split shell-style, run without a shell."""

    command: str = Field(description="Split with shlex rules and run without a shell in the root.")
    timeout_seconds: float | None = Field(default=None, gt=0, le=86400)
    timeout: float | None = Field(default=None, gt=0, le=86400, description="Alias of timeout_seconds.")


class LegacyExecResponse(BaseModel):
    stdout: str
    stderr: str
    exit_code: int
    timed_out: bool = False


class ExecRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    argv: list[str] | None = Field(
        default=None, min_length=1, description="Program and arguments (no shell)."
    )
    command: str | None = Field(default=None, description="Shell string, run as `sh -c` (or `shell`).")
    shell: str = Field(default="/bin/sh", description="Shell used for `command`.")
    cwd: str = Field(default="", description="Working directory relative to the root.")
    env: dict[str, str] = Field(default_factory=dict, description="Added to the runtime's environment.")
    clear_env: bool = Field(default=False, description="Start from an empty environment (plus `env`).")
    stdin: str | None = Field(default=None, description="Text written to the process' stdin.")
    timeout_seconds: float | None = Field(default=None, gt=0, le=86400)
    max_output_bytes: int | None = Field(default=None, ge=0, le=1 << 30)
    tag: str | None = Field(default=None, max_length=200, description="Free label, shown in listings.")
    journal: bool = Field(
        default=True,
        description="POST /v1/exec and /v1/processes: record the command in the journal (and HANDOFF.md); an orchestrator's "
        "own plumbing sets false.",
    )


class ExecResponse(BaseModel):
    argv: list[str]
    exit_code: int
    signal: int | None
    stdout: str
    stderr: str
    timed_out: bool
    truncated: bool
    duration_seconds: float


class ProcessInfo(BaseModel):
    id: str
    pid: int
    argv: list[str]
    cwd: str
    tag: str | None
    state: Literal["running", "exited"]
    exit_code: int | None
    signal: int | None
    timed_out: bool
    started_at: float
    ended_at: float | None
    stdout_bytes: int
    stderr_bytes: int


class ProcessList(BaseModel):
    processes: list[ProcessInfo]


class StdinRequest(BaseModel):
    data: str = ""
    eof: bool = False


class SignalRequest(BaseModel):
    signal: str = Field(default="TERM", max_length=16, description="Name (TERM, SIGKILL) or number.")


class FileInfo(BaseModel):
    name: str
    path: str
    type: str
    size: int
    mode: str
    modified_at: str
    mtime: float


class SandboxdEntry(BaseModel):
    name: str
    size: int
    type: str
    modified_at: str
    mode: str


class SandboxdListing(BaseModel):
    path: str
    entries: list[SandboxdEntry]


class LegacyEntry(BaseModel):
    name: str
    size: int
    type: str
    mod_time: float


class ExistsResponse(BaseModel):
    exists: bool


class TreeListing(BaseModel):
    path: str
    entries: list[FileInfo]


class MkdirRequest(BaseModel):
    path: str
    parents: bool = True
    mode: str | None = None


class MoveRequest(BaseModel):
    src: str
    dst: str
    overwrite: bool = False


class MoveResponse(BaseModel):
    src: str
    dst: str


class PathResponse(BaseModel):
    path: str


class WriteB64Request(BaseModel):
    path: str
    content_b64: str


class WriteB64Response(BaseModel):
    status: str
    path: str
    size: int


class AmicableList(BaseModel):
    files: list[str]


class Health(BaseModel):
    status: str
    message: str | None = None
    uptime_seconds: int | None = None
    idle_seconds: int | None = Field(
        default=None, description="Seconds since the last API request ended (0 while one is in flight)."
    )


class Metadata(BaseModel):
    env: dict[str, str]
    root: str
    version: str


class UploadResponse(BaseModel):
    message: str
    files: list[str] = []


class BaselineRequest(BaseModel):
    exclude: list[str] | None = Field(default=None, description="Glob patterns; `dir/` excludes a directory.")


class BaselineInfo(BaseModel):
    created_at: float
    files: int
    snapshot_bytes: int
    exclude: list[str]


class DiffFile(BaseModel):
    path: str
    status: Literal["added", "modified", "deleted"]
    binary: bool
    size: int | None = None


class DiffResponse(BaseModel):
    baseline_created_at: float
    added: list[str]
    modified: list[str]
    deleted: list[str]
    files: list[DiffFile]
    patch: str | None = None


class DecisionRequest(BaseModel):
    text: str = Field(min_length=1, max_length=20000)
    author: str | None = Field(default=None, max_length=200)


class JournalEntries(BaseModel):
    entries: list[dict[str, object]]
    last_seq: int


class ImportResponse(BaseModel):
    path: str
    files: int
    bytes: int
