"""Who may use the SDK path, asked of the API server: TokenReview (who is this bearer token?) then
SubjectAccessReview (may they `create` the subresource `sandboxes/proxy` of group agents.x-k8s.io, named
like the sandbox, in its namespace?).

`create` on `sandboxes/proxy` mirrors `pods/exec` and `pods/portforward` (both `create`): reaching a sandbox's
runtime runs commands in it, which reading the Sandbox (`get sandboxes`) must not grant. A Role may narrow it
to some sandboxes with `resourceNames`. Answers are remembered briefly (`ttl` seconds, by a hash of the token,
never the token itself) so a session costs one review per sandbox, not one per request; a revoked binding stops
working within that time plus nginx's authCacheSeconds.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from shadow_operator.clients.kube import ApiError, Kube
from shadow_operator.router.decisions import Decision

log = logging.getLogger(__name__)

GROUP = "agents.x-k8s.io"
RESOURCE = "sandboxes"
SUBRESOURCE = "proxy"
VERB = "create"
TOKEN_REVIEWS = "/apis/authentication.k8s.io/v1/tokenreviews"
SUBJECT_ACCESS_REVIEWS = "/apis/authorization.k8s.io/v1/subjectaccessreviews"
MAX_ENTRIES = 10_000
K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class Expiring(Generic[K, V]):
    """Answers kept `ttl` seconds; at most MAX_ENTRIES (then forgotten all at once: they are cheap to ask)."""

    def __init__(self, ttl: float, clock: Callable[[], float]) -> None:
        self.ttl = ttl
        self.clock = clock
        self._entries: dict[K, tuple[V, float]] = {}

    def get(self, key: K) -> tuple[V] | None:
        """`(value,)` while remembered (the value may itself be None: a remembered refusal), else None."""
        found = self._entries.get(key)
        if found is None or found[1] <= self.clock():
            return None
        return (found[0],)

    def put(self, key: K, value: V) -> None:
        if len(self._entries) >= MAX_ENTRIES:
            self._entries.clear()
        self._entries[key] = (value, self.clock() + self.ttl)


@dataclass(frozen=True)
class User:
    """status.user of a TokenReview: what a SubjectAccessReview asks about."""

    username: str
    uid: str
    groups: tuple[str, ...]
    extra: Mapping[str, tuple[str, ...]]


def bearer(authorization: str) -> str | None:
    scheme, _, token = authorization.strip().partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token and " " not in token else None


def _user(status: Mapping[str, Any]) -> User | None:
    if not status.get("authenticated"):
        return None
    user = status.get("user") or {}
    return User(
        username=str(user.get("username") or ""),
        uid=str(user.get("uid") or ""),
        groups=tuple(str(g) for g in user.get("groups") or ()),
        extra={
            str(k): tuple(str(v) for v in values or ()) for k, values in (user.get("extra") or {}).items()
        },
    )


@dataclass
class ApiServerAuthorizer:
    """The `Authorizer` of `decisions.SdkPolicy`: a bearer token the API server authenticates and authorizes."""

    kube: Kube
    ttl: float = 10.0
    clock: Callable[[], float] = time.monotonic
    _users: Expiring[str, User | None] = field(init=False, repr=False)
    _verdicts: Expiring[tuple[str, str, str], bool] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._users = Expiring(self.ttl, self.clock)
        self._verdicts = Expiring(self.ttl, self.clock)

    async def __call__(self, authorization: str, namespace: str, sandbox: str) -> Decision | None:
        token = bearer(authorization)
        if token is None:
            return Decision(401, "Authorization must be `Bearer <token>`")
        digest = hashlib.sha256(token.encode()).hexdigest()
        try:
            user = await self._authenticate(digest, token)
            if user is None:
                return Decision(401, "the bearer token was not accepted by the API server")
            allowed = await self._authorize(digest, user, namespace, sandbox)
        except ApiError as exc:
            log.warning("access review failed: %s", exc)
            return Decision(503, "could not check the caller's access; retry")
        if not allowed:
            return Decision(
                403,
                f"{user.username} may not {VERB} {RESOURCE}/{SUBRESOURCE} ({GROUP}) of {namespace}/{sandbox}",
            )
        return None

    async def _authenticate(self, digest: str, token: str) -> User | None:
        cached = self._users.get(digest)
        if cached is not None:
            return cached[0]
        review = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": token}}
        result = await self.kube.create(TOKEN_REVIEWS, review)
        found = _user(result.get("status") or {})
        self._users.put(digest, found)
        return found

    async def _authorize(self, digest: str, user: User, namespace: str, sandbox: str) -> bool:
        key = (digest, namespace, sandbox)
        cached = self._verdicts.get(key)
        if cached is not None:
            return cached[0]
        spec: dict[str, Any] = {
            "user": user.username,
            "groups": list(user.groups),
            "resourceAttributes": {
                "namespace": namespace,
                "verb": VERB,
                "group": GROUP,
                "resource": RESOURCE,
                "subresource": SUBRESOURCE,
                "name": sandbox,
            },
        }
        if user.uid:
            spec["uid"] = user.uid
        if user.extra:
            spec["extra"] = {k: list(v) for k, v in user.extra.items()}
        review = {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "spec": spec}
        result = await self.kube.create(SUBJECT_ACCESS_REVIEWS, review)
        allowed = bool((result.get("status") or {}).get("allowed"))
        self._verdicts.put(key, allowed)
        return allowed
