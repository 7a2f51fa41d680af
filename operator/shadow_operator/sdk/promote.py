"""Promote: bring what changed in an environment back into the local directory a source came from.

Only what changed in the workspace since its baseline is written (or deleted) locally, so local work done
meanwhile on other files survives. Paths, modes and sizes come from the workspace, so they are confined
(`sdk.confine`): nothing lands outside the directory, in any spelling of `.git`, or through a symbolic link, and
the bytes stream to disk under a size budget.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from shadow_operator.sdk import confine, runtime
from shadow_operator.sdk.errors import PromoteError, UnsafePath
from shadow_operator.sdk.kube import Op
from shadow_operator.sdk.runtime import Diff, RuntimeEndpoint


@dataclass
class PromotePlan:
    """What a promote of one source would do, paths relative to the source directory. `refused` lists the
    changed paths that will not be promoted (outside the source, `.`/`..` forms, any spelling of `.git`, and
    anything in a directory no baseline covers, such as `__pycache__`: `confine.undiffed`)."""

    source: str
    workspace_dir: str
    local_dir: Path
    write: list[str] = field(default_factory=list)
    delete: list[str] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        """Whether the plan writes and deletes nothing."""
        return not (self.write or self.delete)


def _selected(rel: str, patterns: Sequence[str]) -> bool:
    return not patterns or any(
        fnmatch.fnmatch(rel, p) or fnmatch.fnmatch(rel, p.rstrip("/") + "/*") for p in patterns
    )


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
            if not confine.is_safe(rel) or confine.undiffed(rel):
                plan.refused.append(rel)
            elif _selected(rel, patterns):
                into.append(rel)
    return plan


def apply(ep: RuntimeEndpoint, plan: PromotePlan, budget: confine.Budget | None = None) -> Op[PromotePlan]:
    """Write the changed files (their execute bits kept) and delete the deleted ones in the local directory.
    Stops with UnsafePath at a path that would leave it, and TooLarge past the budget (1 GiB by default)."""
    budget = budget or confine.Budget(option="max_bytes")
    prefix = plan.workspace_dir.strip("/") + "/"
    try:
        dest = confine.Confined(plan.local_dir)
    except UnsafePath as exc:
        raise PromoteError(
            exc.message, hint="give the local directory of the source with --to PATH"
        ) from None
    with dest:
        for rel in plan.write:
            confine.check(rel)  # a plan may have been built by hand
            info = yield from runtime.stat(ep, prefix + rel)
            if info is None:
                continue  # removed in the workspace since the diff was taken
            if info.get("type") == "directory":
                dest.mkdir(rel)
                continue
            if info.get("type") != "file":
                continue  # links are not promoted: they could point anywhere on this machine
            budget.member(rel, confine.number(info.get("size"), 10))
            with dest.writer(rel, confine.number(info.get("mode"), 8), budget) as out:
                yield from runtime.read_into(ep, prefix + rel, out.write)
        for rel in plan.delete:
            dest.delete(rel)
    return plan
