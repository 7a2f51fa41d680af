"""`shadowctl status` shows where the time to Ready went (status.timings, seconds after creation)."""

from __future__ import annotations

import pytest
from shadow_operator.api.environment import PoolAdoption, ShadowEnvironment
from shadow_operator.cli import environments
from shadow_operator.sdk import environment as envops
from shadow_operator.sdk import fork as forkops

pytestmark = pytest.mark.unit


def env(timings: dict[str, str] | None, clone: dict | None = None) -> ShadowEnvironment:
    status: dict = {"conditions": [{"type": "Ready", "status": "True", "reason": "EnvironmentReady"}]}
    if timings is not None:
        status["timings"] = timings
    if clone is not None:
        status["clone"] = clone
    return ShadowEnvironment.from_body(
        {
            "metadata": {"name": "demo", "namespace": "team", "creationTimestamp": "2026-01-01T00:00:00Z"},
            "spec": {"sources": [{"name": "app", "repo": "app", "upload": {}}]},
            "status": status,
        }
    )


TIMINGS = {
    "ready": "2026-01-01T00:00:02.900Z",
    "scheduled": "2026-01-01T00:00:00.250Z",
    "workspaceReady": "2026-01-01T00:00:01.500Z",
    "copiedIn": "2026-01-01T00:00:02.750Z",
}


def test_phases_in_the_order_they_finished() -> None:
    assert envops.phase_seconds(env(TIMINGS)) == {
        "scheduled": 0.25,
        "workspaceReady": 1.5,
        "copiedIn": 2.75,
        "ready": 2.9,
    }
    assert envops.phase_seconds(env(None)) == {}


def test_status_prints_them() -> None:
    with environments.out.capture() as captured:
        environments.print_status(env(TIMINGS), "text")
    text = " ".join(captured.get().split())  # the console wraps at its width
    assert "timings (s after creation): scheduled 0.2, workspaceReady 1.5, copiedIn 2.8, ready 2.9" in text


def test_a_forks_clone_time_comes_from_its_timing_when_there_is_one() -> None:
    clone = {
        "method": "Copy",
        "reason": "r",
        "source": "environment/x",
        "completedAt": "2026-01-01T00:00:04Z",
    }
    assert forkops.clone_seconds(env({"cloned": "2026-01-01T00:00:03.440Z"}, clone)) == 3.4
    assert forkops.clone_seconds(env(None, clone)) == 4.0


def test_status_says_what_came_of_the_pool() -> None:
    taken = env(TIMINGS)
    assert taken.status is not None
    taken.status.pool = PoolAdoption(
        name="warm",
        adopted=True,
        reason="Adopted",
        message="took instance warm-x1y2z of ShadowEnvironmentPool warm",
    )
    with environments.out.capture() as captured:
        environments.print_status(taken, "text")
    text = " ".join(captured.get().split())
    assert "pool warm: Adopted: took instance warm-x1y2z of ShadowEnvironmentPool warm" in text
