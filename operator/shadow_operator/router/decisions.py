"""The router's decisions, free of any web framework: what nginx should do with one request.

`Decision.status` is what the caller finally sees: 200 (proxy to `upstream`), 302 (token exchanged for a
cookie), 400, 401, 403 (authenticated but not allowed, or a port the sandbox does not declare), 404, 502 or
503. How it travels to nginx is `app.py`'s business.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from urllib.parse import parse_qsl, urlencode, urlsplit

from shadow_operator.clients.kube import ApiError
from shadow_operator.common.links import QUERY_PARAMETER
from shadow_operator.common.tokens import DEFAULT_MAX_LIFETIME_SECONDS, KeyRing, TokenError
from shadow_operator.router import validation
from shadow_operator.router.index import Index, Route

log = logging.getLogger(__name__)
HEADER = "X-Shadow-Preview-Token"
COOKIE = "shadow_preview"
# Over HTTPS the cookie carries the __Host- prefix: browsers then refuse it unless it is Secure, for "/" and
# host-only, so a sibling sandbox cannot plant one for the whole preview domain.
SECURE_COOKIE = "__Host-shadow_preview"


@dataclass(frozen=True)
class Decision:
    status: int
    detail: str
    upstream: str | None = None
    runtime_token: str | None = None
    sandbox: str | None = None  # `namespace/name` of the sandbox a 200 routes to (the metrics' label)
    headers: Mapping[str, str] = field(default_factory=dict)
    uid: str | None = None  # the uid of that sandbox
    # A sandbox that exists and may be reached but is not Ready: the request may be held while it wakes.
    waiting_for: Route | None = None


def _upstream(ip: str, port: int) -> str:
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"


def cookie_value(cookie_header: str, name: str) -> str | None:
    for part in cookie_header.split(";"):
        key, sep, value = part.strip().partition("=")
        if sep and key == name:
            return value.strip().strip('"')
    return None


@dataclass
class PreviewPolicy:
    """Previews: `<sandbox>.<domain>` in one of `namespaces`; private ones need a token signed with the keys
    of the sandbox's namespace, derived from the root `keys` (`KeyRing.for_namespace`)."""

    index: Index
    domain: str
    namespaces: tuple[str, ...]
    keys: Callable[[], KeyRing]
    default_access: str = "public"
    secure: bool = True
    max_token_seconds: int = DEFAULT_MAX_LIFETIME_SECONDS
    clock: Callable[[], float] = time.time

    @property
    def cookie_name(self) -> str:
        return SECURE_COOKIE if self.secure else COOKIE

    def _find(self, sandbox: str) -> Route | None:
        routes = [r for ns in self.namespaces if (r := self.index.route(ns, sandbox)) is not None]
        # A name in two namespaces is ambiguous under one domain: refuse rather than pick.
        return routes[0] if len(routes) == 1 else None

    def decide(self, host: str, uri: str, cookie_header: str = "", header_token: str = "") -> Decision:
        try:
            sandbox = validation.sandbox_of_host(host, self.domain)
        except validation.Invalid:
            return Decision(404, "No preview is served at this address.")
        route = self._find(sandbox)
        if route is None:
            return Decision(404, f"There is no sandbox named {sandbox}.")
        if (route.access or self.default_access) == "private":
            denied = self._check_access(route, uri, cookie_header, header_token)
            if denied is not None:
                return denied
        if route.preview_port is None:
            return Decision(503, f"Sandbox {sandbox} is starting or not ready yet.")
        if not route.ready or not route.ips:
            return Decision(503, f"Sandbox {sandbox} is starting or not ready yet.", waiting_for=route)
        return Decision(
            200,
            "ok",
            upstream=_upstream(route.ips[0], route.preview_port),
            sandbox=f"{route.namespace}/{route.name}",
            uid=route.uid,
        )

    def _verify(self, token: str, route: Route) -> int | None:
        """The token's expiry when it is valid for this sandbox (this incarnation of it: its uid), else None."""
        try:
            # The keys of the sandbox's own namespace (the one the Host named): a tenant signs for its own.
            keys = self.keys().for_namespace(route.namespace)
            claims = keys.verify(token, now=self.clock(), max_lifetime=self.max_token_seconds)
        except TokenError:
            return None
        if (claims.namespace, claims.sandbox, claims.uid) != (route.namespace, route.name, route.uid):
            return None
        return claims.expires

    def _check_access(self, route: Route, uri: str, cookie_header: str, header_token: str) -> Decision | None:
        parts = urlsplit(uri)
        query = parse_qsl(parts.query, keep_blank_values=True)
        given = [value for key, value in query if key == QUERY_PARAMETER]
        if given:
            expires = self._verify(given[-1], route)
            if expires is None:
                return Decision(401, "This preview link is invalid or has expired.")
            # Exchange the link for a cookie and drop the token from the address bar (and from history).
            rest = urlencode([(k, v) for k, v in query if k != QUERY_PARAMETER])
            location = (parts.path or "/") + (f"?{rest}" if rest else "")
            max_age = max(int(expires - self.clock()), 1)
            attributes = f"Path=/; Max-Age={max_age}; HttpOnly; SameSite=Lax"
            if self.secure:
                attributes += "; Secure"
            cookie = f"{self.cookie_name}={given[-1]}; {attributes}"
            return Decision(
                302,
                "Signed in to this preview.",
                headers={"Location": location, "Set-Cookie": cookie, "Cache-Control": "no-store"},
            )
        for token in (header_token, cookie_value(cookie_header, self.cookie_name) or ""):
            if token and self._verify(token, route) is not None:
                return None
        return Decision(401, "This preview is private: open it with a signed preview link.")


# Who may use the SDK path, asked of the API server: (the caller's Authorization header, namespace, sandbox)
# -> None when allowed, else the refusal (401 unauthenticated, 403 not allowed, 503 could not ask).
Authorizer = Callable[[str, str, str], Awaitable[Decision | None]]
# A sandbox's runtime token: (namespace, sandbox, sandbox uid) -> the token, or None; ApiError when it could not
# be read (router/secrets.py reads the sandbox's token Secret by name).
TokenReader = Callable[[str, str, str], Awaitable[str | None]]
# The authorization modes of the SDK path. `subjectaccessreview`: every caller is authorized (a loopback peer,
# i.e. a `kubectl port-forward` that RBAC allowed, or a bearer token the API server authenticates and
# authorizes for the sandbox). `insecure-allow-all`: anyone who reaches the port may use public sandboxes.
SUBJECT_ACCESS_REVIEW = "subjectaccessreview"
INSECURE_ALLOW_ALL = "insecure-allow-all"


@dataclass
class SdkPolicy:
    """The SDK contract: X-Sandbox-* headers name a managed sandbox in one of `namespaces`, and one port its pod
    template declares. Callers are authorized (`authorize`) unless the mode is insecure-allow-all and the
    sandbox's preview access is public: private sandboxes need authorization on this path in every mode."""

    index: Index
    namespaces: tuple[str, ...]
    authorize: Authorizer
    runtime_tokens: TokenReader
    mode: str = SUBJECT_ACCESS_REVIEW
    trust_loopback: bool = True
    default_access: str = "public"

    def _needs_authorization(self, route: Route | None) -> bool:
        if self.mode != INSECURE_ALLOW_ALL:
            return True
        return route is not None and (route.access or self.default_access) == "private"

    async def _authorized(self, peer: str, authorization: str, namespace: str, name: str) -> Decision | None:
        if self.trust_loopback and validation.is_loopback_peer(peer):
            return None  # kubectl port-forward to the router: RBAC already allowed pods/portforward on it.
        if not authorization:
            return Decision(401, "a bearer token is required (or connect through kubectl port-forward)")
        return await self.authorize(authorization, namespace, name)

    async def decide(self, headers: Mapping[str, str], peer: str) -> Decision:
        """`peer`: the address nginx saw the request come from (never a header the caller set)."""
        try:
            target = validation.sdk_target(
                headers.get("X-Sandbox-ID"),
                headers.get("X-Sandbox-Namespace"),
                headers.get("X-Sandbox-Port"),
                headers.get("X-Sandbox-Pod-IP"),
                headers.get("X-Sandbox-UID"),
            )
        except validation.Invalid as exc:
            return Decision(400, str(exc))
        served = target.namespace in self.namespaces
        route = self.index.route(target.namespace, target.name) if served else None
        # Authorization comes before "not found", so an unauthorized caller cannot probe which sandboxes exist.
        if self._needs_authorization(route):
            refused = await self._authorized(
                peer, headers.get("Authorization", ""), target.namespace, target.name
            )
            if refused is not None:
                return refused
        if route is None or (target.uid is not None and target.uid != route.uid):
            return Decision(404, f"sandbox {target.namespace}/{target.name} not found")
        if target.port not in route.ports:
            declared = ", ".join(str(p) for p in sorted(route.ports)) or "none"
            return Decision(
                403,
                f"port {target.port} is not declared by sandbox {target.namespace}/{target.name}'s pod "
                f"template (declared: {declared})",
            )
        if not route.ready or not route.ips:
            return Decision(502, f"sandbox {target.namespace}/{target.name} is not ready", waiting_for=route)
        ip = route.ips[0]
        if target.pod_ip is not None:
            if target.pod_ip not in route.ips:
                # A 5xx makes the SDK forget a stale pod IP (after a pod swap) and retry without it.
                return Decision(502, "X-Sandbox-Pod-IP is not the sandbox's pod (stale?)")
            ip = target.pod_ip
        token = None
        if target.port == route.runtime_port:
            # Only the runtime gets the token; a dev server on another port never sees it.
            try:
                token = await self.runtime_tokens(target.namespace, target.name, route.uid)
            except ApiError as exc:
                log.warning("runtime token of %s/%s not read: %s", target.namespace, target.name, exc)
                return Decision(503, "could not read the sandbox's runtime token; retry")
        return Decision(
            200,
            "ok",
            upstream=_upstream(ip, target.port),
            runtime_token=token,
            sandbox=f"{route.namespace}/{route.name}",
            uid=route.uid,
        )
