"""`shadowctl mcp` on kind, as a coding agent drives it over stdio with the official `mcp` client: an
environment created from a local directory (progress reported while it starts), a command run in it, a race
of three candidates whose winner (after the judge) is promoted into the local directory only because the call
said confirm=true (the same race refused without confirm leaves everything as it was), then seed 000's loop by
hand: a change written, verified, diffed, and promoted only with confirm=true."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from mcp import Client, StdioServerParameters
from mcp.types import CallToolResult

from tests.e2e.cluster import Cluster
from tests.e2e.test_cli_sdk import REQUESTS, TIMEOUT
from tests.e2e.test_fork import SNAPSHOT_CLASS
from tests.e2e.test_race import CANDIDATES, repository
from tests.support.hostile_repo import git
from tests.support.race import BROKEN, CHECK

pytestmark = pytest.mark.e2e

SHADOWCTL = str(Path(sys.executable).parent / "shadowctl")


def data(result: CallToolResult) -> Any:
    text = result.content[0].text  # type: ignore[union-attr]
    assert not result.is_error, text
    return json.loads(text)


def test_an_agent_creates_execs_and_races_over_mcp(
    cluster: Cluster, e2e_namespace: str, tmp_path: Path
) -> None:
    ns, source = e2e_namespace, f"mcp-{uuid.uuid4().hex[:6]}"
    repo = repository(tmp_path)
    head = git(repo, "rev-parse", "HEAD")
    params = StdioServerParameters(
        command=SHADOWCTL,
        args=["mcp", "-n", ns, "--root", str(tmp_path)],
        env={**os.environ, "KUBECONFIG": cluster.kubeconfig},
    )
    progress: list[str] = []

    async def noted(done: float, total: float | None, message: str | None) -> None:
        progress.append(message or "")

    async def agent() -> dict[str, Any]:
        async with Client(params, read_timeout_seconds=float(TIMEOUT) + 120) as mcp:
            created = data(
                await mcp.call_tool(
                    "env_create",
                    {
                        "name": source,
                        "local": [str(repo)],
                        "verify_commands": [CHECK],
                        "storage_class": SNAPSHOT_CLASS,
                        "cpu": REQUESTS["cpu"],
                        "memory": REQUESTS["memory"],
                        "timeout": float(TIMEOUT),
                    },
                    progress_callback=noted,
                )
            )
            assert created["ready"] and created["verdict"]["result"] == "FAIL"  # broken: what the race is for
            assert progress[0] == f"creating {source}" and any("uploading" in m for m in progress), progress

            ran = data(await mcp.call_tool("env_exec", {"name": source, "command": "cat core/calc.py"}))
            assert (ran["exit_code"], ran["stdout"]) == (0, BROKEN)

            race = {"name": source, "commands": CANDIDATES, "promote": True, "timeout": float(TIMEOUT)}
            refused = await mcp.call_tool("env_race", race)
            assert refused.is_error and "confirm=true" in refused.content[0].text  # type: ignore[union-attr]

            progress.clear()
            result = data(await mcp.call_tool("env_race", {**race, "confirm": True}, progress_callback=noted))
            assert any(f"{source}-race-3" in m for m in progress), progress
            # Seed 000's loop in the source, by hand: change, verify, look at the diff, promote (only when asked).
            fixed = BROKEN.replace("a - b", "a + b")
            data(
                await mcp.call_tool(
                    "env_write_file", {"name": source, "path": "core/calc.py", "content": fixed}
                )
            )
            data(
                await mcp.call_tool(
                    "env_write_file", {"name": source, "path": "core/NOTES.md", "content": "x\n"}
                )
            )
            verdict = data(await mcp.call_tool("env_verify", {"name": source, "timeout": float(TIMEOUT)}))
            assert verdict["result"] == "PASS", verdict
            diff = data(await mcp.call_tool("env_diff", {"name": source}))
            assert "core/NOTES.md" in diff["added"] and "core/calc.py" in diff["modified"], diff
            assert "+    return a + b" in diff["patch"], diff["patch"]
            refused = await mcp.call_tool("env_promote", {"name": source})
            assert refused.is_error and not (repo / "NOTES.md").exists()
            data(await mcp.call_tool("env_promote", {"name": source, "confirm": True}))
            assert (repo / "NOTES.md").read_text() == "x\n"

            for name in (source, f"{source}-race-3"):  # the winner is kept, the losers and the judge are gone
                data(await mcp.call_tool("env_destroy", {"name": name}))
            listed = data(await mcp.call_tool("env_list", {}))
            assert not [env["name"] for env in listed["environments"] if env["name"].startswith(source)], (
                listed
            )
            return dict(result)

    result = asyncio.run(agent())
    names = [f"{source}-race-{i}" for i in (1, 2, 3)]
    assert [c["name"] for c in result["candidates"]] == [names[2], names[0], names[1]], result
    assert result["winner"] == names[2] and result["kept"] == [names[2]], result
    assert result["promoted"] == [
        {"source": "core", "localDir": str(repo), "write": ["calc.py"], "delete": []}
    ]
    assert (repo / "calc.py").read_text() == BROKEN.replace("a - b", "a + b")
    assert git(repo, "rev-parse", "HEAD") == head  # promote writes files; commits stay the user's
