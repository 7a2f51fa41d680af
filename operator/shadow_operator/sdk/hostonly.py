"""Host-only verification: seed 001's fallback when no shadow environment can be had.

Opt-in only (`fallback="host-only"`, `shadowctl ... --fallback host-only`) and always labelled: the verdict says
`mode: host-only`, scores out of 50 (pass at 35) and names why the shadow was not available. The checks run on
this machine, in a TEMPORARY COPY of each source made with the same selection as an upload (what
`git add --all` would snapshot, plus `.git`), so a verification command that writes, builds or deletes never
changes the user's directories. It is not a sandbox: the commands run with the caller's rights, as they would in
a terminal; the copy only keeps their files apart.

The host-only rubric (seed 001 names its scale and threshold, not its checks; these mirror the shadow rubric):

- sourceVerification (15): each source directory could be copied (files > 0) and, in a git repository, its
  HEAD commit read;
- installationHealth (15): each source's project manifest (pyproject.toml, package.json, Cargo.toml, go.mod)
  parses; nothing is installed on the host;
- codeExecution (20): each verification command exits 0 within its timeout, in the copy.

A category without checks is left out and the rest is scaled to 50, as the shadow verdict does.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import tomllib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Literal

from shadow_operator.api.environment import Verdict
from shadow_operator.common import verdict as scoring

# The categories, named here as well for the handoff manifest's recommendations.
from shadow_operator.common.verdict import CODE_EXECUTION as CODE_EXECUTION
from shadow_operator.common.verdict import INSTALLATION_HEALTH as INSTALLATION_HEALTH
from shadow_operator.common.verdict import SOURCE_VERIFICATION as SOURCE_VERIFICATION
from shadow_operator.common.verdict import CheckResult
from shadow_operator.sdk.environment import LocalSource
from shadow_operator.sdk.errors import ShadowError, UploadError
from shadow_operator.sdk.upload import worktree_files

HOST_ONLY: Literal["host-only"] = "host-only"
MAX_SCORE = scoring.HOST_ONLY.max_score
PASS_THRESHOLD = 35
WEIGHTS = scoring.HOST_ONLY.weights
TAIL = 2000  # characters of a command's output kept as evidence
DEFAULT_TIMEOUT = 600.0

ProjectType = Literal["python", "node", "rust", "go"]
# Marker file -> project type, in the order a source's type is decided.
PROJECT_MARKERS: tuple[tuple[str, ProjectType], ...] = (
    ("pyproject.toml", "python"),
    ("setup.py", "python"),
    ("setup.cfg", "python"),
    ("package.json", "node"),
    ("Cargo.toml", "rust"),
    ("go.mod", "go"),
)


class FallbackNotPossible(ShadowError):
    """Host-only verification cannot run (no local source to copy)."""

    code = "FallbackNotPossible"
    hint = "give the local directories: --local PATH (or LocalSource(...) in the spec)"


def check_fallback(fallback: str | None) -> bool:
    """Whether host-only fallback was asked for; anything but None or "host-only" is refused."""
    if fallback is None:
        return False
    if fallback != HOST_ONLY:
        raise ShadowError(f"fallback {fallback!r} is unknown", hint="the only fallback is host-only")
    return True


def project_type(markers: Sequence[str]) -> ProjectType | None:
    """The project type of a directory holding these top-level file names."""
    present = set(markers)
    return next((kind for marker, kind in PROJECT_MARKERS if marker in present), None)


def score(checks: Mapping[str, Sequence[CheckResult]], failure_reason: str | None) -> Verdict:
    """The host-only verdict: categories weighted 15/15/20, scaled to 50, PASS at 35."""
    return scoring.score(
        checks,
        scoring.HOST_ONLY,
        pass_threshold=PASS_THRESHOLD,
        verified_at=dt.datetime.now(dt.UTC),
        issues=[f"shadow unavailable ({failure_reason}): checked on the host only"] if failure_reason else [],
    )


# ------------------------------------------------------------------------------------------ the copy
def _confined_link(root: Path, rel: str, target: str) -> bool:
    """Whether a symlink at `rel` pointing at `target` stays inside `root` (lexically, as the copy is new)."""
    if os.path.isabs(target):
        return False
    parts: list[str] = list(PurePosixPath(rel).parent.parts)
    for part in PurePosixPath(target).parts:
        if part == "..":
            if not parts:
                return False
            parts.pop()
        elif part != ".":
            parts.append(part)
    return True


def copy_source(src: Path, dest: Path) -> tuple[int, list[str]]:
    """Copy what an upload of `src` carries into the new directory `dest`; returns (files copied, symlinks
    left out). A symlink is copied as a link only when it points inside the copy: one pointing elsewhere
    (an absolute path, or out through `..`) could lead a command back into the user's files."""
    files = worktree_files(src)
    dest.mkdir(parents=True)
    copied, skipped = 0, []
    for rel in files:
        origin, target = src / rel, dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        if origin.is_symlink():
            link = os.readlink(origin)
            if not _confined_link(dest, rel, link):
                skipped.append(rel)
                continue
            os.symlink(link, target)
        else:
            try:
                shutil.copy2(origin, target, follow_symlinks=False)
            except FileNotFoundError:
                continue  # gone since it was listed, as an upload would skip it
            except OSError as exc:
                raise UploadError(f"cannot copy {origin}: {exc.strerror or exc}") from None
        copied += 1
    return copied, skipped


@contextlib.contextmanager
def temporary_copies(
    sources: Sequence[LocalSource],
) -> Iterator[tuple[Path, dict[str, tuple[int, list[str]]]]]:
    """A temporary workspace with each source copied to <root>/<source name> (the shadow's layout), deleted
    afterwards whatever happened."""
    with tempfile.TemporaryDirectory(prefix="shadow-host-only-") as tmp:
        root = Path(tmp)
        copies = {s.source_name: copy_source(s.path, root / s.source_name) for s in sources}
        yield root, copies


# ----------------------------------------------------------------------------------------- the checks
def _git(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    return subprocess.run(
        ["git", *args], cwd=cwd, env=env, capture_output=True, text=True, check=False, timeout=60
    )


def head_commit(path: Path) -> str | None:
    """HEAD of the repository at `path`, or None (not a repository, no commit yet, no git)."""
    try:
        done = _git(path, "rev-parse", "--verify", "-q", "HEAD")
    except (FileNotFoundError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() or None if done.returncode == 0 else None


def manifest_check(directory: Path) -> CheckResult | None:
    """Does the source's project manifest parse? None when it has none."""
    names = [m for m, _ in PROJECT_MARKERS if (directory / m).is_file()]
    kind = project_type(names)
    if kind is None:
        return None
    marker = next(m for m, k in PROJECT_MARKERS if k == kind and m in names)
    path = directory / marker
    try:
        text = path.read_text(encoding="utf-8")
        if marker.endswith(".toml"):
            tomllib.loads(text)
        elif marker == "package.json":
            json.loads(text)
        elif marker == "go.mod" and not any(line.startswith("module ") for line in text.splitlines()):
            return CheckResult(f"{directory.name}: {marker}", False, "no module line")
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        return CheckResult(f"{directory.name}: {marker}", False, f"does not parse: {exc}"[:TAIL])
    return CheckResult(f"{directory.name}: {marker}", True, f"{kind} project")


@dataclass(frozen=True)
class HostCommand:
    """A verification command as the environment declares it (`spec.verify.commands[]`)."""

    name: str
    command: str
    cwd: str | None = None
    timeout_seconds: float = DEFAULT_TIMEOUT


def run_command(root: Path, cmd: HostCommand) -> CheckResult:
    cwd = root / (cmd.cwd or "")
    if not cwd.resolve().is_relative_to(root.resolve()):
        return CheckResult(cmd.name, False, f"cwd {cmd.cwd} is outside the copy")
    started = time.monotonic()
    try:
        # A session of its own, so a timeout kills whatever the command started too (not just `sh`).
        proc = subprocess.Popen(
            ["sh", "-c", cmd.command],
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    except OSError as exc:
        return CheckResult(cmd.name, False, f"{cmd.command}: {exc}")
    try:
        raw, _ = proc.communicate(timeout=cmd.timeout_seconds)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return CheckResult(cmd.name, False, f"{cmd.command}: killed after {cmd.timeout_seconds:g}s")
    output = raw.decode(errors="replace").strip()[-TAIL:]
    took = time.monotonic() - started
    detail = f"{cmd.command}: exit {proc.returncode} in {took:.1f}s" + (f"\n{output}" if output else "")
    return CheckResult(cmd.name, proc.returncode == 0, detail)


def commands_of(texts: Sequence[str]) -> list[HostCommand]:
    """Commands given as strings, named as `shadowctl create --verify` names them."""
    return [HostCommand(f"check-{i}", text) for i, text in enumerate(texts, 1)]


def verify_on_host(
    sources: Sequence[LocalSource], commands: Sequence[HostCommand], failure_reason: str | None
) -> Verdict:
    """Copy the sources into a temporary directory, run the host-only checks there, and score them."""
    if not sources:
        raise FallbackNotPossible("host-only verification needs at least one local source")
    checks: dict[str, list[CheckResult]] = {
        SOURCE_VERIFICATION: [],
        INSTALLATION_HEALTH: [],
        CODE_EXECUTION: [],
    }
    with temporary_copies(sources) as (root, copies):
        for source in sources:
            name = source.source_name
            files, skipped = copies[name]
            detail = f"{files} files copied from {source.path}"
            if skipped:
                detail += f"; symlinks leading out left out: {', '.join(skipped[:5])}"
            checks[SOURCE_VERIFICATION].append(CheckResult(f"{name}: copied", files > 0, detail))
            if (source.path / ".git").is_dir():
                commit = head_commit(source.path)
                checks[SOURCE_VERIFICATION].append(
                    CheckResult(f"{name}: git HEAD", commit is not None, commit or "no commit readable")
                )
            manifest = manifest_check(root / name)
            if manifest is not None:
                checks[INSTALLATION_HEALTH].append(manifest)
        for cmd in commands:
            checks[CODE_EXECUTION].append(run_command(root, cmd))
    verdict = score(checks, failure_reason)
    if not commands:
        verdict.issues.append("no verification commands were given: code execution was not checked")
    return verdict
