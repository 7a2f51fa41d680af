"""Race: commands per candidate, how a change is measured, and the ranking (ties go to the smaller change)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from shadow_operator.sdk.errors import ShadowError
from shadow_operator.sdk.race import (
    RaceCandidate,
    candidate_names,
    changed_lines,
    measure,
    parse_commands,
    plan_commands,
    rank,
    winner,
)
from shadow_operator.sdk.runtime import Diff

pytestmark = pytest.mark.unit

SHADOWCTL = str(Path(sys.executable).parent / "shadowctl")

PATCH = """diff --git a/core/x.py b/core/x.py
--- a/core/x.py
+++ b/core/x.py
@@ -1,2 +1,3 @@
 keep
-old
+new
+more
"""


def cand(name: str, **kw: object) -> RaceCandidate:
    base: dict[str, object] = {
        "command": "c",
        "state": "done",
        "exit_code": 0,
        "verdict": "PASS",
        "score": 100,
        "max_score": 100,
        "duration_seconds": 1.0,
        "changed_files": 1,
        "changed_lines": 1,
    }
    return RaceCandidate(name=name, **{**base, **kw})  # type: ignore[arg-type]


def names(ranked: list[RaceCandidate]) -> list[str]:
    return [c.name for c in ranked]


def test_verdict_then_score_then_exit_code() -> None:
    ranked = rank(
        [
            cand("fail-fast", verdict="FAIL", score=40, duration_seconds=0.1),
            cand("pass-low", score=80),
            cand("pass-high-exit-1", exit_code=1),
            cand("pass-high"),
            cand("broken", error="CopyFailed: no", verdict=None, score=None, exit_code=None),
        ]
    )
    assert names(ranked) == ["pass-high", "pass-high-exit-1", "pass-low", "fail-fast", "broken"]
    assert [c.rank for c in ranked] == [1, 2, 3, 4, 5]
    assert winner(ranked) is ranked[0]


def test_ties_go_to_the_smaller_change_before_the_faster_run() -> None:
    ranked = rank(
        [
            cand("big-fast", changed_files=5, changed_lines=10, duration_seconds=0.5),
            cand("small-slow", changed_files=1, changed_lines=40, duration_seconds=9.0),
            cand("smaller-slow", changed_files=1, changed_lines=2, duration_seconds=9.0),
            cand("smaller-quick", changed_files=1, changed_lines=2, duration_seconds=3.0),
        ]
    )
    assert names(ranked) == ["smaller-quick", "smaller-slow", "small-slow", "big-fast"]


def test_scores_compare_as_fractions_of_their_maximum() -> None:
    ranked = rank([cand("a", score=40, max_score=50), cand("b", score=70, max_score=100)])
    assert names(ranked) == ["a", "b"]  # 80 % beats 70 %


def test_no_winner_unless_the_best_passed() -> None:
    ranked = rank([cand("x", verdict="FAIL", score=10), cand("y", verdict="FAIL", score=20)])
    assert names(ranked) == ["y", "x"] and winner(ranked) is None
    assert winner([]) is None


def test_change_is_measured_from_the_diff() -> None:
    assert changed_lines(PATCH) == 3 and changed_lines(None) == 0
    c = cand("m", changed_files=0, changed_lines=0)
    measure(
        c, Diff(added=["core/n.py"], modified=["core/x.py"], deleted=["core/old.py"], patch=PATCH), ["core"]
    )
    assert (c.files, c.changed_files, c.changed_lines) == (["core/n.py", "core/old.py", "core/x.py"], 3, 3)


def test_only_changes_inside_the_sources_count() -> None:
    """The runtime rewrites HANDOFF.md at the workspace root after each command: not the candidate's change."""
    handoff = (
        "diff --git a/HANDOFF.md b/HANDOFF.md\n--- a/HANDOFF.md\n+++ b/HANDOFF.md\n@@ -1 +1 @@\n-a\n+b\n"
    )
    c = cand("m", changed_files=0, changed_lines=0)
    measure(c, Diff(modified=["HANDOFF.md", "core/x.py"], patch=handoff + PATCH), ["core"])
    assert (c.files, c.changed_files, c.changed_lines) == (["core/x.py"], 1, 3)
    assert changed_lines(handoff + PATCH) == 5 and changed_lines(handoff + PATCH, ["core"]) == 3


def test_commands_from_a_file_line_by_line_or_yaml() -> None:
    text = "# approaches\nagent --model a\n\n  agent --model b  \n"
    assert parse_commands(text) == ["agent --model a", "agent --model b"]
    assert parse_commands('- "echo a: b"\n- make test\n') == ["echo a: b", "make test"]
    assert parse_commands("key: [unclosed\n") == ["key: [unclosed"]


def test_candidates_are_planned_and_named() -> None:
    assert plan_commands(["make"], 3) == ["make"] * 3
    assert plan_commands(["a", "b"], None) == ["a", "b"]
    assert candidate_names("env", 2) == ["env-race-1", "env-race-2"]
    assert candidate_names("env", 1, "try") == ["try-1"]
    for commands, count, says in (
        ([], None, "needs a command"),
        (["a", "b"], 2, "repeats one command"),
        (["only"], None, "2 to 20"),
        (["a"], 21, "2 to 20"),
    ):
        with pytest.raises(ShadowError, match=says):
            plan_commands(commands, count)


def test_cli_race_mistakes_are_one_line_and_a_hint(tmp_path: Path) -> None:
    env = {**os.environ, "KUBECONFIG": "/nonexistent/kubeconfig", "COLUMNS": "200"}

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([SHADOWCTL, "race", *args], env=env, capture_output=True, text=True, timeout=60)

    commands = tmp_path / "c.txt"
    commands.write_text("make a\nmake b\n")
    for args, needle in (
        (("env",), "a race needs a command"),
        (("env", "--", "make", "-j2"), "2 to 20"),  # one command, no --count: no race
        (("env", "--count", "2", "--commands", str(commands)), "--count repeats COMMAND"),
        (("env", "--to-branch", "b", "--count", "2", "--", "true"), "add --promote"),
        (("env", "--method", "Rsync", "--count", "2", "--", "true"), "unknown"),
        (("env", "--count", "2", "--", "true"), "KUBECONFIG"),  # well-formed: then the cluster is needed
    ):
        result = run(*args)
        lines = result.stderr.strip().splitlines()
        assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
        assert lines[0].startswith("error: ") and lines[-1].startswith("hint: "), result.stderr
        assert needle in result.stderr, result.stderr


def test_live_table_shows_commands_verbatim() -> None:
    from rich.console import Console
    from shadow_operator.cli.race import table

    ranked = rank(
        [
            cand("a", command="test [ -f x ] && echo [bold]done[/bold]"),
            cand("b", state="failed", error="CopyFailed: [x] gone", verdict=None, score=None),
        ]
    )
    console = Console(record=True, width=250)
    console.print(table(ranked))
    text = console.export_text()
    assert "test [ -f x ] && echo [bold]done[/bold]" in text and "CopyFailed: [x] gone" in text
    assert "PASS" in text and "100/100" in text


def test_a_refused_promote_says_why_and_names_no_winner(capsys: pytest.CaptureFixture[str]) -> None:
    from shadow_operator.cli.race import report
    from shadow_operator.sdk.race import RaceResult

    gamed = cand("env-race-1", judged="FAIL")
    refused = (
        "env-race-1 PASSed in its own workspace, but its change FAILed in a fresh fork [x]: nothing promoted"
    )
    result = RaceResult(
        source="env",
        namespace="ns",
        candidates=rank([gamed, cand("env-race-2", verdict="FAIL", score=10)]),
        winner=None,
        judge="env-race-judge",
        refused=refused,
        fork_seconds=1.0,
        ranked_seconds=2.0,
        total_seconds=3.0,
    )
    report(result, promote=True)
    err = capsys.readouterr().err
    assert refused in err and "winner:" not in err and "promoted " not in err


# ------------------------------------------------------------------------------------------ the drivers
def test_the_sync_and_async_drivers_run_one_race_alike() -> None:
    # The race is written once (sdk.race.race, steps of operations); both drivers must run each step's
    # operations together, send the results in order, and throw a failure into the race so its cleanup runs.
    import asyncio
    from collections.abc import Generator
    from typing import Any

    import httpx
    from shadow_operator.sdk import race as raceops
    from shadow_operator.sdk.race import Together

    def op(value: object) -> Generator[Any, Any, object]:
        if isinstance(value, Exception):
            raise value
        return value
        yield  # an operation that needs no call

    def steps(seen: list[object]) -> raceops.Race:
        first = yield Together([op(1), op(2), op(3)])
        seen.append(first)
        try:
            yield Together([op(ShadowError("fork failed"))])
        except ShadowError as exc:
            seen.append(str(exc))
        try:
            yield Together([op("a"), op(KeyError("boom"))])
        finally:
            seen.append((yield Together([op("cleanup")])))

    def race_of(run: Any) -> list[object]:
        seen: list[object] = []
        with pytest.raises(KeyError):
            run(steps(seen))
        return seen

    with httpx.Client() as http:
        sync = race_of(lambda s: raceops.run(http, s))

    async def run_async(s: raceops.Race) -> object:
        async with httpx.AsyncClient() as http:
            return await raceops.arun(http, s)

    assert sync == race_of(lambda s: asyncio.run(run_async(s))) == [[1, 2, 3], "fork failed", ["cleanup"]]
