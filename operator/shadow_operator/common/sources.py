"""Sources of an environment planned: where each goes in the workspace and which Gitea repository holds it.

Pure data over a ShadowEnvironment's body, read alike by the operator (copy-in, pushes) and the SDK (uploads,
promote), so it lives here, outside both.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

Body = Mapping[str, Any]


@dataclass(frozen=True)
class SourcePlan:
    """Where a source goes: its directory in the workspace and its Gitea repository."""

    name: str
    path: str
    org: str
    repo: str
    git_url: str | None
    git_ref: str | None
    upload: bool

    @property
    def full_repo(self) -> str:
        return f"{self.org}/{self.repo}"


def plan_sources(env: Body, inherited: Sequence[Mapping[str, Any]] | None = None) -> list[SourcePlan]:
    """The environment's sources; a fork without spec.sources has those it `inherited` with its clone
    (already in the workspace, so they are planned like uploads)."""
    spec = env["spec"]
    default_org = (spec.get("gitea") or {}).get("organization") or "shadow"
    plans = []
    for source in spec.get("sources") or inherited or ():
        org, _, repo = source["repo"].rpartition("/")
        git = source.get("git")
        plans.append(
            SourcePlan(
                name=source["name"],
                path=source.get("path") or source["name"],
                org=org or default_org,
                repo=repo,
                git_url=git["url"] if git else None,
                git_ref=(git or {}).get("ref"),
                upload=git is None,
            )
        )
    return plans
