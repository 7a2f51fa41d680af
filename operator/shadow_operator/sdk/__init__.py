"""The Python SDK: ShadowEnvironments (`ShadowGateway`) and plain sandboxes (`SandboxClient`), sync and async.

Light to import: kopf is loaded only to read credentials, when a cluster is contacted. Every operation is
written once (sans-I/O, `kube.run` / `kube.arun`); errors are typed (`errors`) and carry a code and a hint.
"""

from shadow_operator.sdk.environment import EnvironmentSpec, GitSource, LocalSource, upload_source
from shadow_operator.sdk.errors import (
    ApiNotInstalled,
    ClusterUnreachable,
    EnvironmentFailed,
    EnvironmentNotFound,
    KubeError,
    NoCredentials,
    NotAnUploadSource,
    NotFound,
    NotKubernetes,
    OperatorNotRunning,
    PromoteError,
    RuntimeRefused,
    RuntimeUnreachable,
    SandboxClaimFailedError,
    SandboxNotFoundError,
    SandboxNotReadyError,
    SandboxTemplateNotFoundError,
    SandboxWarmPoolNotFoundError,
    ShadowError,
    SourceNotFound,
    UploadError,
    WaitTimeout,
)
from shadow_operator.sdk.gateway import AsyncShadowGateway, ShadowGateway
from shadow_operator.sdk.hostonly import FallbackNotPossible
from shadow_operator.sdk.manifest import HandoffManifest
from shadow_operator.sdk.preview import (
    PreviewKeysUnavailable,
    PreviewLink,
    PreviewUnavailable,
    apreview_link,
    preview_link,
)
from shadow_operator.sdk.promote import PromotePlan
from shadow_operator.sdk.race import RaceCandidate, RaceResult
from shadow_operator.sdk.runtime import Diff, ExecutionResult, JournalEntry
from shadow_operator.sdk.sandbox import AsyncSandbox, AsyncSandboxClient, Sandbox, SandboxClient
from shadow_operator.sdk.upload import (
    UploadResult,
    stream_worktree,
    upload_to_runtime,
    worktree_files,
)

__all__ = [
    "ApiNotInstalled",
    "AsyncSandbox",
    "AsyncSandboxClient",
    "AsyncShadowGateway",
    "ClusterUnreachable",
    "Diff",
    "EnvironmentFailed",
    "EnvironmentNotFound",
    "EnvironmentSpec",
    "ExecutionResult",
    "FallbackNotPossible",
    "GitSource",
    "HandoffManifest",
    "JournalEntry",
    "KubeError",
    "LocalSource",
    "NoCredentials",
    "NotAnUploadSource",
    "NotFound",
    "NotKubernetes",
    "OperatorNotRunning",
    "PreviewKeysUnavailable",
    "PreviewLink",
    "PreviewUnavailable",
    "PromoteError",
    "PromotePlan",
    "RaceCandidate",
    "RaceResult",
    "RuntimeRefused",
    "RuntimeUnreachable",
    "Sandbox",
    "SandboxClaimFailedError",
    "SandboxClient",
    "SandboxNotFoundError",
    "SandboxNotReadyError",
    "SandboxTemplateNotFoundError",
    "SandboxWarmPoolNotFoundError",
    "ShadowError",
    "ShadowGateway",
    "SourceNotFound",
    "UploadError",
    "UploadResult",
    "WaitTimeout",
    "apreview_link",
    "preview_link",
    "stream_worktree",
    "upload_source",
    "upload_to_runtime",
    "worktree_files",
]
