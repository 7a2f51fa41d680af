"""Egress allowlists (issue 29): which rules apply to a sandbox, and what they allow.

Pure and shared: the egress gateway decides every connection and request with it, the operator and `shadowctl`
explain refusals with it. A template's `spec.egress` is the platform's allowlist; a claim or environment may
only narrow it (each of its rules must fit inside one of the template's), and a rule that does not fit is
dropped, never widened into. Once a policy applies, anything no rule allows is refused.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import unquote

from shadow_operator.api.models import EgressCredential, EgressNarrowing, EgressPolicy, EgressRuleBase

DEFAULT_PORTS = (443,)
PROXY_USER = "sandbox"
# The one port on which requests travel in clear HTTP; on every other allowed port the gateway speaks TLS.
PLAIN_HTTP_PORT = 80
NARROW_ONLY = (
    "a claim or environment may only narrow its template's egress, so a rule that would widen it is dropped"
)


@dataclass(frozen=True)
class Rule:
    """One effective rule: what the template (or a narrowing inside it) allows, with the template's credential."""

    host: str
    ports: tuple[int, ...] = DEFAULT_PORTS
    methods: frozenset[str] | None = None
    paths: tuple[str, ...] | None = None
    websocket: bool = False
    credential: EgressCredential | None = None

    @classmethod
    def of(cls, rule: EgressRuleBase, credential: EgressCredential | None = None) -> Rule:
        return cls(
            host=rule.host,
            ports=tuple(rule.ports or DEFAULT_PORTS),
            methods=frozenset(rule.methods) if rule.methods else None,
            paths=tuple(rule.paths) if rule.paths else None,
            websocket=rule.websocket,
            credential=credential,
        )

    @property
    def needs_requests(self) -> bool:
        """Whether the gateway must see each request (terminate TLS) to apply this rule."""
        return self.methods is not None or self.paths is not None or self.credential is not None

    def describe(self) -> str:
        methods = ",".join(sorted(self.methods)) if self.methods else "any method"
        paths = " ".join(self.paths) if self.paths else "any path"
        ports = ",".join(str(p) for p in self.ports)
        return f"{self.host}:{ports} {methods} {paths}"


def host_matches(pattern: str, host: str) -> bool:
    """`api.example.com` matches itself only; `*.example.com` every name under example.com, not example.com."""
    host = host.lower().rstrip(".")
    if pattern.startswith("*."):
        return host.endswith(pattern[1:]) and len(host) > len(pattern) - 1
    return host == pattern


def _host_within(narrow: str, wide: str) -> bool:
    if narrow == wide:
        return True
    # x.example.com and *.a.example.com both fit inside *.example.com.
    return wide.startswith("*.") and host_matches(wide, narrow.removeprefix("*."))


def fits(narrow: EgressRuleBase, wide: Rule) -> bool:
    """Whether a claim's rule allows nothing the template's rule does not."""
    if not _host_within(narrow.host, wide.host):
        return False
    if not set(narrow.ports or DEFAULT_PORTS) <= set(wide.ports):
        return False
    if wide.methods is not None and not (narrow.methods and set(narrow.methods) <= wide.methods):
        return False
    if wide.paths is not None and not (
        narrow.paths and all(any(p.startswith(w) for w in wide.paths) for p in narrow.paths)
    ):
        return False
    return not (narrow.websocket and not wide.websocket)


@dataclass(frozen=True)
class Effective:
    """The rules that apply to one sandbox (None: no egress policy, the gateway is not involved) and why some
    of the claim's were dropped."""

    rules: tuple[Rule, ...] | None
    dropped: tuple[
        str, ...
    ] = ()  # each: the rule, what in it goes beyond the template (NARROW_ONLY says why)


def effective(template: EgressPolicy | None, narrowing: EgressNarrowing | None) -> Effective:
    """The template's rules, or the claim's (environment's) where it narrows them."""
    if template is None:
        return Effective(None)
    wide = tuple(Rule.of(rule, rule.credential) for rule in template.rules)
    if narrowing is None:
        return Effective(wide)
    kept: list[Rule] = []
    dropped: list[str] = []
    for i, rule in enumerate(narrowing.rules):
        inside = next((w for w in wide if fits(rule, w)), None)
        if inside is None:
            dropped.append(f"spec.egress.rules[{i}] ({Rule.of(rule).describe()}): {widens(rule, wide)}")
        else:
            kept.append(Rule.of(rule, inside.credential))
    return Effective(tuple(kept), tuple(dropped))


def widens(narrow: EgressRuleBase, wide: Sequence[Rule]) -> str:
    """Why a claim's rule fits inside none of the template's: what it allows beyond the first template rule
    for its host (ports, then methods, paths, WebSocket), or that no template rule covers the host."""
    same_host = [w for w in wide if _host_within(narrow.host, w.host)]
    if not same_host:
        return f"no rule of the template covers host {narrow.host}"
    w = same_host[0]
    theirs = f"the template's rule for {w.host} allows"
    if outside := sorted(set(narrow.ports or DEFAULT_PORTS) - set(w.ports)):
        return (
            f"port {','.join(map(str, outside))} is beyond it ({theirs} ports {','.join(map(str, w.ports))})"
        )
    if w.methods is not None:
        methods = ",".join(sorted(w.methods))
        if not narrow.methods:
            return f"it allows any method ({theirs} {methods} only)"
        if extra := sorted(set(narrow.methods) - w.methods):
            return f"method {','.join(extra)} is beyond it ({theirs} {methods} only)"
    if w.paths is not None:
        paths = " ".join(w.paths)
        if not narrow.paths:
            return f"it allows any path ({theirs} paths under {paths} only)"
        if outside_paths := [p for p in narrow.paths if not any(p.startswith(x) for x in w.paths)]:
            return f"path {' '.join(outside_paths)} is beyond it ({theirs} paths under {paths} only)"
    if narrow.websocket and not w.websocket:
        return f"it allows WebSocket ({theirs} no WebSocket)"
    return "it fits inside no single rule of the template"


def clean_path(path: str) -> str | None:
    """The request path without its query, or None when it could mean another path upstream (dot segments,
    encoded slashes or dots, backslashes), which a path prefix cannot be checked against."""
    bare = path.split("?", 1)[0].split("#", 1)[0]
    if not bare.startswith("/") or "\\" in bare:
        return None
    decoded = unquote(bare)
    if re.search(r"%2f|%5c|%2e", bare, re.IGNORECASE) or "%" in decoded:
        return None
    if any(segment in (".", "..") for segment in decoded.split("/")):
        return None
    return bare


@dataclass(frozen=True)
class Decision:
    allowed: bool
    rule: int | None  # index into the effective rules of the rule that allowed it
    reason: str  # for the log and the 403 body
    # For a refusal no rule covered: the rule that would allow it, as `--allow` takes it.
    hint: str | None = None

    @property
    def rule_label(self) -> str:
        return "none" if self.rule is None else str(self.rule)


def _where(sandbox: str) -> str:
    return f"for sandbox {sandbox}"


def decide_connection(rules: Sequence[Rule], sandbox: str, host: str, port: int) -> Decision:
    """May the sandbox open a connection to host:port at all (the CONNECT target, then the TLS server name)?"""
    for i, rule in enumerate(rules):
        if host_matches(rule.host, host) and port in rule.ports:
            return Decision(True, i, f"host {rule.host} port {port}")
    return Decision(
        False,
        None,
        f"egress to {host}:{port} is not allowed {_where(sandbox)}: add host {host}"
        f"{'' if port in DEFAULT_PORTS else f' with port {port}'} to the template or claim's egress rules",
        allow_hint(host, port),
    )


def needs_requests(rules: Sequence[Rule], host: str, port: int) -> bool:
    """Whether any rule for host:port needs to see the requests (so the gateway terminates TLS)."""
    return port == PLAIN_HTTP_PORT or any(
        rule.needs_requests for rule in rules if host_matches(rule.host, host) and port in rule.ports
    )


def decide_request(
    rules: Sequence[Rule], sandbox: str, host: str, port: int, method: str, path: str, websocket: bool = False
) -> Decision:
    """May this request go out? The first rule matching host, port, method and path allows it."""
    what = f"{host} {method} {path.split('?', 1)[0][:200]}"
    bare = clean_path(path)
    if bare is None:
        return Decision(
            False,
            None,
            f"egress to {what} is refused {_where(sandbox)}: the path has dot segments or escaped slashes, "
            "dots or backslashes, so it cannot be checked against the egress rules' path prefixes",
        )
    for_host = [(i, r) for i, r in enumerate(rules) if host_matches(r.host, host) and port in r.ports]
    if not for_host:
        return decide_connection(rules, sandbox, host, port)
    for i, rule in for_host:
        if rule.methods is not None and method.upper() not in rule.methods:
            continue
        if rule.paths is not None and not any(bare.startswith(p) for p in rule.paths):
            continue
        if websocket and not rule.websocket:
            return Decision(
                False,
                i,
                f"egress to {what} as a WebSocket is not allowed {_where(sandbox)}: set websocket: true on "
                f"the egress rule for {rule.host}",
            )
        return Decision(True, i, rule.describe())
    allowed = "; ".join(rule.describe() for _, rule in for_host)
    rules = [rule for _, rule in for_host]
    missing = []
    if not any(r.methods is None or method.upper() in r.methods for r in rules):
        missing.append(f"method {method.upper()}")
    if not any(r.paths is None or any(bare.startswith(p) for p in r.paths) for r in rules):
        missing.append(f"a path prefix covering {bare}")
    return Decision(
        False,
        None,
        f"egress to {what} is not allowed {_where(sandbox)}: the rules for this host allow only {allowed}; "
        f"add {' and '.join(missing) or f'a rule with method {method.upper()} and a path prefix covering {bare}'}"
        " to the template or claim's egress rules",
        allow_hint(host, port, method.upper(), bare),
    )


def allow_hint(host: str, port: int, method: str = "", path: str = "") -> str:
    """The narrowest `--allow` rule that covers a request: its method and its path's directory (GET
    pypi.org/simple/foo/ -> 'GET pypi.org/simple/foo/'; GET pypi.org/simple/foo -> 'GET pypi.org/simple/')."""
    target = host if port in DEFAULT_PORTS else f"{host}:{port}"
    if not method or not path:
        return target
    return f"{method} {target}{path.rsplit('/', 1)[0]}/"


def proxy_token(key: bytes, namespace: str, name: str) -> str:
    """A sandbox's proxy password: derived from the key the gateway and the operator share, so neither stores
    it. The operator puts it in the sandbox Pod's proxy URL (the Pod is named like its Sandbox); the gateway
    accepts it only from that Pod's addresses."""
    return hmac.new(key, f"{namespace}/{name}".encode(), hashlib.sha256).hexdigest()


ALLOW_SYNTAX = "[METHOD,...] HOST[:PORT][/PATH-PREFIX], e.g. pypi.org, '*.pythonhosted.org' or 'GET,HEAD pypi.org/simple/'"


def parse_allow(text: str) -> dict[str, object]:
    """One `--allow` value as an egress rule (the CLI's and SDK's form; the API server checks the rest)."""
    methods, _, target = text.strip().rpartition(" ")
    host_port, slash, path = target.partition("/")
    host, colon, port = host_port.partition(":")
    rule: dict[str, object] = {"host": host.lower()}
    if not host or (colon and not port.isdigit()) or "://" in text:
        raise ValueError(f"--allow {text!r}: expected {ALLOW_SYNTAX}")
    if colon:
        rule["ports"] = [int(port)]
    if methods.strip():
        rule["methods"] = [m.strip().upper() for m in methods.split(",") if m.strip()]
    if slash:
        rule["paths"] = ["/" + path]
    return rule


# ------------------------------------------------------------------ the decision log as Kubernetes Events
# The gateway records its decisions as Events (events.k8s.io/v1) on the Sandbox they concern, in its namespace;
# `shadowctl egress log` and the SDK read them back. Everything in them came from a sandbox: readers escape it.
EVENT_CONTROLLER = "shadow.dev/egress-gateway"
EVENT_LABEL_SANDBOX = "shadow.dev/egress-sandbox"
# JSON: decision, method, host, port, path, rule, hint (the structured form of the Event's note).
EVENT_ANNOTATION = "shadow.dev/egress-decision"
REASON_ALLOWED = "EgressAllowed"
REASON_REFUSED = "EgressRefused"
# More distinct destinations than the gateway records one by one for a sandbox: one Event counts the rest.
REASON_OVERFLOW = "EgressTooManyDestinations"
EVENT_REASONS = (REASON_ALLOWED, REASON_REFUSED, REASON_OVERFLOW)


def printable(text: str, limit: int) -> str:
    """Hostile text as one line of printable ASCII: control characters, backslashes and everything outside
    ASCII escaped (\\x1b, \\u202e), at most `limit` characters (cut with `...`)."""
    safe = text.encode("unicode_escape").decode("ascii")
    safe = "".join(ch if " " <= ch <= "~" else f"\\x{ord(ch):02x}" for ch in safe)
    return safe if len(safe) <= limit else safe[: max(limit - 3, 0)] + "..."
