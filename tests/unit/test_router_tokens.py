"""Preview tokens: signing, verification, expiry, maximum lifetime, uid binding, tampering, key rotation, and
signed links."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json

import pytest
from shadow_operator.common.links import signed_link
from shadow_operator.common.tokens import KeyRing, TokenError, generate_key

pytestmark = pytest.mark.unit

OLD, NEW = b"o" * 32, b"n" * 32
NOW = 1_800_000_000.0
UID = "6f1c2a8e-3b7d-4c5e-9f10-2a3b4c5d6e7f"


def test_signed_token_verifies_to_its_claims() -> None:
    keys = KeyRing({"k1": OLD})
    claims = keys.verify(keys.sign("team-a", "sb-1", UID, 60, now=NOW), now=NOW + 59)
    assert (claims.namespace, claims.sandbox, claims.uid) == ("team-a", "sb-1", UID)
    assert (claims.issued, claims.expires) == (int(NOW), int(NOW) + 60)


def test_expired_token_is_refused() -> None:
    keys = KeyRing({"k1": OLD})
    token = keys.sign("team-a", "sb-1", UID, 60, now=NOW)
    with pytest.raises(TokenError) as refused:
        keys.verify(token, now=NOW + 60)
    assert refused.value.reason == "expired"


@pytest.mark.parametrize(
    ("mangle", "reason"),
    [
        (lambda t: t[:-1] + ("A" if t[-1] != "A" else "B"), "bad-signature"),
        (
            lambda t: ".".join([*t.split(".")[:2], t.split(".")[2][:-2] + "xx", t.split(".")[3]]),
            "bad-signature",
        ),
        (lambda t: "v9" + t[2:], "malformed"),
        (lambda t: t + ".extra", "malformed"),
        (lambda t: t.replace(".k1.", ".k7."), "unknown-key"),
        (lambda t: "x" * 2000, "too-long"),
        (lambda t: "", "malformed"),
    ],
)
def test_tampered_tokens_are_refused(mangle: object, reason: str) -> None:
    keys = KeyRing({"k1": OLD})
    token = keys.sign("team-a", "sb-1", UID, 60, now=NOW)
    with pytest.raises(TokenError) as refused:
        keys.verify(mangle(token), now=NOW)  # type: ignore[operator]
    assert refused.value.reason == reason


def test_rotation_signs_with_the_newest_key_and_accepts_both() -> None:
    before = KeyRing({"2026-01": OLD})
    during = KeyRing({"2026-01": OLD, "2026-02": NEW})
    after = KeyRing({"2026-02": NEW})
    old_token = before.sign("ns", "sb", UID, 3600, now=NOW)
    new_token = during.sign("ns", "sb", UID, 3600, now=NOW)
    assert new_token.split(".")[1] == "2026-02"
    # Live cookies signed before the new key was added keep working while both keys are present.
    assert during.verify(old_token, now=NOW).sandbox == "sb"
    assert after.verify(new_token, now=NOW).sandbox == "sb"
    with pytest.raises(TokenError):
        after.verify(old_token, now=NOW)


@pytest.mark.parametrize("keys", [{"k1": b"short"}, {"bad id!": OLD}])
def test_weak_or_oddly_named_keys_are_refused(keys: dict[str, bytes]) -> None:
    with pytest.raises(ValueError):
        KeyRing(keys)


def test_keys_load_from_a_mounted_secret(tmp_path: object) -> None:
    from pathlib import Path

    directory = Path(str(tmp_path))
    (directory / "k1").write_text(generate_key() + "\n")
    (directory / "..data").mkdir()  # the kubelet's own bookkeeping is skipped
    ring = KeyRing.from_directory(directory)
    assert ring.signing_id == "k1"
    assert ring.verify(ring.sign("ns", "sb", UID, 5)).sandbox == "sb"
    assert not KeyRing.from_directory(directory / "missing")


def test_signed_link_appends_the_token_to_the_preview_url() -> None:
    keys = KeyRing({"k1": OLD})
    link = signed_link(
        keys, "https://sb-1.preview.example.com/", "team-a", "sb-1", UID, ttl_seconds=60, now=NOW
    )
    base, _, token = link.partition("?shadow_token=")
    assert base == "https://sb-1.preview.example.com/"
    claims = keys.verify(token, now=NOW)
    assert (claims.sandbox, claims.uid) == ("sb-1", UID)


def test_token_signed_to_live_longer_than_the_maximum_is_refused() -> None:
    keys = KeyRing({"k1": OLD})
    day = 24 * 3600
    assert keys.verify(keys.sign("ns", "sb", UID, day, now=NOW), now=NOW, max_lifetime=day).uid == UID
    too_long = keys.sign("ns", "sb", UID, day + 1, now=NOW)
    for at in (NOW, NOW + day):  # refused from the start, not only once it has run past the maximum
        with pytest.raises(TokenError) as refused:
            keys.verify(too_long, now=at, max_lifetime=day)
        assert refused.value.reason == "lifetime-too-long"


def test_token_issued_in_the_future_is_refused_beyond_clock_skew() -> None:
    keys = KeyRing({"k1": OLD})
    assert keys.verify(keys.sign("ns", "sb", UID, 60, now=NOW + 30), now=NOW).uid == UID
    with pytest.raises(TokenError) as refused:
        # Dated ahead, it would outlive the maximum counted from now.
        keys.verify(keys.sign("ns", "sb", UID, 60, now=NOW + 3600), now=NOW, max_lifetime=3600)
    assert refused.value.reason == "not-yet-valid"


def _v1_token(key: bytes, payload: dict[str, object]) -> str:
    """A token as the previous format signed it: bound to the name only, no issue time."""
    encoded = base64.urlsafe_b64encode(json.dumps(payload).encode()).rstrip(b"=").decode()
    signed = f"v1.k1.{encoded}"
    mac = hmac.new(key, signed.encode(), hashlib.sha256).digest()
    return f"{signed}.{base64.urlsafe_b64encode(mac).rstrip(b'=').decode()}"


def test_tokens_without_a_uid_are_refused() -> None:
    keys = KeyRing({"k1": OLD})
    with pytest.raises(TokenError) as refused:
        keys.verify(_v1_token(OLD, {"ns": "ns", "sb": "sb", "exp": int(NOW) + 60}), now=NOW)
    assert refused.value.reason == "malformed"
    with pytest.raises(ValueError, match="uid"):
        keys.sign("ns", "sb", "", 60, now=NOW)


def test_namespace_keys_are_derived_per_namespace_under_the_same_ids() -> None:
    """Issue 28 L3: each namespace's keys are HMAC(root key, its name); they sign for that namespace only."""
    root = KeyRing({"k1": OLD, "k2": NEW})
    team_a, team_b = root.for_namespace("team-a"), root.for_namespace("team-b")
    assert set(team_a.secrets()) == {"k1", "k2"} and team_a.signing_id == "k2"
    expected = hmac.new(
        NEW, b"shadow-operator preview links for namespace\x00team-a", hashlib.sha256
    ).digest()
    assert team_a.secrets()["k2"] == base64.urlsafe_b64encode(expected).rstrip(b"=")
    assert team_a.secrets() != team_b.secrets() and OLD not in team_a.secrets().values()
    assert root.for_namespace("team-a").secrets() == team_a.secrets()  # the operator and router agree
    token = team_a.sign("team-b", "sb-1", UID, 60, now=NOW)
    with pytest.raises(TokenError) as refused:
        team_b.verify(token, now=NOW)
    assert refused.value.reason == "bad-signature"
    with pytest.raises(ValueError, match="namespace"):
        root.for_namespace("")
