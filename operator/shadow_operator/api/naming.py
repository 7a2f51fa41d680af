"""Deterministic names and label values derived from object names."""

from __future__ import annotations

import hashlib

from shadow_operator.api import constants as c

_FNV_OFFSET = 0x811C9DC5
_FNV_PRIME = 0x01000193
MAX_NAME = 253


def name_hash(name: str) -> str:
    """FNV-1a 32-bit of the name as 8 hex digits: a label value of bounded length (as upstream)."""
    value = _FNV_OFFSET
    for byte in name.encode():
        value = ((value ^ byte) * _FNV_PRIME) & 0xFFFFFFFF
    return f"{value:08x}"


def bounded(name: str, limit: int = MAX_NAME) -> str:
    """`name` if it fits in `limit`, else a prefix plus a short digest so distinct inputs stay distinct."""
    if len(name) <= limit:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:10]
    return f"{name[: limit - 11].rstrip('-.')}-{digest}"


def token_secret_name(sandbox: str) -> str:
    return bounded(sandbox + c.RUNTIME_TOKEN_SECRET_SUFFIX)


def pvc_name(template_name: str, sandbox: str) -> str:
    return bounded(f"{template_name}-{sandbox}")


def network_policy_name(template: str) -> str:
    return bounded(f"{template}-sandbox-network", 253)
