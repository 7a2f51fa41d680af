"""The Python SDK: ShadowEnvironments (`ShadowGateway`) and plain sandboxes (`SandboxClient`), sync and async.

Light to import: each name loads its module when first used (PEP 562), so `shadowctl --version` or a
`kube` call does not pay for the models of every API. Every operation is
written once (sans-I/O, `kube.run` / `kube.arun`); errors are typed (`errors`) and carry a code and a hint.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from shadow_operator.sdk.egress import EgressDecision
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

_WHERE = {
    "ApiNotInstalled": "shadow_operator.sdk.errors",
    "AsyncSandbox": "shadow_operator.sdk.sandbox",
    "AsyncSandboxClient": "shadow_operator.sdk.sandbox",
    "AsyncShadowGateway": "shadow_operator.sdk.gateway",
    "ClusterUnreachable": "shadow_operator.sdk.errors",
    "Diff": "shadow_operator.sdk.runtime",
    "EnvironmentFailed": "shadow_operator.sdk.errors",
    "EnvironmentNotFound": "shadow_operator.sdk.errors",
    "EnvironmentSpec": "shadow_operator.sdk.environment",
    "ExecutionResult": "shadow_operator.sdk.runtime",
    "FallbackNotPossible": "shadow_operator.sdk.hostonly",
    "GitSource": "shadow_operator.sdk.environment",
    "HandoffManifest": "shadow_operator.sdk.manifest",
    "JournalEntry": "shadow_operator.sdk.runtime",
    "EgressDecision": "shadow_operator.sdk.egress",
    "KubeError": "shadow_operator.sdk.errors",
    "LocalSource": "shadow_operator.sdk.environment",
    "NoCredentials": "shadow_operator.sdk.errors",
    "NotAnUploadSource": "shadow_operator.sdk.errors",
    "NotFound": "shadow_operator.sdk.errors",
    "NotKubernetes": "shadow_operator.sdk.errors",
    "OperatorNotRunning": "shadow_operator.sdk.errors",
    "PreviewKeysUnavailable": "shadow_operator.sdk.preview",
    "PreviewLink": "shadow_operator.sdk.preview",
    "PreviewUnavailable": "shadow_operator.sdk.preview",
    "PromoteError": "shadow_operator.sdk.errors",
    "PromotePlan": "shadow_operator.sdk.promote",
    "RaceCandidate": "shadow_operator.sdk.race",
    "RaceResult": "shadow_operator.sdk.race",
    "RuntimeRefused": "shadow_operator.sdk.errors",
    "RuntimeUnreachable": "shadow_operator.sdk.errors",
    "Sandbox": "shadow_operator.sdk.sandbox",
    "SandboxClaimFailedError": "shadow_operator.sdk.errors",
    "SandboxClient": "shadow_operator.sdk.sandbox",
    "SandboxNotFoundError": "shadow_operator.sdk.errors",
    "SandboxNotReadyError": "shadow_operator.sdk.errors",
    "SandboxTemplateNotFoundError": "shadow_operator.sdk.errors",
    "SandboxWarmPoolNotFoundError": "shadow_operator.sdk.errors",
    "ShadowError": "shadow_operator.sdk.errors",
    "ShadowGateway": "shadow_operator.sdk.gateway",
    "SourceNotFound": "shadow_operator.sdk.errors",
    "UploadError": "shadow_operator.sdk.errors",
    "UploadResult": "shadow_operator.sdk.upload",
    "WaitTimeout": "shadow_operator.sdk.errors",
    "apreview_link": "shadow_operator.sdk.preview",
    "preview_link": "shadow_operator.sdk.preview",
    "stream_worktree": "shadow_operator.sdk.upload",
    "upload_source": "shadow_operator.sdk.environment",
    "upload_to_runtime": "shadow_operator.sdk.upload",
    "worktree_files": "shadow_operator.sdk.upload",
}


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


__all__ = [
    "ApiNotInstalled",
    "AsyncSandbox",
    "AsyncSandboxClient",
    "AsyncShadowGateway",
    "ClusterUnreachable",
    "Diff",
    "EgressDecision",
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
