"""Preview tokens: signing, verification, expiry, tampering, key rotation, and signed links."""

from __future__ import annotations

import pytest
from shadow_operator.router.links import signed_link
from shadow_operator.router.tokens import KeyRing, TokenError, generate_key

pytestmark = pytest.mark.unit

OLD, NEW = b"o" * 32, b"n" * 32
NOW = 1_800_000_000.0


def test_signed_token_verifies_to_its_claims() -> None:
    keys = KeyRing({"k1": OLD})
    claims = keys.verify(keys.sign("team-a", "sb-1", 60, now=NOW), now=NOW + 59)
    assert (claims.namespace, claims.sandbox, claims.expires) == ("team-a", "sb-1", int(NOW) + 60)


def test_expired_token_is_refused() -> None:
    keys = KeyRing({"k1": OLD})
    token = keys.sign("team-a", "sb-1", 60, now=NOW)
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
        (lambda t: "v2" + t[2:], "malformed"),
        (lambda t: t + ".extra", "malformed"),
        (lambda t: t.replace(".k1.", ".k7."), "unknown-key"),
        (lambda t: "x" * 2000, "too-long"),
        (lambda t: "", "malformed"),
    ],
)
def test_tampered_tokens_are_refused(mangle: object, reason: str) -> None:
    keys = KeyRing({"k1": OLD})
    token = keys.sign("team-a", "sb-1", 60, now=NOW)
    with pytest.raises(TokenError) as refused:
        keys.verify(mangle(token), now=NOW)  # type: ignore[operator]
    assert refused.value.reason == reason


def test_rotation_signs_with_the_newest_key_and_accepts_both() -> None:
    before = KeyRing({"2026-01": OLD})
    during = KeyRing({"2026-01": OLD, "2026-02": NEW})
    after = KeyRing({"2026-02": NEW})
    old_token = before.sign("ns", "sb", 3600, now=NOW)
    new_token = during.sign("ns", "sb", 3600, now=NOW)
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
    assert ring.verify(ring.sign("ns", "sb", 5)).sandbox == "sb"
    assert not KeyRing.from_directory(directory / "missing")


def test_signed_link_appends_the_token_to_the_preview_url() -> None:
    keys = KeyRing({"k1": OLD})
    link = signed_link(keys, "https://sb-1.preview.example.com/", "team-a", "sb-1", ttl_seconds=60, now=NOW)
    base, _, token = link.partition("?shadow_token=")
    assert base == "https://sb-1.preview.example.com/"
    assert keys.verify(token, now=NOW).sandbox == "sb-1"
