"""Client-side helpers for ShadowEnvironments, for CLIs and automations (not used by the operator itself).

Synchronous and light to import: kopf is loaded only to read credentials, when a cluster is contacted.
"""

from shadow_operator.sdk.kube import KubeError
from shadow_operator.sdk.preview import PreviewUnavailable, preview_link
from shadow_operator.sdk.upload import (
    EnvironmentNotFound,
    NotAnUploadSource,
    RuntimeRefused,
    RuntimeUnreachable,
    SourceNotFound,
    UploadError,
    UploadResult,
    UploadTimeout,
    runtime_endpoint,
    stream_worktree,
    upload_source,
    upload_to_runtime,
    worktree_files,
)

__all__ = [
    "EnvironmentNotFound",
    "KubeError",
    "NotAnUploadSource",
    "PreviewUnavailable",
    "RuntimeRefused",
    "RuntimeUnreachable",
    "SourceNotFound",
    "UploadError",
    "UploadResult",
    "UploadTimeout",
    "preview_link",
    "runtime_endpoint",
    "stream_worktree",
    "upload_source",
    "upload_to_runtime",
    "worktree_files",
]
