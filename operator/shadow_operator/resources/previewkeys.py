"""The Secret of one namespace's preview link keys (common/tokens.py `KeyRing.for_namespace`): what the
operator writes into each namespace the preview router serves, and tenants there read to sign links."""

from __future__ import annotations

import base64
from typing import Any

from shadow_operator.api import constants as c
from shadow_operator.common.tokens import KeyRing


def link_keys_secret(namespace: str, root: KeyRing) -> dict[str, Any]:
    """The Secret `PREVIEW_LINK_KEYS_SECRET` in `namespace`: the root keys derived for it, under their ids."""
    derived = root.for_namespace(namespace).secrets()
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": c.PREVIEW_LINK_KEYS_SECRET,
            "namespace": namespace,
            "labels": {c.LABEL_MANAGED_BY: c.MANAGED_BY_VALUE},
            "annotations": {c.ANNOTATION_PREVIEW_LINK_NAMESPACE: namespace},
        },
        "type": "Opaque",
        "data": {kid: base64.b64encode(key).decode() for kid, key in sorted(derived.items())},
    }


def differs(current: dict[str, Any] | None, wanted: dict[str, Any]) -> bool:
    """Whether the Secret as it is (None: absent) lacks what `link_keys_secret` wants of it."""
    if current is None:
        return True
    meta, want = current.get("metadata") or {}, wanted["metadata"]
    return (
        (current.get("data") or {}) != wanted["data"]
        or any((meta.get("labels") or {}).get(k) != v for k, v in want["labels"].items())
        or any((meta.get("annotations") or {}).get(k) != v for k, v in want["annotations"].items())
    )
