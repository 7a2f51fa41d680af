"""Egress allowlists: which rules apply to a sandbox (narrowing only) and what they allow."""

from __future__ import annotations

import pytest
from shadow_operator.api.models import EgressNarrowing, EgressPolicy
from shadow_operator.common import egress

pytestmark = pytest.mark.unit

SANDBOX = "team-a/agent-1"


def policy(*rules: dict[str, object]) -> EgressPolicy:
    return EgressPolicy.model_validate({"rules": list(rules)})


def narrowing(*rules: dict[str, object]) -> EgressNarrowing:
    return EgressNarrowing.model_validate({"rules": list(rules)})


TEMPLATE = policy(
    {"host": "pypi.org", "methods": ["GET", "HEAD"], "paths": ["/simple/", "/pypi/"]},
    {"host": "*.pythonhosted.org"},
    {
        "host": "api.model.example",
        "methods": ["POST"],
        "paths": ["/v1/"],
        "credential": {
            "secretName": "model-key",
            "key": "token",
            "header": "Authorization",
            "prefix": "Bearer ",
        },
    },
)


def test_hosts_exact_and_suffix() -> None:
    assert egress.host_matches("pypi.org", "PyPI.org.")
    assert not egress.host_matches("pypi.org", "evil-pypi.org")
    assert egress.host_matches("*.pythonhosted.org", "files.pythonhosted.org")
    assert egress.host_matches("*.pythonhosted.org", "a.b.pythonhosted.org")
    # The suffix is a whole label: neither the domain itself nor a name that only ends the same way.
    assert not egress.host_matches("*.pythonhosted.org", "pythonhosted.org")
    assert not egress.host_matches("*.pythonhosted.org", "evilpythonhosted.org")


def test_no_policy_means_the_gateway_is_not_involved() -> None:
    assert egress.effective(None, narrowing({"host": "pypi.org"})).rules is None


def test_a_set_policy_denies_everything_it_does_not_name() -> None:
    rules = egress.effective(policy(), None).rules
    assert rules == ()
    refused = egress.decide_connection(rules, SANDBOX, "pypi.org", 443)
    assert not refused.allowed
    assert refused.reason == (
        "egress to pypi.org:443 is not allowed for sandbox team-a/agent-1: add host pypi.org to the template "
        "or claim's egress rules"
    )


def test_method_and_path_prefix() -> None:
    rules = egress.effective(TEMPLATE, None).rules
    assert rules is not None
    assert egress.decide_request(rules, SANDBOX, "pypi.org", 443, "GET", "/simple/numpy/?x=1").allowed
    post = egress.decide_request(rules, SANDBOX, "pypi.org", 443, "POST", "/simple/numpy/")
    assert not post.allowed
    assert "egress to pypi.org POST /simple/numpy/ is not allowed for sandbox team-a/agent-1" in post.reason
    assert "add method POST" in post.reason
    admin = egress.decide_request(rules, SANDBOX, "pypi.org", 443, "GET", "/admin/")
    assert not admin.allowed and admin.reason.endswith(
        "add a path prefix covering /admin/ to the template or claim's egress rules"
    )
    assert "add method POST to the template" in post.reason
    # Only port 443 unless the rule names others.
    assert not egress.decide_connection(rules, SANDBOX, "pypi.org", 8443).allowed
    assert egress.decide_connection(rules, SANDBOX, "files.pythonhosted.org", 443).allowed


@pytest.mark.parametrize(
    "path",
    [
        "/simple/../admin",
        "/simple/%2e%2e/admin",
        "/simple/..%2fadmin",
        "/simple/%2fadmin",
        "/simple\\..\\a",
        "x",
    ],
)
def test_paths_that_could_mean_another_path_upstream_are_refused(path: str) -> None:
    rules = egress.effective(TEMPLATE, None).rules
    assert rules is not None
    decision = egress.decide_request(rules, SANDBOX, "pypi.org", 443, "GET", path)
    assert not decision.allowed
    assert "cannot be checked" in decision.reason


def test_tls_is_terminated_only_where_a_rule_needs_the_request() -> None:
    rules = egress.effective(TEMPLATE, None).rules
    assert rules is not None
    assert egress.needs_requests(rules, "pypi.org", 443)
    assert egress.needs_requests(rules, "api.model.example", 443)
    assert not egress.needs_requests(rules, "files.pythonhosted.org", 443)
    # Clear HTTP is always seen: it has nothing to hide it.
    assert egress.needs_requests(rules, "files.pythonhosted.org", 80)


def test_websocket_needs_the_rule_to_say_so() -> None:
    rules = egress.effective(policy({"host": "ws.example.com", "paths": ["/"]}), None).rules
    assert rules is not None
    refused = egress.decide_request(rules, SANDBOX, "ws.example.com", 443, "GET", "/chat", websocket=True)
    assert not refused.allowed and "set websocket: true" in refused.reason
    rules = egress.effective(
        policy({"host": "ws.example.com", "paths": ["/"], "websocket": True}), None
    ).rules
    assert rules is not None
    assert egress.decide_request(
        rules, SANDBOX, "ws.example.com", 443, "GET", "/chat", websocket=True
    ).allowed


def test_a_claim_narrows_and_keeps_the_templates_credential() -> None:
    result = egress.effective(
        TEMPLATE,
        narrowing(
            {"host": "pypi.org", "methods": ["GET"], "paths": ["/simple/numpy/"]},
            {"host": "files.pythonhosted.org"},
            {"host": "*.a.pythonhosted.org"},
            {"host": "api.model.example", "methods": ["POST"], "paths": ["/v1/chat/"]},
        ),
    )
    assert result.dropped == ()
    assert result.rules is not None and len(result.rules) == 4
    assert result.rules[3].credential is not None and result.rules[3].credential.secret_name == "model-key"
    assert not egress.decide_request(result.rules, SANDBOX, "pypi.org", 443, "GET", "/simple/flask/").allowed


@pytest.mark.parametrize(
    ("wider", "why"),
    [
        ({"host": "evil.example"}, "no rule of the template covers host evil.example"),
        ({"host": "*.org"}, "no rule of the template covers host *.org"),  # a wider wildcard
        # The domain under the wildcard is not in it.
        ({"host": "pythonhosted.org"}, "no rule of the template covers host pythonhosted.org"),
        (
            {"host": "pypi.org", "methods": ["GET"]},
            "it allows any path (the template's rule for pypi.org allows paths under /simple/ /pypi/ only)",
        ),
        (
            {"host": "pypi.org", "methods": ["GET", "POST"], "paths": ["/simple/"]},
            "method POST is beyond it (the template's rule for pypi.org allows GET,HEAD only)",
        ),
        (
            {"host": "pypi.org", "methods": ["GET"], "paths": ["/"]},
            "path / is beyond it (the template's rule for pypi.org allows paths under /simple/ /pypi/ only)",
        ),
        (
            {"host": "pypi.org", "methods": ["GET"], "paths": ["/simple/"], "ports": [443, 8443]},
            "port 8443 is beyond it (the template's rule for pypi.org allows ports 443)",
        ),
        (
            {"host": "files.pythonhosted.org", "websocket": True},
            "it allows WebSocket (the template's rule for *.pythonhosted.org allows no WebSocket)",
        ),
    ],
)
def test_a_claim_cannot_widen_and_is_told_why(wider: dict[str, object], why: str) -> None:
    result = egress.effective(TEMPLATE, narrowing(wider))
    assert result.rules == ()
    (dropped,) = result.dropped
    assert dropped == f"spec.egress.rules[0] ({egress.Rule.of(narrowing(wider).rules[0]).describe()}): {why}"


@pytest.mark.parametrize(
    ("text", "rule"),
    [
        ("pypi.org", {"host": "pypi.org"}),
        ("*.pythonhosted.org", {"host": "*.pythonhosted.org"}),
        (
            "GET,HEAD pypi.org/simple/",
            {"host": "pypi.org", "methods": ["GET", "HEAD"], "paths": ["/simple/"]},
        ),
        (
            "post api.example.com:8443/v1/",
            {"host": "api.example.com", "ports": [8443], "methods": ["POST"], "paths": ["/v1/"]},
        ),
    ],
)
def test_allow_flags(text: str, rule: dict[str, object]) -> None:
    assert egress.parse_allow(text) == rule
    # What the CLI builds is what the API takes.
    EgressNarrowing.model_validate({"rules": [rule]})


@pytest.mark.parametrize("text", ["https://pypi.org", "pypi.org:https", ""])
def test_allow_flags_that_cannot_work_say_the_syntax(text: str) -> None:
    with pytest.raises(ValueError, match=r"expected \[METHOD,...\] HOST\[:PORT\]\[/PATH-PREFIX\]"):
        egress.parse_allow(text)


def test_the_sdk_puts_allow_flags_in_the_claim() -> None:
    from shadow_operator.sdk.errors import ShadowError
    from shadow_operator.sdk.sandbox import build_claim

    body = build_claim("c", "ns", template="t", warmpool=None, allow=["pypi.org", "GET files.example/x/"])
    assert body["spec"]["egress"] == {
        "rules": [{"host": "pypi.org"}, {"host": "files.example", "methods": ["GET"], "paths": ["/x/"]}]
    }
    # None keeps the template's; an empty list narrows to nothing.
    assert "egress" not in build_claim("c", "ns", template="t", warmpool=None)["spec"]
    assert build_claim("c", "ns", template="t", warmpool=None, allow=[])["spec"]["egress"] == {"rules": []}
    with pytest.raises(ShadowError, match="--allow 'https://x'"):
        build_claim("c", "ns", template="t", warmpool=None, allow=["https://x"])


def test_a_refusal_names_the_rule_that_would_allow_it() -> None:
    rules = egress.effective(TEMPLATE, None).rules or ()
    by_path = egress.decide_request(rules, SANDBOX, "pypi.org", 443, "get", "/packages/x/y.whl?sig=1")
    assert by_path.hint == "GET pypi.org/packages/x/"
    by_host = egress.decide_connection(rules, SANDBOX, "evil.example", 8443)
    assert by_host.hint == "evil.example:8443"
    assert egress.decide_request(rules, SANDBOX, "pypi.org", 443, "GET", "/simple/a/").hint is None


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("pypi.org", "pypi.org"),
        ("a\x1b[2Jb", "a\\x1b[2Jb"),
        ("x\ny\r\tz", "x\\ny\\r\\tz"),
        ("\u202eexe.gnp", "\\u202eexe.gnp"),
        ("back\\slash", "back\\\\slash"),
        ("\x7f\x00", "\\x7f\\x00"),
        ("é" * 100, ("\\xe9" * 100)[:37] + "..."),
    ],
)
def test_hostile_text_is_escaped_to_one_bounded_line(text: str, shown: str) -> None:
    out = egress.printable(text, 40)
    assert out == shown
    assert len(out) <= 40 and all(" " <= ch <= "~" for ch in out)
