"""Pydantic model of ShadowEnvironment (shadow.dev/v1alpha1): the single source of truth for its CRD.

A ShadowEnvironment is an isolated copy of someone's work: each source is copied into a workspace volume (never
mounted from the user's machine), mirrored into the environment's own Gitea, and git inside the workspace is told
to fetch the named GitHub prefixes from that Gitea instead, so "install from a git URL" is exercised for real
before anything is pushed. The status carries the snapshot commit of every source, a stable failure code when
something cannot work, and a verdict an automation can act on (the smoke-test handoff of seed 001).
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, model_validator

from shadow_operator.api.models import (
    AUTO_SUSPEND_POLICY_DESCRIPTION,
    CONDITIONS_FIELD,
    MAX_ENV,
    PRESERVE,
    ApiModel,
    AutoSuspendPolicy,
    ClaimEnvVar,
    Condition,
    EgressNarrowing,
    Resource,
    cel,
    validations,
)

MAX_SOURCES = 32
MAX_REWRITES = 32
MAX_VERIFY_COMMANDS = 32
DNS_LABEL = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"
DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
# The name of another object (a template, a StorageClass, a snapshot...); unset means a default.
ObjectName = Annotated[str | None, Field(max_length=253)]
# A Gitea owner (organization) and a repository name: letters, digits, `-`, `_`, `.`.
GITEA_NAME = r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,99}"
# Paths as RE2 patterns (the API server's regex engine has no lookahead): segments that are not empty, `.`
# or `..`, so no path can climb out of the workspace.
SEGMENT = r"([^/.][^/]*|\.[^/.][^/]*|\.\.[^/]+)"
RELATIVE_PATH = rf"^{SEGMENT}(/{SEGMENT})*$"
ABSOLUTE_PATH = rf"^(/{SEGMENT})+$"
QUANTITY = r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?$"

FailureCode = Literal[
    "TemplateNotFound",
    "ImagePullFailed",
    "Unschedulable",
    "StorageUnavailable",
    "RuntimeClassNotFound",
    "SourceFetchFailed",
    "GiteaBootstrapFailed",
    "Timeout",
    "CloneSourceNotFound",
    "SnapshotUnsupported",
    "SnapshotFailed",
    "SnapshotTimeout",
    "CopyFailed",
    "RuntimeStalled",
    "AutoSuspendPolicyRefused",
    "GiteaStalled",
]
CloneMethod = Literal["Snapshot", "Copy"]
OperationKind = Literal["CopyIn", "CloneCopy", "Push", "GiteaSetup"]
Category = Literal["sourceVerification", "installationHealth", "codeExecution"]
Probe = Literal["SourceCommit", "ProjectKind"]


# ------------------------------------------------------------------------------------------------ spec
class GitSource(ApiModel):
    """Clone the source from a git URL."""

    url: str = Field(
        min_length=1,
        max_length=2048,
        description="Clone URL (https://, http://, git:// or file://). It is cloned as is: the environment's "
        "git rewrites do not apply to it.",
        pattern=r"^(https?|git|file)://\S+$",
    )
    ref: str | None = Field(
        default=None,
        max_length=255,
        description="Branch, tag or commit to check out; default: the remote's default branch.",
    )


class UploadSource(ApiModel):
    """Filled by the client from a local working tree (uncommitted changes and untracked files that are not
    ignored included), e.g. `shadowctl create --local PATH`."""


class Source(ApiModel):
    """One repository copied into the workspace and mirrored into the environment's Gitea."""

    model_config = ConfigDict(
        json_schema_extra=validations(
            cel(
                "has(self.git) != has(self.upload)",
                "a source needs exactly one of git: {url, ref} or upload: {}",
            )
        )
    )

    name: str = Field(
        max_length=63,
        pattern=DNS_LABEL,
        description="Name of the source (a DNS label), unique in the environment.",
    )
    path: str | None = Field(
        default=None,
        max_length=1024,
        pattern=RELATIVE_PATH,
        description="Directory under the workspace's mountPath the source is copied to; default: its name.",
    )
    repo: str = Field(
        max_length=201,
        pattern=rf"^({GITEA_NAME}/)?{GITEA_NAME}$",
        description="Repository in the environment's Gitea, `org/name` (or `name` for spec.gitea.organization). "
        "Git rewrites point the public URL of this repository here.",
    )
    git: GitSource | None = Field(default=None, description="Clone from a git URL.")
    upload: UploadSource | None = Field(default=None, description="Uploaded by the client.")


class WorkspaceFrom(ApiModel):
    """Start the workspace as a copy of another one (a fork) instead of copying the sources in."""

    model_config = ConfigDict(
        json_schema_extra=validations(
            cel(
                "has(self.environment) != has(self.snapshot)",
                "workspace.from needs exactly one of environment (fork a running environment) or "
                "snapshot (a VolumeSnapshot)",
            ),
            cel(
                "!has(self.snapshot) || self.method != 'Copy'",
                "a VolumeSnapshot can only be restored: method Copy needs from.environment",
            ),
        )
    )

    environment: ObjectName = Field(
        default=None,
        pattern=DNS_LABEL,
        description="Fork this ShadowEnvironment (same namespace): its workspace is snapshotted after a "
        "filesystem flush (or copied, see method) and this one starts from it. The source keeps running.",
    )
    snapshot: ObjectName = Field(
        default=None,
        description="Restore this VolumeSnapshot (same namespace), e.g. one taken by `shadowctl snapshot`.",
    )
    method: Literal["Auto", "Snapshot", "Copy"] = Field(
        default="Auto",
        description="Auto: a VolumeSnapshot when the source volume's CSI driver has a VolumeSnapshotClass, "
        "else a copy streamed through the two runtimes. Snapshot: fail with SnapshotUnsupported instead of "
        "copying. Copy: always copy. status.cloneMethod says which was used, and the Cloned condition why.",
    )
    timeout_seconds: int = Field(
        default=300,
        ge=10,
        le=86400,
        description="Fail with SnapshotTimeout (or CopyFailed) when the snapshot is not readyToUse, or the copy "
        "not done, this long after it started.",
    )
    retain_snapshot: bool = Field(
        default=False,
        description="Keep the VolumeSnapshot taken for the fork when this environment is deleted (it is "
        "owned by the environment otherwise; `shadowctl cleanup` finds it once the environment is gone).",
    )


class WorkspaceVolume(ApiModel):
    """The workspace volume."""

    mount_path: str = Field(
        default="/workspace",
        max_length=1024,
        pattern=ABSOLUTE_PATH,
        description="Absolute path the workspace is mounted at. It may be the same path as on your machine "
        "(path preservation), so absolute paths in configs and lockfiles keep working.",
    )
    size: str = Field(default="10Gi", pattern=QUANTITY, description="Size of the workspace volume.")
    storage_class_name: ObjectName = Field(
        default=None,
        description="StorageClass of the volume; default: the cluster's default (for a fork: the class of "
        "the volume it starts from).",
    )


class WorkspaceSpec(WorkspaceVolume):
    """The workspace volume, and what it starts as."""

    from_: WorkspaceFrom | None = Field(
        default=None,
        alias="from",
        description="Start as a copy of another environment's workspace or of a VolumeSnapshot. The files "
        "land at the same relative paths; keep mountPath equal to the source's for absolute paths to work.",
    )


class GiteaPersistence(ApiModel):
    """Where Gitea keeps its data: a volume of its own, or the Pod's emptyDir (the default)."""

    model_config = ConfigDict(
        json_schema_extra=validations(
            cel(
                "!self.retain || self.enabled",
                "retain: true keeps Gitea's volume after the environment is deleted, but Gitea has no "
                "volume unless enabled: true; set spec.gitea.persistence.enabled: true too, or drop retain",
            ),
            cel(
                "self.enabled == oldSelf.enabled && self.size == oldSelf.size",
                "spec.gitea.persistence.enabled and size cannot change once the environment exists (Gitea "
                "keeps the storage it started with); create a new environment for other storage",
                reason="FieldValueForbidden",
            ),
        )
    )

    enabled: bool = Field(
        default=False,
        description="Give Gitea a PersistentVolumeClaim of `size` (one per environment, which waits for the "
        "provisioner). Default: an emptyDir limited to `size`, ready at once but lost when Gitea's Pod is "
        "replaced (rescheduled, evicted, or restarted with a new template by the operator); the operator then "
        "sets Gitea up again and pushes each copied-in source's snapshot again from the workspace as it is at "
        "that moment (status.sources[].commit changes if its files did; the event GiteaDataLost says so). "
        "Branches pushed later (shadowctl promote, publish) are not restored. Immutable.",
    )
    size: str = Field(
        default="1Gi",
        pattern=QUANTITY,
        description="Size of Gitea's volume, or the size limit of its emptyDir. Immutable.",
    )
    retain: bool = Field(
        default=False,
        description="Keep Gitea's volume when the environment is deleted (everything else is removed). "
        "Needs enabled: true.",
    )


class GiteaSpec(ApiModel):
    """The environment's own git server."""

    enabled: bool = Field(default=True, description="Run a Gitea for this environment.")
    organization: str = Field(
        default="shadow",
        max_length=100,
        pattern=rf"^{GITEA_NAME}$",
        description="Organization of sources whose repo names no organization.",
    )
    persistence: GiteaPersistence = Field(
        default_factory=GiteaPersistence,
        description="Gitea's storage: an emptyDir by default, a volume with enabled: true.",
    )


class GitRewrite(ApiModel):
    """Fetch URLs starting with `from` from the environment's Gitea organization `to` (git `insteadOf`)."""

    from_: str = Field(
        alias="from",
        min_length=1,
        max_length=1024,
        pattern=r"^(https?|git|ssh)://\S+/$|^git@\S+[:/]$",
        description="URL prefix to redirect, ending in `/`, e.g. https://github.com/microsoft/.",
    )
    to: str = Field(
        max_length=100, pattern=rf"^{GITEA_NAME}$", description="Gitea organization the prefix maps to."
    )


class PreviewSpec(ApiModel):
    """The dev server people look at."""

    port: int | None = Field(default=None, ge=1, le=65535, description="Port of the preview dev server.")


class VerifyCommand(ApiModel):
    """A command whose exit code counts towards the verdict."""

    name: str = Field(max_length=63, pattern=DNS_LABEL, description="Name shown in the evidence.")
    command: str = Field(min_length=1, max_length=8192, description="Shell command (`sh -c`).")
    cwd: str | None = Field(
        default=None,
        max_length=1024,
        pattern=RELATIVE_PATH,
        description="Working directory relative to the workspace; default: its root.",
    )
    timeout_seconds: int = Field(default=600, ge=1, le=86400, description="Killed after this long.")


class VerifySpec(ApiModel):
    """The smoke test run once the sources are in place (seed 001's rubric)."""

    enabled: bool = Field(default=True, description="Verify automatically once the sources are ready.")
    commands: list[VerifyCommand] | None = Field(
        default=None,
        max_length=MAX_VERIFY_COMMANDS,
        description="Commands that must exit 0 (code execution).",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
    )
    install: bool = Field(
        default=True,
        description="Install every Python and Node.js source from its rewritten git URL (installation "
        "health).",
    )
    pass_threshold: int = Field(default=75, ge=0, le=100, description="Score (of 100) needed to PASS.")


class WorkspaceShape(ApiModel):
    """What an environment's workspace Pod and Gitea are made of (a ShadowEnvironmentPool has the same
    fields: its started instances are taken by environments whose values are the pool's)."""

    gitea: GiteaSpec = Field(default_factory=GiteaSpec, description="The environment's own git server.")
    git_rewrites: list[GitRewrite] | None = Field(
        default=None,
        max_length=MAX_REWRITES,
        description="URL prefixes that git, pip, uv and npm inside the workspace fetch from this "
        "environment's Gitea instead. Only these prefixes are redirected.",
        json_schema_extra={"x-kubernetes-list-type": "atomic"},
    )
    template: ObjectName = Field(
        default=None,
        description="SandboxTemplate (same namespace) the workspace starts from; default: the operator's "
        "default template.",
    )
    runtime_class_name: ObjectName = Field(
        default=None,
        pattern=DNS_SUBDOMAIN,
        description="RuntimeClass of the workspace Pod (replaces the template's), e.g. `gvisor` to run it "
        "under gVisor's user-space kernel; default: the template's (none: the node's default runtime). A "
        "class the cluster does not have is a failure (status.failure.code RuntimeClassNotFound).",
    )
    env: list[ClaimEnvVar] | None = Field(
        default=None,
        max_length=MAX_ENV,
        description="Environment variables of the workspace.",
        json_schema_extra={"x-kubernetes-list-type": "atomic"},
    )
    resources: dict[str, Any] | None = Field(
        default=None,
        description="core/v1 ResourceRequirements of the workspace container, laid over the template's key by "
        "key: a request or limit named here replaces the template's, the others are kept.",
        json_schema_extra={"type": "object", **PRESERVE},
    )
    preview: PreviewSpec | None = Field(default=None, description="The preview dev server.")
    journal: bool = Field(
        default=True, description="Record the command journal and keep HANDOFF.md in the workspace."
    )


class ShadowEnvironmentSpec(WorkspaceShape):
    """Desired state of a ShadowEnvironment."""

    model_config = ConfigDict(
        json_schema_extra=validations(
            cel(
                "has(self.sources) || has(self.workspace.from)",
                "spec.sources is required unless spec.workspace.from names an environment or a snapshot "
                "to start from",
            ),
            cel(
                "has(self.sources) == has(oldSelf.sources)",
                "spec.sources is immutable: create a new environment for other sources",
                reason="FieldValueForbidden",
            ),
            cel(
                "!has(self.idleTimeoutSeconds) || !has(self.autoSuspendPolicy)",
                "set spec.autoSuspendPolicy or spec.idleTimeoutSeconds (its older short form), not both",
            ),
        )
    )

    sources: list[Source] | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_SOURCES,
        description="Repositories to copy in. Immutable: create a new environment for other sources. A fork "
        "(workspace.from) inherits its source's when this is unset; the files come with the clone.",
        json_schema_extra={
            "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": ["name"],
            "x-kubernetes-validations": [
                cel(
                    "self == oldSelf",
                    "spec.sources is immutable: create a new environment for other sources",
                    reason="FieldValueForbidden",
                ),
                cel(
                    "self.all(s, self.exists_one(t, t.repo == s.repo))",
                    "two sources cannot share one Gitea repo",
                ),
            ],
        },
    )
    workspace: WorkspaceSpec = Field(
        default_factory=WorkspaceSpec,
        description="The workspace volume. Immutable.",
        json_schema_extra={
            "x-kubernetes-validations": [
                cel("self == oldSelf", "spec.workspace is immutable", reason="FieldValueForbidden")
            ]
        },
    )
    pool: str | None = Field(
        default=None,
        max_length=63,
        pattern=DNS_LABEL,
        description="ShadowEnvironmentPool (same namespace) to take a started workspace and Gitea from, "
        "instead of starting them (seconds sooner). Taken only when this environment's template, workspace, "
        "gitea, gitRewrites, env, resources, preview and journal equal the pool's and it is not a fork; "
        "otherwise, or when the pool has no Ready instance, they are started as usual and status.pool says "
        "why. Read once, at creation.",
    )
    egress: EgressNarrowing | None = Field(
        default=None,
        description="Narrows the template's spec.egress for this workspace (never widens it); ignored when "
        "the template has none. The environment's own Gitea stays reachable.",
    )
    shutdown_time: datetime | None = Field(
        default=None, description="Absolute time when the workspace expires (its Pod is removed)."
    )
    auto_suspend_policy: AutoSuspendPolicy | None = Field(
        default=None,
        description=AUTO_SUSPEND_POLICY_DESCRIPTION
        + " Given to the workspace Sandbox, which suspends (its Pod "
        "removed, its volume and Gitea kept); set the annotation on the environment (shadowctl start) or on "
        "its Sandbox. Overrides the template's, within it: a threshold longer than the template's fails "
        "with AutoSuspendPolicyRefused.",
    )
    idle_timeout_seconds: int | None = Field(
        default=None,
        ge=60,
        description="The older short form of autoSuspendPolicy.suspendThresholdSeconds (at least 60 here).",
    )
    suspend: bool = Field(
        default=False,
        description="Stop the workspace while true: its Pod is removed, its volume (uncommitted work "
        "included) and Gitea are kept; set it back to false to start the workspace again as it was "
        "(shadowctl stop / start).",
    )
    startup_timeout_seconds: int = Field(
        default=600,
        ge=30,
        le=86400,
        description="Fail with code Timeout when the environment is not Ready this long after creation.",
    )
    verify: VerifySpec = Field(default_factory=VerifySpec, description="The smoke test and its verdict.")


# ---------------------------------------------------------------------------------------------- status
class SourceStatus(ApiModel):
    """A source as it was copied in."""

    name: str = Field(description="Source name.")
    repo: str = Field(description="Gitea repository, org/name.")
    path: str = Field(description="Directory in the workspace, relative to mountPath.")
    commit: str = Field(
        description="Snapshot commit: the source's tree as copied in, uncommitted work included."
    )
    branch: str = Field(description="Branch of the Gitea repository that holds the snapshot.")
    clone_url: str = Field(alias="cloneURL", description="In-cluster clone URL of the Gitea repository.")
    public_url: str | None = Field(
        default=None,
        alias="publicURL",
        description="The URL people and lockfiles use that a git rewrite sends to this repository.",
    )


class Failure(ApiModel):
    """Why the environment cannot become Ready, as a stable code an automation can branch on."""

    code: FailureCode = Field(description="Stable failure code.")
    message: str = Field(description="What happened and what to do next.")


class Check(ApiModel):
    """One check of the verdict's rubric."""

    name: str = Field(description="What was checked.")
    passed: bool = Field(description="Whether it passed.")
    detail: str = Field(default="", description="Evidence: command, exit code, the tail of its output.")


class EvidenceCategory(ApiModel):
    """A rubric category: its share of the score and the checks behind it."""

    score: int = Field(description="Points earned.")
    max_score: int = Field(description="Points possible.")
    checks: list[Check] = Field(default_factory=list, description="The checks.")


class Verdict(ApiModel):
    """The smoke test's verdict (seed 001's shape)."""

    result: Literal["PASS", "FAIL"] = Field(description="PASS when score >= passThreshold.")
    score: int = Field(ge=0, description="Points earned, scaled to maxScore.")
    max_score: int = Field(ge=1, description="Points possible.")
    pass_threshold: int = Field(ge=0, description="Score needed to PASS.")
    mode: Literal["shadow", "host-only"] = Field(default="shadow", description="Where the checks ran.")
    evidence: dict[str, EvidenceCategory] = Field(
        default_factory=dict,
        description="Per category: sourceVerification, installationHealth, codeExecution.",
    )
    issues: list[str] = Field(default_factory=list, description="Every failed check, one line each.")
    verified_at: datetime | None = Field(default=None, description="When the checks ran.")
    observed_generation: int | None = Field(default=None, description="The generation verified.")
    trigger: str | None = Field(
        default=None,
        description="The shadow.dev/verify-requested annotation this verdict answers (a new value re-runs "
        "the checks).",
    )


class VerifyRunCheck(ApiModel):
    """A check of the verification under way: done once `passed` is set."""

    category: Category = Field(description="The rubric category it counts in.")
    name: str = Field(description="What is checked, as the verdict's evidence names it.")
    passed: bool | None = Field(default=None, description="Its outcome; unset while it has not ended.")
    detail: str = Field(default="", description="Evidence: exit code, the tail of the output.")
    source: str | None = Field(default=None, description="An install check's source.")
    tool: Literal["pip", "npm"] | None = Field(default=None, description="An install check's installer.")
    command: str | None = Field(default=None, description="A verify command's name (spec.verify.commands).")
    probe: Probe | None = Field(
        default=None,
        description="A quick check of a source, run beside the other sources' before the install checks and "
        "verify commands: SourceCommit (the workspace has the snapshot commit) or ProjectKind (what the source "
        "is, python, node or other: it adds the source's install check and is not scored itself).",
    )
    process: str | None = Field(
        default=None, description="The runtime's id of the background process running the check."
    )
    started_at: datetime | None = Field(default=None, description="When its process was started.")
    deadline: datetime | None = Field(
        default=None, description="When the operator stops waiting for the process (its timeout and 30 s)."
    )


class VerifyRun(ApiModel):
    """The verification under way. Each check that runs in the workspace is a background process of its
    runtime, which the operator starts and then looks in on, so no operator worker waits for it; an operator that
    takes over (a leader change, a restart) carries on from here instead of running a check again."""

    generation: int = Field(description="The generation being verified.")
    trigger: str | None = Field(default=None, description="The shadow.dev/verify-requested value it answers.")
    started_at: datetime = Field(description="When it started.")
    checks: list[VerifyRunCheck] = Field(default_factory=list, description="Its checks, in order.")


class OperationRun(ApiModel):
    """Long work under way for the environment, off the operator's workers: a source's copy-in (CopyIn), a
    fork's copy between the runtimes (CloneCopy), the answer to a push request (Push) or the setup of its Gitea
    (GiteaSetup, in status.giteaOperation). The operator that started it reads its outcome when it ends; one that
    takes over (a restart, a leader change) finds an operation it does not run: a copy-in's snapshot running in
    the workspace is waited for, not started again; a fork's copy is started again (it overwrites the same files);
    a push is not run twice but answered as interrupted; Gitea's setup is carried on under the same id (each of
    its steps leaves alone what exists)."""

    kind: OperationKind = Field(description="What runs: CopyIn, CloneCopy, Push or GiteaSetup.")
    id: str = Field(description="The operator's id of the operation.")
    source: str | None = Field(default=None, description="A copy-in's source.")
    request: str | None = Field(default=None, description="A push: the id of the request it answers.")
    push: bool | None = Field(
        default=None,
        description="A copy-in: true when it pushes to Gitea, false when it only prepares the "
        "workspace while Gitea starts.",
    )
    process: str | None = Field(
        default=None,
        description="A copy-in: the runtime's id of the background process snapshotting the source in the "
        "workspace. An operator that takes over waits for this process instead of starting the clone again.",
    )
    started_at: datetime = Field(description="When it was started.")
    deadline: datetime = Field(
        description="When the operator ends it if it is still under way (later by as long as it waited for a "
        "slot, operator.operations)."
    )
    taken_over: int | None = Field(
        default=None,
        description="How many times an operator that had not started it carried it on (a restart, a leader "
        "change).",
    )


class IdleStatus(ApiModel):
    """Suspension after spec.idleTimeoutSeconds without runtime activity."""

    suspended_at: datetime | None = Field(
        default=None, description="When the idle workspace was suspended (its Pod removed, its volume kept)."
    )
    resume_request: str | None = Field(
        default=None,
        description="The shadow.dev/resume-requested annotation value that last resumed the workspace.",
    )


class InheritedSource(ApiModel):
    """A source that came with a fork's clone."""

    name: str = Field(description="Source name.")
    repo: str = Field(description="Gitea repository, org/name.")
    path: str = Field(description="Directory in the workspace, relative to mountPath.")


class CloneStatus(ApiModel):
    """How the workspace was cloned from spec.workspace.from."""

    method: CloneMethod = Field(description="Snapshot (a VolumeSnapshot restored) or Copy (a tar stream).")
    reason: str = Field(description="Why this method was chosen.")
    source: str = Field(description="What was cloned: environment/<name> or volumesnapshot/<name>.")
    snapshot: str | None = Field(default=None, description="The VolumeSnapshot restored.")
    snapshot_class_name: str | None = Field(
        default=None, description="The VolumeSnapshotClass of the snapshot taken for the fork."
    )
    storage_class_name: str | None = Field(default=None, description="StorageClass of the new volume.")
    restore_size: str | None = Field(
        default=None,
        description="Smallest size of the new volume: the snapshot's restoreSize, or the source volume's size.",
    )
    sources: list[InheritedSource] | None = Field(
        default=None, description="The sources inherited with the clone (when spec.sources is unset)."
    )
    started_at: datetime | None = Field(default=None, description="When cloning started.")
    completed_at: datetime | None = Field(
        default=None, description="When the cloned workspace was usable (its Pod Ready with the files)."
    )
    copied_bytes: int | None = Field(default=None, description="Bytes streamed (method Copy).")


MAX_PUSH_MESSAGE = 4096


class PushRequest(ApiModel):
    """A push the client asks the operator to make into the environment's Gitea (the annotation
    shadow.dev/push-request, JSON). The operator pushes, not the workspace: the Gitea token never enters it.

    With `source`, the source's working tree is committed on top of its HEAD (with `message`) and pushed to
    `branch` of its repository (`shadowctl promote --to-branch`). With `path` (a directory the client
    uploaded into the workspace) and `repo`, the directory is snapshotted like a source and pushed with its
    branches and tags to `repo`, created when missing (`shadowctl publish`).
    """

    id: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$", description="Unique per request.")
    source: str | None = Field(default=None, pattern=DNS_LABEL, description="A source to promote.")
    branch: str | None = Field(
        default=None, min_length=1, max_length=200, description="The branch to push the source to."
    )
    message: str = Field(
        default="shadow promote", max_length=MAX_PUSH_MESSAGE, description="Commit message of the promote."
    )
    path: str | None = Field(
        default=None,
        pattern=RELATIVE_PATH,
        max_length=1024,
        description="A directory of the workspace to publish, relative to mountPath.",
    )
    repo: str | None = Field(
        default=None,
        pattern=rf"^{GITEA_NAME}/{GITEA_NAME}$",
        description="The Gitea repository (org/name) to publish to.",
    )

    @model_validator(mode="after")
    def _one_kind(self) -> PushRequest:
        if (self.source is None) == (self.path is None):
            raise ValueError("a push request names either a source (promote) or a path (publish)")
        if self.source is not None and not self.branch:
            raise ValueError("a promote to a branch needs the branch")
        if self.path is not None and not self.repo:
            raise ValueError("a publish needs the repository (org/name)")
        for name in (self.repo or "").split("/"):
            if name in (".", "..") or name.endswith((".git", ".wiki")):
                raise ValueError(f"{name!r} is not a repository or organization name Gitea accepts")
        return self


class PushStatus(ApiModel):
    """The answer to the last push request (shadow.dev/push-request)."""

    id: str = Field(description="The request answered.")
    repo: str | None = Field(default=None, description="Gitea repository, org/name.")
    branch: str | None = Field(default=None, description="The branch pushed.")
    commit: str | None = Field(default=None, description="The commit pushed.")
    clone_url: str | None = Field(default=None, alias="cloneURL", description="In-cluster clone URL.")
    error: str | None = Field(default=None, description="Why the push failed (unset when it succeeded).")
    finished_at: datetime | None = Field(default=None, description="When the push finished.")


class PhaseTimings(ApiModel):
    """When each phase of the environment first finished (the environment's creation is metadata's)."""

    scheduled: datetime | None = Field(default=None, description="The workspace Pod was bound to a node.")
    workspace_ready: datetime | None = Field(default=None, description="The workspace Pod was Ready.")
    gitea_ready: datetime | None = Field(
        default=None, description="Gitea was up with its organizations and repositories."
    )
    uploaded: datetime | None = Field(
        default=None, description="Every uploaded source (spec.sources[].upload) had arrived."
    )
    copied_in: datetime | None = Field(
        default=None, description="Every source was in the workspace and in Gitea (SourcesReady)."
    )
    ready: datetime | None = Field(default=None, description="The environment was Ready.")
    verified: datetime | None = Field(default=None, description="The first verdict was written.")
    cloned: datetime | None = Field(
        default=None, description="A fork's workspace held the source's files (Cloned)."
    )


class PoolAdoption(ApiModel):
    """Whether the environment took its workspace and Gitea from its pool (spec.pool)."""

    name: str = Field(description="The ShadowEnvironmentPool asked for.")
    adopted: bool = Field(
        description="The workspace and Gitea came from the pool (status.sandbox names them)."
    )
    reason: str = Field(
        description="Adopted; PoolNotFound; PoolEmpty (no Ready instance); PoolMismatch (a field differs "
        "from the pool's); Fork (a fork's volume comes from its source)."
    )
    message: str | None = Field(default=None, description="What happened, for people.")


class ShadowEnvironmentStatus(ApiModel):
    """Observed state of a ShadowEnvironment."""

    conditions: list[Condition] | None = CONDITIONS_FIELD
    observed_generation: int | None = Field(default=None, description="Generation last acted upon.")
    sandbox: str | None = Field(
        default=None,
        description="The workspace Sandbox. Its name is the environment's, or the pool instance's it adopted "
        "(spec.pool); the Gitea StatefulSet, Service and Secret are named after it too (`<sandbox>-gitea`).",
    )
    pool: PoolAdoption | None = Field(default=None, description="What came of spec.pool.")
    runtime_url: str | None = Field(
        default=None, alias="runtimeURL", description="In-cluster URL of the workspace's runtime API."
    )
    runtime_token_secret: str | None = Field(
        default=None, description="Secret holding the runtime's bearer token (key `token`)."
    )
    preview_url: str | None = Field(default=None, alias="previewURL", description="Preview URL.")
    gitea_url: str | None = Field(
        default=None, alias="giteaURL", description="In-cluster base URL of the environment's Gitea."
    )
    gitea_pod_uid: str | None = Field(
        default=None,
        alias="giteaPodUID",
        description="The Gitea Pod the organizations and repositories were last set up in. A new Pod is set up "
        "again, and a source whose snapshot branch it lacks (its data was lost) is pushed again.",
    )
    sources: list[SourceStatus] | None = Field(
        default=None,
        description="Every source copied in, with its snapshot commit.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
    )
    sources_ready: str | None = Field(default=None, description="Sources copied in, of all (e.g. 2/2).")
    idle: IdleStatus | None = Field(default=None, description="Idle suspension of the workspace.")
    clone_method: CloneMethod | None = Field(
        default=None, description="How a fork's workspace was cloned (spec.workspace.from): Snapshot or Copy."
    )
    clone: CloneStatus | None = Field(default=None, description="Details of the clone (spec.workspace.from).")
    failure: Failure | None = Field(default=None, description="Set while the environment cannot work.")
    verdict: Verdict | None = Field(default=None, description="The last verification's verdict.")
    verify_run: VerifyRun | None = Field(default=None, description="The verification under way, if any.")
    operation: OperationRun | None = Field(
        default=None, description="The copy-in, fork copy or push under way, if any."
    )
    gitea_operation: OperationRun | None = Field(
        default=None,
        description="The setup of the environment's Gitea under way (its token, organizations and "
        "repositories, and the check for snapshots it lost), if any. Apart from status.operation: the workspace "
        "side of the copy-in runs meanwhile.",
    )
    last_push: PushStatus | None = Field(
        default=None, description="The answer to the last shadow.dev/push-request annotation."
    )
    timings: PhaseTimings | None = Field(
        default=None,
        description="When each phase first finished, to see where the time to Ready goes (also exported "
        "as the histogram shadow_operator_environment_phase_seconds).",
    )


class ShadowEnvironment(Resource):
    """An isolated copy of your work, with its own Gitea standing in for GitHub, a diff and a verdict."""

    spec: ShadowEnvironmentSpec
    status: ShadowEnvironmentStatus | None = None
