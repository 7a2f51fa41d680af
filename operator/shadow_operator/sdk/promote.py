"""Promote: bring what changed in an environment back into the local directory a source came from.

Only what changed in the workspace since its baseline is written (or deleted) locally, so local work done
meanwhile on other files survives. `.git` is never touched, and nothing lands outside the directory.
"""

from __future__ import annotations

import fnmatch
import os
import stat as stat_mod
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from shadow_operator.sdk import runtime
from shadow_operator.sdk.errors import PromoteError
from shadow_operator.sdk.kube import Op
from shadow_operator.sdk.runtime import Diff, RuntimeEndpoint


@dataclass
class PromotePlan:
    """What a promote of one source would do, paths relative to the source directory."""

    source: str
    workspace_dir: str
    local_dir: Path
    write: list[str] = field(default_factory=list)
    delete: list[str] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not (self.write or self.delete)


def _selected(rel: str, patterns: Sequence[str]) -> bool:
    return not patterns or any(
        fnmatch.fnmatch(rel, p) or fnmatch.fnmatch(rel, p.rstrip("/") + "/*") for p in patterns
    )


def safe_relative(rel: str) -> bool:
    """A relative path that stays inside its directory and does not go through any `.git`."""
    parts = PurePosixPath(rel).parts
    return bool(parts) and not PurePosixPath(rel).is_absolute() and ".." not in parts and ".git" not in parts


def plan_promote(
    diff: Diff, source: str, workspace_dir: str, local_dir: Path, patterns: Sequence[str] = ()
) -> PromotePlan:
    """The changes of the diff that fall under the source's directory (and the --paths globs)."""
    prefix = workspace_dir.strip("/") + "/"
    plan = PromotePlan(source, workspace_dir, local_dir)
    for paths, into in ((diff.added + diff.modified, plan.write), (diff.deleted, plan.delete)):
        for path in sorted(paths):
            if not path.startswith(prefix):
                continue
            rel = path[len(prefix) :]
            if safe_relative(rel) and _selected(rel, patterns):
                into.append(rel)
    return plan


def apply(ep: RuntimeEndpoint, plan: PromotePlan) -> Op[PromotePlan]:
    """Write the changed files (with their mode) and delete the deleted ones in the local directory."""
    root = plan.local_dir.resolve()
    if not root.is_dir():
        raise PromoteError(
            f"{root} is not a directory", hint="give the local directory of the source with --to PATH"
        )
    prefix = plan.workspace_dir.strip("/") + "/"
    for rel in plan.write:
        info = yield from runtime.stat(ep, prefix + rel)
        if info is None:
            continue  # removed in the workspace since the diff was taken
        target = _inside(root, rel)
        if info["type"] == "directory":
            target.mkdir(parents=True, exist_ok=True)
            continue
        if info["type"] == "symlink":
            continue  # links are not promoted: they could point anywhere on this machine
        data = yield from runtime.read_file(ep, prefix + rel)
        _write_atomic(target, data, int(info["mode"], 8) & 0o777)
    for rel in plan.delete:
        target = _inside(root, rel)
        if target.is_file() or target.is_symlink():
            target.unlink()
        elif target.is_dir() and not any(target.iterdir()):
            target.rmdir()
    return plan


def _inside(root: Path, rel: str) -> Path:
    target = root / rel
    # A symlinked parent directory could lead the write elsewhere: resolve and check.
    if not target.parent.resolve().is_relative_to(root) and target.parent.exists():
        raise PromoteError(f"{rel} would be written outside {root} (through a symbolic link)")
    return target


def _write_atomic(target: Path, data: bytes, mode: int) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    if target.is_symlink() or (target.exists() and not stat_mod.S_ISREG(target.lstat().st_mode)):
        raise PromoteError(f"{target} exists and is not a regular file; move it away and promote again")
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.chmod(tmp, mode or 0o644)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
