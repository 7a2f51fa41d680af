"""Credentials outside the sandbox (issue 29): a real sandbox-runtime, given the proxy variables the operator
gives a sandbox Pod, sends requests through the real egress gateway; the upstream receives the credential, and
nothing the workspace can read holds it: its environment, its files, its process list, its journal and
HANDOFF.md, the runtime's log."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from shadow_operator.common.egress import proxy_token
from shadow_operator.resources.egress_proxy import proxy_env

from tests.runtime.conftest import Server, wait_until
from tests.support.egress import Gateway, Upstream, start_gateway, start_upstream
from tests.support.pki import CertificateAuthority

pytestmark = pytest.mark.unit

SECRET = "sk-live-never-in-the-workspace-7f3a9c"
KEY = b"runtime-test-key"


@pytest.fixture
def setup(tmp_path: Path) -> Iterator[tuple[Gateway, Upstream, Path]]:
    ca = CertificateAuthority(tmp_path, "upstream-test-ca")
    upstream = start_upstream(ca, "model.test")
    rule = {
        "host": "model.test",
        "ports": [upstream.port],
        "methods": ["POST"],
        "paths": ["/v1/"],
        "credential": {"secretName": "model", "key": "token", "header": "Authorization", "prefix": "Bearer "},
    }
    policy = {
        "sandboxes": [
            {"namespace": "team", "name": "agent", "token": proxy_token(KEY, "team", "agent"),
             "addresses": ["127.0.0.1"], "template": {"rules": [rule]}}
        ],
        "secrets": {"team/model": {"token": SECRET}},
    }  # fmt: skip
    gen = start_gateway(tmp_path, ca.pair.cert, {"model.test": "127.0.0.1"}, policy)
    gateway = next(gen)
    bundle = tmp_path / "bundle.crt"
    wait_until(lambda: _ca(gateway) is not None, 10, "the gateway's policy")
    bundle.write_text(str(_ca(gateway)) + ca.pair.cert.read_text())
    yield gateway, upstream, bundle
    assert upstream.server is not None
    upstream.server.shutdown()
    next(gen, None)


def _ca(gateway: Gateway) -> str | None:
    import httpx

    answer = httpx.get(f"{gateway.admin}/v1/ca/team")
    return answer.text if answer.status_code == 200 else None


def test_the_credential_reaches_upstream_and_nothing_in_the_workspace_holds_it(
    setup: tuple[Gateway, Upstream, Path], launch: Callable[..., Server], tmp_path: Path
) -> None:
    gateway, upstream, bundle = setup
    env = {e["name"]: e["value"] for e in proxy_env("team", "agent", f"127.0.0.1:{gateway.port}", KEY)}
    # The Pod mounts the CA at /etc/shadow-egress; here the same bundle sits elsewhere.
    env = {k: (str(bundle) if v.endswith(".crt") else v) for k, v in env.items()}
    root = tmp_path / "ws"
    root.mkdir()
    srv = launch("--handoff", "--heartbeat", "0.2", root=root, env=env)
    c = srv.client()
    url = f"https://model.test:{upstream.port}/v1/chat"
    # What an agent would run: its own curl, with whatever it likes as Authorization.
    call = c.post(
        "/v1/exec", json={"command": f"curl -sS -X POST -H 'Authorization: Bearer mine' -d '{{}}' {url}"}
    ).json()
    assert call["exit_code"] == 0 and call["stdout"] == "upstream says hi\n", call
    # curl spoke HTTP/2 to the gateway, whose HTTP/1.1 upstream request then has lower-case header names.
    headers = {k.lower(): v for k, v in upstream.received[-1]["headers"].items()}
    assert headers["authorization"] == f"Bearer {SECRET}"
    # A path the rule does not allow is refused, and says why.
    refused = c.post(
        "/v1/exec", json={"command": f"curl -sS -X POST https://model.test:{upstream.port}/admin"}
    ).json()
    assert "is not allowed for sandbox team/agent" in refused["stdout"]

    seen: list[str] = []
    for command in (
        "env",
        "ps auxeww",
        "cat /proc/*/environ 2>/dev/null | tr '\\0' '\\n'",
        "cat /proc/*/cmdline 2>/dev/null | tr '\\0' ' '",
    ):
        seen.append(c.post("/v1/exec", json={"command": command}).json()["stdout"])
    wait_until(lambda: (root / "HANDOFF.md").exists(), 10, "HANDOFF.md")
    seen.append(json.dumps(c.get("/v1/journal").json()))
    seen += [p.read_text(errors="replace") for p in root.rglob("*") if p.is_file()]
    assert srv.log is not None
    seen.append(srv.log.read_text(errors="replace"))
    seen.append(Path(f"/proc/{srv.pid}/environ").read_bytes().decode(errors="replace"))
    assert any("HTTPS_PROXY" in text for text in seen)  # the greps did read the workspace's environment
    leaks = [text[:200] for text in seen if SECRET in text]
    assert not leaks, leaks
