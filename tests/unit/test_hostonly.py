"""Host-only verification (seed 001's fallback): the 50-point rubric, and the temporary copy the checks run in,
which never lets them touch the user's directory."""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
from shadow_operator.sdk import hostonly
from shadow_operator.sdk.environment import LocalSource
from shadow_operator.sdk.errors import ShadowError
from shadow_operator.sdk.hostonly import CODE_EXECUTION, INSTALLATION_HEALTH, SOURCE_VERIFICATION, CheckResult

pytestmark = pytest.mark.unit


def ok(name: str) -> CheckResult:
    return CheckResult(name, True)


def bad(name: str) -> CheckResult:
    return CheckResult(name, False, "exit 1")


def test_rubric_is_fifty_points_pass_at_thirty_five() -> None:
    full = hostonly.score(
        {SOURCE_VERIFICATION: [ok("a")], INSTALLATION_HEALTH: [ok("b")], CODE_EXECUTION: [ok("c")]}, "Timeout"
    )
    assert (full.result, full.score, full.max_score, full.pass_threshold, full.mode) == (
        "PASS", 50, 50, 35, "host-only",
    )  # fmt: skip
    assert full.issues == ["shadow unavailable (Timeout): checked on the host only"]
    assert {k: v.max_score for k, v in full.evidence.items()} == {
        SOURCE_VERIFICATION: 15, INSTALLATION_HEALTH: 15, CODE_EXECUTION: 20,
    }  # fmt: skip
    # One command of two fails: 15 + 15 + 10 = 40, still a PASS; both fail: 30, a FAIL.
    half = hostonly.score(
        {SOURCE_VERIFICATION: [ok("a")], INSTALLATION_HEALTH: [ok("b")], CODE_EXECUTION: [ok("c"), bad("d")]},
        None,
    )
    assert (half.result, half.score) == ("PASS", 40)
    assert half.issues == ["codeExecution: d failed: exit 1"]
    none = hostonly.score(
        {
            SOURCE_VERIFICATION: [ok("a")],
            INSTALLATION_HEALTH: [ok("b")],
            CODE_EXECUTION: [bad("c"), bad("d")],
        },
        None,
    )
    assert (none.result, none.score) == ("FAIL", 30)


def test_a_category_without_checks_is_left_out_and_the_rest_scaled() -> None:
    # No project manifest: source (15) + code (20) scaled to 50; a failing command alone sinks it.
    verdict = hostonly.score({SOURCE_VERIFICATION: [ok("a")], CODE_EXECUTION: [bad("c")]}, None)
    assert (verdict.result, verdict.score) == ("FAIL", 21)  # 50 * 15/35
    assert hostonly.score({}, None).result == "FAIL"


def test_fallback_is_opt_in_and_named() -> None:
    assert hostonly.check_fallback(None) is False
    assert hostonly.check_fallback("host-only") is True
    with pytest.raises(ShadowError, match="unknown"):
        hostonly.check_fallback("docker")


def git(repo: Path, *args: str) -> None:
    subprocess.run(
        ["git", "-c", "user.email=t@t", "-c", "user.name=t", *args], cwd=repo, check=True, capture_output=True
    )


def snapshot(root: Path) -> dict[str, bytes | str]:
    """Every entry under root: file contents, link targets."""
    found: dict[str, bytes | str] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in filenames + dirnames:
            path = Path(dirpath) / name
            rel = str(path.relative_to(root))
            if path.is_symlink():
                found[rel] = "-> " + os.readlink(path)
            elif path.is_file():
                found[rel] = path.read_bytes()
            else:
                found[rel] = "dir"
    return found


def test_checks_run_in_a_temporary_copy_never_in_the_source(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temporary))
    repo = tmp_path / "core"
    (repo / "core").mkdir(parents=True)
    (repo / "core" / "__init__.py").write_text("VERSION = 1\n")
    (repo / "pyproject.toml").write_text('[project]\nname = "core"\nversion = "0"\n')
    (repo / ".gitignore").write_text("secret.env\n")
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", ".")
    git(repo, "commit", "-q", "-m", "one")
    (repo / "core" / "__init__.py").write_text("VERSION = 2\n")  # uncommitted: checked as it is
    (repo / "secret.env").write_text("ignored, never copied\n")
    outside = tmp_path / "outside.txt"
    outside.write_text("not yours\n")
    os.symlink(outside, repo / "absolute-link")
    os.symlink("../outside.txt", repo / "climbing-link")
    os.symlink("core/__init__.py", repo / "inner-link")
    before = snapshot(repo) | {"outside.txt": outside.read_bytes()}

    commands = hostonly.commands_of(
        [
            "cd core && python3 -B -c 'import core, sys; sys.exit(core.VERSION != 2)'",
            "test ! -e core/secret.env && test ! -e core/absolute-link && test ! -e core/climbing-link",
            "test -L core/inner-link && git -C core status --porcelain | grep -q __init__",
            "echo changed > core/core/__init__.py && rm -rf core/.git core/pyproject.toml && touch core/new",
            "echo overwritten > core/inner-link",
        ]
    )
    verdict = hostonly.verify_on_host([LocalSource(repo)], commands, "ClusterUnreachable")

    after = snapshot(repo) | {"outside.txt": outside.read_bytes()}
    assert after == before, "the source directory (or a file a link points at) changed"
    code = verdict.evidence[CODE_EXECUTION]
    assert [c.passed for c in code.checks] == [True, True, True, True, True], code.checks
    source = verdict.evidence[SOURCE_VERIFICATION].checks
    assert source[0].passed and "absolute-link" in source[0].detail and "climbing-link" in source[0].detail
    assert source[1].name == "core: git HEAD" and source[1].passed
    assert verdict.evidence[INSTALLATION_HEALTH].checks[0].detail == "python project"
    assert (verdict.result, verdict.score, verdict.mode) == ("PASS", 50, "host-only")
    assert list(temporary.iterdir()) == []  # the copy is gone


def test_a_broken_manifest_and_a_hanging_command_fail_their_checks(tmp_path: Path) -> None:
    src = tmp_path / "web"
    src.mkdir()
    (src / "package.json").write_text("{not json")
    started = time.monotonic()
    commands = [hostonly.HostCommand("hang", "sleep 30 & sleep 30", timeout_seconds=1)]
    verdict = hostonly.verify_on_host([LocalSource(src)], commands, "OperatorNotRunning")
    assert time.monotonic() - started < 15  # the whole process group was killed, not only sh
    assert not verdict.evidence[INSTALLATION_HEALTH].checks[0].passed
    assert "killed after 1s" in verdict.evidence[CODE_EXECUTION].checks[0].detail
    assert verdict.result == "FAIL"


def test_no_local_source_no_fallback() -> None:
    with pytest.raises(hostonly.FallbackNotPossible):
        hostonly.verify_on_host([], [], "ClusterUnreachable")


def test_the_host_only_verdict_and_the_operators_agree() -> None:
    # One scorer (common.verdict) behind both: for the same checks the same evidence and issues, and the same
    # share of the maximum (50 on the host, 100 in the shadow), whichever categories apply.
    from datetime import UTC, datetime
    from itertools import product

    from shadow_operator.common.verdict import score_verdict

    outcomes = [[], [ok("a")], [bad("b")], [ok("a"), bad("b")], [ok("a"), ok("c"), bad("b")]]
    for source, install, code in product(outcomes, repeat=3):
        checks = {SOURCE_VERIFICATION: source, INSTALLATION_HEALTH: install, CODE_EXECUTION: code}
        host = hostonly.score(checks, None)
        shadow = score_verdict(checks, pass_threshold=70, verified_at=datetime.now(UTC), generation=1)
        assert host.issues == shadow["issues"]
        assert {k: [c.model_dump() for c in v.checks] for k, v in host.evidence.items()} == {
            k: v["checks"] for k, v in shadow["evidence"].items()
        }
        # Each rounds to a whole point: half a point of 50 and half of 100 apart at most.
        assert abs(host.score / host.max_score - shadow["score"] / shadow["maxScore"]) <= 0.015
        assert (host.mode, shadow["mode"]) == ("host-only", "shadow")
