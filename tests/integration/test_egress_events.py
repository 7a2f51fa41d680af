"""The egress decision log a tenant reads: the real gateway process following a real API server writes its
decisions as Events on the Sandbox, and `shadowctl egress log` reads them back, from the namespace asked only.

A hostile sandbox floods the gateway with thousands of distinct hosts: its namespace gets a bounded number of
Events (one counts the rest), and another tenant's refusal still gets its Event at once."""

from __future__ import annotations

import asyncio
import base64
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from kubernetes import client
from shadow_operator.api import constants as c
from shadow_operator.api import naming
from shadow_operator.common.egress import proxy_token

from tests.support.controlplane import wait_for
from tests.support.egress import Gateway, Upstream, start_gateway, start_upstream
from tests.support.pki import CertificateAuthority
from tests.support.sandbox_operator import ENVIRONMENT, SANDBOX, TEMPLATE, Objects, install_crds, sandbox_body
from tests.support.shadowctl import run, write_kubeconfig

pytestmark = pytest.mark.integration

FLOOD = 2000
PER_SANDBOX = 32


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[CertificateAuthority, Upstream]]:
    ca = CertificateAuthority(tmp_path_factory.mktemp("upstreams"), "upstream-test-ca")
    pypi = start_upstream(ca, "pypi.test")
    yield ca, pypi
    assert pypi.server is not None
    pypi.server.shutdown()


@pytest.fixture
def namespaces(k8s_api: client.ApiClient, namespace: str) -> Iterator[tuple[str, str]]:
    """The hostile tenant's namespace and another tenant's."""
    install_crds(k8s_api)
    core = client.CoreV1Api(k8s_api)
    other = f"{namespace[:50]}-b"
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=other)))
    try:
        yield namespace, other
    finally:
        core.delete_namespace(other)


@pytest.fixture
def gateway(
    tmp_path: Path, namespaces: tuple[str, str], upstream: tuple[CertificateAuthority, Upstream]
) -> Iterator[Gateway]:
    ca, _ = upstream
    # A small write budget (1 a second): what a flood does to a busy gateway's, in a test's time.
    extra = ("--events-per-second", "1", "--events-burst", "2", "--events-every", "1")
    yield from start_gateway(
        tmp_path, ca.pair.cert, {"pypi.test": "127.0.0.1"}, None, f"{namespaces[0]}/egress-key", extra
    )


def serve_sandbox(api: client.ApiClient, namespace: str, address: str, port: int) -> None:
    """Template `tpl` (GET pypi.test/simple/ only), Sandbox `sb` and its Pod at `address`."""
    objs, core = Objects(api, namespace), client.CoreV1Api(api)
    rules = [{"host": "pypi.test", "ports": [port], "methods": ["GET"], "paths": ["/simple/"]}]
    objs.create(
        TEMPLATE,
        {
            "metadata": {"name": "tpl"},
            "spec": {
                "podTemplate": {"spec": {"containers": [{"name": "main", "image": "busybox"}]}},
                "egress": {"rules": rules},
            },
        },
    )
    sandbox = objs.create(SANDBOX, sandbox_body("sb"))
    owner = {
        "apiVersion": "agents.x-k8s.io/v1beta1",
        "kind": "Sandbox",
        "name": "sb",
        "uid": sandbox["metadata"]["uid"],
        "controller": True,
    }
    # A node that does not exist: no kubelet (nor kwok) rewrites the Pod's status, so its address is ours.
    core.create_namespaced_pod(
        namespace,
        {
            "metadata": {
                "name": "sb",
                "labels": {c.LABEL_TEMPLATE_REF_HASH: naming.name_hash("tpl")},
                "ownerReferences": [owner],
            },
            "spec": {"nodeName": "no-such-node", "containers": [{"name": "main", "image": "busybox"}]},
        },
    )
    core.patch_namespaced_pod_status(
        "sb", namespace, {"status": {"podIP": address, "podIPs": [{"ip": address}]}}
    )


def serve_both(api: client.ApiClient, namespaces: tuple[str, str], gateway: Gateway, port: int) -> bytes:
    """Sandbox `sb` in each namespace (at 127.0.0.1, then 127.0.0.2), once the gateway serves both: the
    proxy credentials' key."""
    for namespace, address in zip(namespaces, ("127.0.0.1", "127.0.0.2"), strict=True):
        serve_sandbox(api, namespace, address, port)
    wait_for(
        lambda: all(httpx.get(f"{gateway.admin}/v1/ca/{ns}").status_code == 200 for ns in namespaces),
        timeout=10,
        what="the gateway to serve both sandboxes",
    )
    secret = client.CoreV1Api(api).read_namespaced_secret("egress-key", namespaces[0])
    return base64.b64decode(secret.data["key"])


def gateway_events(api: client.ApiClient, namespace: str) -> list[Any]:
    return list(
        client.CoreV1Api(api)
        .list_namespaced_event(namespace, label_selector="shadow.dev/egress-sandbox=sb")
        .items
    )


async def flood(gateway: Gateway, token: str, count: int) -> list[bytes]:
    """`count` CONNECTs to distinct hosts no rule allows, from the hostile sandbox's address: the answers."""
    auth = base64.b64encode(f"sandbox:{token}".encode()).decode()
    gate = asyncio.Semaphore(16)

    async def one(i: int) -> bytes:
        async with gate:
            reader, writer = await asyncio.open_connection(
                "127.0.0.1", gateway.port, local_addr=("127.0.0.1", 0)
            )
            host = f"h{i}.flood.test"
            writer.write(
                f"CONNECT {host}:443 HTTP/1.1\r\nHost: {host}:443\r\nProxy-Authorization: Basic {auth}\r\n\r\n".encode()
            )
            await writer.drain()
            answer = await reader.readuntil(b"\r\n\r\n")
            writer.close()
            return answer.split(b"\r\n", 1)[0]

    return await asyncio.gather(*(one(i) for i in range(count)))


def curl(gateway: Gateway, token: str, trust: Path, url: str, source: str) -> str:
    return subprocess.run(
        ["curl", "-s", "-o", "/dev/null", "--interface", source, "--proxy", gateway.proxy(token),
         "--cacert", str(trust), "-w", "%{http_code}", url],
        capture_output=True, text=True, timeout=30,
    ).stdout  # fmt: skip


def test_a_flood_of_hosts_is_bounded_and_another_tenants_refusal_still_gets_its_event(
    k8s_api: client.ApiClient,
    kubeconfig: str,
    namespaces: tuple[str, str],
    gateway: Gateway,
    upstream: tuple[CertificateAuthority, Upstream],
    tmp_path: Path,
) -> None:
    hostile, victim = namespaces
    ca, pypi = upstream
    key = serve_both(k8s_api, namespaces, gateway, pypi.port)

    answers = asyncio.run(flood(gateway, proxy_token(key, hostile, "sb"), FLOOD))
    assert set(answers) == {b"HTTP/1.1 403 Forbidden"}

    trust = tmp_path / "trust.pem"
    trust.write_text(gateway.ca_pem(victim) + ca.pair.cert.read_text())
    token = proxy_token(key, victim, "sb")
    base = f"https://pypi.test:{pypi.port}"
    assert curl(gateway, token, trust, f"{base}/private/pkg", "127.0.0.2") == "403"
    assert curl(gateway, token, trust, f"{base}/simple/numpy/", "127.0.0.2") == "200"

    # The hostile namespace's 33 Events take half a minute of the gateway's budget; the other tenant's do not
    # wait behind them.
    def victims() -> dict[str, Any] | None:
        found = {e.reason: e for e in gateway_events(k8s_api, victim)}
        return found if {"EgressRefused", "EgressAllowed"} <= set(found) else None

    found = wait_for(victims, timeout=5, what="the other tenant's events")
    assert len(gateway_events(k8s_api, hostile)) < PER_SANDBOX + 1
    refused, allowed = found["EgressRefused"], found["EgressAllowed"]
    assert refused.type == "Warning" and refused.reporting_component == "shadow.dev/egress-gateway"
    assert refused.message.startswith(f"refused GET pypi.test:{pypi.port}/private/pkg: ")
    assert refused.message.endswith(f"(add: --allow 'GET pypi.test:{pypi.port}/private/')")
    assert allowed.type == "Normal"
    assert allowed.message == (
        f"allowed GET pypi.test:{pypi.port}/simple/numpy/ by rule 0 (pypi.test:{pypi.port} GET /simple/)"
    )
    # On the Sandbox itself (its uid too): `kubectl describe sandbox sb` lists them.
    sandbox = Objects(k8s_api, victim).get(SANDBOX, "sb")
    assert sandbox is not None
    assert refused.involved_object.kind == "Sandbox" and refused.involved_object.name == "sb"
    assert refused.involved_object.uid == sandbox["metadata"]["uid"]
    described = subprocess.run(
        ["kubectl", "--kubeconfig", kubeconfig, "-n", victim, "describe", "sandbox", "sb"],
        capture_output=True, text=True, timeout=30,
    ).stdout  # fmt: skip
    assert (
        "EgressRefused" in described and f"(add: --allow 'GET pypi.test:{pypi.port}/private/')" in described
    )

    # The flood: 32 destinations one by one, one Event counting the rest; nothing more reaches etcd.
    def flood_written() -> list[Any] | None:
        events = gateway_events(k8s_api, hostile)
        overflow = [e for e in events if e.reason == "EgressTooManyDestinations"]
        if overflow and overflow[0].series and overflow[0].series.count == FLOOD - PER_SANDBOX:
            return events
        return None

    events = wait_for(flood_written, timeout=60, what="the flood's events")
    assert len(events) == PER_SANDBOX + 1
    assert sorted(e.reason for e in events).count("EgressRefused") == PER_SANDBOX
    assert all(e.series is None or e.series.count == 1 for e in events if e.reason == "EgressRefused")


@pytest.fixture
def logged(
    k8s_api: client.ApiClient,
    namespaces: tuple[str, str],
    gateway: Gateway,
    upstream: tuple[CertificateAuthority, Upstream],
    tmp_path: Path,
) -> tuple[str, str, int]:
    """Sandbox `sb` in both namespaces; in the first, a refused and an allowed GET; in the second a refused
    GET to another path. Returns the namespaces and the upstream's port once all three Events are written."""
    first, second = namespaces
    ca, pypi = upstream
    key = serve_both(k8s_api, namespaces, gateway, pypi.port)
    base = f"https://pypi.test:{pypi.port}"
    for ns, address, paths in ((first, "127.0.0.1", ("/private/a", "/private/b", "/simple/x/")),
                               (second, "127.0.0.2", ("/secret-of-b/",))):  # fmt: skip
        trust = tmp_path / f"trust-{ns}.pem"
        trust.write_text(gateway.ca_pem(ns) + ca.pair.cert.read_text())
        for path in paths:
            curl(gateway, proxy_token(key, ns, "sb"), trust, f"{base}{path}", address)
    wait_for(
        lambda: len(gateway_events(k8s_api, first)) == 2 and len(gateway_events(k8s_api, second)) == 1,
        timeout=10,
        what="the events",
    )
    wait_for(
        lambda: any(e.series and e.series.count == 2 for e in gateway_events(k8s_api, first)),
        timeout=10,
        what="the second refusal to be counted",
    )
    return first, second, pypi.port


def test_shadowctl_egress_log_shows_the_namespaces_own_decisions(
    k8s_api: client.ApiClient, kubeconfig: str, logged: tuple[str, str, int], tmp_path: Path
) -> None:
    first, second, port = logged
    shown = run(kubeconfig, "egress", "log", "sb", "--sandbox", "-n", first, "-o", "json")
    assert shown.returncode == 0, shown.stderr
    decisions = json.loads(shown.stdout)
    # The most recent last; each kind once, counted.
    assert [(d["decision"], d["method"], d["host"], d["count"]) for d in decisions] == [
        ("refused", "GET", "pypi.test", 2),
        ("allowed", "GET", "pypi.test", 1),
    ]
    refused = next(d for d in decisions if d["decision"] == "refused")
    assert refused["path"] == "/private/a" and refused["hint"] == f"GET pypi.test:{port}/private/"
    allowed = next(d for d in decisions if d["decision"] == "allowed")
    assert allowed["rule"] == f"pypi.test:{port} GET /simple/" and allowed["path"] == "/simple/x/"
    # Another namespace's sandbox of the same name: its decisions, never the first's.
    other = json.loads(run(kubeconfig, "egress", "log", "sb", "--sandbox", "-n", second, "-o", "json").stdout)
    assert [(d["decision"], d["path"]) for d in other] == [("refused", "/secret-of-b/")]
    assert "secret-of-b" not in shown.stdout

    table = run(kubeconfig, "egress", "log", "sb", "--sandbox", "-n", first, "--refused")
    assert table.returncode == 0, table.stderr
    assert table.stdout.split()[:6] == ["LAST", "SEEN", "COUNT", "DECISION", "METHOD", "DESTINATION"]
    assert f"add: --allow 'GET pypi.test:{port}/private/'" in table.stdout
    assert "allowed" not in table.stdout

    # An environment's log is its workspace Sandbox's.
    objs = Objects(k8s_api, first)
    objs.create(
        ENVIRONMENT,
        {"metadata": {"name": "web"}, "spec": {"sources": [{"name": "s", "repo": "o/s", "upload": {}}]}},
        version="v1alpha1",
    )
    client.CustomObjectsApi(k8s_api).patch_namespaced_custom_object_status(
        "shadow.dev", "v1alpha1", first, "shadowenvironments", "web", {"status": {"sandbox": "sb"}}
    )
    by_env = json.loads(run(kubeconfig, "egress", "log", "web", "-n", first, "-o", "json").stdout)
    assert by_env == decisions

    # One line each for what is not there.
    missing = run(kubeconfig, "egress", "log", "nope", "-n", first)
    assert missing.returncode == 1 and missing.stderr.splitlines()[0] == (
        f"error: ShadowEnvironment {first}/nope does not exist"
    )
    gone = run(kubeconfig, "egress", "log", "nope", "--sandbox", "-n", first)
    assert gone.returncode == 1 and gone.stderr.splitlines()[0] == (
        f"error: neither a SandboxClaim nor a Sandbox named nope exists in namespace {first}"
    )

    # A tenant of the first namespace with the built-in `view` role (and the chart's read of sandboxes)
    # reads its log, and is refused the other namespace's.
    rbac, core = client.RbacAuthorizationV1Api(k8s_api), client.CoreV1Api(k8s_api)
    core.create_namespaced_service_account(first, {"metadata": {"name": "tenant"}})
    subject = [{"kind": "ServiceAccount", "name": "tenant", "namespace": first}]
    rbac.create_namespaced_role(
        first,
        {
            "metadata": {"name": "sandbox-reader"},
            "rules": [
                {"apiGroups": ["agents.x-k8s.io"], "resources": ["sandboxes"], "verbs": ["get"]},
                {
                    "apiGroups": ["extensions.agents.x-k8s.io"],
                    "resources": ["sandboxclaims"],
                    "verbs": ["get"],
                },
            ],
        },
    )
    for kind, role in (("ClusterRole", "view"), ("Role", "sandbox-reader")):
        rbac.create_namespaced_role_binding(
            first,
            {
                "metadata": {"name": f"tenant-{role}"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": kind, "name": role},
                "subjects": subject,
            },
        )
    token = core.create_namespaced_service_account_token(
        "tenant", first, {"spec": {"audiences": [], "expirationSeconds": 600}}
    ).status.token
    tenant = write_kubeconfig(tmp_path / "tenant", kubeconfig, {"t": {"token": token}}, {"t": ("t", first)})
    wait_for(
        lambda: run(tenant, "egress", "log", "sb", "--sandbox", "-o", "json").returncode == 0,
        timeout=10,
        what="the tenant's bindings",
    )
    assert json.loads(run(tenant, "egress", "log", "sb", "--sandbox", "-o", "json").stdout) == decisions
    refused_other = run(tenant, "egress", "log", "sb", "--sandbox", "-n", second)
    assert refused_other.returncode == 1 and "forbidden" in refused_other.stderr.lower()
    assert "secret-of-b" not in refused_other.stdout + refused_other.stderr


def test_shadowctl_prints_hostile_event_text_escaped(
    k8s_api: client.ApiClient, kubeconfig: str, namespace: str
) -> None:
    """Whoever may write Events in the namespace (or a sandbox through the gateway) chooses these bytes: they
    reach the terminal escaped, one line each, never as escape sequences or rich markup."""
    install_crds(k8s_api)
    Objects(k8s_api, namespace).create(SANDBOX, sandbox_body("sb"))
    evil = "evil.test\x1b[2J\x1b]8;;http://x\x07[bold red]spoof[/]\u202egnp.exe\nrefused GET fake"
    client.CoreV1Api(k8s_api).create_namespaced_event(
        namespace,
        {
            "metadata": {
                "name": "sb.forged",
                "labels": {"shadow.dev/egress-sandbox": "sb"},
                "annotations": {
                    "shadow.dev/egress-decision": json.dumps(
                        {"decision": "refused", "method": "GET\r\n", "host": evil, "port": "x", "hint": evil}
                    )
                },
            },
            "involvedObject": {
                "apiVersion": "agents.x-k8s.io/v1beta1",
                "kind": "Sandbox",
                "name": "sb",
                "namespace": namespace,
            },
            "reason": "EgressRefused",
            "message": evil,
            "type": "Warning",
            "reportingComponent": "shadow.dev/egress-gateway",
            "reportingInstance": "forged",
            "firstTimestamp": "2026-01-01T00:00:00Z",
            "lastTimestamp": "2026-01-01T00:00:00Z",
            "count": 3,
        },
    )
    for args in ((), ("-o", "json")):
        shown = run(
            kubeconfig, "egress", "log", "sb", "--sandbox", "-n", namespace, *args, env={"COLUMNS": "400"}
        )
        assert shown.returncode == 0, shown.stderr
        assert "\x1b" not in shown.stdout and "\u202e" not in shown.stdout and "\x07" not in shown.stdout
        assert "\\x1b[2J" in shown.stdout or "\\\\x1b[2J" in shown.stdout
    table = run(
        kubeconfig, "egress", "log", "sb", "--sandbox", "-n", namespace, env={"COLUMNS": "400"}
    ).stdout
    assert "[bold red]spoof[/]" in table
    assert "\nrefused GET fake" not in table
