"""`shadowctl mcp` over stdio, driven by the official `mcp` client as a coding agent drives it: a real
subprocess, the local control plane with the operator, a real Gitea binary and a real sandbox-runtime.

kwok plays the kubelet but no network: its Pods' addresses lead nowhere. Here the test's Pods run on a kwok
node whose address is this machine's, on the host's network, so kwok gives them that address; one runtime
listens there with a token the test pre-creates as the sandboxes' token Secrets. So the API server's pod proxy,
which the SDK goes through for everything in a workspace (uploads, exec, files, diff, promote), reaches a
real runtime; the operator reaches the same one at SHADOW_RUNTIME_API_URL for copy-in, baseline and checks.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import socket
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from mcp import Client, StdioServerParameters
from mcp.types import CallToolResult
from shadow_operator.api import constants as c
from shadow_operator.api import naming

from tests.runtime.conftest import Server, start_server
from tests.support.controlplane import FAKE_NODE_ANNOTATION, free_port, wait_for
from tests.support.gitea import GiteaServer
from tests.support.sandbox_operator import ENVIRONMENT, TEMPLATE, Objects, gitea_operator, template_body
from tests.support.volumes import bind_volumes

pytestmark = pytest.mark.integration
V = "v1alpha1"
SHADOWCTL = str(Path(sys.executable).parent / "shadowctl")
GITEA_PORT = free_port()
GITEA_URL = f"http://127.0.0.1:{GITEA_PORT}"
TOKEN = secrets.token_urlsafe(32)
TAINT = "shadow.dev/test-mcp"
CHECK = "python3 core/check.py"
TEMPLATE_NAME = "mcp-workspace"
BROKEN = "def add(a, b):\n    return a - b\n"
FIXED = BROKEN.replace("a - b", "a + b")


def machine_address() -> str:
    """An address of this machine that is not loopback (the API server refuses to proxy to loopback): the
    one its default route leaves from (a UDP connect sends nothing)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.connect(("10.255.255.254", 9))
        address = str(sock.getsockname()[0])
    assert not address.startswith("127."), f"no address but loopback ({address})"
    return address


ADDRESS = machine_address()


@pytest.fixture(scope="module")
def runtime(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """The workspace runtime, on every address (the pod proxy comes in on ADDRESS), behind TOKEN."""
    root = tmp_path_factory.mktemp("workspace")
    log = tmp_path_factory.mktemp("log") / "runtime.log"
    env = {"SANDBOX_RUNTIME_TOKEN": TOKEN}
    srv = start_server(root, "--host", "0.0.0.0", env=env, token=TOKEN, log=log)
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture(scope="module")
def operator(k8s_api: client.ApiClient, runtime: Server) -> Iterator[Any]:
    # The test's template puts its Pods on the host's network (what gives them this machine's address), which
    # only Pod Security's privileged level allows.
    with gitea_operator(
        k8s_api,
        GITEA_URL,
        SHADOW_RUNTIME_API_URL=runtime.url,
        SHADOW_ALLOW_HOST_NAMESPACES="true",
        SHADOW_POD_SECURITY_LEVEL="privileged",
    ) as runner:
        yield runner


@contextlib.contextmanager
def node_at_this_machine(core: client.CoreV1Api) -> Iterator[str]:
    """A kwok node whose address is this machine's, tainted so that only the test's Pods go there: kwok gives
    a host-network Pod its node's address (and keeps an address the node was created with)."""
    name = f"mcp-{secrets.token_hex(3)}"
    core.create_node(
        {
            "metadata": {
                "name": name,
                "annotations": {FAKE_NODE_ANNOTATION: "fake"},
                "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "type": "kwok"},
            },
            "spec": {"taints": [{"key": TAINT, "value": name, "effect": "NoSchedule"}]},
            "status": {
                "addresses": [{"type": "InternalIP", "address": ADDRESS}],
                "allocatable": {"cpu": "8", "memory": "32Gi", "pods": "20"},
                "capacity": {"cpu": "8", "memory": "32Gi", "pods": "20"},
            },
        }
    )

    def ready() -> bool:
        node = core.read_node(name)
        addresses = [a.address for a in node.status.addresses or ()]
        conditions = {x.type: x.status for x in node.status.conditions or ()}
        return conditions.get("Ready") == "True" and addresses[:1] == [ADDRESS]

    try:
        wait_for(ready, timeout=60, what=f"node {name} Ready at {ADDRESS}")
        yield name
    finally:
        core.delete_node(name)


def token_secret(objs: Objects, sandbox: str) -> None:
    """The sandbox's runtime token Secret, made before the operator would make one (it never replaces one),
    so that it holds the token the test's runtime was started with."""
    objs.core.create_namespaced_secret(
        objs.namespace,
        {
            "metadata": {
                "name": naming.token_secret_name(sandbox),
                "labels": {
                    c.LABEL_SANDBOX_NAME_HASH: naming.name_hash(sandbox),
                    c.LABEL_MANAGED_BY: c.MANAGED_BY_VALUE,  # in the operator's cache, as its own are
                },
            },
            "stringData": {c.RUNTIME_TOKEN_KEY: TOKEN},
        },
    )


def workspace_template(runtime: Server, node: str) -> dict[str, Any]:
    """Pods on the node at this machine's address, on the host's network: the runtime's port is the port
    the test's runtime listens on."""
    body = template_body(TEMPLATE_NAME)
    port = int(runtime.url.rsplit(":", 1)[1])
    pod = body["spec"]["podTemplate"]["spec"]
    pod.update(
        hostNetwork=True,
        nodeSelector={"kubernetes.io/hostname": node},
        tolerations=[{"key": TAINT, "operator": "Exists", "effect": "NoSchedule"}],
    )
    pod["containers"][0]["ports"] = [{"name": "runtime", "containerPort": port}]
    pod["containers"][0]["readinessProbe"] = {"tcpSocket": {"port": port}}
    return body


def delete_volume(core: client.CoreV1Api, name: str) -> None:
    with contextlib.suppress(ApiException):  # gone with its claim (reclaim policy Delete)
        core.delete_persistent_volume(name)


def server(kubeconfig: str, namespace: str, root: Path) -> StdioServerParameters:
    env = {**os.environ, "KUBECONFIG": kubeconfig}
    return StdioServerParameters(
        command=SHADOWCTL, args=["mcp", "-n", namespace, "--root", str(root)], env=env
    )


def data(result: CallToolResult) -> Any:
    text = result.content[0].text  # type: ignore[union-attr]
    assert not result.is_error, text
    return json.loads(text)


def error(result: CallToolResult) -> str:
    assert result.is_error, result.content
    return str(result.content[0].text)  # type: ignore[union-attr]


@pytest.mark.timeout(600)
def test_an_agent_creates_changes_verifies_and_promotes_over_stdio(
    objs: Objects, kubeconfig: str, runtime: Server, tmp_path: Path
) -> None:
    ns = objs.namespace
    project = tmp_path / "projects" / "core"
    project.mkdir(parents=True)
    (project / "calc.py").write_text(BROKEN)
    (project / "check.py").write_text(
        "import sys\nsys.path.insert(0, 'core')\nfrom calc import add\nsys.exit(0 if add(2, 3) == 5 else 1)\n"
    )
    progress: list[str] = []

    async def noted(done: float, total: float | None, message: str | None) -> None:
        progress.append(message or "")

    async def agent(stack: contextlib.ExitStack) -> None:
        async with Client(server(kubeconfig, ns, tmp_path / "projects"), read_timeout_seconds=120) as mcp:
            tools = {t.name: t for t in (await mcp.list_tools()).tools}
            assert {"env_create", "env_exec", "env_promote", "env_race", "sandbox_claim"} <= set(tools)
            assert tools["env_promote"].annotations and tools["env_promote"].annotations.destructive_hint

            # Bad input is refused before anything is asked of the cluster, with the reason and a hint.
            outside = error(await mcp.call_tool("env_create", {"name": "seed", "local": ["/etc"]}))
            assert "outside the directories this server may use" in outside and "hint: " in outside
            assert objs.get(ENVIRONMENT, "seed", V) is None
            # A listing is one object, empty or not (MCP sends a bare list as a block per item, none when empty).
            assert data(await mcp.call_tool("env_list", {})) == {
                "namespace": ns,
                "environments": [],
                "truncated": False,
            }

            # Create from the local directory; Gitea comes up once the operator made its credentials.
            args = {"name": "seed", "local": ["core"], "template": TEMPLATE_NAME, "verify_commands": [CHECK]}
            create = asyncio.create_task(
                mcp.call_tool("env_create", args, read_timeout_seconds=300, progress_callback=noted)
            )
            await asyncio.to_thread(
                wait_for, lambda: objs.secret_exists("seed-gitea-admin"), timeout=60, what="Gitea Secret"
            )
            creds = objs.secret_data("seed-gitea-admin")
            gitea = GiteaServer.standing_in(tmp_path / "gitea", creds, GITEA_PORT)
            await asyncio.to_thread(stack.enter_context, gitea)
            created = data(await create)
            assert created["ready"] is True and created["sources"] == ["core"]
            assert created["verdict"]["result"] == "FAIL"  # the source's bug: add subtracts
            assert any(m.startswith("uploading core") for m in progress), progress

            # The agent's change, in the workspace.
            listed = data(await mcp.call_tool("env_list_files", {"name": "seed", "path": "core"}))
            assert {"core/calc.py", "core/check.py"} <= {e["path"] for e in listed["entries"]}
            read = data(await mcp.call_tool("env_read_file", {"name": "seed", "path": "core/calc.py"}))
            assert (read["content"], read["truncated"]) == (BROKEN, False)
            fixed = {"name": "seed", "path": "core/calc.py", "content": FIXED}
            assert data(await mcp.call_tool("env_write_file", fixed))["bytes"] == len(FIXED)
            ran = data(await mcp.call_tool("env_exec", {"name": "seed", "command": CHECK}))
            assert ran["exit_code"] == 0, ran

            progress.clear()
            verdict = data(await mcp.call_tool("env_verify", {"name": "seed"}, progress_callback=noted))
            assert verdict["result"] == "PASS", verdict
            assert progress and progress[0] == "verifying seed"
            diff = data(await mcp.call_tool("env_diff", {"name": "seed"}))
            assert diff["modified"] == ["core/calc.py"] and "+    return a + b" in diff["patch"]

            # Promote only when the agent says it was asked to; then into the directory it came from.
            refused = error(await mcp.call_tool("env_promote", {"name": "seed"}))
            assert "refused" in refused and "confirm=true" in refused
            assert (project / "calc.py").read_text() == BROKEN
            promoted = data(await mcp.call_tool("env_promote", {"name": "seed", "confirm": True}))
            assert promoted["promoted"][0]["written"] == ["calc.py"]
            assert (project / "calc.py").read_text() == FIXED

            # The SDK's errors are tool errors with the SDK's hint; a path out of the workspace is refused.
            missing = error(await mcp.call_tool("env_status", {"name": "nope"}))
            assert f"ShadowEnvironment {ns}/nope does not exist" in missing
            assert "hint: list the environments: shadowctl list" in missing
            escape = error(await mcp.call_tool("env_read_file", {"name": "seed", "path": "../etc/passwd"}))
            assert "'..'" in escape and "hint: " in escape

            destroyed = data(await mcp.call_tool("env_destroy", {"name": "seed"}))
            assert destroyed == {"deleted": "seed", "namespace": ns}
            assert objs.get(ENVIRONMENT, "seed", V) is None
            # A listing is one object, empty or not (MCP sends a bare list as a block per item, none when empty).
            assert data(await mcp.call_tool("env_list", {})) == {
                "namespace": ns,
                "environments": [],
                "truncated": False,
            }

            # A plain sandbox from the same template (after the environment: one host port per node).
            box = {"claim": "mcp-box"}
            claimed = data(await mcp.call_tool("sandbox_claim", {**box, "template": TEMPLATE_NAME}))
            assert claimed["sandbox"] == "mcp-box"
            listed = data(await mcp.call_tool("sandbox_list", {}))
            assert [c["claim"] for c in listed["claims"]] == ["mcp-box"], listed
            written = {**box, "path": "box/hi.txt", "content": "hi"}
            assert data(await mcp.call_tool("sandbox_write_file", written))["bytes"] == 2
            ran = data(await mcp.call_tool("sandbox_exec", {**box, "command": "cat box/hi.txt"}))
            assert (ran["stdout"], ran["exit_code"]) == ("hi", 0)
            # The egress gateway's decision Events on the sandbox (one written here as the gateway would).
            objs.core.create_namespaced_event(ns, egress_event(ns, "mcp-box"))
            logged = data(await mcp.call_tool("sandbox_egress_log", {**box, "refused_only": True}))
            assert [(d["decision"], d["host"], d["hint"]) for d in logged["decisions"]] == [
                ("refused", "pypi.org", "GET pypi.org/simple/")
            ]
            assert data(await mcp.call_tool("sandbox_delete", box)) == {"deleted": "mcp-box", "namespace": ns}

    with contextlib.ExitStack() as stack:
        node = stack.enter_context(node_at_this_machine(objs.core))
        objs.create(TEMPLATE, workspace_template(runtime, node))
        for volume in bind_volumes(objs, ["workspace-seed"], tmp_path):
            stack.callback(delete_volume, objs.core, volume)
        token_secret(objs, "seed")
        token_secret(objs, "mcp-box")
        asyncio.run(agent(stack))


def egress_event(namespace: str, sandbox: str) -> dict[str, Any]:
    detail = {"decision": "refused", "method": "GET", "host": "pypi.org", "port": 443, "path": "/simple/x",
              "rule": "", "hint": "GET pypi.org/simple/"}  # fmt: skip
    return {
        "metadata": {
            "name": f"{sandbox}.egress-test",
            "labels": {"shadow.dev/egress-sandbox": sandbox},
            "annotations": {"shadow.dev/egress-decision": json.dumps(detail)},
        },
        "involvedObject": {
            "apiVersion": "agents.x-k8s.io/v1beta1",
            "kind": "Sandbox",
            "name": sandbox,
            "namespace": namespace,
        },
        "reason": "EgressRefused",
        "message": "refused GET pypi.org/simple/x: not allowed (add: --allow 'GET pypi.org/simple/')",
        "type": "Warning",
        "reportingComponent": "shadow.dev/egress-gateway",
        "reportingInstance": "test",
        "firstTimestamp": "2026-01-01T00:00:00Z",
        "lastTimestamp": "2026-01-01T00:00:00Z",
    }
