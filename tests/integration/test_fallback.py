"""Host-only fallback against a real API server and operator: an environment that failed with a code (its
SandboxTemplate is missing) is reported with that code, and, only when asked, verified on the host instead."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
from shadow_operator.sdk import (
    AsyncShadowGateway,
    EnvironmentFailed,
    EnvironmentSpec,
    FallbackNotPossible,
    LocalSource,
    ShadowGateway,
)
from shadow_operator.sdk import manifest as m

from tests.support.sandbox_operator import Objects

pytestmark = pytest.mark.integration

SHADOWCTL = str(Path(sys.executable).parent / "shadowctl")
SCHEMA = json.loads(m.SCHEMA_PATH.read_text())
CHECK = "cd svc && test -f go.mod && echo built > ../artifact"


@pytest.fixture
def use_kubeconfig(kubeconfig: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KUBECONFIG", kubeconfig)


@pytest.fixture
def svc(tmp_path: Path) -> Path:
    repo = tmp_path / "svc"
    repo.mkdir()
    (repo / "go.mod").write_text("module example.com/svc\n\ngo 1.22\n")
    (repo / "main.go").write_text("package main\n")
    return repo


def test_failed_environment_code_goes_into_failure_reason(
    objs: Objects, use_kubeconfig: None, svc: Path
) -> None:
    spec = EnvironmentSpec(local=[LocalSource(svc)], template="absent", verify_commands=[CHECK])
    before = sorted(p.name for p in svc.iterdir())
    with ShadowGateway("failing", namespace=objs.namespace) as gw:
        with pytest.raises(EnvironmentFailed) as failed:
            gw.start(spec, timeout=60)
        assert failed.value.code == "TemplateNotFound"

        # Without the opt-in: the shadow's manifest, unavailable, with the code; nothing ran on the host.
        plain = gw.manifest().dump()
        jsonschema.Draft202012Validator(SCHEMA).validate(plain)
        assert (plain["shadow_id"], plain["shadow_available"], plain["failure_reason"]) == (
            "failing",
            False,
            "TemplateNotFound",
        )
        assert (plain["fallback_mode"], plain["mode"], plain["verdict"]) == (False, "shadow", None)

        # With it, and no commands given: the local directory comes from the environment's record, but the
        # commands it declares are not run on this machine (whoever can edit the object would run code here).
        unrun = gw.manifest(fallback="host-only").dump()
        assert "codeExecution" not in unrun["verdict"]["evidence"]
        assert any("are not run on this machine" in i for i in unrun["verdict"]["issues"])
        assert not (svc.parent / "artifact").exists()

        # The caller's own commands run, in a temporary copy of the recorded directory.
        host = gw.manifest(fallback="host-only", spec=EnvironmentSpec(verify_commands=[CHECK])).dump()
    jsonschema.Draft202012Validator(SCHEMA).validate(host)
    assert (host["shadow_id"], host["fallback_mode"], host["failure_reason"], host["mode"]) == (
        "failing",
        True,
        "TemplateNotFound",
        "host-only",
    )
    assert host["local_sources"] == [
        {"name": "svc", "path": str(svc), "github_repo": None, "snapshot_commit": None, "project_type": "go"}
    ]
    verdict = host["verdict"]
    assert (verdict["result"], verdict["score"], verdict["maxScore"]) == ("PASS", 50, 50)
    assert verdict["evidence"]["codeExecution"]["checks"][0]["name"] == "check-1"
    assert verdict["issues"][0] == "shadow unavailable (TemplateNotFound): checked on the host only"
    assert sorted(p.name for p in svc.iterdir()) == before
    assert not (svc.parent / "artifact").exists()

    async def verify_async() -> str:
        async with AsyncShadowGateway("failing", namespace=objs.namespace) as agw:
            v = await agw.verify(
                timeout=60, fallback="host-only", spec=EnvironmentSpec(verify_commands=[CHECK])
            )
            return f"{v.mode} {v.result} {v.score}/{v.max_score}"

    assert asyncio.run(verify_async()) == "host-only PASS 50/50"


def test_cli_create_falls_back_when_asked(objs: Objects, kubeconfig: str, svc: Path) -> None:
    env = {**os.environ, "KUBECONFIG": kubeconfig, "COLUMNS": "200"}
    args = ["--local", str(svc), "--template", "absent", "--verify", "exit 1", "-n", objs.namespace]
    args += ["--timeout", "60"]

    def ctl(*extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([SHADOWCTL, *extra], env=env, capture_output=True, text=True, timeout=300)

    plain = ctl("create", "no-fallback", *args)
    assert plain.returncode == 1 and "TemplateNotFound" in plain.stderr and "HOST-ONLY" not in plain.stderr

    labelled = ctl("create", "with-fallback", *args, "--fallback", "host-only", "-o", "json")
    assert labelled.returncode == 1, labelled.stderr  # the host-only checks ran, and the command failed
    assert "shadow unavailable (TemplateNotFound): HOST-ONLY" in labelled.stderr
    verdict = json.loads(labelled.stdout)
    assert (verdict["mode"], verdict["failureReason"], verdict["result"]) == (
        "host-only",
        "TemplateNotFound",
        "FAIL",
    )
    assert verdict["score"] == 30  # the copy (15) and go.mod (15) pass, the command (20) fails


def test_fallback_copies_only_directories_this_machine_recorded(
    objs: Objects, use_kubeconfig: None, kubeconfig: str, svc: Path, tmp_path: Path
) -> None:
    """Whoever may patch the environment chooses its `local.shadow.dev/*` annotations: a directory named there
    alone (another one added, or the recorded one swapped for another) is never copied nor checked here."""
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id_ed25519").write_text("secret\n")
    # What ran where: the command lists the copy's top level into a file beside the sources.
    listing = tmp_path / "copied"
    probe = f"ls -A > {listing}"
    spec = EnvironmentSpec(local=[LocalSource(svc)], template="absent")
    with ShadowGateway("tampered", namespace=objs.namespace) as gw:
        with pytest.raises(EnvironmentFailed):
            gw.start(spec, timeout=60)

        def annotate(annotations: dict[str, str]) -> None:
            objs.custom.patch_namespaced_custom_object(
                "shadow.dev", "v1alpha1", objs.namespace, "shadowenvironments", "tampered",
                {"metadata": {"annotations": annotations}},
            )  # fmt: skip

        annotate({"local.shadow.dev/home": str(home)})
        found = gw.manifest(fallback="host-only", spec=EnvironmentSpec(verify_commands=[probe])).dump()
        assert [s["name"] for s in found["local_sources"]] == ["svc"]
        assert listing.read_text().split() == ["svc"]
        assert any(f"'home' says it came from {home}" in i for i in found["verdict"]["issues"])

        # The recorded source's own annotation pointed elsewhere: it no longer matches the record, so nothing
        # is left to copy, and that is said in one line.
        listing.unlink()
        annotate({"local.shadow.dev/svc": str(home)})
        with pytest.raises(FallbackNotPossible, match="which this machine has no record of"):
            gw.manifest(fallback="host-only", spec=EnvironmentSpec(verify_commands=[probe]))
        assert not listing.exists()

    env = {**os.environ, "KUBECONFIG": kubeconfig, "COLUMNS": "200"}
    refused = subprocess.run(
        [SHADOWCTL, "verify", "tampered", "-n", objs.namespace, "--fallback", "host-only", "--verify", probe],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert refused.returncode == 1 and "which this machine has no record of" in refused.stderr, refused.stderr
    assert not listing.exists()
    # Given with --local, a directory is the caller's choice and is copied.
    given = subprocess.run(
        [SHADOWCTL, "verify", "tampered", "-n", objs.namespace, "--fallback", "host-only", "--verify", probe,
         "--local", str(svc), "-o", "json"],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert given.returncode == 0, given.stderr
    assert listing.read_text().split() == ["svc"]
