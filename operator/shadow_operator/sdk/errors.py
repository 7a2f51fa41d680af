"""Typed errors of the SDK. Each carries a stable `code` (for environments, the failure code of their status)
and a `hint`: what to do next, for a person reading it on a terminal. Names follow the `k8s-agent-sandbox`
SDK where it has one for the same thing (SandboxError, SandboxNotFoundError, SandboxNotReadyError, ...).
"""

from __future__ import annotations


class ShadowError(Exception):
    """Base of every error the SDK raises on purpose."""

    code = "Error"
    hint = ""

    def __init__(self, message: str, *, code: str | None = None, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        if hint is not None:
            self.hint = hint


# ------------------------------------------------------------------------------------------ the cluster
class ClusterUnreachable(ShadowError):
    code = "ClusterUnreachable"
    hint = "is the cluster running? `kubectl get nodes` should answer"


class NotKubernetes(ClusterUnreachable):
    """Something answered in the API server's place (a proxy, a login page, a load balancer's error page)."""

    code = "NotKubernetes"
    hint = (
        "check the server of the kubeconfig context (kubectl config view --minify) and any proxy in between"
    )


class NoCredentials(ClusterUnreachable):
    code = "NoCredentials"
    hint = "point KUBECONFIG at a cluster (kubectl config current-context) and try again"


class KubeError(ShadowError):
    """A non-2xx answer of the API server; `status` is its HTTP status (0: no answer at all)."""

    def __init__(
        self,
        message: str,
        *,
        status: int = 0,
        reason: str = "",
        code: str | None = None,
        hint: str | None = None,
    ) -> None:
        super().__init__(message, code=code, hint=hint)
        self.status = status
        self.reason = reason

    @property
    def not_found(self) -> bool:
        return self.status == 404


class ApiNotInstalled(KubeError):
    code = "ApiNotInstalled"
    hint = (
        "install the operator: helm install shadow-operator charts/shadow-operator (then `shadowctl doctor`)"
    )


class Forbidden(KubeError):
    code = "Forbidden"
    hint = "ask for the permission, or check it: kubectl auth can-i --list"


class Conflict(KubeError):
    code = "AlreadyExists"
    hint = "pick another name, or delete the existing object first"


class Invalid(KubeError):
    """The API server refused the object (its schema or a CEL rule); the message is the server's."""

    code = "Invalid"
    hint = "fix the field named in the message"


class NotFound(KubeError):
    code = "NotFound"


class EnvironmentNotFound(NotFound):
    hint = "list the environments: shadowctl list"


class SandboxNotFoundError(NotFound):
    hint = "list the sandboxes: shadowctl sandbox list"


class SandboxTemplateNotFoundError(NotFound):
    code = "TemplateNotFound"
    hint = "list the templates: kubectl get sandboxtemplates"


class SandboxWarmPoolNotFoundError(NotFound):
    code = "WarmPoolNotFound"
    hint = "list the warm pools: kubectl get sandboxwarmpools"


class SourceNotFound(NotFound):
    code = "SourceNotFound"
    hint = "shadowctl status NAME lists the sources"


# ----------------------------------------------------------------------------------- waits and failures
class OperatorNotRunning(ShadowError):
    code = "OperatorNotRunning"
    hint = "`shadowctl doctor` says which release should run it and where"


class EnvironmentFailed(ShadowError):
    """The environment reports a failure (status.failure); `code` is its code, e.g. SourceFetchFailed."""

    hint = "kubectl describe shadowenvironment NAME shows the events"


class SandboxNotReadyError(ShadowError):
    code = "NotReady"


class SandboxClaimFailedError(ShadowError):
    code = "ClaimFailed"


class WaitTimeout(ShadowError):
    code = "Timeout"
    hint = "look at its conditions: shadowctl status NAME"


# ------------------------------------------------------------------------------------------ the runtime
class RuntimeUnreachable(ShadowError):
    code = "RuntimeUnreachable"
    hint = "is the workspace Pod running? kubectl get pods -l shadow.dev/environment=NAME"


class RuntimeRefused(ShadowError):
    """The workspace runtime (or the API server's proxy in front of it) answered with an error status."""

    code = "RuntimeRefused"

    def __init__(self, status: int, message: str, *, what: str = "the workspace runtime") -> None:
        super().__init__(f"{what} answered {status}: {message}")
        self.status = status
        self.detail = message


# ------------------------------------------------------------------------------------------ local side
class UploadError(ShadowError):
    """An upload cannot be done; the message says why."""

    code = "UploadFailed"


class NotAnUploadSource(UploadError):
    code = "NotAnUploadSource"


class PromoteError(ShadowError):
    code = "PromoteFailed"


class UnsafePath(ShadowError):
    """A path from a sandbox that would land outside its local directory, in a `.git`, or through a link."""

    code = "UnsafePath"
    hint = "nothing was written there; look at what the workspace produced"


class TooLarge(ShadowError):
    """What a sandbox sends is over a size or count limit of the client."""

    code = "TooLarge"
