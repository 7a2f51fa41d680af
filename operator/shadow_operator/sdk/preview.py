"""A signed link to a private preview, from the cluster: the Sandbox's previewURL and the keys of its namespace
(the Secret `shadow-preview-link-keys` the operator writes there: they sign for that namespace only).

Written once as an operation (`signed_preview`), driven on a sync client (`preview_link`) or an async one
(`apreview_link`); shadowctl's `preview` verbs use it too.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TypedDict, Unpack

import httpx

from shadow_operator.api import constants as c
from shadow_operator.api.kinds import SANDBOX, SECRET
from shadow_operator.common.links import DEFAULT_TTL_SECONDS, signed_link
from shadow_operator.common.tokens import DEFAULT_MAX_LIFETIME_SECONDS, KeyRing
from shadow_operator.sdk import kube
from shadow_operator.sdk.errors import Forbidden, NotFound, SandboxNotFoundError, ShadowError
from shadow_operator.sdk.kube import Op


class PreviewUnavailable(ShadowError):
    """The sandbox has no preview URL (no preview domain configured, or no preview port)."""

    code = "PreviewUnavailable"
    hint = "set previewRouter.domain in the chart's values, and a preview port in the template"


class PreviewKeysUnavailable(ShadowError):
    """The keys Secret cannot be read, holds no usable key, or signs for another namespace: no link."""

    code = "PreviewKeysUnavailable"


@dataclass(frozen=True)
class PreviewLink:
    url: str
    sandbox: str
    namespace: str
    expires_at: int  # unix seconds


def _keys(body: kube.Body, where: str) -> KeyRing:
    try:
        keys = KeyRing.from_secret_data(body.get("data"))
    except ValueError as exc:
        raise PreviewKeysUnavailable(
            f"Secret {where} holds an unusable preview key: {exc}",
            hint="each key is 32 bytes or more: python3 -c 'import secrets; print(secrets.token_urlsafe(32))'",
        ) from None
    if not keys:
        raise PreviewKeysUnavailable(
            f"Secret {where} holds no preview key",
            hint="add a key of 32 bytes or more to the router's keys Secret (README: Private previews)",
        )
    return keys


def read_keys(namespace: str, name: str, signs_for: str) -> Op[KeyRing]:
    """The keys that sign links for sandboxes of `signs_for`: a namespace's link keys Secret (the operator
    writes it, annotated with its namespace), or the router's own keys Secret (administrators), whose keys are
    then derived for `signs_for` here as the router derives them."""
    where = f"{namespace}/{name}"
    try:
        body = yield from kube.get(SECRET.path(namespace, name), f"read the preview keys Secret {where}")
    except NotFound:
        raise PreviewKeysUnavailable(
            f"the preview keys Secret {where} does not exist",
            hint=f"the operator writes {c.PREVIEW_LINK_KEYS_SECRET} into each namespace the preview router serves "
            "once the router's keys Secret exists; or name another with --keys-secret, --keys-namespace "
            "(README: Private previews)",
        ) from None
    except Forbidden as exc:
        raise PreviewKeysUnavailable(
            f"{exc.message}",
            hint=f"signing links needs `get` on Secret {where}: "
            f"kubectl auth can-i get secret/{name} -n {namespace}",
        ) from None
    keys = _keys(body, where)
    annotations = (body.get("metadata") or {}).get("annotations") or {}
    scope = annotations.get(c.ANNOTATION_PREVIEW_LINK_NAMESPACE)
    if scope is None:
        return keys.for_namespace(signs_for)
    if scope != signs_for:
        raise PreviewKeysUnavailable(
            f"Secret {where} signs links for namespace {scope}, not {signs_for}",
            hint=f"use the Secret {c.PREVIEW_LINK_KEYS_SECRET} of namespace {signs_for}",
        )
    return keys


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
    # The namespace's own link keys unless told otherwise (the router refuses any other namespace's).
    keys = yield from read_keys(
        keys_namespace or namespace, keys_secret or c.PREVIEW_LINK_KEYS_SECRET, signs_for=namespace
    )
    issued = int(now if now is not None else time.time())
    link = signed_link(keys, url, namespace, sandbox, uid, ttl_seconds=ttl_seconds, now=issued)
    return PreviewLink(link, sandbox, namespace, issued + ttl_seconds)


class LinkOptions(TypedDict, total=False):
    """How `preview_link` and `apreview_link` sign (as `signed_preview`); all optional."""

    ttl_seconds: int  # how long the link opens the preview (default 86400: a day)
    keys_secret: str | None  # another keys Secret than the namespace's link keys
    keys_namespace: str | None  # its namespace (default: the sandbox's)
    max_ttl_seconds: int  # the router's previewRouter.maxTokenSeconds (default 86400)


def preview_link(
    sandbox: str,
    namespace: str | None = None,
    *,
    http: httpx.Client | None = None,
    **options: Unpack[LinkOptions],
) -> str:
    """A link that opens the sandbox's (private) preview for `ttl_seconds` (at most `max_ttl_seconds`, the
    router's `previewRouter.maxTokenSeconds`); the caller needs read access to the Sandbox and to the Secret
    `shadow-preview-link-keys` of its namespace, which is what makes handing out links a privilege (and one
    for that namespace only). `keys_secret`/`keys_namespace` name another Secret: the router's own keys
    Secret (administrators) signs for any namespace."""
    op = signed_preview(sandbox, namespace or kube.context_namespace(), **options)
    if http is not None:
        return kube.run(http, op).url
    with kube.connect() as client:
        return kube.run(client, op).url


async def apreview_link(
    sandbox: str,
    namespace: str | None = None,
    *,
    http: httpx.AsyncClient | None = None,
    **options: Unpack[LinkOptions],
) -> str:
    """The async twin of `preview_link`."""
    op = signed_preview(sandbox, namespace or kube.context_namespace(), **options)
    if http is not None:
        return (await kube.arun(http, op)).url
    async with kube.connect_async() as client:
        return (await kube.arun(client, op)).url
