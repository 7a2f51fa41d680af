"""Signed, expiring preview tokens: HMAC-SHA256 over (namespace, sandbox, sandbox uid, issued, expiry), several
keys for rotation.

Format: `v2.<key id>.<payload>.<signature>`, payload and signature base64url without padding; the payload is
the JSON `{"ns": ..., "sb": ..., "uid": ..., "iat": <unix seconds>, "exp": <unix seconds>}`. The uid binds a
token to one incarnation of the sandbox: a sandbox deleted and created again under the same name has a new
uid, so links to the old one open nothing. `iat` lets a verifier refuse tokens signed to live longer than it
allows (`max_lifetime`), whoever signed them. v1 tokens (bound to the name only, no issue time) are refused.
The key id names the key that signed, so a verifier holding several keys checks against exactly one. Rotation: add a key whose id sorts after the others (new
links are signed with the last id), keep the old one until the longest token it signed has expired, then drop
it; live cookies keep working throughout because every key present is accepted.

Per namespace: the router holds the root keys (a Secret no tenant reads) and verifies a token for a sandbox of
namespace N only with N's keys, `for_namespace(N)`: each root key's HMAC over N, under the same key id. The
operator writes N's keys into a Secret in N (`PREVIEW_LINK_KEYS_SECRET`), so whoever may read Secrets there
signs links for N's sandboxes and for no other namespace's. Rotating a root key rotates every namespace's.
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

VERSION = "v2"
# The longest a token may live (expiry minus issue time) unless the router is told otherwise; the chart's
# previewRouter.maxTokenSeconds defaults to it too.
DEFAULT_MAX_LIFETIME_SECONDS = 24 * 3600
# Clocks of the signer (a laptop) and the router differ a little: a token issued this far ahead still counts.
CLOCK_SKEW_SECONDS = 60
# Key ids are Secret data keys and appear in tokens: keep them short and plain.
KEY_ID = re.compile(r"^[A-Za-z0-9_-]{1,32}$")
MIN_KEY_BYTES = 32
MAX_TOKEN_LENGTH = 1024
# What a namespace's keys are derived for (HMAC-SHA256(root key, DERIVATION + namespace)): never a token's MAC.
DERIVATION = b"shadow-operator preview links for namespace\x00"


class TokenError(ValueError):
    """A token that does not verify; `reason` is a stable word for logs and tests."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class Claims:
    namespace: str
    sandbox: str
    uid: str
    issued: int
    expires: int


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _mac_bytes(key: bytes, message: bytes) -> bytes:
    return hmac.new(key, message, hashlib.sha256).digest()


def _mac(key: bytes, signed: str) -> bytes:
    return _mac_bytes(key, signed.encode())


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

    def secrets(self) -> dict[str, bytes]:
        """Key id -> key: what a keys Secret holds."""
        return dict(self._keys)

    def for_namespace(self, namespace: str) -> KeyRing:
        """The keys of one namespace, derived from these (the root keys): the same ids, each key the base64url
        text of HMAC-SHA256(root key, DERIVATION + namespace). They sign and verify tokens for that namespace's
        sandboxes only; they reveal nothing of the root keys or of another namespace's keys."""
        if not namespace:
            raise ValueError("preview keys are derived for a namespace: give one")
        label = DERIVATION + namespace.encode()
        return KeyRing({kid: _b64(_mac_bytes(key, label)).encode() for kid, key in self._keys.items()})

    @classmethod
    def from_secret_data(cls, data: Mapping[str, str] | None) -> KeyRing:
        """A keys Secret's `data` as the API server returns it (base64 values); ValueError when one is not."""
        keys = {}
        for kid, value in (data or {}).items():
            try:
                keys[kid] = base64.b64decode(value, validate=True).strip()
            except (binascii.Error, ValueError):
                raise ValueError(f"preview key {kid!r} is not base64") from None
        return cls(keys)

    @classmethod
    def from_directory(cls, directory: Path) -> KeyRing:
        """A mounted Secret: one file per key (hidden files are the kubelet's own bookkeeping)."""
        keys = {}
        if directory.is_dir():
            for path in sorted(directory.iterdir()):
                if not path.name.startswith(".") and path.is_file():
                    keys[path.name] = path.read_bytes().strip()
        return cls(keys)

    def sign(
        self, namespace: str, sandbox: str, uid: str, ttl_seconds: int, *, now: float | None = None
    ) -> str:
        """A token for the sandbox `namespace/sandbox` whose metadata.uid is `uid`, valid `ttl_seconds`."""
        if ttl_seconds <= 0:
            raise ValueError("ttl_seconds must be positive")
        if not uid:
            raise ValueError("a preview token is bound to the sandbox's uid: give one")
        kid = self.signing_id
        issued = int(now if now is not None else time.time())
        claims = {"ns": namespace, "sb": sandbox, "uid": uid, "iat": issued, "exp": issued + ttl_seconds}
        payload = _b64(json.dumps(claims, separators=(",", ":")).encode())
        signed = f"{VERSION}.{kid}.{payload}"
        return f"{signed}.{_b64(_mac(self._keys[kid], signed))}"

    def verify(self, token: str, *, now: float | None = None, max_lifetime: int | None = None) -> Claims:
        """The claims of a valid, unexpired token that was signed to live at most `max_lifetime` seconds (any
        lifetime when None); TokenError otherwise (never anything else)."""
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
            claims = Claims(
                str(data["ns"]), str(data["sb"]), str(data["uid"]), int(data["iat"]), int(data["exp"])
            )
        except (binascii.Error, ValueError, KeyError, TypeError, AttributeError):
            raise TokenError("malformed") from None
        at = now if now is not None else time.time()
        if claims.expires <= at:
            raise TokenError("expired")
        if claims.issued > at + CLOCK_SKEW_SECONDS:
            raise TokenError("not-yet-valid")
        if max_lifetime is not None and claims.expires - claims.issued > max_lifetime:
            raise TokenError("lifetime-too-long")
        return claims


def generate_key() -> str:
    """A fresh key for the keys Secret (URL-safe text, 256 bits)."""
    return _b64(os.urandom(32))
