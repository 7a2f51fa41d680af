"""Signed preview links: `<previewURL>?shadow_token=<token>` for a sandbox, valid for a while."""

from __future__ import annotations

from urllib.parse import urlencode, urlsplit, urlunsplit

from shadow_operator.common.tokens import KeyRing

# The query parameter a signed link carries its token in (the router takes it off before proxying).
QUERY_PARAMETER = "shadow_token"
DEFAULT_TTL_SECONDS = 24 * 3600


def signed_link(
    keys: KeyRing,
    preview_url: str,
    namespace: str,
    sandbox: str,
    uid: str,
    *,
    ttl_seconds: int = DEFAULT_TTL_SECONDS,
    now: float | None = None,
) -> str:
    """`preview_url` (the Sandbox's `status.previewURL`) with a token for that sandbox (its `uid`) appended."""
    token = keys.sign(namespace, sandbox, uid, ttl_seconds, now=now)
    parts = urlsplit(preview_url)
    query = "&".join(q for q in (parts.query, urlencode({QUERY_PARAMETER: token})) if q)
    return urlunsplit((parts.scheme, parts.netloc, parts.path or "/", query, ""))
