"""A signed link to a private preview, from the cluster: the Sandbox's previewURL and the router's keys.

Written once as an operation (`signed_preview`), driven on a sync client (`preview_link`) or an async one
(`apreview_link`); shadowctl's `preview` verbs use it too.
"""

from __future__ import annotations

import base64
import time
from dataclasses import dataclass

import httpx

from shadow_operator.api.kinds import SANDBOX, SECRET
from shadow_operator.common.links import DEFAULT_TTL_SECONDS, signed_link
from shadow_operator.common.tokens import DEFAULT_MAX_LIFETIME_SECONDS, KeyRing
from shadow_operator.sdk import discovery, kube
from shadow_operator.sdk.errors import Forbidden, NotFound, SandboxNotFoundError, ShadowError
from shadow_operator.sdk.kube import Op


class PreviewUnavailable(ShadowError):
    """The sandbox has no preview URL (no preview domain configured, or no preview port)."""

    code = "PreviewUnavailable"
    hint = "set previewRouter.domain in the chart's values, and a preview port in the template"


class PreviewKeysUnavailable(ShadowError):
    """The router's keys Secret cannot be read, or holds no usable key: no link can be signed."""

    code = "PreviewKeysUnavailable"


@dataclass(frozen=True)
class PreviewLink:
    url: str
    sandbox: str
    namespace: str
    expires_at: int  # unix seconds


def _keys(body: kube.Body, where: str) -> KeyRing:
    try:
        keys = KeyRing(
            {kid: base64.b64decode(value).strip() for kid, value in (body.get("data") or {}).items()}
        )
    except ValueError as exc:
        raise PreviewKeysUnavailable(
            f"Secret {where} holds an unusable preview key: {exc}",
            hint="each key is 32 bytes or more: python3 -c 'import secrets; print(secrets.token_urlsafe(32))'",
        ) from None
    if not keys:
        raise PreviewKeysUnavailable(
            f"Secret {where} holds no preview key",
            hint="add a key of 32 bytes or more to it (README: Private previews)",
        )
    return keys


def read_keys(namespace: str, name: str) -> Op[KeyRing]:
    where = f"{namespace}/{name}"
    try:
        body = yield from kube.get(SECRET.path(namespace, name), f"read the preview keys Secret {where}")
    except NotFound:
        raise PreviewKeysUnavailable(
            f"the preview keys Secret {where} does not exist",
            hint="create it (README: Private previews), or name the router's with --keys-secret, --keys-namespace",
        ) from None
    except Forbidden as exc:
        raise PreviewKeysUnavailable(
            f"{exc.message}",
            hint=f"signing links needs `get` on Secret {where}: "
            f"kubectl auth can-i get secret/{name} -n {namespace}",
        ) from None
    return _keys(body, where)


def signed_preview(
    sandbox: str,
    namespace: str,
    *,
    ttl_seconds: int = DEFAULT_TTL_SECONDS,
    keys_secret: str | None = None,
    keys_namespace: str | None = None,
    max_ttl_seconds: int = DEFAULT_MAX_LIFETIME_SECONDS,
    now: float | None = None,
) -> Op[PreviewLink]:
    """A link bound to the sandbox's uid (a sandbox created again under the name does not open with it).
    Links longer than `max_ttl_seconds` (the router's default `previewRouter.maxTokenSeconds`) are refused
    here rather than signed for a router that would refuse them."""
    if ttl_seconds <= 0:
        raise ShadowError(f"a link must live a while, not {ttl_seconds}s", hint="give --ttl SECONDS > 0")
    if ttl_seconds > max_ttl_seconds:
        raise ShadowError(
            f"a link may live at most {max_ttl_seconds}s, not {ttl_seconds}s",
            hint="the router refuses longer links (previewRouter.maxTokenSeconds): give a shorter --ttl",
        )
    what = f"Sandbox {namespace}/{sandbox}"
    try:
        body = yield from kube.get(SANDBOX.path(namespace, sandbox), what)
    except NotFound:
        raise SandboxNotFoundError(f"{what} does not exist") from None
    url = (body.get("status") or {}).get("previewURL")
    if not url:
        raise PreviewUnavailable(f"{what} has no status.previewURL (is the preview router enabled?)")
    uid = str((body.get("metadata") or {}).get("uid") or "")
    if not uid:
        raise ShadowError(f"{what} has no metadata.uid", hint="read it from the API server, not from a file")
    if keys_secret is None or keys_namespace is None:
        where = yield from discovery.locate(namespace)  # the router of the release serving `namespace`
        keys_secret = keys_secret or where.keys_secret
        keys_namespace = keys_namespace or where.keys_namespace
    keys = yield from read_keys(keys_namespace, keys_secret)
    issued = int(now if now is not None else time.time())
    link = signed_link(keys, url, namespace, sandbox, uid, ttl_seconds=ttl_seconds, now=issued)
    return PreviewLink(link, sandbox, namespace, issued + ttl_seconds)


def preview_link(
    sandbox: str,
    namespace: str | None = None,
    *,
    ttl_seconds: int = DEFAULT_TTL_SECONDS,
    keys_secret: str | None = None,
    keys_namespace: str | None = None,
    max_ttl_seconds: int = DEFAULT_MAX_LIFETIME_SECONDS,
    http: httpx.Client | None = None,
) -> str:
    """A link that opens the sandbox's (private) preview for `ttl_seconds` (at most `max_ttl_seconds`, the
    router's `previewRouter.maxTokenSeconds`); the caller needs read access to the Sandbox and to the router's
    keys Secret, which is what makes handing out links a privilege."""
    op = signed_preview(
        sandbox,
        namespace or kube.context_namespace(),
        ttl_seconds=ttl_seconds,
        keys_secret=keys_secret,
        keys_namespace=keys_namespace,
        max_ttl_seconds=max_ttl_seconds,
    )
    if http is not None:
        return kube.run(http, op).url
    with kube.connect() as client:
        return kube.run(client, op).url


async def apreview_link(
    sandbox: str,
    namespace: str | None = None,
    *,
    ttl_seconds: int = DEFAULT_TTL_SECONDS,
    keys_secret: str | None = None,
    keys_namespace: str | None = None,
    max_ttl_seconds: int = DEFAULT_MAX_LIFETIME_SECONDS,
    http: httpx.AsyncClient | None = None,
) -> str:
    """The async twin of `preview_link`."""
    op = signed_preview(
        sandbox,
        namespace or kube.context_namespace(),
        ttl_seconds=ttl_seconds,
        keys_secret=keys_secret,
        keys_namespace=keys_namespace,
        max_ttl_seconds=max_ttl_seconds,
    )
    if http is not None:
        return (await kube.arun(http, op)).url
    async with kube.connect_async() as client:
        return (await kube.arun(client, op)).url
