"""wait_for (tests/support/controlplane.py): an object a predicate reads that is not found yet is "not yet".

The errors are the Kubernetes client's own exception classes, made as the client makes them for an answer of
that status (the API server's Status object as the body); no server is involved.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable

import pytest
from kubernetes.client.exceptions import ApiException
from kubernetes.dynamic.exceptions import NotFoundError

from tests.support.controlplane import absent, wait_for

pytestmark = pytest.mark.unit

REASONS = {403: "Forbidden", 404: "Not Found", 500: "Internal Server Error"}


def api_error(status: int, message: str) -> ApiException:
    """The ApiException the client raises for an answer of `status` whose Status says `message`."""
    exc = ApiException(status=status, reason=REASONS[status])
    exc.body = json.dumps(
        {"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": message, "code": status}
    ).encode()
    return exc


def claim_not_found() -> ApiException:
    return api_error(404, 'persistentvolumeclaims "workspace-f4" not found')


class Appears:
    """A predicate that raises `error()` `misses` times, then returns `value`; `calls` counts its calls."""

    def __init__(self, misses: int, error: Callable[[], Exception], value: object) -> None:
        self.misses, self.error, self.value = misses, error, value
        self.calls = 0

    def __call__(self) -> object:
        self.calls += 1
        if self.calls <= self.misses:
            raise self.error()
        return self.value


def test_waits_through_not_found_and_returns_when_the_predicate_holds() -> None:
    predicate = Appears(3, claim_not_found, {"annotated": True})

    got = wait_for(predicate, timeout=10, what="the claim", interval=0.01)

    assert got == {"annotated": True}
    assert predicate.calls == 4


def test_the_dynamic_clients_not_found_is_waited_through_too() -> None:
    predicate = Appears(2, lambda: NotFoundError(claim_not_found()), True)

    assert wait_for(predicate, timeout=10, what="the snapshot", interval=0.01) is True
    assert predicate.calls == 3


@pytest.mark.parametrize("status", [403, 500])
def test_any_other_api_error_propagates_at_once(status: int) -> None:
    predicate = Appears(1, lambda: api_error(status, "no"), True)

    started = time.monotonic()
    with pytest.raises(ApiException) as raised:
        wait_for(predicate, timeout=30, what="the claim", interval=0.01)

    assert raised.value.status == status
    assert predicate.calls == 1
    assert time.monotonic() - started < 5


def test_an_error_that_is_not_the_kubernetes_clients_propagates_even_with_status_404() -> None:
    class HttpError(Exception):
        status = 404

    predicate = Appears(1, HttpError, True)

    with pytest.raises(HttpError):
        wait_for(predicate, timeout=30, what="a page", interval=0.01)
    assert predicate.calls == 1


def test_the_timeout_names_the_object_still_not_found() -> None:
    def predicate() -> bool:
        raise claim_not_found()

    with pytest.raises(TimeoutError) as raised:
        wait_for(predicate, timeout=0.2, what="the fork's claim to be annotated", interval=0.01)

    assert str(raised.value) == (
        "timed out after 0s waiting for the fork's claim to be annotated"
        ' (last: 404 persistentvolumeclaims "workspace-f4" not found)'
    )


def test_the_timeout_names_no_error_when_the_object_was_found_at_the_last_poll() -> None:
    calls: list[None] = []

    def predicate() -> bool:
        calls.append(None)
        if len(calls) == 1:
            raise claim_not_found()
        return False  # found, not (yet) as wanted

    with pytest.raises(TimeoutError) as raised:
        wait_for(predicate, timeout=0.2, what="the claim to be annotated", interval=0.01)

    assert str(raised.value) == "timed out after 0s waiting for the claim to be annotated"
    assert len(calls) > 1


def test_absent_is_true_only_for_not_found_and_lets_other_errors_through() -> None:
    def raises(exc: Exception) -> Callable[[], object]:
        def read() -> object:
            raise exc

        return read

    assert absent(raises(claim_not_found())) is True
    assert absent(lambda: {"metadata": {"name": "still-here"}}) is False
    with pytest.raises(ApiException) as err:
        absent(raises(api_error(403, "forbidden")))
    assert err.value.status == 403
