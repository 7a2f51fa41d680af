"""The runtime token of a sandbox, for the SDK path: its token Secret read by name when a request needs it.

router-auth never lists or watches Secrets (issue 28 L4): the internet-facing pod may only `get` a Secret whose
name it knows, the one the operator made for the sandbox a request was already routed to. Answers are kept
`ttl` seconds per (namespace, sandbox, sandbox uid), so a busy session costs one read, not one per request.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from shadow_operator.api import naming
from shadow_operator.api.kinds import SECRET
from shadow_operator.clients.kube import Kube
from shadow_operator.router.access import Expiring
from shadow_operator.router.index import runtime_token


@dataclass
class RuntimeTokens:
    """`await tokens(namespace, sandbox, uid)`: the runtime token, or None (no such Secret, or not the operator's).
    An API error (ApiError) is the caller's to answer."""

    kube: Kube
    ttl: float = 10.0
    clock: Callable[[], float] = time.monotonic
    _known: Expiring[tuple[str, str, str], str | None] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._known = Expiring(self.ttl, self.clock)

    async def __call__(self, namespace: str, sandbox: str, uid: str) -> str | None:
        key = (namespace, sandbox, uid)
        cached = self._known.get(key)
        if cached is not None:
            return cached[0]
        body = await self.kube.get(SECRET.path(namespace, naming.token_secret_name(sandbox)))
        token = runtime_token(body) if body is not None else None
        self._known.put(key, token)
        return token
