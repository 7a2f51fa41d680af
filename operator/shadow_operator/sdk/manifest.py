"""The handoff manifest a smoke-test agent receives: seed 001's "Agent Handoff Protocol".

Built from an environment's status (sources, snapshot commits, failure) and its diff (`build_manifest`), or,
when no shadow can be had, from the local directories alone (`fallback_manifest`, `fallback_mode: true`, with
the failure code in `failure_reason`). Field names are the protocol's (snake_case). The JSON Schema checked in
at `sdk/schemas/handoff-manifest.schema.json` is generated from `HandoffManifest` (`python -m
shadow_operator.sdk.manifest --check` says whether it is current).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path, PurePosixPath
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from shadow_operator.api import constants as c
from shadow_operator.api.environment import ShadowEnvironment, Verdict
from shadow_operator.sdk import environment as envops
from shadow_operator.sdk import hostonly, localdirs, runtime
from shadow_operator.sdk.environment import ANNOTATION_LOCAL_PREFIX, EnvironmentSpec, LocalSource
from shadow_operator.sdk.errors import (
    ApiNotInstalled,
    ClusterUnreachable,
    EnvironmentFailed,
    OperatorNotRunning,
    RuntimeRefused,
    RuntimeUnreachable,
    SandboxNotReadyError,
    ShadowError,
)
from shadow_operator.sdk.hostonly import PROJECT_MARKERS, HostCommand, ProjectType, project_type
from shadow_operator.sdk.kube import Op
from shadow_operator.sdk.runtime import Diff

SCHEMA_PATH = Path(__file__).parent / "schemas" / "handoff-manifest.schema.json"
MAX_LISTED = 1000  # changed files and modules listed at most (a manifest goes into a prompt)


class ManifestSource(BaseModel):
    """One source under test."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(description="The source's name in the environment.")
    path: str | None = Field(description="The local directory it came from (null for a cloned git URL).")
    github_repo: str | None = Field(description="The repository it stands for, org/name.")
    snapshot_commit: str | None = Field(
        description="The commit captured in the shadow (uncommitted work included); null in fallback mode."
    )
    project_type: ProjectType | None = Field(default=None, description="Detected from its manifest files.")


class TestContext(BaseModel):
    """What to test."""

    __test__ = False  # not a pytest class, whatever its name
    model_config = ConfigDict(extra="forbid")

    changed_files: list[str] = Field(
        description="Files changed since the copy-in (shadow) or since HEAD (fallback), workspace-relative "
        "(<source path>/<file>)."
    )
    affected_modules: list[str] = Field(
        description="Modules those files belong to: dotted Python modules, Go and Node directories, Rust "
        "module paths."
    )
    project_type: ProjectType | None = Field(description="The first source's detected project type.")


# Seed 001's failure codes (its shadow tool ran Docker) for ours: what its smoke-test agent does next is the same
# (host-only, or try building first), so a protocol written against the seed reads `seed_failure_reason`.
SEED_FAILURE_REASONS: Mapping[str, str] = {
    "ClusterUnreachable": "docker_not_running",
    "ApiNotInstalled": "docker_not_installed",
    "OperatorNotRunning": "docker_not_installed",
    "TemplateNotFound": "image_not_found",
    "ImagePullFailed": "image_not_found",
    "RuntimeClassNotFound": "image_not_found",
    **dict.fromkeys(
        (
            "Unschedulable", "StorageUnavailable", "SourceFetchFailed", "GiteaBootstrapFailed", "Timeout",
            "CloneSourceNotFound", "SnapshotUnsupported", "SnapshotFailed", "SnapshotTimeout", "CopyFailed",
            "RuntimeStalled", "GiteaStalled",
            "AutoSuspendPolicyRefused",
        ),
        "create_failed",
    ),
}  # fmt: skip
# What to do about a category with failed checks (seed 001's `recommendations`), by the rubric's categories.
RECOMMENDATIONS: Mapping[str, str] = {
    hostonly.SOURCE_VERIFICATION: "the sources did not all arrive: check the local directories and git URLs, "
    "then create the environment again",
    hostonly.INSTALLATION_HEALTH: "the project does not install: fix its manifest or dependencies (the "
    "installationHealth evidence names the command and its output)",
    hostonly.CODE_EXECUTION: "a verification command fails: run it in the environment (shadowctl exec ENV "
    "CMD), fix the code, then verify again (shadowctl verify ENV)",
}


def snake(name: str) -> str:
    """sourceVerification -> source_verification (the seed spells its keys in snake case)."""
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


class SmokeTestResponse(BaseModel):
    """Seed 001's smoke-test response, spelt as the seed spells it, from the verdict."""

    model_config = ConfigDict(extra="forbid")

    verdict: Literal["PASS", "FAIL"] = Field(description="The verdict's result.")
    state: Literal["pass", "needs-work", "fail"] = Field(
        description="Seed 000's decision: pass (PASS and every check passed: promote), needs-work (PASS with "
        "issues found: report them, keep the environment for debugging if wanted), fail (FAIL)."
    )
    mode: Literal["shadow", "host-only"]
    score: int
    max_score: int
    pass_threshold: int
    evidence: dict[str, dict[str, Any]] = Field(
        description="Per category (source_verification, installation_health, code_execution): score, "
        "max_score and checks."
    )
    issues_found: list[str] = Field(description="Every failed check, one line each (the verdict's issues).")
    recommendations: list[str] = Field(description="What to do next, one line per category with failures.")


def smoke_test(verdict: Verdict) -> SmokeTestResponse:
    """The verdict in seed 001's names, with seed 000's three-way state."""
    failing = [
        name for name, category in verdict.evidence.items() if any(not x.passed for x in category.checks)
    ]
    state: Literal["pass", "needs-work", "fail"] = "pass"
    if verdict.result == "FAIL":
        state = "fail"
    elif failing or verdict.issues:
        state = "needs-work"
    return SmokeTestResponse(
        verdict=verdict.result,
        state=state,
        mode=verdict.mode,
        score=verdict.score,
        max_score=verdict.max_score,
        pass_threshold=verdict.pass_threshold,
        evidence={
            snake(name): category.model_dump(mode="json") for name, category in verdict.evidence.items()
        },
        issues_found=list(verdict.issues),
        recommendations=[RECOMMENDATIONS[name] for name in failing if name in RECOMMENDATIONS],
    )


class HandoffManifest(BaseModel):
    """Seed 001's handoff manifest, with the verdict when one is known."""

    model_config = ConfigDict(extra="forbid", title="HandoffManifest")

    shadow_id: str | None = Field(description="The environment's name (null when none exists).")
    shadow_available: bool = Field(description="Whether the environment is Ready.")
    local_sources: list[ManifestSource] = Field(description="The sources under test.")
    test_context: TestContext
    fallback_mode: bool = Field(description="True when the shadow failed and checks ran on the host only.")
    failure_reason: str | None = Field(description="Why the shadow is not available: a stable failure code.")
    mode: Literal["shadow", "host-only"] = Field(description="Where the verdict's checks ran.")
    verdict: Verdict | None = Field(
        default=None, description="The last verdict (host-only: out of 50, pass at 35), as the API spells it."
    )
    smoke_test: SmokeTestResponse | None = Field(
        default=None,
        description="The same verdict in seed 001's response names (issues_found, "
        "recommendations, snake_case evidence) and seed 000's state (pass, needs-work, fail).",
    )
    seed_failure_reason: str | None = Field(
        default=None,
        description="failure_reason in seed 001's codes (docker_not_running, "
        "docker_not_installed, image_not_found, create_failed), for a protocol written against the seed.",
    )

    def dump(self) -> dict[str, Any]:
        """JSON-ready, with the verdict as the API spells it (camelCase), as the schema says, and in the seed's
        names beside it (derived from today's as it is dumped, so they never disagree)."""
        seed = {
            "smoke_test": smoke_test(self.verdict) if self.verdict is not None else None,
            "seed_failure_reason": (
                SEED_FAILURE_REASONS.get(self.failure_reason, "create_failed")
                if self.failure_reason
                else None
            ),
        }
        return self.model_copy(update=seed).model_dump(mode="json", by_alias=True)


# ------------------------------------------------------------------------------------------ pure parts
def github_repo(public_url: str | None, fallback: str | None) -> str | None:
    """org/name of a public URL like https://github.com/org/name(.git), else `fallback`."""
    if public_url:
        tail = public_url.strip().rstrip("/").removesuffix(".git")
        # A URL (scheme://host/org/name) or scp-like (git@host:org/name).
        repo_path = tail.split("://", 1)[1].partition("/")[2] if "://" in tail else tail.partition(":")[2]
        parts = repo_path.split("/")
        if len(parts) >= 2 and all(parts[-2:]):
            return "/".join(parts[-2:])
    return fallback


def affected_modules(files: Sequence[str], kinds: Mapping[str, ProjectType | None]) -> list[str]:
    """Modules of workspace-relative changed files; `kinds` maps a source path to its project type."""
    found: dict[str, None] = {}
    for path in files:
        source = next((s for s in sorted(kinds, key=len, reverse=True) if path.startswith(s + "/")), None)
        rel = PurePosixPath(path[len(source) + 1 :] if source else path)
        kind = kinds.get(source) if source else None
        module = _module(rel, kind)
        if module:
            found[module] = None
    return list(found)[:MAX_LISTED]


def build_test_context(
    changed: Sequence[str], kinds: Mapping[str, ProjectType | None], sources: Sequence[ManifestSource]
) -> TestContext:
    """What a smoke-test agent looks at first: the changed files, their modules, the first project type."""
    return TestContext(
        changed_files=list(changed[:MAX_LISTED]),
        affected_modules=affected_modules(changed, kinds),
        project_type=next((s.project_type for s in sources if s.project_type), None),
    )


def _module(rel: PurePosixPath, kind: ProjectType | None) -> str | None:
    parts = list(rel.parts)
    if not parts or parts[0].startswith("."):
        return None
    if rel.suffix == ".py" and kind in ("python", None):
        if parts[0] == "src" and len(parts) > 1:
            parts = parts[1:]
        parts[-1] = rel.stem
        if parts[-1] == "__init__":
            parts = parts[:-1]
        return ".".join(parts) or None
    if rel.suffix == ".rs" and kind == "rust":
        if parts[0] == "src":
            parts = parts[1:]
        parts[-1] = rel.stem
        if parts and parts[-1] in ("lib", "main", "mod"):
            parts = parts[:-1]
        return "::".join(["crate", *parts])
    if rel.suffix == ".go" and kind == "go":
        return str(rel.parent) if len(parts) > 1 else "."
    if rel.suffix in (".js", ".jsx", ".ts", ".tsx", ".mjs", ".cjs", ".vue", ".svelte") and kind == "node":
        return str(rel.parent) if len(parts) > 1 else "."
    return None


def build_manifest(
    env: ShadowEnvironment,
    diff: Diff | None,
    kinds: Mapping[str, ProjectType | None],
    recorded: Mapping[str, str],
) -> HandoffManifest:
    """The manifest of an environment from its status and diff; `kinds` maps each source's workspace path to
    its detected project type. A source's local `path` is the directory this machine recorded for it
    (`recorded`, source -> directory), and only while the cluster's annotation agrees (`localdirs.trusted_dir`):
    an agent acting on the manifest must not be sent to a directory a co-tenant wrote into the object."""
    status = env.status
    failure = status.failure if status else None
    ready = any(
        x.type == c.COND_READY and x.status == "True" for x in (status.conditions if status else None) or []
    )
    sources = []
    for s in (status.sources if status else None) or []:
        sources.append(
            ManifestSource(
                name=s.name,
                path=localdirs.trusted_dir(
                    recorded.get(s.name), env.metadata.annotations.get(ANNOTATION_LOCAL_PREFIX + s.name)
                ),
                github_repo=github_repo(s.public_url, s.repo),
                snapshot_commit=s.commit,
                project_type=kinds.get(s.path),
            )
        )
    changed = diff.changed_in([s.path for s in (status.sources if status else None) or []]) if diff else []
    return HandoffManifest(
        shadow_id=env.metadata.name,
        shadow_available=ready and failure is None,
        local_sources=sources,
        test_context=build_test_context(changed, kinds, sources),
        fallback_mode=False,
        failure_reason=failure.code if failure else None,
        mode="shadow",
        verdict=status.verdict if status else None,
    )


# ------------------------------------------------------------------------------------- the host side
def local_project_type(path: Path) -> ProjectType | None:
    return project_type([m for m, _ in PROJECT_MARKERS if (path / m).is_file()])


def _git(path: Path, *args: str) -> str | None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    try:
        done = subprocess.run(
            ["git", *args], cwd=path, env=env, capture_output=True, text=True, check=False, timeout=60
        )
    except (FileNotFoundError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


def local_changes(path: Path) -> list[str]:
    """Files changed since HEAD in a local repository (untracked, not ignored, included)."""
    listed = _git(path, "status", "--porcelain=v1", "-z", "--untracked-files=all")
    files: list[str] = []
    entries = iter((listed or "").split("\0"))
    for entry in entries:
        if len(entry) < 4:
            continue
        files.append(entry[3:])
        if entry[0] in "RC":
            next(entries, None)  # the rename's origin follows
    return files


def fallback_manifest(
    sources: Sequence[LocalSource], failure_reason: str, shadow_id: str | None, verdict: Verdict | None
) -> HandoffManifest:
    """The manifest when no shadow can be had: the local directories, their changes since HEAD."""
    entries = [
        ManifestSource(
            name=s.source_name,
            path=str(s.path),
            github_repo=s.repo
            or github_repo((_git(s.path, "remote", "get-url", "origin") or "").strip(), None),
            snapshot_commit=None,
            project_type=local_project_type(s.path),
        )
        for s in sources
    ]
    kinds = {s.source_name: e.project_type for s, e in zip(sources, entries, strict=True)}
    changed = sorted(f"{s.source_name}/{f}" for s in sources for f in local_changes(s.path))
    return HandoffManifest(
        shadow_id=shadow_id,
        shadow_available=False,
        local_sources=entries,
        test_context=build_test_context(changed, kinds, entries),
        fallback_mode=True,
        failure_reason=failure_reason,
        mode="host-only",
        verdict=verdict,
    )


# ---------------------------------------------------------------------------------- from a cluster
# Which marker files each source directory holds (argv: the directories); only known names are believed.
_DETECT = (
    'for d in "$@"; do for f in '
    + " ".join(m for m, _ in PROJECT_MARKERS)
    + ' ; do [ -f "$d/$f" ] && printf "%s\\t%s\\n" "$d" "$f"; done; done; true'
)


def detect_kinds(ep: runtime.RuntimeEndpoint, paths: Sequence[str]) -> Op[dict[str, ProjectType | None]]:
    """The project type of each source directory in the workspace (one command, not journalled)."""
    if not paths:
        return {}
    result = yield from runtime.run_command(
        ep, ["sh", "-c", _DETECT, "sh", *paths], journal=False, timeout=30.0
    )
    found: dict[str, list[str]] = {p: [] for p in paths}
    for line in result.stdout.splitlines():
        directory, _, marker = line.partition("\t")
        if directory in found and any(marker == m for m, _ in PROJECT_MARKERS):
            found[directory].append(marker)
    return {p: project_type(markers) for p, markers in found.items()}


def manifest(namespace: str, name: str, recorded: Mapping[str, str]) -> Op[HandoffManifest]:
    """The manifest of a running environment; one that is not Ready (yet, or failed) gets no diff. `recorded`:
    the local directories this machine recorded for its sources (`build_manifest`)."""
    env = yield from envops.get(namespace, name)
    m = build_manifest(env, None, {}, recorded)
    if not m.shadow_available:
        return m
    try:
        ep = yield from envops.runtime_endpoint(env)
        diff = yield from runtime.diff(ep, paths_only=True)
        kinds = yield from detect_kinds(
            ep, [s.path for s in (env.status.sources if env.status else None) or []]
        )
    except (SandboxNotReadyError, RuntimeUnreachable, RuntimeRefused):
        return m.model_copy(update={"shadow_available": False})
    return build_manifest(env, diff, kinds, recorded)


# ------------------------------------------------------------------------------------- the fallback
# What makes an environment impossible to have: no cluster, no operator (or its API), or a failure code.
UNAVAILABLE: tuple[type[ShadowError], ...] = (
    ClusterUnreachable,
    OperatorNotRunning,
    ApiNotInstalled,
    EnvironmentFailed,
)


def known_environment(namespace: str, name: str) -> Op[ShadowEnvironment | None]:
    """The environment when the cluster answers for it, else None (the fallback works without)."""
    try:
        return (yield from envops.get(namespace, name))
    except ShadowError:
        return None


def recorded_sources(
    env: ShadowEnvironment | None, recorded: Mapping[str, str]
) -> tuple[list[LocalSource], list[str]]:
    """The local directories this machine recorded for the environment (where it was created, uploaded or
    forked from), and a note per directory the cluster names that is not copied.

    The annotations `local.shadow.dev/<source>` are the cluster's word, which anyone who may patch the object
    (a co-tenant of the namespace) chooses, e.g. `~`: as for promote, one counts only where it matches this
    machine's record (`localdirs.trusted_dir`), so a directory named by the cluster alone is never copied, nor
    are commands run in a copy of it."""
    annotations = env.metadata.annotations if env is not None else {}
    annotated = {
        key[len(ANNOTATION_LOCAL_PREFIX) :]: value
        for key, value in annotations.items()
        if key.startswith(ANNOTATION_LOCAL_PREFIX)
    }
    sources, refused = [], []
    for name in sorted(set(recorded) | set(annotated)):
        trusted = localdirs.trusted_dir(recorded.get(name), annotated.get(name))
        if trusted is None:
            refused.append(
                f"source {name!r} says it came from {annotated[name]}, which this machine has no record of "
                "(it records the directories it creates, uploads and forks from): not copied"
            )
        elif Path(trusted).is_dir():
            sources.append(LocalSource(Path(trusted), name=name))
    return sources, refused


def fallback_for(
    exc: ShadowError | None,
    reason: str,
    lookup: Callable[[], ShadowEnvironment | None],
    recorded: Mapping[str, str],
    workspace_path: Path | None,
    spec: EnvironmentSpec | None,
    name: str,
) -> HandoffManifest:
    """The host-only manifest of a gateway whose environment cannot be had. The sources are those given
    (`spec`'s, or workspace_path), else those this machine recorded (`recorded_sources`); the environment is
    looked up for them unless the cluster itself is out of reach.

    The environment's verification commands are never taken from the cluster to run on this machine: whoever
    may edit the object would otherwise run code on the caller's host. They are named in a note instead; the
    caller gives the commands to run (`--verify`, verify_commands)."""
    env = None if isinstance(exc, ClusterUnreachable) else lookup()
    sources = list(spec.local) if spec else ([LocalSource(workspace_path)] if workspace_path else [])
    given = list(spec.verify_commands) if spec else []
    notes: list[str] = []
    if not sources:
        sources, notes = recorded_sources(env, recorded)
        if not sources and notes:
            raise hostonly.FallbackNotPossible(notes[0])
    declared = (env.spec.verify.commands if env is not None else None) or []
    if declared and not given:
        notes.append(
            f"the environment declares {len(declared)} verification command(s); commands read from the cluster "
            "are not run on this machine: give them (--verify CMD, or verify_commands) to run them here"
        )
    found = host_only(name, reason, sources, hostonly.commands_of(given))
    if found.verdict is not None:
        found.verdict.issues.extend(notes)
    return found


def host_only(
    name: str | None,
    failure_reason: str,
    sources: Sequence[LocalSource],
    commands: Sequence[HostCommand],
) -> HandoffManifest:
    """Verify on the host (in a temporary copy) and say so: fallback_mode, failure_reason, mode host-only."""
    verdict = hostonly.verify_on_host(sources, commands, failure_reason)
    return fallback_manifest(sources, failure_reason, name, verdict)


# --------------------------------------------------------------------------------------------- schema
def json_schema() -> dict[str, Any]:
    schema = HandoffManifest.model_json_schema(by_alias=True, mode="serialization")
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": "https://shadow.dev/schemas/handoff-manifest.schema.json",
        **schema,
    }


def render_schema() -> str:
    return json.dumps(json_schema(), indent=2, sort_keys=True) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    """Write the schema (default) or, with --check, exit 1 when the checked-in one is stale."""
    args = list(sys.argv[1:] if argv is None else argv)
    text = render_schema()
    if "--check" in args:
        current = SCHEMA_PATH.read_text() if SCHEMA_PATH.exists() else ""
        if current != text:
            print(f"{SCHEMA_PATH} is stale: run python -m shadow_operator.sdk.manifest", file=sys.stderr)
            return 1
        return 0
    SCHEMA_PATH.parent.mkdir(parents=True, exist_ok=True)
    SCHEMA_PATH.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
