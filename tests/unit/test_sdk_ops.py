"""The SDK's pure parts: manifests it builds, how claim status reads, promote planning, the typed errors of
API answers, and choosing a kubeconfig context."""

from __future__ import annotations

import asyncio
import io
import json
import os
import tarfile
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from shadow_operator.api import constants as c
from shadow_operator.api.environment import PushRequest
from shadow_operator.cli.common import split_remote
from shadow_operator.cli.environments import parse_git
from shadow_operator.sdk import environment as envops
from shadow_operator.sdk import kube, promote
from shadow_operator.sdk import sandbox as sandbox_ops
from shadow_operator.sdk.download import extract
from shadow_operator.sdk.environment import (
    ANNOTATION_LOCAL_PREFIX,
    EnvironmentSpec,
    GitSource,
    LocalSource,
    build_environment,
)
from shadow_operator.sdk.errors import (
    ApiNotInstalled,
    Forbidden,
    Invalid,
    NotFound,
    RuntimeRefused,
    SandboxTemplateNotFoundError,
    ShadowError,
)
from shadow_operator.sdk.kube import Call, Watch
from shadow_operator.sdk.runtime import Diff

from tests.support.fakes import environment

pytestmark = pytest.mark.unit


def test_environment_manifest_records_local_directories(tmp_path: Path) -> None:
    (tmp_path / "My_Repo").mkdir()
    spec = EnvironmentSpec(
        local=[LocalSource(tmp_path / "My_Repo", "acme/core")],
        git=[GitSource("https://example.com/x/tool.git", "v1")],
        rewrites={"https://github.com/acme/": "acme"},
        verify_commands=["pytest -q"],
    )
    body = build_environment("e1", "ns", spec)
    assert body["spec"]["sources"] == [
        {"name": "my-repo", "repo": "acme/core", "upload": {}},
        {
            "name": "tool",
            "repo": "shadow/tool",
            "git": {"url": "https://example.com/x/tool.git", "ref": "v1"},
        },
    ]
    assert body["spec"]["gitRewrites"] == [{"from": "https://github.com/acme/", "to": "acme"}]
    assert body["spec"]["verify"] == {"commands": [{"name": "check-1", "command": "pytest -q"}]}
    assert body["metadata"]["annotations"] == {ANNOTATION_LOCAL_PREFIX + "my-repo": str(tmp_path / "My_Repo")}
    assert "runtimeClassName" not in body["spec"]
    sandboxed = build_environment("e2", "ns", EnvironmentSpec(git=spec.git, runtime_class="gvisor"))
    assert sandboxed["spec"]["runtimeClassName"] == "gvisor"
    with pytest.raises(ShadowError, match="nothing to copy in"):
        build_environment("e1", "ns", EnvironmentSpec())
    twice = EnvironmentSpec(local=[LocalSource(tmp_path / "My_Repo"), LocalSource(tmp_path / "My_Repo")])
    with pytest.raises(ShadowError, match="same name"):
        build_environment("e1", "ns", twice)


def test_an_environment_from_a_pool_starts_from_the_pools_values(tmp_path: Path) -> None:
    """`shadowctl create --pool`: the pool's shaping fields (not its replicas, not a workspace `from`), then
    what the user gave explicitly on top, so the environment matches the pool unless told otherwise."""
    pool_spec = {
        "replicas": 4,
        "template": "python",
        "workspace": {"mountPath": "/src", "size": "5Gi", "from": {"environment": "x"}},
        "gitRewrites": [{"from": "https://github.com/acme/", "to": "acme"}],
        "journal": False,
        "preview": None,
    }
    (tmp_path / "app").mkdir()
    spec = EnvironmentSpec(local=[LocalSource(tmp_path / "app")], pool="warm")
    body = build_environment("e1", "ns", spec, pool_spec)["spec"]
    assert body["pool"] == "warm" and body["template"] == "python" and body["journal"] is False
    assert body["workspace"] == {"mountPath": "/src", "size": "5Gi"}
    assert body["gitRewrites"] == pool_spec["gitRewrites"]
    assert "replicas" not in body and "preview" not in body
    override = EnvironmentSpec(
        local=[LocalSource(tmp_path / "app")], pool="warm", mount_path="/app", template="t"
    )
    body = build_environment("e1", "ns", override, pool_spec)["spec"]
    assert body["workspace"] == {"mountPath": "/app", "size": "5Gi"} and body["template"] == "t"


def test_claim_manifest_and_status() -> None:
    assert sandbox_ops.build_claim("c", "ns", template="py", warmpool=None)["spec"] == {
        "sandboxTemplateRef": {"name": "py"}
    }
    pooled = sandbox_ops.build_claim("c", "ns", template=None, warmpool="pool", env={"A": "1"})
    assert pooled["spec"] == {"warmPoolRef": {"name": "pool"}, "env": [{"name": "A", "value": "1"}]}
    with pytest.raises(ShadowError, match="exactly one"):
        sandbox_ops.build_claim("c", "ns", template="py", warmpool="pool")

    meta = {"name": "c", "namespace": "ns"}
    assert sandbox_ops.claim_ready({"metadata": meta}) is None
    ready = {"type": "Ready", "status": "True", "reason": "Ready"}
    bound = sandbox_ops.claim_ready(
        {"metadata": meta, "status": {"conditions": [ready], "sandbox": {"name": "s"}}}
    )
    assert bound == sandbox_ops.SandboxRef("c", "s", "ns")
    missing = {"type": "Ready", "status": "False", "reason": "TemplateNotFound", "message": "no py"}
    with pytest.raises(SandboxTemplateNotFoundError) as err:
        sandbox_ops.claim_ready({"metadata": meta, "status": {"conditions": [missing]}})
    assert err.value.code == "TemplateNotFound"


def test_promote_plan_stays_in_the_source_and_out_of_git(tmp_path: Path) -> None:
    diff = Diff(
        added=["core/new.py", "core/.git/config", "other/x.py", "core/docs/a.md"],
        modified=["core/app.py", "core/sub/../../escape"],
        deleted=["core/old.py"],
    )
    plan = promote.plan_promote(diff, "core", "core", tmp_path)
    assert plan.write == ["app.py", "docs/a.md", "new.py"] and plan.delete == ["old.py"]
    assert promote.plan_promote(diff, "core", "core", tmp_path, ["docs"]).write == ["docs/a.md"]
    assert promote.plan_promote(Diff(), "core", "core", tmp_path).empty


def test_promote_plan_refuses_directories_no_baseline_covers(tmp_path: Path) -> None:
    """A workspace that rewrote its own baseline lists a bytecode file in its diff: promoted, an unchecked
    hash-based .pyc would run in place of its source on the user's machine. Any spelling of the directory."""
    bytecode = [
        "core/__pycache__/app.cpython-311.pyc",
        "core/pkg/__PyCache__/m.pyc",
        "core/.Sandbox-Runtime/x",
    ]
    plan = promote.plan_promote(Diff(added=[*bytecode, "core/app.py"]), "core", "core", tmp_path)
    assert plan.write == ["app.py"]
    assert plan.refused == sorted(p.removeprefix("core/") for p in bytecode)
    # A file of that name is no directory: nothing stands in for it.
    assert promote.plan_promote(Diff(added=["core/__pycache__"]), "core", "core", tmp_path).write == [
        "__pycache__"
    ]


def tar_of(members: dict[str, bytes]) -> io.BytesIO:
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w:gz") as tar:
        for name, content in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(content)
            tar.addfile(info, io.BytesIO(content))
    data.seek(0)
    return data


def test_cp_extraction_refuses_paths_outside_the_target(tmp_path: Path) -> None:
    assert extract([tar_of({"a/b.txt": b"ok"}).getvalue()], tmp_path / "in") == 1
    assert (tmp_path / "in/a/b.txt").read_bytes() == b"ok"
    with pytest.raises(ShadowError, match=r"refusing '\.\./escape\.txt'"):
        extract([tar_of({"../escape.txt": b"no"}).getvalue()], tmp_path / "in2")
    assert not (tmp_path / "escape.txt").exists()


def test_cli_argument_forms() -> None:
    assert split_remote("env:src/app.py") == ("env", "src/app.py")
    assert split_remote("./local:odd") == (None, "./local:odd")
    assert split_remote("dir/file") == (None, "dir/file")
    assert parse_git("https://h/o/r.git@v2:org/name") == GitSource("https://h/o/r.git", "v2", "org/name")
    assert parse_git("https://h/o/r") == GitSource("https://h/o/r", None, "")


def answer(status: int, body: dict[str, Any], *, runtime: bool = False) -> Exception:
    request = httpx.Request("GET", "https://api/x")
    response = httpx.Response(status, json=body, request=request)
    return kube.error_of(response, Call("GET", "/x", "read x", runtime=runtime))


def test_api_answers_become_typed_errors() -> None:
    not_installed = answer(
        404, {"kind": "Status", "message": "the server could not find the requested resource"}
    )
    assert isinstance(not_installed, ApiNotInstalled) and "not installed" in str(not_installed)
    assert isinstance(answer(404, {"kind": "Status", "message": 'x "a" not found'}), NotFound)
    assert isinstance(answer(403, {"kind": "Status", "message": "forbidden"}), Forbidden)
    invalid = answer(422, {"kind": "Status", "reason": "Invalid", "message": "spec.sources: Required value"})
    assert isinstance(invalid, Invalid) and "spec.sources" in str(invalid)
    # Through the pod proxy: the runtime's own errors, and the API server's (a Status) told apart.
    refused = answer(403, {"code": "FORBIDDEN", "message": "path escapes the root"}, runtime=True)
    assert isinstance(refused, RuntimeRefused) and refused.status == 403
    assert isinstance(answer(403, {"kind": "Status", "message": "no"}, runtime=True), Forbidden)


def test_context_option_selects_another_context(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "a",
        "contexts": [
            {"name": "a", "context": {"cluster": "ca", "user": "u"}},
            {"name": "b", "context": {"cluster": "cb", "user": "u"}},
        ],
        "clusters": [
            {"name": "ca", "cluster": {"server": "https://a.example:6443"}},
            {"name": "cb", "cluster": {"server": "https://b.example:6443"}},
        ],
        "users": [{"name": "u", "user": {"token": "t"}}],
    }
    path = tmp_path / "config"
    path.write_text(json.dumps(config))
    monkeypatch.setenv("KUBECONFIG", str(path))
    with kube.connect() as http:
        assert str(http.base_url).startswith("https://a.example:6443")
    with kube.connect(context="b") as http:
        assert str(http.base_url).startswith("https://b.example:6443")
    assert os.environ["KUBECONFIG"] == str(path)
    with pytest.raises(ShadowError, match="no context"):
        kube.connect(context="nope")


def test_a_gateway_naming_a_pool_starts_from_it(tmp_path: Path) -> None:
    """`ShadowGateway(name, path, pool=...)`: the spec `start()` creates names the pool (shadowctl's --pool)."""
    from shadow_operator.sdk.gateway import GatewayOps

    spec = GatewayOps("e1", "ns", tmp_path, "https://cluster", pool="warm").spec(None)
    assert spec.pool == "warm" and [s.path for s in spec.local] == [tmp_path]
    assert GatewayOps("e1", "ns", tmp_path, "https://cluster").spec(None).pool is None


def test_verify_and_push_return_the_status_that_answers_them() -> None:
    """Each is one annotation patch, then the part of status that answers it, typed: the verdict of this
    trigger (an older verdict is no answer: the environment is watched on), the lastPush of this request."""

    def answered_with(status: dict[str, Any]) -> httpx.Response:
        return httpx.Response(200, json=environment(status=status).body)

    verdict = {"result": "PASS", "score": 50, "maxScore": 50, "passThreshold": 35}
    op = envops.verify("team", "demo", timeout=30)
    patch = next(op)
    assert isinstance(patch, Call) and patch.method == "PATCH"
    trigger = patch.body["metadata"]["annotations"][c.ANNOTATION_VERIFY_REQUEST]
    assert op.send(httpx.Response(200, json={})).method == "GET"
    assert isinstance(op.send(answered_with({"verdict": {**verdict, "trigger": "older"}})), Watch)
    op = envops.verify("team", "demo", timeout=30)
    trigger = next(op).body["metadata"]["annotations"][c.ANNOTATION_VERIFY_REQUEST]
    op.send(httpx.Response(200, json={}))
    with pytest.raises(StopIteration) as done:
        op.send(answered_with({"verdict": {**verdict, "trigger": trigger}}))
    assert (done.value.value.result, done.value.value.trigger) == ("PASS", trigger)

    op = envops.push("team", "demo", PushRequest(id="p1", source="app", branch="b"), timeout=30)
    assert json.loads(next(op).body["metadata"]["annotations"][c.ANNOTATION_PUSH_REQUEST])["id"] == "p1"
    op.send(httpx.Response(200, json={}))
    with pytest.raises(StopIteration) as done:
        op.send(answered_with({"lastPush": {"id": "p1", "commit": "abc"}}))
    assert (done.value.value.id, done.value.value.commit) == ("p1", "abc")


def test_both_drivers_pause_where_an_operation_asks_and_carry_on() -> None:
    """kube.Pause: the woken sandbox's runtime is tried again after a pause (sdk/wake.py); both drivers wait
    that long and send None back into the operation."""

    def op() -> kube.Op[list[Any]]:
        seen = [(yield kube.Pause(0.05)), (yield kube.Pause(0.05))]
        return seen

    for driver in ("sync", "async"):
        started = time.monotonic()
        if driver == "sync":
            with httpx.Client() as http:
                seen = kube.run(http, op())
        else:

            async def drive() -> list[Any]:
                async with httpx.AsyncClient() as http:
                    return await kube.arun(http, op())

            seen = asyncio.run(drive())
        assert seen == [None, None], driver
        assert time.monotonic() - started >= 0.1, driver
