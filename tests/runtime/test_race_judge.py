"""A race's judge (sdk/reverify.py) with two real workspace runtimes: a candidate that games its own checks
PASSes in its workspace, and its change, carried into a fresh copy of the same snapshot, FAILs there, so the
race promotes nothing. The whole race runs on kind (tests/e2e/test_race.py); here are the carry and the verdict
that decides, against real runtimes, with the operator's baseline excludes and its verification command."""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Sequence
from pathlib import Path

import httpx
import pytest
from shadow_operator.api import constants as c
from shadow_operator.api.environment import Verdict
from shadow_operator.sdk import confine, kube, reverify, runtime
from shadow_operator.sdk.errors import TooLarge
from shadow_operator.sdk.promote import PromotePlan
from shadow_operator.sdk.race import RaceCandidate, judged
from shadow_operator.sdk.runtime import RuntimeEndpoint

from tests.runtime.conftest import Server
from tests.support.race import BROKEN, CHECK, GAMED

pytestmark = pytest.mark.unit


def snapshot(root: Path) -> None:
    """The source as the race's shared snapshot holds it: a source `core` beside a file outside the sources."""
    (root / "core").mkdir(parents=True)
    (root / "core" / "calc.py").write_text(BROKEN)
    (root / "core" / "old.txt").write_text("to delete\n")
    (root / "notes.md").write_text("outside the sources\n")


def workspace(
    launch: Callable[..., Server], root: Path, exclude: Sequence[str] = c.BASELINE_EXCLUDE
) -> tuple[Server, RuntimeEndpoint]:
    """A workspace holding the snapshot, its diff baseline captured as the operator captures it."""
    snapshot(root)
    server = launch(root=root)
    with server.client() as http:
        assert http.post("/v1/baseline", json={"exclude": list(exclude)}).is_success
    return server, RuntimeEndpoint(server.url, {})


def check(http: httpx.Client, ep: RuntimeEndpoint) -> int:
    """The environment's verification command, run in the workspace as the operator's verify runs it."""
    return kube.run(http, runtime.run_command(ep, CHECK, timeout=60)).exit_code


def verdict(result: str) -> Verdict:
    return Verdict.model_validate(
        {"result": result, "score": 100 if result == "PASS" else 60, "maxScore": 100, "passThreshold": 80}
    )


def test_a_gamed_pass_fails_in_the_judge_and_nothing_is_promoted(
    launch: Callable[..., Server], tmp_path: Path
) -> None:
    _, cand = workspace(launch, tmp_path / "candidate")
    _, fresh = workspace(launch, tmp_path / "judge")
    with httpx.Client(timeout=120) as http:
        assert check(http, cand) == 1  # the source is broken
        assert kube.run(http, runtime.run_command(cand, GAMED, timeout=120)).exit_code == 0
        assert check(http, cand) == 0  # its own workspace says PASS
        diff = kube.run(http, runtime.diff(cand))
        assert diff.changed_in(["core"]) == ["core/calc.py"]  # a small diff: the .pyc does not show

        carried = kube.run(http, reverify.carry(cand, fresh, ["core"], confine.Budget()))
        assert carried == ["core/calc.py"]
        assert (tmp_path / "judge/core/calc.py").read_text() == BROKEN.replace("a - b", "a * b")
        assert not (tmp_path / "judge/core/__pycache__").exists()
        assert check(http, fresh) == 1  # the judge runs the same command on the change alone: FAIL

    best = RaceCandidate(name="env-race-1", command=GAMED, verdict="PASS", score=100, max_score=100)
    refused = judged(best, "env-race-judge", verdict("FAIL"))
    assert refused is not None and "nothing promoted" in refused and "env-race-judge" in refused
    assert best.judged == "FAIL"
    assert judged(RaceCandidate(name="b", command="c"), "j", verdict("PASS")) is None


def test_the_carry_is_the_change_inside_the_sources_and_nothing_else(
    launch: Callable[..., Server], tmp_path: Path
) -> None:
    cand_srv, cand = workspace(launch, tmp_path / "candidate")
    _, fresh = workspace(launch, tmp_path / "judge")
    root = cand_srv.root
    (root / "core" / "calc.py").write_text(BROKEN.replace("a - b", "a + b"))
    (root / "core" / "tool.sh").write_text("#!/bin/sh\necho hi\n")
    os.chmod(root / "core" / "tool.sh", 0o4755)
    (root / "core" / "old.txt").unlink()
    (root / "core" / "link").symlink_to("/etc/passwd")
    (root / "core" / "pkg").mkdir()
    (root / "core" / "pkg" / "mod.py").write_text("X = 1\n")
    (root / "notes.md").write_text("changed outside the sources\n")
    (root / "bin").mkdir()
    (root / "bin" / "python3").write_text("#!/bin/sh\nexit 0\n")
    with httpx.Client(timeout=120) as http:
        carried = kube.run(http, reverify.carry(cand, fresh, ["core"], confine.Budget()))
        assert carried == ["core/calc.py", "core/old.txt", "core/pkg/mod.py", "core/tool.sh"]
        assert check(http, fresh) == 0
        plans = [PromotePlan("core", "core", tmp_path / "local")]
        plans[0].write = ["calc.py", "pkg/mod.py", "tool.sh", "build/out.o"]  # build/: left by the checks
        plans[0].delete = ["old.txt"]
        kept = reverify.only_carried(plans, carried)
        assert (kept[0].write, kept[0].delete) == (["calc.py", "pkg/mod.py", "tool.sh"], ["old.txt"])

        # The bytes count against the promote's budget: a change too large to promote is not carried either.
        with pytest.raises(TooLarge):
            kube.run(http, reverify.carry(cand, fresh, ["core"], confine.Budget(max_bytes=20)))
    judge = tmp_path / "judge"
    assert (judge / "core/calc.py").read_text() == BROKEN.replace("a - b", "a + b")
    assert stat.S_IMODE((judge / "core/tool.sh").stat().st_mode) == 0o755  # execute kept, setuid never
    assert not (judge / "core/old.txt").exists()
    assert not (judge / "core/link").exists() and not (judge / "bin").exists()
    assert (judge / "notes.md").read_text() == "outside the sources\n"


def test_a_tampered_baseline_does_not_carry_bytecode(launch: Callable[..., Server], tmp_path: Path) -> None:
    """The candidate owns its workspace, baseline included: one that no longer leaves __pycache__ out lists the
    stale .pyc in the diff, and the judge still never takes it (nor would it PASS with it)."""
    _, cand = workspace(launch, tmp_path / "candidate", exclude=[".git/", ".sandbox-runtime/"])
    _, fresh = workspace(launch, tmp_path / "judge")
    with httpx.Client(timeout=120) as http:
        assert kube.run(http, runtime.run_command(cand, GAMED, timeout=120)).exit_code == 0
        listed = kube.run(http, runtime.diff(cand, paths_only=True)).changed_in(["core"])
        assert any("__pycache__" in p for p in listed), listed
        carried = kube.run(http, reverify.carry(cand, fresh, ["core"], confine.Budget()))
        assert carried == ["core/calc.py"]
        assert check(http, fresh) == 1
