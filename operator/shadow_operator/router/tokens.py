"""Signed, expiring preview tokens: HMAC-SHA256 over (namespace, sandbox, expiry), several keys for rotation.

Format: `v1.<key id>.<payload>.<signature>`, payload and signature base64url without padding; the payload is
the JSON `{"ns": ..., "sb": ..., "exp": <unix seconds>}`. The key id names the key that signed, so a verifier
holding several keys checks against exactly one. Rotation: add a key whose id sorts after the others (new
links are signed with the last id), keep the old one until the longest token it signed has expired, then drop
it; live cookies keep working throughout because every key present is accepted.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import os
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

VERSION = "v1"
# Key ids are Secret data keys and appear in tokens: keep them short and plain.
KEY_ID = re.compile(r"^[A-Za-z0-9_-]{1,32}$")
MIN_KEY_BYTES = 32
MAX_TOKEN_LENGTH = 1024


class TokenError(ValueError):
    """A token that does not verify; `reason` is a stable word for logs and tests."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class Claims:
    namespace: str
    sandbox: str
    expires: int


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _mac(key: bytes, signed: str) -> bytes:
    return hmac.new(key, signed.encode(), hashlib.sha256).digest()


class KeyRing:
    """The keys a router accepts (id -> secret); signs with the key whose id sorts last."""

    def __init__(self, keys: Mapping[str, bytes]) -> None:
        for kid, secret in keys.items():
            if not KEY_ID.match(kid):
                raise ValueError(f"preview key id {kid!r} must match {KEY_ID.pattern}")
            if len(secret) < MIN_KEY_BYTES:
                raise ValueError(f"preview key {kid!r} is shorter than {MIN_KEY_BYTES} bytes")
        self._keys = dict(keys)

    def __bool__(self) -> bool:
        return bool(self._keys)

    @property
    def signing_id(self) -> str:
        if not self._keys:
            raise ValueError("no preview signing key")
        return max(self._keys)

    @classmethod
    def from_directory(cls, directory: Path) -> KeyRing:
        """A mounted Secret: one file per key (hidden files are the kubelet's own bookkeeping)."""
        keys = {}
        if directory.is_dir():
            for path in sorted(directory.iterdir()):
                if not path.name.startswith(".") and path.is_file():
                    keys[path.name] = path.read_bytes().strip()
        return cls(keys)

    def sign(self, namespace: str, sandbox: str, ttl_seconds: int, *, now: float | None = None) -> str:
        if ttl_seconds <= 0:
            raise ValueError("ttl_seconds must be positive")
        kid = self.signing_id
        expires = int(now if now is not None else time.time()) + ttl_seconds
        payload = _b64(
            json.dumps({"ns": namespace, "sb": sandbox, "exp": expires}, separators=(",", ":")).encode()
        )
        signed = f"{VERSION}.{kid}.{payload}"
        return f"{signed}.{_b64(_mac(self._keys[kid], signed))}"

    def verify(self, token: str, *, now: float | None = None) -> Claims:
        """The claims of a valid, unexpired token; TokenError otherwise (never anything else)."""
        if len(token) > MAX_TOKEN_LENGTH:
            raise TokenError("too-long")
        parts = token.split(".")
        if len(parts) != 4 or parts[0] != VERSION:
            raise TokenError("malformed")
        _, kid, payload, signature = parts
        key = self._keys.get(kid)
        if key is None:
            raise TokenError("unknown-key")
        try:
            presented = _unb64(signature)
        except (binascii.Error, ValueError):
            raise TokenError("malformed") from None
        if not hmac.compare_digest(presented, _mac(key, f"{VERSION}.{kid}.{payload}")):
            raise TokenError("bad-signature")
        try:
            data = json.loads(_unb64(payload))
            claims = Claims(str(data["ns"]), str(data["sb"]), int(data["exp"]))
        except (binascii.Error, ValueError, KeyError, TypeError):
            raise TokenError("malformed") from None
        if claims.expires <= (now if now is not None else time.time()):
            raise TokenError("expired")
        return claims


def generate_key() -> str:
    """A fresh key for the keys Secret (URL-safe text, 256 bits)."""
    return _b64(os.urandom(32))
