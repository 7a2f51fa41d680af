"""Local edits pushed into a running workspace (`shadowctl sync`, `ShadowGateway.sync()`).

A sync sends what an upload would send (`upload.worktree_files`: what `git add --all` would snapshot, and
`.git`, with the same refusals and the same rewritten git config) but only the files that changed since the
last push from this machine, and deletes in the workspace what was deleted here since then. What was pushed
last is recorded beside the local directories (`localdirs`): a file the workspace made itself, or one this
machine never pushed, is never deleted. A deletion stays inside the source's directory and out of every
`.git` (`confine.check`), whatever the recorded list says.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from shadow_operator.sdk import confine, localdirs, runtime
from shadow_operator.sdk.errors import RuntimeRefused
from shadow_operator.sdk.kube import Op
from shadow_operator.sdk.runtime import RuntimeEndpoint
from shadow_operator.sdk.upload import stream_worktree, worktree_files

Stamps = dict[str, tuple[int, int]]  # relative path -> (mtime_ns, size)


@dataclass
class SyncPlan:
    """What one push of a source sends and deletes."""

    source: str
    local_dir: Path
    workspace_dir: str  # the source's directory, relative to the workspace
    changed: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    stamps: Stamps = field(default_factory=dict)  # of every file pushed, once this plan is carried out

    @property
    def empty(self) -> bool:
        """Whether nothing is to be sent or deleted."""
        return not self.changed and not self.deleted


def stamps(local_dir: Path) -> Stamps:
    """The files an upload of `local_dir` carries, with what tells a changed one apart."""
    found: Stamps = {}
    for rel in worktree_files(local_dir):
        try:
            st = os.lstat(local_dir / rel)
        except FileNotFoundError:
            continue  # gone since it was listed
        found[rel] = (st.st_mtime_ns, st.st_size)
    return found


def plan(
    source: str, local_dir: Path, workspace_dir: str, previous: Mapping[str, tuple[int, int]]
) -> SyncPlan:
    """Changed and deleted files of `local_dir` since `previous` (the stamps of the last push)."""
    now = stamps(local_dir)
    changed = sorted(rel for rel, stamp in now.items() if tuple(previous.get(rel) or ()) != stamp)
    deleted = sorted(
        rel for rel in previous if rel not in now and confine.is_safe(rel) and not confine.undiffed(rel)
    )
    return SyncPlan(source, local_dir, workspace_dir, changed, deleted, now)


def push(ep: RuntimeEndpoint, sync: SyncPlan) -> Op[SyncPlan]:
    """Send the changed files into the source's directory and delete the deleted ones there."""
    if sync.changed:
        yield from runtime.import_archive(
            ep, sync.workspace_dir, stream_worktree(sync.local_dir, sync.changed)
        )
    for rel in sync.deleted:
        confine.check(rel)
        try:
            yield from runtime.delete_path(ep, f"{sync.workspace_dir.rstrip('/')}/{rel}")
        except RuntimeRefused as exc:
            if exc.status != 404:  # already gone there: what was asked for
                raise
    return sync


def record(cluster: str, namespace: str, name: str, sync: SyncPlan) -> None:
    """Remember what was pushed, for the next sync's comparison."""
    localdirs.record_pushed(cluster, namespace, name, sync.source, sync.stamps)


def previous(cluster: str, namespace: str, name: str, source: str) -> dict[str, tuple[int, int]]:
    return localdirs.pushed(cluster, namespace, name, source)
