"""Leader election, the pure parts: Lease records and bodies, MicroTime, expiry decisions, configuration,
the command line, and the standby liveness endpoint (loopback only)."""

from __future__ import annotations

import asyncio
import json
import re
import socket
import urllib.request
from datetime import UTC, datetime, timedelta, timezone
from typing import cast

import pytest
from shadow_operator.__main__ import _parser, main
from shadow_operator.clients.kube import Kube
from shadow_operator.engine import leader
from shadow_operator.engine.leader import (
    LeaderElectionConfig,
    LeaderElector,
    LeaseRecord,
    Observer,
    claimed_record,
    format_microtime,
    lease_body,
    parse_microtime,
    released_record,
    with_record,
)

pytestmark = pytest.mark.unit

T0 = datetime(2026, 11, 23, 9, 0, 0, tzinfo=UTC)
MICROTIME = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$")


# --- MicroTime ---------------------------------------------------------------------------------------------


def test_microtime_is_rfc3339_utc_with_six_fractional_digits() -> None:
    assert format_microtime(T0) == "2026-11-23T09:00:00.000000Z"
    assert format_microtime(T0 + timedelta(microseconds=1234)) == "2026-11-23T09:00:00.001234Z"
    cet = timezone(timedelta(hours=1))
    assert format_microtime(datetime(2026, 11, 23, 10, 0, 0, 5, tzinfo=cet)) == "2026-11-23T09:00:00.000005Z"
    assert MICROTIME.match(format_microtime(datetime.now(UTC)))


def test_microtime_refuses_naive_datetimes_and_round_trips() -> None:
    with pytest.raises(ValueError):
        format_microtime(datetime(2026, 11, 23, 9, 0, 0))
    moment = T0 + timedelta(seconds=1, microseconds=999999)
    assert parse_microtime(format_microtime(moment)) == moment
    assert parse_microtime("2026-11-23T09:00:00Z") == T0


# --- records and bodies ------------------------------------------------------------------------------------


def test_first_claim_creates_a_lease_with_no_transitions() -> None:
    record = claimed_record(None, "pod-a_1", 15, T0)
    assert record == LeaseRecord(
        "pod-a_1", 15, "2026-11-23T09:00:00.000000Z", "2026-11-23T09:00:00.000000Z", 0
    )
    assert lease_body("shadow-operator", "shadow-system", record) == {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": "shadow-operator", "namespace": "shadow-system"},
        "spec": {
            "holderIdentity": "pod-a_1",
            "leaseDurationSeconds": 15,
            "acquireTime": "2026-11-23T09:00:00.000000Z",
            "renewTime": "2026-11-23T09:00:00.000000Z",
            "leaseTransitions": 0,
        },
    }


def test_renewal_keeps_acquire_time_and_transitions() -> None:
    held = claimed_record(None, "pod-a_1", 15, T0)
    renewed = claimed_record(held, "pod-a_1", 15, T0 + timedelta(seconds=2))
    assert renewed.acquire_time == "2026-11-23T09:00:00.000000Z"
    assert renewed.renew_time == "2026-11-23T09:00:02.000000Z"
    assert renewed.transitions == 0 and renewed.holder == "pod-a_1"


def test_takeover_counts_a_transition_and_resets_acquire_time() -> None:
    held = LeaseRecord("pod-a_1", 15, "2026-11-23T08:00:00.000000Z", "2026-11-23T08:59:50.000000Z", 4)
    taken = claimed_record(held, "pod-b_2", 15, T0)
    assert taken == LeaseRecord("pod-b_2", 15, format_microtime(T0), format_microtime(T0), 5)
    # Taking over a released lease is a transition too.
    assert claimed_record(released_record(held, T0), "pod-b_2", 15, T0).transitions == 5


def test_release_clears_the_holder_and_keeps_the_count() -> None:
    held = LeaseRecord("pod-a_1", 15, "2026-11-23T08:00:00.000000Z", "2026-11-23T08:59:58.000000Z", 3)
    released = released_record(held, T0)
    assert released.holder == "" and released.lease_duration == 1 and released.transitions == 3
    assert released.spec()["holderIdentity"] == ""
    assert released.renew_time == "2026-11-23T09:00:00.000000Z"


def test_record_of_a_lease_tolerates_missing_fields() -> None:
    assert LeaseRecord.of({}) == LeaseRecord()
    assert LeaseRecord.of({"spec": {"holderIdentity": None, "leaseTransitions": 2}}) == LeaseRecord(
        transitions=2
    )
    record = claimed_record(None, "x", 15, T0)
    assert LeaseRecord.of(lease_body("n", "ns", record)) == record


def test_write_keeps_resource_version_labels_and_foreign_spec_fields() -> None:
    read = {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": "l", "namespace": "ns", "resourceVersion": "42", "labels": {"a": "b"}},
        "spec": {"holderIdentity": "old", "leaseDurationSeconds": 15, "strategy": "OldestEmulationVersion"},
    }
    body = with_record(read, claimed_record(LeaseRecord.of(read), "new", 10, T0))
    assert body["metadata"] == read["metadata"]
    assert body["spec"]["strategy"] == "OldestEmulationVersion"
    assert body["spec"]["holderIdentity"] == "new" and body["spec"]["leaseDurationSeconds"] == 10
    assert read["spec"]["holderIdentity"] == "old", "the read object is not modified"


# --- expiry decisions --------------------------------------------------------------------------------------


def test_nothing_observed_or_released_or_own_lease_is_free() -> None:
    observer = Observer(default_duration=15)
    assert not observer.held_by_other("me", now=0.0)
    observer.observe(LeaseRecord("", 1, transitions=1), now=100.0)
    assert not observer.held_by_other("me", now=100.0)
    observer.observe(LeaseRecord("me", 15), now=101.0)
    assert not observer.held_by_other("me", now=101.0)


def test_another_holder_expires_after_its_duration_on_our_clock() -> None:
    observer = Observer(default_duration=15)
    record = LeaseRecord("other", 4, renew_time="2020-01-01T00:00:00.000000Z")
    observer.observe(record, now=100.0)
    # The renewTime (years ago, or on a skewed clock) does not matter: only how long we saw no change.
    assert observer.held_by_other("me", now=100.0)
    assert observer.held_by_other("me", now=103.99)
    # Seeing the same record again does not restart the clock.
    observer.observe(record, now=103.0)
    assert not observer.held_by_other("me", now=104.0)
    assert observer.expires_at() == 104.0


def test_a_renewal_restarts_the_clock() -> None:
    observer = Observer(default_duration=15)
    observer.observe(LeaseRecord("other", 4, renew_time="a"), now=100.0)
    observer.observe(LeaseRecord("other", 4, renew_time="b"), now=103.0)
    assert observer.held_by_other("me", now=106.0)
    assert not observer.held_by_other("me", now=107.0)


def test_the_holders_duration_counts_and_zero_means_ours() -> None:
    observer = Observer(default_duration=15)
    observer.observe(LeaseRecord("other", 0), now=0.0)
    assert observer.held_by_other("me", now=14.9)
    assert not observer.held_by_other("me", now=15.0)
    observer.observe(LeaseRecord("other", 30), now=0.0)
    assert observer.held_by_other("me", now=29.0)


# --- configuration -----------------------------------------------------------------------------------------


def test_default_timings_are_client_go_like() -> None:
    config = LeaderElectionConfig(identity="me")
    assert (config.lease_duration, config.renew_deadline, config.retry_period) == (15, 10.0, 2.0)
    assert (config.lease_name, config.namespace) == ("shadow-operator", "shadow-system")


@pytest.mark.parametrize(
    ("timings", "message"),
    [
        ({"lease_duration": 10, "renew_deadline": 10}, "must be longer than the renew deadline"),
        ({"renew_deadline": 2.4, "retry_period": 2}, "must be longer than 1.2 x the retry period"),
        ({"retry_period": 0}, "retry period must be positive"),
        ({"namespace": ""}, "needs a lease name, a namespace"),
    ],
)
def test_unsafe_timings_are_refused(timings: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        LeaderElectionConfig(identity="me", **timings)  # type: ignore[arg-type]


def test_config_from_env_and_overrides() -> None:
    env = {
        "POD_NAME": "shadow-operator-7d9f-abcde",
        "POD_NAMESPACE": "ops",
        "SHADOW_OPERATOR_NAMESPACE": "ignored",
        "SHADOW_LEASE_NAME": "my-lease",
        "SHADOW_LEASE_DURATION": "4",
        "SHADOW_RENEW_DEADLINE": "3",
        "SHADOW_RETRY_PERIOD": "0.5",
    }
    config = LeaderElectionConfig.from_env(env)
    assert (config.lease_name, config.namespace) == ("my-lease", "ops")
    assert (config.lease_duration, config.renew_deadline, config.retry_period) == (4, 3.0, 0.5)
    assert re.fullmatch(r"shadow-operator-7d9f-abcde_[0-9a-f]{10}", config.identity)
    assert LeaderElectionConfig.from_env(env).identity != config.identity, "unique per process"
    # Flags win; an unset flag (None) does not.
    flagged = LeaderElectionConfig.from_env(env, namespace="cli", lease_duration=None, retry_period=1)
    assert (flagged.namespace, flagged.lease_duration, flagged.retry_period) == ("cli", 4, 1)
    explicit = LeaderElectionConfig.from_env({**env, "SHADOW_LEADER_ELECTION_NAMESPACE": "le"})
    assert explicit.namespace == "le"
    assert LeaderElectionConfig.from_env({"SHADOW_OPERATOR_NAMESPACE": "op"}).namespace == "op"
    assert LeaderElectionConfig.from_env({}).namespace == "shadow-system"


def test_config_from_env_refuses_garbage() -> None:
    with pytest.raises(ValueError, match="SHADOW_LEASE_DURATION='15s'"):
        LeaderElectionConfig.from_env({"SHADOW_LEASE_DURATION": "15s"})
    with pytest.raises(ValueError, match="SHADOW_LEADER_ELECTION='maybe'"):
        leader.enabled_from_env(True, {"SHADOW_LEADER_ELECTION": "maybe"})


@pytest.mark.parametrize(
    ("value", "default", "expected"),
    [("", True, True), ("", False, False), ("false", True, False), ("True", False, True), ("0", True, False)],
)
def test_enabled_from_env(value: str, default: bool, expected: bool) -> None:
    assert leader.enabled_from_env(default, {"SHADOW_LEADER_ELECTION": value}) is expected


# --- command line ------------------------------------------------------------------------------------------


def test_cli_accepts_kopf_style_scope_and_election_flags() -> None:
    args = _parser().parse_args(
        ["run", "-A", "--leader-elect", "--lease-duration", "4", "--retry-period=0.5"]
    )
    assert args.all_namespaces and args.namespace == []
    assert args.leader_elect is True and args.lease_duration == 4 and args.retry_period == 0.5
    args = _parser().parse_args(["run", "--all-namespaces", "--standalone"])
    assert args.all_namespaces and args.standalone and args.leader_elect is None
    args = _parser().parse_args(["run", "-n", "a", "--namespace", "b", "--no-leader-elect"])
    assert args.namespace == ["a", "b"] and args.leader_elect is False


def test_cli_refuses_contradictions_before_starting_anything(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["run", "-A", "-n", "team-a"])
    assert exit_info.value.code == 2
    with pytest.raises(SystemExit) as exit_info:
        main(["run", "--leader-elect", "--lease-duration", "5", "--renew-deadline", "8"])
    assert exit_info.value.code == 2
    assert "must be longer than the renew deadline" in capsys.readouterr().err


# --- standby liveness --------------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_standby_answers_liveness_and_frees_the_port() -> None:
    port = _free_port()
    url = f"http://127.0.0.1:{port}/healthz"

    async def scenario() -> dict[str, object]:
        no_client = cast(Kube, None)  # the health endpoint never talks to the API server
        elector = LeaderElector(no_client, LeaderElectionConfig(identity="pod-a_1", namespace="ops"))
        async with leader.standby_health(url, elector):
            body = await asyncio.to_thread(lambda: urllib.request.urlopen(url, timeout=5).read())
        answer: dict[str, object] = json.loads(body)
        return answer

    assert asyncio.run(scenario()) == {"leader": False, "identity": "pod-a_1", "lease": "ops/shadow-operator"}
    # The operator's own liveness endpoint can bind the same port right after.
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))
