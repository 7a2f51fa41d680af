"""The few Kubernetes API calls the SDK makes, on a synchronous httpx client.

Credentials come from kopf's own login (the kubeconfig, else the Pod's service account), so clients need no
Kubernetes library either. kopf is imported only when a client is made: importing it loads its whole operator
framework, which a CLI that never talks to a cluster should not pay for.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Generator, Mapping
from typing import Any

import httpx

from shadow_operator import __version__

Body = dict[str, Any]
USER_AGENT = f"shadow-operator-sdk/{__version__}"
MERGE_PATCH = "application/merge-patch+json"


class KubeError(Exception):
    """A non-2xx answer from the API server (or no credentials at all, status 0)."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"{status} {reason}: {message}" if status else message)
        self.status = status
        self.reason = reason
        self.message = message

    @property
    def not_found(self) -> bool:
        return self.status == 404


def connect(*, timeout: float = 30.0) -> httpx.Client:
    """An httpx client for the API server of the current kubeconfig context (or the Pod's service account).

    A client on someone's machine acts as them, so their kubeconfig wins over a service account, as with
    kubectl. Client certificates given inline are handled by kopf's SSL context (it writes them to temporary
    files only while the context loads them). Exec and auth-provider plugins are not run: kopf's minimal
    kubeconfig login reads tokens, certificates and basic auth only.
    """
    import kopf

    settings = kopf.OperatorSettings()
    try:
        info = kopf.login_with_kubeconfig(settings=settings) or kopf.login_with_service_account(
            settings=settings
        )
    except (OSError, KeyError, kopf.LoginError) as exc:
        raise KubeError(0, "NoCredentials", f"cannot read the kubeconfig: {exc!r}") from None
    if info is None:
        raise KubeError(
            0,
            "NoCredentials",
            "no Kubernetes credentials: set KUBECONFIG (or create ~/.kube/config), or run in a Pod",
        )
    return httpx.Client(
        base_url=info.server,
        verify=info.as_ssl_context(),
        headers={"Accept": "application/json", "User-Agent": USER_AGENT, **info.as_http_headers()},
        proxy=info.proxy_url,
        trust_env=info.trust_env,
        timeout=httpx.Timeout(timeout, connect=10.0),
    )


def request(
    client: httpx.Client, method: str, path: str, *, body: Any = None, content_type: str = "application/json"
) -> Body:
    """One JSON call; a non-2xx answer raises KubeError with the Status's reason and message."""
    content = None if body is None else json.dumps(body, separators=(",", ":"))
    headers = {"Content-Type": content_type} if content is not None else {}
    response = client.request(method, path, content=content, headers=headers)
    if not response.is_success:
        raise error_of(response)
    decoded: Body = response.json() if response.content else {}
    return decoded


def watch(
    client: httpx.Client, collection: str, params: Mapping[str, str], timeout_seconds: int
) -> Generator[tuple[str, Body], None, None]:
    """(type, object) of each event of one watch request, which the server ends after timeout_seconds."""
    query = {**params, "watch": "1", "allowWatchBookmarks": "true", "timeoutSeconds": str(timeout_seconds)}
    # The read timeout outlasts the server's own, so a quiet watch ends cleanly rather than as an error.
    timeout = httpx.Timeout(timeout_seconds + 15.0, connect=10.0)
    with client.stream("GET", collection, params=query, timeout=timeout) as response:
        if not response.is_success:
            response.read()
            raise error_of(response)
        for line in response.iter_lines():
            if line.strip():
                event = json.loads(line)
                yield str(event["type"]), event["object"]


def error_of(response: httpx.Response) -> KubeError:
    """KubeError from a Status body when there is one, else from the status line and the text."""
    reason, message = response.reason_phrase, response.text[:1000]
    with contextlib.suppress(ValueError):
        decoded = response.json()
        if isinstance(decoded, dict):
            reason = str(decoded.get("reason") or reason)
            message = str(decoded.get("message") or message)
    return KubeError(response.status_code, reason, message)
