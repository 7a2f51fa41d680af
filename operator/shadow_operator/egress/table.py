"""Who is asking: the sandboxes the gateway serves, their addresses, proxy credentials and effective rules.

A connection is attributed to a sandbox only when BOTH the proxy credential it presents and its source address
belong to that sandbox: a credential copied out of one sandbox is useless from another Pod, and a Pod that
inherits a recycled IP address has no credential for the sandbox that had it.
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shadow_operator.api.models import EgressNarrowing, EgressPolicy
from shadow_operator.common import egress


@dataclass(frozen=True)
class SandboxEntry:
    namespace: str
    name: str
    token: str
    addresses: frozenset[str]
    rules: tuple[egress.Rule, ...]
    dropped: tuple[str, ...] = ()
    # Bearer token that may read this sandbox's decision log (the sandbox's runtime token: whoever may use the
    # sandbox may read its log).
    log_token: str | None = None
    # The Sandbox's uid (its decisions are Events about it; `kubectl describe` matches them by uid).
    uid: str = ""

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass
class PolicyTable:
    """Every sandbox under an egress policy, and the credential values its rules name."""

    sandboxes: dict[str, SandboxEntry] = field(default_factory=dict)
    # (namespace, secret name) -> key -> value
    secrets: dict[tuple[str, str], dict[str, str]] = field(default_factory=dict)

    def identify(self, token: str | None, address: str) -> SandboxEntry | None:
        if not token:
            return None
        for entry in self.sandboxes.values():
            if hmac.compare_digest(entry.token, token):
                return entry if address in entry.addresses else None
        return None

    def secret(self, namespace: str, name: str, key: str) -> str | None:
        return self.secrets.get((namespace, name), {}).get(key)

    def replace(
        self, sandboxes: Iterable[SandboxEntry], secrets: Mapping[tuple[str, str], dict[str, str]]
    ) -> None:
        """Swap in a new state at once: a decision sees the old table or the new one, never a mix."""
        self.sandboxes = {entry.key: entry for entry in sandboxes}
        self.secrets = dict(secrets)


def entry_from_dict(item: Mapping[str, Any]) -> SandboxEntry:
    template = EgressPolicy.model_validate(item.get("template") or {})
    narrowing = (
        EgressNarrowing.model_validate(item["narrowing"]) if item.get("narrowing") is not None else None
    )
    result = egress.effective(template, narrowing)
    return SandboxEntry(
        namespace=item["namespace"],
        name=item["name"],
        token=item["token"],
        addresses=frozenset(item.get("addresses") or ()),
        rules=result.rules or (),
        dropped=result.dropped,
        log_token=item.get("logToken"),
        uid=item.get("uid") or "",
    )


def load_file(table: PolicyTable, path: Path) -> None:
    """The file source (development, tests, a cluster without the watch): JSON with `sandboxes` (namespace,
    name, token, addresses, template: an EgressPolicy, narrowing, logToken, uid) and `secrets` ("ns/name": {key:
    value})."""
    data = json.loads(path.read_text())
    secrets = {tuple(ref.split("/", 1)): dict(values) for ref, values in (data.get("secrets") or {}).items()}
    table.replace((entry_from_dict(item) for item in data.get("sandboxes") or ()), secrets)
