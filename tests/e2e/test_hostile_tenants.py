"""Hostile tenants on one kind cluster, all at once (issue 18's chaos run): eight environments created
together with `shadowctl create --local` -- one whose verify command prints 10 MiB of control characters, one
whose tenant plants git canaries in its workspace and is then forked and promoted to a branch, one from a
git-lfs repository, five ordinary ones -- while the operator's memory is sampled from its /metrics; the
router's SDK path called from another namespace (no credentials, a token without RBAC, a token with RBAC);
and a runtime flooded with 1 MiB-argument execs while its /healthz is timed.

Pass: the shared operator stays under half its memory limit and never restarts; the ordinary environments
are Ready and PASS; no canary sees either Gitea token and every push lands in the environment's own Gitea;
the lfs file is in the workspace and in a clone from Gitea; only the authorized router call succeeds;
/healthz p99 < 200 ms under the flood. Figures go to ~/.cache/shadow-operator/e2e-timings.json
(BENCHMARKS.md, "Hostile tenants").
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import statistics
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tests.e2e.cluster import (
    DEFAULT_TEMPLATE,
    FULLNAME,
    OPERATOR_NAMESPACE,
    Cluster,
    OperatorMemory,
    assert_runs_under_namespace_runtime,
    eventually,
    memory_limit,
    restarts,
    under_each_runtime,
)
from tests.e2e.test_cli_sdk import REQUESTS, TIMEOUT, ctl, ok
from tests.e2e.test_environment import python_package
from tests.support.hostile_repo import git

# Alone: it asserts the operator's peak memory and a /healthz p99 under a flood.
pytestmark = [pytest.mark.e2e, pytest.mark.e2e_alone]

ORDINARY = 5
# 10 MiB of control characters (each one a 6-byte JSON escape): the answer the operator must not hold whole.
FLOOD = 'python3 -c "import sys; sys.stdout.write(chr(1) * (10 << 20))"'
IMPORT = "cd pkg && python3 -c 'import shadowpkg; print(shadowpkg.VERSION)'"

# Run by the tenant in its workspace root once its environment is Ready: every canary appends what its
# process holds to canaries/*.log; the rewrites send the environment's Gitea URL to a dead address.
PLANT = r"""
set -eu
mkdir -p canaries
canary() { printf '#!/bin/sh\n{ echo "== $0 $*"; env; } >> %s/canaries/%s.log\ncat >/dev/null 2>&1 || true\n' "$PWD" "$1" > "$2"; chmod +x "$2"; }
for hook in pre-push reference-transaction post-commit pre-commit; do canary "hook-$hook" "pkg/.git/hooks/$hook"; done
canary fsmonitor pkg/.git/fsmonitor.sh
canary credential pkg/.git/credential.sh
canary included pkg/.git/included.sh
printf '#!/bin/sh\n{ echo "== filter"; env; } >> %s/canaries/filter.log\ncat\n' "$PWD" > pkg/.git/clean.sh
chmod +x pkg/.git/clean.sh
printf '[credential]\n\thelper = %s/pkg/.git/included.sh\n' "$PWD" > pkg/.git/extra.config
cd pkg
git config core.fsmonitor "$PWD/.git/fsmonitor.sh"
git config credential.helper "$PWD/.git/credential.sh"
git config include.path "$PWD/.git/extra.config"
git config http.proxy http://127.0.0.1:9
git config "url.http://127.0.0.1:9/.insteadOf" "$SHADOW_GITEA_URL/"
git config filter.canary.clean "$PWD/.git/clean.sh"
echo '* filter=canary' > .gitattributes
echo 'print("promoted")' > app.py
"""


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def lfs_repository(root: Path) -> bytes:
    """A repository whose `model.bin` (5 MiB of random bytes) is tracked by real git-lfs."""
    root.mkdir(parents=True)
    git(root, "init", "-q", "-b", "main")
    git(root, "lfs", "install", "--local")
    git(root, "lfs", "track", "*.bin")
    weights = os.urandom(5 << 20)
    (root / "model.bin").write_bytes(weights)
    git(root, "add", ".")
    git(root, "commit", "-q", "-m", "weights")
    assert git(root, "show", "HEAD:model.bin").startswith("version https://git-lfs")
    return weights


def create(cluster: Cluster, ns: str, name: str, repo: Path, verify: str | None) -> dict[str, Any]:
    """`shadowctl create --local` (upload, wait for Ready and the verdict); the status it prints."""
    args = ["create", name, "-n", ns, "--local", f"{repo}:shadowdemo/{repo.name}", "--cpu", REQUESTS["cpu"]]
    args += ["--memory", REQUESTS["memory"], "--timeout", TIMEOUT, "-o", "json"]
    if verify:
        args += ["--verify", verify]
    result = ctl(cluster, *args)
    return {"name": name, "returncode": result.returncode, "stdout": result.stdout, "stderr": result.stderr}


def sh(cluster: Cluster, ns: str, env: str, script: str) -> str:
    return ok(ctl(cluster, "exec", env, "-n", ns, "--", "sh", "-c", script))


def gitea_token(cluster: Cluster, ns: str, env: str) -> str:
    secret = cluster.core.read_namespaced_secret(f"{env}-gitea-admin", ns)
    return base64.b64decode(secret.data["token"]).decode()


@under_each_runtime  # under runc and under gVisor (the namespace's template asks for the class)
def test_eight_hostile_and_ordinary_tenants_at_once(
    cluster: Cluster, e2e_namespace: str, tmp_path: Path, timings: dict[str, float]
) -> None:
    ns = e2e_namespace
    noisy, canary, lfs = unique("noisy"), unique("canary"), unique("lfs")
    ordinary = [unique(f"plain{i}") for i in range(ORDINARY)]
    repos = {name: python_package(tmp_path / name / "pkg") for name in (noisy, canary, *ordinary)}
    repos[lfs] = tmp_path / lfs / "pkg"
    weights = lfs_repository(repos[lfs])
    verify = {noisy: FLOOD, lfs: None}
    limit, restarts_before = memory_limit(cluster), restarts(cluster)

    with OperatorMemory(cluster) as memory, ThreadPoolExecutor(max_workers=len(repos)) as pool:
        started = time.monotonic()
        futures = {
            name: pool.submit(create, cluster, ns, name, repo, verify.get(name, IMPORT))
            for name, repo in repos.items()
        }
        created = {name: future.result() for name, future in futures.items()}
        timings["hostile_eight_environments_seconds"] = round(time.monotonic() - started, 2)
        for name, result in created.items():
            assert result["returncode"] == 0 or name == noisy, result
        statuses = {
            name: json.loads(result["stdout"])["status"]
            for name, result in created.items()
            if result["stdout"]
        }

        # The tenant plants its canaries, the environment is forked (the fork's copy-in pushes to its own
        # Gitea) and both are promoted to a branch.
        sh(cluster, ns, canary, PLANT)
        fork = f"{canary}-fork"
        ok(ctl(cluster, "fork", canary, fork, "-n", ns, "--no-verify", "--timeout", TIMEOUT, "-o", "json"))
        pushed = {}
        for env in (canary, fork):
            args = ["promote", env, "-n", ns, "--source", "pkg", "--to-branch", "review/x", "-o", "json"]
            pushed[env] = json.loads(ok(ctl(cluster, *args)))

    peak = max(memory.samples, default=0.0)
    timings["hostile_operator_peak_rss_mib"] = round(peak / 2**20, 1)
    timings["hostile_operator_limit_mib"] = round(limit / 2**20, 1)
    assert memory.samples, "no sample of the operator's memory could be read from its /metrics"
    assert peak < 0.5 * limit, f"operator peak RSS {peak / 2**20:.0f} MiB, limit {limit / 2**20:.0f} MiB"
    assert restarts(cluster) == restarts_before, "the operator restarted"

    # Ordinary tenants: Ready and PASS next to the hostile ones.
    assert_runs_under_namespace_runtime(cluster, ns, noisy)
    for name in ordinary:
        assert statuses[name]["verdict"]["result"] == "PASS", statuses[name]
    # The flood: a verdict whose evidence holds a bounded tail of the output, not 10 MiB.
    flooded = json.loads(ok(ctl(cluster, "status", noisy, "-n", ns, "-o", "json")))["status"]
    detail = flooded["verdict"]["evidence"]["codeExecution"]["checks"][0]["detail"]
    assert len(detail) < 8192, len(detail)
    assert "(output truncated)" in detail[:200], detail[:200]

    # Canaries: none saw either token; each push landed in the environment's own Gitea.
    for env in (canary, fork):
        url = json.loads(ok(ctl(cluster, "status", env, "-n", ns, "-o", "json")))["status"]["sources"][0][
            "cloneURL"
        ]
        listed = sh(cluster, ns, env, f"cd / && git ls-remote {url} refs/heads/review/x")
        assert listed.split()[0] == pushed[env]["commit"], listed
        shown = sh(
            cluster, ns, env, f"cd /tmp && rm -rf c && git clone -q -b review/x {url} c && cat c/app.py"
        )
        assert shown.strip() == 'print("promoted")'
    seen = "".join(sh(cluster, ns, env, "cat canaries/*.log 2>/dev/null || true") for env in (canary, fork))
    assert "== filter" in seen  # the tenant's own filter ran, in its workspace, where no token is
    for env in (canary, fork):
        assert gitea_token(cluster, ns, env) not in seen, f"a canary saw {env}'s Gitea token"

    # lfs: the large file's content (not its pointer) in the workspace and in a clone from its Gitea.
    digest = hashlib.sha256(weights).hexdigest()
    assert sh(cluster, ns, lfs, "sha256sum pkg/model.bin").split()[0] == digest
    url = statuses[lfs]["sources"][0]["cloneURL"]
    cloned = sh(cluster, ns, lfs, f"cd /tmp && rm -rf a && git clone -q {url} a && sha256sum a/model.bin")
    assert cloned.split()[0] == digest

    # Isolation between tenants' Gitea: an ordinary workspace cannot read the canary environment's Gitea.
    other = statuses[canary]["sources"][0]["cloneURL"]
    refused = ctl(
        cluster, "exec", ordinary[0], "-n", ns, "--", "sh", "-c", f"timeout 20 git ls-remote {other}"
    )
    assert refused.returncode != 0, refused.stdout

    for name in [fork, *repos]:
        ok(ctl(cluster, "destroy", name, "-n", ns, "--no-wait"))


@pytest.fixture
def router_target(cluster: Cluster) -> Iterator[str]:
    """A claimed sandbox in the router's namespace (the namespace it serves by default)."""
    name = unique("target")
    cluster.claim(OPERATOR_NAMESPACE, name, {"sandboxTemplateRef": {"name": DEFAULT_TEMPLATE}})
    try:
        yield cluster.sandbox_of(cluster.wait_claim_ready(OPERATOR_NAMESPACE, name))
    finally:
        cluster.delete(OPERATOR_NAMESPACE, "sandboxclaims", name)


@pytest.fixture
def caller_namespace(cluster: Cluster) -> Iterator[str]:
    """Another tenant's namespace with a ServiceAccount `agent` and a Pod `caller` (the workspace image)."""
    ns = unique("caller")
    cluster.core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=ns)))
    try:
        cluster.core.create_namespaced_service_account(
            ns, client.V1ServiceAccount(metadata=client.V1ObjectMeta(name="agent"))
        )
        template = cluster.get(OPERATOR_NAMESPACE, "sandboxtemplates", DEFAULT_TEMPLATE)
        assert template is not None
        image = template["spec"]["podTemplate"]["spec"]["containers"][0]["image"]
        pod = client.V1Pod(
            metadata=client.V1ObjectMeta(name="caller"),
            spec=client.V1PodSpec(
                service_account_name="agent",
                automount_service_account_token=False,
                containers=[client.V1Container(name="caller", image=image, command=["sleep", "3600"])],
            ),
        )
        cluster.core.create_namespaced_pod(ns, pod)

        def running() -> bool | None:
            got = cluster.core.read_namespaced_pod("caller", ns)
            return True if got.status.phase == "Running" else None

        eventually(running, f"pod {ns}/caller Running", 180)
        yield ns
    finally:
        cluster.core.delete_namespace(ns)


def call_router(cluster: Cluster, ns: str, sandbox: str, token: str | None, **extra: str) -> tuple[int, str]:
    """POST /execute through the router's SDK Service, from the caller Pod (a real in-cluster peer)."""
    url = f"http://sandbox-router-svc.{OPERATOR_NAMESPACE}.svc.cluster.local:8080/execute"
    headers = {
        "X-Sandbox-ID": sandbox,
        "X-Sandbox-Namespace": OPERATOR_NAMESPACE,
        "X-Sandbox-Port": "8888",
        "Content-Type": "application/json",
        **extra,
    }
    if token:
        headers["Authorization"] = f"Bearer {token}"
    argv = ["curl", "-sS", "-o", "/dev/stdout", "-w", "\n%{http_code}", "-X", "POST", url]
    for key, value in headers.items():
        argv += ["-H", f"{key}: {value}"]
    argv += ["--data", json.dumps({"command": "echo reached"})]
    out = subprocess.run(
        ["kubectl", "--kubeconfig", cluster.kubeconfig, "-n", ns, "exec", "caller", "--", *argv],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    body, _, code = out.stdout.rpartition("\n")
    return int(code), body


def test_router_sdk_path_from_another_namespace(
    cluster: Cluster, router_target: str, caller_namespace: str
) -> None:
    ns, sandbox = caller_namespace, router_target
    token = subprocess.run(
        ["kubectl", "--kubeconfig", cluster.kubeconfig, "-n", ns, "create", "token", "agent"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()

    code, body = call_router(cluster, ns, sandbox, None)
    assert code == 401, body
    code, body = call_router(cluster, ns, sandbox, None, **{"X-Shadow-Peer": "127.0.0.1"})
    assert code == 401, body
    code, body = call_router(cluster, ns, sandbox, token)
    assert code == 403 and "sandboxes/proxy" in body, body

    rbac = client.RbacAuthorizationV1Api(cluster.api)
    binding = client.V1RoleBinding(
        metadata=client.V1ObjectMeta(name=f"{ns}-sandbox-proxy"),
        role_ref=client.V1RoleRef(
            api_group="rbac.authorization.k8s.io",
            kind="ClusterRole",
            name=f"{FULLNAME}-preview-router-sandbox-proxy",
        ),
        subjects=[client.RbacV1Subject(kind="ServiceAccount", name="agent", namespace=ns)],
    )
    rbac.create_namespaced_role_binding(OPERATOR_NAMESPACE, binding)
    try:

        def allowed() -> tuple[int, str] | None:
            got = call_router(cluster, ns, sandbox, token)
            return got if got[0] == 200 else None

        code, body = eventually(allowed, "the router to allow the bound ServiceAccount", 60)
        assert "reached" in body, body
        code, body = call_router(cluster, ns, sandbox, token, **{"X-Sandbox-Port": "22"})
        assert code == 403, body
    finally:
        rbac.delete_namespaced_role_binding(f"{ns}-sandbox-proxy", OPERATOR_NAMESPACE)


# Timed inside the sandbox, next to the runtime, so the figure is the runtime's and not the port-forward's.
HEALTH_POLL = """
import json, time, urllib.request
latencies = []
for _ in range(200):
    t0 = time.perf_counter()
    urllib.request.urlopen("http://127.0.0.1:8888/healthz", timeout=10).read()
    latencies.append(time.perf_counter() - t0)
    time.sleep(0.05)
print(json.dumps(latencies))
"""


def test_runtime_health_while_flooded(
    cluster: Cluster, router_target: str, timings: dict[str, float]
) -> None:
    """Four clients send execs with a 1 MiB argument (through a port-forward) while /healthz is polled 200
    times from inside the sandbox."""
    sandbox = router_target
    big = "x" * (1024 * 1024)
    stop = threading.Event()
    answers: list[int] = []
    with (
        cluster.runtime(OPERATOR_NAMESPACE, sandbox) as flood_http,
        cluster.runtime(OPERATOR_NAMESPACE, sandbox) as http,
    ):
        put = http.put("/v1/files/health_poll.py", content=HEALTH_POLL.encode())
        assert put.status_code in (200, 201, 204), put.text

        def flood() -> None:
            while not stop.is_set():
                sent = flood_http.post("/execute", json={"command": f"echo {big}"}, timeout=120)
                answers.append(sent.status_code)

        floods = [threading.Thread(target=flood, daemon=True) for _ in range(4)]
        for thread in floods:
            thread.start()
        try:
            eventually(lambda: len(answers) >= 4 or None, "the flood to be under way", 60)
            polled = http.post(
                "/v1/exec", json={"command": "python3 health_poll.py", "timeout_seconds": 120}, timeout=150
            )
        finally:
            stop.set()
            for thread in floods:
                thread.join(timeout=150)
    assert polled.status_code == 200, polled.text
    result = polled.json()
    assert result["exit_code"] == 0, result
    latencies = json.loads(result["stdout"])
    p99 = statistics.quantiles(latencies, n=100)[98]
    timings["hostile_healthz_p99_ms"] = round(p99 * 1000, 1)
    timings["hostile_flood_execs"] = len(answers)
    assert set(answers) == {200}, sorted(set(answers))
    assert p99 < 0.2, f"/healthz p99 {p99 * 1000:.0f} ms while flooded ({len(answers)} execs answered)"


def test_templates_asking_for_the_host_are_refused_at_admission(cluster: Cluster, e2e_namespace: str) -> None:
    """The chart's ValidatingAdmissionPolicy, as installed: a tenant's template may not ask for the node."""
    template = cluster.get(e2e_namespace, "sandboxtemplates", DEFAULT_TEMPLATE)
    assert template is not None
    spec = json.loads(json.dumps(template["spec"]))
    pod = spec["podTemplate"]["spec"]
    pod["volumes"] = [*(pod.get("volumes") or []), {"name": "node", "hostPath": {"path": "/"}}]
    pod["hostPID"] = True
    body = {"kind": "SandboxTemplate", "metadata": {"name": unique("host")}, "spec": spec}
    with pytest.raises(ApiException) as refused:
        cluster.create(e2e_namespace, "sandboxtemplates", body)
    assert refused.value.status in (400, 403, 422), refused.value
    message = str(refused.value.body)
    assert "podSecurity.allowHostPath" in message or "podSecurity.allowHostNamespaces" in message, message
