"""Shared fixtures: a real local control plane for integration tests, one namespace per test.

Set SHADOW_TEST_KUBECONFIG to reuse a running control plane (e.g. from `make cluster-up`) instead of
starting one for the session.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest

from tests.support.controlplane import ControlPlane, wait_for

TIERS = ("unit", "integration", "e2e", "storage", "argocd")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    untiered = [item.nodeid for item in items if not any(item.get_closest_marker(t) for t in TIERS)]
    if untiered:
        raise pytest.UsageError(
            "every test needs exactly one tier marker (unit, integration, e2e, storage, argocd); missing on:\n  "
            + "\n  ".join(untiered)
        )


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """`make test` must prove the integration tier ran: skipped or uncollected integration tests fail it."""
    if os.environ.get("SHADOW_REQUIRE_INTEGRATION") != "1":
        return
    if hasattr(session.config, "workerinput"):  # a pytest-xdist worker: the controller sees every report
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is None:
        return

    def integration(kind: str) -> list[object]:
        return [r for r in reporter.stats.get(kind, []) if "integration" in getattr(r, "keywords", {})]

    passed, skipped = integration("passed"), integration("skipped")
    problem = None
    if skipped:
        problem = f"{len(skipped)} integration test(s) were skipped"
    elif not passed:
        problem = "no integration test passed (none collected?)"
    if problem:
        reporter.write_line("")
        reporter.write_line(f"ERROR: {problem}; `make test` requires the integration tier to run.", red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


# Seconds spent per test module (setup, call and teardown of its tests; a session fixture such as the control
# plane counts in the module whose test first asked for it), printed at the end of every run: where the time of
# `make test` goes (BENCHMARKS.md lists the slowest).
_MODULE_SECONDS: dict[str, float] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    module = report.nodeid.split("::", 1)[0]
    _MODULE_SECONDS[module] = _MODULE_SECONDS.get(module, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if len(_MODULE_SECONDS) < 2:
        return
    slowest = sorted(_MODULE_SECONDS.items(), key=lambda item: item[1], reverse=True)[:8]
    terminalreporter.section("slowest test modules")
    total = sum(_MODULE_SECONDS.values())
    terminalreporter.write_line(f"{total:8.1f}s  all {len(_MODULE_SECONDS)} modules")
    for module, seconds in slowest:
        terminalreporter.write_line(f"{seconds:8.1f}s  {module}")


@pytest.fixture(scope="session", autouse=True)
def client_state(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The client records where environments came from under XDG_STATE_HOME (sdk/localdirs.py); tests, and
    the shadowctl processes they start, keep theirs out of the user's home."""
    before = os.environ.get("XDG_STATE_HOME")
    os.environ["XDG_STATE_HOME"] = str(tmp_path_factory.mktemp("state"))
    yield
    if before is None:
        os.environ.pop("XDG_STATE_HOME", None)
    else:
        os.environ["XDG_STATE_HOME"] = before


@pytest.fixture(scope="session")
def kubeconfig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Path of an admin kubeconfig for a running control plane; also exported as KUBECONFIG."""
    reuse = os.environ.get("SHADOW_TEST_KUBECONFIG")
    if reuse:
        os.environ["KUBECONFIG"] = reuse
        yield reuse
        return
    cp = ControlPlane(directory=tmp_path_factory.mktemp("controlplane"), die_with_parent=True)
    cp.start()
    os.environ["KUBECONFIG"] = str(cp.kubeconfig)
    try:
        yield str(cp.kubeconfig)
    finally:
        cp.stop()


@pytest.fixture(scope="session")
def k8s_api(kubeconfig: str) -> Iterator[object]:
    """A configured synchronous `kubernetes.client.ApiClient`."""
    from kubernetes import config

    api = config.new_client_from_config(config_file=kubeconfig)
    try:
        yield api
    finally:
        api.close()


@pytest.fixture
def namespace(k8s_api: object, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace for one test, deleted (without waiting for finalization) afterwards."""
    from kubernetes import client

    core = client.CoreV1Api(k8s_api)  # type: ignore[arg-type]
    test_name = request.node.name.lower().replace("_", "-")
    name = f"t-{test_name[:40].strip('-[]')}-{uuid.uuid4().hex[:6]}"
    name = "".join(c if c.isalnum() or c == "-" else "-" for c in name)
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    wait_for(
        lambda: bool(
            core.list_namespaced_service_account(name, field_selector="metadata.name=default").items
        ),
        timeout=30,
        what=f"default service account in {name}",
    )
    try:
        yield name
    finally:
        core.delete_namespace(name, propagation_policy="Background")
