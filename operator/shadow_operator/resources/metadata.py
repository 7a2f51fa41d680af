"""Metadata every child object of ours carries or is read by: owner references, the controller's uid, and the
label and annotation keys reserved for selectors and ownership (never copied from what a user wrote).

Pure functions over API objects, for the builders in `resources/`, the engine's client and the reconcilers.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from shadow_operator.api import constants as c

Body = Mapping[str, Any]


def is_reserved_key(key: str) -> bool:
    return key.startswith(c.RESERVED_PREFIXES)


def drop_reserved(mapping: Mapping[str, str] | None) -> dict[str, str]:
    """User labels/annotations minus the keys that steer selectors and ownership."""
    return {k: v for k, v in (mapping or {}).items() if not is_reserved_key(k)}


def owner_reference(owner: Body, *, controller: bool = True) -> dict[str, Any]:
    return {
        "apiVersion": owner["apiVersion"],
        "kind": owner["kind"],
        "name": owner["metadata"]["name"],
        "uid": owner["metadata"]["uid"],
        "controller": controller,
        "blockOwnerDeletion": True,
    }


def controller_uid(obj: Body) -> str | None:
    for ref in obj.get("metadata", {}).get("ownerReferences") or ():
        if ref.get("controller"):
            return str(ref.get("uid"))
    return None
