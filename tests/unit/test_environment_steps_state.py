"""The typed status of a pass: Ready derived, phases timed once, the merge patch written from the model."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from prometheus_client import REGISTRY
from shadow_operator.api import constants as c
from shadow_operator.controllers.environment.reconciler import _observe_timings
from shadow_operator.controllers.environment.state import StepFailed
from shadow_operator.engine.status import dump

from tests.support.fakes import NAMESPACE, environment, new_pass, to_patch

pytestmark = pytest.mark.unit

SPEC = {"sources": [{"name": "app", "repo": "acme/app", "upload": {}}], "gitea": {"enabled": False}}


def test_ready_marks_its_time_once_and_the_patch_carries_it() -> None:
    state = new_pass(environment(spec=SPEC))
    state.set(c.COND_WORKSPACE_READY, True, "WorkspaceReady", "")
    state.set(c.COND_SOURCES_READY, True, "SourcesCopied", "")
    patch = state.changes()  # what the pass writes
    assert patch["timings"] == {"ready": "2026-01-01T00:00:10Z"}
    assert patch.get("failure") is None and patch["observedGeneration"] == 1
    ready = [x for x in patch["conditions"] if x["type"] == c.COND_READY]
    assert ready[0]["status"] == "True" and ready[0]["reason"] == "EnvironmentReady"

    later = new_pass(environment(spec=SPEC, status=patch), now=datetime(2026, 1, 1, 0, 5, tzinfo=UTC))
    later.mark("ready")
    assert to_patch(later.finish())["timings"]["ready"] == "2026-01-01T00:00:10Z"


def test_a_failure_is_written_and_the_fields_of_list_items_are_never_null() -> None:
    status = {
        "sources": [
            {
                "name": "app",
                "repo": "acme/app",
                "path": "app",
                "commit": "a" * 40,
                "branch": "main",
                "cloneURL": "",
            }
        ],
    }
    state = new_pass(environment(spec=SPEC, status=status))
    state.fail(StepFailed("TemplateNotFound", "TemplateNotFound", "no template"))
    patch = state.changes()  # what the pass writes
    assert patch["failure"] == {"code": "TemplateNotFound", "message": "no template"}
    assert "publicURL" not in dump(state.status)["sources"][0]  # the status as stored
    assert "timings" not in patch  # nothing finished: the field is not written at all


def test_each_phase_is_observed_once_in_seconds_since_creation() -> None:
    def count(phase: str) -> float:
        labels = {"namespace": NAMESPACE, "phase": phase}
        return REGISTRY.get_sample_value("shadow_operator_environment_phase_seconds_count", labels) or 0.0

    def total(phase: str) -> float:
        labels = {"namespace": NAMESPACE, "phase": phase}
        return REGISTRY.get_sample_value("shadow_operator_environment_phase_seconds_sum", labels) or 0.0

    before = {p: (count(p), total(p)) for p in ("workspaceReady", "copiedIn")}
    old = environment(spec=SPEC, status={"timings": {"workspaceReady": "2026-01-01T00:00:04Z"}})
    state = new_pass(old)
    state.mark("workspace_ready")
    state.mark("copied_in")
    _observe_timings(old, old.body["status"]["timings"], state.status.timings)
    assert count("workspaceReady") == before["workspaceReady"][0]  # finished in an earlier pass
    assert count("copiedIn") == before["copiedIn"][0] + 1
    assert total("copiedIn") == pytest.approx(before["copiedIn"][1] + 10.0)
    # A second write in the same pass (WorkspaceReady is written at once) compares with the first one.
    written = to_patch(state.status)["timings"]
    _observe_timings(old, written, state.status.timings)
    assert count("copiedIn") == before["copiedIn"][0] + 1
