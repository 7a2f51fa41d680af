"""`shadowctl mcp` without a cluster: the tools and their bounds, what is refused before any API call (promote
without confirm, paths out of the workspace, directories outside the roots, oversized writes), progress that
ends with its call, and the HTTP transport's bearer token and bind checks. The whole agent loop against a
control plane is tests/integration/test_mcp.py."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.types import CallToolResult
from shadow_operator.cli import mcptools
from shadow_operator.cli.mcp import TOKEN_ENV, bearer_token, check_host
from shadow_operator.sdk.errors import ShadowError

from tests.support.controlplane import free_port, wait_for

pytestmark = pytest.mark.unit
SHADOWCTL = str(Path(sys.executable).parent / "shadowctl")


def refused(result: CallToolResult) -> str:
    assert result.is_error, result.content
    return str(result.content[0].text)  # type: ignore[union-attr]


def call(root: Path, tool: str, arguments: dict[str, Any]) -> CallToolResult:
    """One tool call on a server whose login leads nowhere: a refusal that needed no API call is the only
    answer that is not about credentials."""
    config = mcptools.Config("default", (root,), kubeconfig=str(root / "no-kubeconfig"))

    async def go() -> CallToolResult:
        async with Client(mcptools.build(config)) as client:
            return await client.call_tool(tool, arguments)

    return asyncio.run(go())


def test_the_tools_and_their_bounds() -> None:
    async def go() -> dict[str, Any]:
        async with Client(mcptools.build(mcptools.Config("default", (Path.cwd(),)))) as client:
            return {t.name: t for t in (await client.list_tools()).tools}

    tools = asyncio.run(go())
    assert set(tools) == {
        *(f"env_{v}" for v in ("list", "status", "create", "exec", "read_file", "write_file", "list_files")),
        *(f"env_{v}" for v in ("diff", "promote", "fork", "race", "verify", "manifest", "destroy")),
        *(
            f"sandbox_{v}"
            for v in (
                "list",
                "claim",
                "exec",
                "read_file",
                "write_file",
                "list_files",
                "egress_log",
                "delete",
            )
        ),
    }
    for name in ("env_promote", "env_destroy", "sandbox_delete"):
        assert tools[name].annotations.destructive_hint, name
    assert tools["env_read_file"].annotations.read_only_hint
    read = tools["env_read_file"].input_schema["properties"]
    assert read["max_bytes"]["maximum"] == mcptools.MAX_READ
    assert read["path"]["maxLength"] == 4096
    assert tools["env_exec"].input_schema["properties"]["timeout"]["maximum"] == mcptools.MAX_TIMEOUT
    assert tools["env_promote"].input_schema["properties"]["confirm"]["default"] is False


def test_promote_and_a_promoting_race_are_refused_without_confirm(tmp_path: Path) -> None:
    text = refused(call(tmp_path, "env_promote", {"name": "demo"}))
    assert "promote of demo refused" in text and "hint: look at env_diff first" in text
    text = refused(
        call(tmp_path, "env_race", {"name": "demo", "commands": ["true"], "count": 2, "promote": True})
    )
    assert "refused" in text and "confirm=true" in text


@pytest.mark.parametrize(
    ("path", "why"),
    [
        ("../etc/passwd", "'..'"),
        ("/etc/passwd", "not a relative path"),
        ("src/.git/config", ".git"),
        ("src/.GIT./hooks/pre-commit", ".git"),
        ("a//b", "empty components"),
    ],
)
def test_workspace_paths_are_confined_before_any_call(tmp_path: Path, path: str, why: str) -> None:
    for tool, args in (
        ("env_read_file", {"name": "demo", "path": path}),
        ("env_write_file", {"name": "demo", "path": path, "content": "x"}),
        ("sandbox_read_file", {"claim": "box", "path": path}),
    ):
        text = refused(call(tmp_path, tool, args))
        assert why in text and "hint: give a path relative to the workspace root" in text, (tool, text)


def test_local_directories_stay_inside_the_roots(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "project").mkdir(parents=True)
    (root / "escape").symlink_to(tmp_path)
    for local in ("/etc", "../", "escape", str(tmp_path)):
        text = refused(call(root, "env_create", {"name": "demo", "local": [local]}))
        assert "outside the directories this server may use" in text, (local, text)
    # Inside the root, the next refusal is the login's: the check passed and the cluster was asked.
    text = refused(call(root, "env_create", {"name": "demo", "local": ["project"]}))
    assert "no usable Kubernetes credentials" in text


def test_names_sizes_and_sources_are_checked(tmp_path: Path) -> None:
    assert "pattern" in refused(call(tmp_path, "env_status", {"name": "Not_A_Label"}))
    too_big = "x" * (mcptools.MAX_WRITE + 1)
    text = refused(call(tmp_path, "env_write_file", {"name": "demo", "path": "f", "content": too_big}))
    assert f"the {mcptools.MAX_WRITE} bytes one write may carry" in text
    text = refused(
        call(tmp_path, "env_write_file", {"name": "d", "path": "f", "content": "@@", "encoding": "base64"})
    )
    assert "not valid base64" in text
    text = refused(call(tmp_path, "env_create", {"name": "demo", "git": ["file:///etc"]}))
    assert "only https:// URLs" in text
    text = refused(
        call(tmp_path, "env_create", {"name": "demo", "git": ["https://user:pw@example.com/o/r.git"]})
    )
    assert "without credentials" in text
    assert "max_bytes" in refused(
        call(tmp_path, "env_read_file", {"name": "demo", "path": "f", "max_bytes": mcptools.MAX_READ + 1})
    )


def test_progress_ends_with_its_call_when_news_comes_last() -> None:
    """The pump of progress notifications stops when its call ends, whatever news came last (a pump left
    running would keep the tool call from ever returning)."""
    sent: list[str | None] = []

    class Ctx:
        async def report_progress(self, progress: float, total: float | None, message: str | None) -> None:
            sent.append(message)

    async def work() -> None:
        progress = mcptools.Progress(Ctx())  # type: ignore[arg-type]
        async with progress.running("working"):
            await asyncio.sleep(0)
            progress.say("almost")
            await asyncio.sleep(0)
            progress.say("done")

    for _ in range(20):
        asyncio.run(asyncio.wait_for(work(), 10))
    assert sent[0] == "working"


def test_http_needs_loopback_or_allow_remote_and_a_real_token(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    check_host("127.0.0.1", False)
    check_host("::1", False)
    check_host("0.0.0.0", True)
    with pytest.raises(ShadowError, match="beyond it") as beyond:
        check_host("0.0.0.0", False)
    assert "--allow-remote" in beyond.value.hint
    with pytest.raises(ShadowError, match="not an IP address"):
        check_host("example.com", True)
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    token, made = bearer_token(None)
    assert made and len(token) >= 32
    short = tmp_path / "short"
    short.write_text("hunter2\n")
    with pytest.raises(ShadowError, match="at least 32 characters"):
        bearer_token(short)
    good = tmp_path / "token"
    good.write_text("t" * 40 + "\n")
    assert bearer_token(good) == ("t" * 40, False)


@pytest.fixture
def http_server(tmp_path: Path) -> Iterator[tuple[str, str]]:
    token = "s" * 43
    port = free_port()
    env = {**os.environ, "SHADOW_MCP_TOKEN": token, "KUBECONFIG": str(tmp_path / "none")}
    args = [SHADOWCTL, "mcp", "-n", "default", "--http", "--port", str(port), "--root", str(tmp_path)]
    with (tmp_path / "server.log").open("wb") as log:
        proc = subprocess.Popen(args, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/mcp"

    def listening() -> bool:
        assert proc.poll() is None, (tmp_path / "server.log").read_text()
        try:
            httpx.get(url, timeout=1)
        except httpx.TransportError:
            return False
        return True

    try:
        wait_for(listening, timeout=30, what="shadowctl mcp --http")
        yield url, token
    finally:
        proc.terminate()
        proc.wait(10)


def test_http_asks_every_request_for_the_bearer_token(http_server: tuple[str, str]) -> None:
    url, token = http_server
    hello = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": token}):
        answer = httpx.post(url, json=hello, headers=headers, timeout=10)
        assert answer.status_code == 401, answer.text
        assert answer.headers["www-authenticate"].startswith("Bearer")
        assert "bearer token" in json.loads(answer.text)["error"]

    async def go() -> set[str]:
        auth = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"})
        async with Client(streamable_http_client(url, http_client=auth)) as client:
            return {t.name for t in (await client.list_tools()).tools}

    assert "env_create" in asyncio.run(go())


def test_the_cli_does_not_import_mcp() -> None:
    code = "import sys, shadow_operator.cli; print('mcp' in sys.modules)"
    assert (
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip() == "False"
    )
