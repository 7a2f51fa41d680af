"""Property-based fuzzing of every documented operation (schemathesis): the server never answers 5xx.

The fuzzed runtime runs with an empty PATH and a short exec timeout, so generated commands cannot find
real programs and nothing generated can run for long.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, given, settings

from tests.runtime.conftest import Server, start_server

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def fuzz_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root: Path = tmp_path_factory.mktemp("fuzz-root")
    empty = tmp_path_factory.mktemp("empty-path")
    log = tmp_path_factory.mktemp("fuzz-log") / "runtime.log"
    srv = start_server(root, "--exec-timeout", "2", "--max-processes", "8", env={"PATH": str(empty)}, log=log)
    yield srv
    srv.stop()


def test_no_server_errors(fuzz_server: Server) -> None:
    # Driven operation by operation (rather than schemathesis' pytest plugin, which does not support
    # this pytest version) so that every failing operation is reported, not just the first.
    api = schemathesis.openapi.from_url(f"{fuzz_server.url}/openapi.json")
    failures: list[str] = []
    session = requests.Session()
    sent = [0]
    operations = 0
    for result in api.get_all_operations():
        op = result.ok()
        operations += 1

        @given(case=op.as_strategy())
        @settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck), database=None)
        def fuzz(case: schemathesis.Case) -> None:
            # Sent with requests' stream=True and judged on the status line: follow-mode endpoints
            # (journal, process logs) stream until the client hangs up.
            kwargs = case.as_transport_kwargs(base_url=fuzz_server.url)
            sent[0] += 1
            with session.request(**kwargs, stream=True, timeout=30) as response:
                assert response.status_code < 500, (
                    f"{case.as_curl_command()} -> {response.status_code} {response.raw.read(500)!r}"
                )

        try:
            fuzz()
        except Exception as err:
            failures.append(f"{op.method.upper()} {op.path}: {str(err)[:2000]}")
    assert operations >= 30 and sent[0] >= operations * 10, (operations, sent[0])
    print(f"{sent[0]} requests over {operations} operations")
    assert not failures, "\n\n".join(failures)
    log = fuzz_server.log.read_text() if fuzz_server.log else ""
    assert "Traceback" not in log, log[-4000:]
