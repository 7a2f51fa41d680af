"""A signed link to a private preview, from the cluster: the Sandbox's previewURL and the router's keys."""

from __future__ import annotations

import base64

import httpx

from shadow_operator.api.kinds import SANDBOX, SECRET
from shadow_operator.router.links import DEFAULT_TTL_SECONDS, signed_link
from shadow_operator.router.tokens import KeyRing
from shadow_operator.sdk import kube
from shadow_operator.sdk.errors import ShadowError

# The chart's defaults for a release named `shadow-operator` in `shadow-system`.
KEYS_SECRET = "shadow-operator-preview-keys"
KEYS_NAMESPACE = "shadow-system"


class PreviewUnavailable(ShadowError):
    """The sandbox has no preview URL (no preview domain configured, or no preview port)."""

    code = "PreviewUnavailable"
    hint = "set previewRouter.domain in the chart's values, and a preview port in the template"


def keys_from_secret(http: httpx.Client, namespace: str, name: str) -> KeyRing:
    body = kube.request(http, "GET", SECRET.path(namespace, name))
    return KeyRing({kid: base64.b64decode(value).strip() for kid, value in (body.get("data") or {}).items()})


def preview_link(
    sandbox: str,
    namespace: str = "default",
    *,
    ttl_seconds: int = DEFAULT_TTL_SECONDS,
    keys_secret: str = KEYS_SECRET,
    keys_namespace: str = KEYS_NAMESPACE,
    http: httpx.Client | None = None,
) -> str:
    """A link that opens the sandbox's (private) preview for `ttl_seconds`; the caller needs read access to
    the Sandbox and to the router's keys Secret, which is what makes handing out links a privilege."""
    client = http or kube.connect()
    try:
        body = kube.request(client, "GET", SANDBOX.path(namespace, sandbox))
        url = (body.get("status") or {}).get("previewURL")
        if not url:
            raise PreviewUnavailable(
                f"Sandbox {namespace}/{sandbox} has no status.previewURL (is the preview router enabled?)"
            )
        keys = keys_from_secret(client, keys_namespace, keys_secret)
        return signed_link(keys, url, namespace, sandbox, ttl_seconds=ttl_seconds)
    finally:
        if http is None:
            client.close()
