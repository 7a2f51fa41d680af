"""The SDK's runtime operations against a real sandbox-runtime, driven by both the sync and the async driver:
exec, files, archive import, diff, journal, and promote into a real local directory."""

from __future__ import annotations

import asyncio
import os
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from shadow_operator.sdk import kube, promote, runtime
from shadow_operator.sdk.errors import RuntimeRefused, RuntimeUnreachable
from shadow_operator.sdk.kube import Op
from shadow_operator.sdk.runtime import RuntimeEndpoint
from shadow_operator.sdk.upload import stream_worktree

from tests.runtime.conftest import Server, free_port

pytestmark = pytest.mark.unit

TOKEN = "sdk-token"


@pytest.fixture
def secured(launch: Callable[..., Server]) -> Server:
    return launch(env={"SANDBOX_RUNTIME_TOKEN": TOKEN}, token=TOKEN)


@pytest.fixture(params=["sync", "async"])
def drive(request: pytest.FixtureRequest) -> Callable[[Op[Any]], Any]:
    """Run an operation with the sync driver or the async one: both must behave the same."""
    if request.param == "sync":

        def sync(op: Op[Any]) -> Any:
            with httpx.Client() as http:
                return kube.run(http, op)

        return sync

    def async_(op: Op[Any]) -> Any:
        async def go() -> Any:
            async with httpx.AsyncClient() as http:
                return await kube.arun(http, op)

        return asyncio.run(go())

    return async_


def endpoint(server: Server, token: str = TOKEN) -> RuntimeEndpoint:
    return RuntimeEndpoint(server.url, {runtime.TOKEN_HEADER: token})


def test_exec_string_and_argv(secured: Server, drive: Callable[[Op[Any]], Any]) -> None:
    ep = endpoint(secured)
    (secured.root / "sub").mkdir(exist_ok=True)
    shell = drive(runtime.run_command(ep, "echo out; echo err >&2; pwd; exit 3", cwd="sub"))
    assert shell.exit_code == 3 and not shell.ok
    assert shell.stdout.splitlines() == ["out", str(secured.root / "sub")]
    assert shell.stderr == "err\n"
    argv = drive(runtime.run_command(ep, ["printf", "%s", "a b"], env={"X": "1"}))
    assert argv.ok and argv.stdout == "a b"


def test_files_round_trip_stat_and_delete(secured: Server, drive: Callable[[Op[Any]], Any]) -> None:
    ep = endpoint(secured)
    drive(runtime.write_file(ep, "dir/file.bin", b"\x00\x01 bytes"))
    assert drive(runtime.read_file(ep, "dir/file.bin")) == b"\x00\x01 bytes"
    info = drive(runtime.stat(ep, "dir/file.bin"))
    assert info is not None and info["type"] == "file" and info["size"] == 8
    assert drive(runtime.stat(ep, "dir/missing")) is None
    drive(runtime.delete_path(ep, "dir", recursive=True))
    assert not (secured.root / "dir").exists()


def test_errors_are_typed(secured: Server, drive: Callable[[Op[Any]], Any]) -> None:
    with pytest.raises(RuntimeRefused) as refused:
        drive(runtime.run_command(endpoint(secured, "wrong"), "true"))
    assert refused.value.status == 401 and refused.value.code == "RuntimeRefused"
    with pytest.raises(RuntimeRefused) as outside:
        drive(runtime.read_file(endpoint(secured), "../etc/passwd"))
    assert 400 <= outside.value.status < 500
    dead = RuntimeEndpoint(f"http://127.0.0.1:{free_port()}", {})
    with pytest.raises(RuntimeUnreachable, match="cannot reach the workspace runtime"):
        drive(runtime.run_command(dead, "true"))


def git(cwd: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True)


def test_upload_diff_and_promote_into_a_local_directory(
    secured: Server, drive: Callable[[Op[Any]], Any], tmp_path: Path
) -> None:
    """The seed-000 loop without a cluster: copy a repository in, change it there, promote the change back."""
    local = tmp_path / "core"
    local.mkdir()
    git(local, "init", "-q", "-b", "main")
    (local / "app.py").write_text("print('v1')\n")
    (local / "gone.txt").write_text("to be deleted\n")
    (local / "run.sh").write_text("#!/bin/sh\n")
    git(local, "add", "-A")
    git(local, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "init")
    (local / "notes.md").write_text("uncommitted\n")  # untracked work travels too
    head_before = (local / ".git" / "HEAD").read_text()

    ep = endpoint(secured)
    imported = drive(runtime.import_archive(ep, "src/core", stream_worktree(local)))
    assert imported.files >= 4
    assert (secured.root / "src/core/notes.md").read_text() == "uncommitted\n"
    with httpx.Client(headers=ep.headers) as http:
        assert http.post(f"{secured.url}/v1/baseline").is_success

    change = "cd src/core && echo \"print('v2')\" > app.py && rm gone.txt && echo new > added.txt && chmod +x run.sh"
    assert drive(runtime.run_command(ep, change)).ok
    (secured.root / "src/core/.git/evil").write_text("never promoted\n")
    diff = drive(runtime.diff(ep, paths_only=True))
    assert "src/core/app.py" in diff.modified and "src/core/gone.txt" in diff.deleted

    plan = promote.plan_promote(diff, "core", "src/core", local)
    assert plan.write == ["added.txt", "app.py", "run.sh"] and plan.delete == ["gone.txt"]
    only_py = promote.plan_promote(diff, "core", "src/core", local, ["*.py"])
    assert only_py.write == ["app.py"] and only_py.delete == []

    (local / "local-only.txt").write_text("kept\n")  # work done locally meanwhile survives
    drive(promote.apply(ep, plan))
    assert (local / "app.py").read_text() == "print('v2')\n"
    assert (local / "added.txt").read_text() == "new\n"
    assert not (local / "gone.txt").exists()
    assert os.access(local / "run.sh", os.X_OK)
    assert (local / "local-only.txt").read_text() == "kept\n"
    assert (local / ".git" / "HEAD").read_text() == head_before and not (local / ".git" / "evil").exists()


def test_journal_records_commands_unless_asked_not_to(
    secured: Server, drive: Callable[[Op[Any]], Any]
) -> None:
    ep = endpoint(secured)
    drive(runtime.run_command(ep, "echo recorded"))
    drive(runtime.run_command(ep, "echo plumbing", journal=False))
    commands = [e.command for e in drive(runtime.journal(ep))]
    assert any("recorded" in (c or "") for c in commands)
    assert not any("plumbing" in (c or "") for c in commands)
