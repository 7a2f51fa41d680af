"""Leader election against the real API server: electors racing for one Lease, crash and graceful hand-over,
loss of leadership, and two real operator processes of which one is SIGKILLed.

Timings are short (lease 3-4 s) to keep the tests fast. The assertions only bound the hand-over times
generously (correctness: never before the lease ran out, never much after); the measured figures are
printed (`pytest -s`).
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from shadow_operator.clients.kube import Kube
from shadow_operator.engine import leader
from shadow_operator.engine.leader import LeaderElectionConfig, LeaderElector, LeadershipLost

from tests.support.controlplane import free_port, wait_for
from tests.support.sandbox_operator import OPERATOR_ENV, ROOT, install_crds

pytestmark = pytest.mark.integration

LEASE = "shadow-operator"
MICROTIME = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$")
# Short, valid timings: renew deadline < lease duration, retry * 1.2 < renew deadline.
FAST = {"lease_duration": 3, "renew_deadline": 2.0, "retry_period": 0.5}
RETRY_MAX = FAST["retry_period"] * (1 + leader.JITTER)
# Lower bounds hold on any machine (load only delays); upper bounds allow a loaded machine's stalls (CI builds
# beside the tests), so they prove that something happens, not how fast: the printed times are the figures.
SLACK = 8.0
# For a test that tells a release from an expiry: the Lease outlives a loaded machine's stalls by far.
RELEASE_TIMINGS = {"lease_duration": 60, "renew_deadline": 40.0}


def config(namespace: str, name: str, **timings: Any) -> LeaderElectionConfig:
    return LeaderElectionConfig(
        lease_name=LEASE, namespace=namespace, identity=f"{name}_{os.urandom(3).hex()}", **{**FAST, **timings}
    )


def read_lease(k8s_api: client.ApiClient, namespace: str, name: str = LEASE) -> dict[str, Any]:
    """The Lease as the API server sends it (raw JSON: MicroTime strings untouched)."""
    response = client.CoordinationV1Api(k8s_api).read_namespaced_lease(
        name, namespace, _preload_content=False
    )
    lease: dict[str, Any] = json.loads(response.data)
    return lease


async def wait_task(task: asyncio.Task[None], timeout: float) -> float:
    """Seconds until `task` finished (raises TimeoutError after `timeout`)."""
    started = time.monotonic()
    await asyncio.wait_for(asyncio.shield(task), timeout)
    return time.monotonic() - started


# --- electors ----------------------------------------------------------------------------------------------


def test_one_of_two_leads_and_the_other_takes_over_after_a_crash(
    k8s_api: client.ApiClient, namespace: str
) -> None:
    async def scenario() -> None:
        kube_a, kube_b = await Kube.connect(), await Kube.connect()
        a, b = LeaderElector(kube_a, config(namespace, "a")), LeaderElector(kube_b, config(namespace, "b"))
        tasks = {asyncio.create_task(a.acquire()): a, asyncio.create_task(b.acquire()): b}
        try:
            done, pending = await asyncio.wait(tasks, timeout=10, return_when=asyncio.FIRST_COMPLETED)
            assert len(done) == 1, "exactly one elector becomes leader"
            first, (waiting,) = tasks[next(iter(done))], pending
            second = tasks[waiting]
            created = read_lease(k8s_api, namespace)["spec"]

            # The other one stands by while the leader renews.
            await asyncio.sleep(4 * FAST["retry_period"])
            assert not waiting.done() and first.is_leader and not second.is_leader
            spec = read_lease(k8s_api, namespace)["spec"]
            assert spec["holderIdentity"] == first.identity
            assert spec["leaseDurationSeconds"] == FAST["lease_duration"] and spec["leaseTransitions"] == 0
            assert MICROTIME.match(spec["acquireTime"]) and MICROTIME.match(spec["renewTime"])
            assert spec["acquireTime"] == created["acquireTime"]
            assert spec["renewTime"] > created["renewTime"], "the leader renews"

            # Crash: the leader stops renewing and never releases.
            await first.abandon()
            took = await wait_task(waiting, timeout=FAST["lease_duration"] + SLACK + 2)
            print(f"\ntakeover after a crash: {took:.2f}s (lease {FAST['lease_duration']}s)")
            assert second.is_leader
            # Not before the lease ran out (its last renewal was at most one retry period before the crash)...
            assert took >= FAST["lease_duration"] - RETRY_MAX - 0.3
            # ... and once it did (within a retry period on a quiet machine; SLACK for a loaded one).
            assert took <= FAST["lease_duration"] + RETRY_MAX + SLACK
            spec = read_lease(k8s_api, namespace)["spec"]
            assert spec["holderIdentity"] == second.identity and spec["leaseTransitions"] == 1
            assert spec["acquireTime"] > created["acquireTime"]
        finally:
            for task in tasks:
                task.cancel()
            await a.abandon()
            await b.abandon()
            await kube_a.close()
            await kube_b.close()

    asyncio.run(scenario())


def test_graceful_shutdown_releases_and_a_standby_takes_over_within_a_retry_period(
    k8s_api: client.ApiClient, namespace: str
) -> None:
    async def scenario() -> None:
        kube = await Kube.connect()
        # A takeover well before the Lease could expire proves the release.
        standby = LeaderElector(kube, config(namespace, "standby", **RELEASE_TIMINGS))
        stop = asyncio.Event()
        worked: list[str] = []

        async def work() -> None:
            worked.append("started")
            await stop.wait()

        # The wrapper: `work` runs only as leader; when it returns, the Lease is released.
        first = config(namespace, "first", **RELEASE_TIMINGS)
        leading = asyncio.create_task(leader.run_with_leadership(work, first))
        waiting: asyncio.Task[None] | None = None
        try:
            wait_for_leader = time.monotonic() + 10
            while not worked:
                assert time.monotonic() < wait_for_leader, "the first elector never led"
                await asyncio.sleep(0.05)
            waiting = asyncio.create_task(standby.acquire())
            await asyncio.sleep(3 * FAST["retry_period"])
            assert not waiting.done()

            stop.set()
            took = await wait_task(waiting, timeout=RELEASE_TIMINGS["lease_duration"] - 5)
            print(f"\ntakeover after a graceful release: {took:.2f}s (retry period {FAST['retry_period']}s)")
            assert await leading is True
            spec = read_lease(k8s_api, namespace)["spec"]
            assert spec["holderIdentity"] == standby.identity and spec["leaseTransitions"] == 1
        finally:
            leading.cancel()
            if waiting is not None:
                waiting.cancel()
            await standby.abandon()
            await kube.close()

    asyncio.run(scenario())


def test_a_leader_that_sees_another_holder_stops_at_once(k8s_api: client.ApiClient, namespace: str) -> None:
    """Someone else wrote the Lease (e.g. it took over while we were paused): `main` is cancelled at once."""

    async def scenario() -> None:
        cancelled: list[float] = []
        losses: list[float] = []

        async def work() -> None:
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                cancelled.append(time.monotonic())
                raise

        running = asyncio.create_task(
            leader.run_with_leadership(
                work, config(namespace, "leader"), on_lost=lambda: losses.append(time.monotonic())
            )
        )
        # In a thread, so that the elector runs on this loop meanwhile.
        await asyncio.to_thread(
            wait_for,
            lambda: read_lease(k8s_api, namespace)["spec"].get("holderIdentity"),
            timeout=10,
            what="the elector to become leader",
            interval=0.05,
        )
        lease = read_lease(k8s_api, namespace)
        lease["spec"]["holderIdentity"] = "intruder"
        client.CoordinationV1Api(k8s_api).replace_namespaced_lease(LEASE, namespace, lease)
        overwritten = time.monotonic()
        with pytest.raises(LeadershipLost):
            await asyncio.wait_for(running, timeout=10)
        took = losses[0] - overwritten
        print(f"\nloss noticed {took:.2f}s after another holder appeared")
        assert len(losses) == 1 and cancelled and cancelled[0] >= losses[0]
        assert took <= FAST["retry_period"] + 1.0
        assert read_lease(k8s_api, namespace)["spec"]["holderIdentity"] == "intruder", "not released"

    asyncio.run(scenario())


@pytest.fixture
def lease_only_kubeconfig(k8s_api: client.ApiClient, kubeconfig: str, namespace: str, tmp_path: Path) -> str:
    """A kubeconfig for a service account that may do exactly what the chart's Role allows on leases."""
    core, rbac = client.CoreV1Api(k8s_api), client.RbacAuthorizationV1Api(k8s_api)
    core.create_namespaced_service_account(namespace, {"metadata": {"name": "elector"}})
    rbac.create_namespaced_role(
        namespace,
        {
            "metadata": {"name": "leader-election"},
            "rules": [
                {
                    "apiGroups": ["coordination.k8s.io"],
                    "resources": ["leases"],
                    "verbs": ["get", "create", "update"],
                }
            ],
        },
    )
    rbac.create_namespaced_role_binding(
        namespace,
        {
            "metadata": {"name": "leader-election"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "leader-election"},
            "subjects": [{"kind": "ServiceAccount", "name": "elector", "namespace": namespace}],
        },
    )
    token = core.create_namespaced_service_account_token(
        "elector", namespace, {"spec": {"expirationSeconds": 3600}}
    ).status.token
    admin = yaml.safe_load(Path(kubeconfig).read_text())
    cluster = admin["clusters"][0]["cluster"]
    if "certificate-authority" in cluster:
        ca = Path(cluster.pop("certificate-authority")).read_bytes()
        cluster["certificate-authority-data"] = base64.b64encode(ca).decode()
    path = tmp_path / "elector.kubeconfig"
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": cluster}],
                "users": [{"name": "elector", "user": {"token": token}}],
                "contexts": [{"name": "c", "context": {"cluster": "c", "user": "elector"}}],
                "current-context": "c",
            }
        )
    )
    return str(path)


def test_the_charts_lease_rbac_suffices_and_a_leader_that_cannot_renew_reports_loss(
    k8s_api: client.ApiClient, namespace: str, lease_only_kubeconfig: str, kubeconfig: str
) -> None:
    """Renewals refused for real (the RoleBinding is deleted): loss after the renew deadline, not before."""

    async def scenario() -> None:
        os.environ["KUBECONFIG"] = lease_only_kubeconfig
        try:
            kube = await Kube.connect()
        finally:
            os.environ["KUBECONFIG"] = kubeconfig
        losses: list[float] = []
        elector = LeaderElector(
            kube, config(namespace, "limited"), on_lost=lambda: losses.append(time.monotonic())
        )
        try:
            await asyncio.wait_for(elector.acquire(), timeout=10)  # get + create
            renewed = read_lease(k8s_api, namespace)["spec"]["renewTime"]
            await asyncio.sleep(3 * FAST["retry_period"])
            assert read_lease(k8s_api, namespace)["spec"]["renewTime"] > renewed  # update
            assert elector.is_leader

            client.RbacAuthorizationV1Api(k8s_api).delete_namespaced_role_binding(
                "leader-election", namespace
            )
            revoked = time.monotonic()
            await asyncio.wait_for(elector.wait_lost(), timeout=FAST["renew_deadline"] + SLACK + 2)
            took = losses[0] - revoked
            print(
                f"\nloss reported {took:.2f}s after renewals started failing (deadline {FAST['renew_deadline']}s)"
            )
            assert not elector.is_leader and len(losses) == 1
            # The last good renewal was at most one retry period before the revocation.
            assert FAST["renew_deadline"] - RETRY_MAX - 0.3 <= took <= FAST["renew_deadline"] + SLACK
        finally:
            await elector.abandon()
            await kube.close()

    asyncio.run(scenario())


# --- two operator processes --------------------------------------------------------------------------------


class Replica:
    """`python -m shadow_operator run --leader-elect` as a subprocess, identified by its POD_NAME."""

    def __init__(self, name: str, kubeconfig: str, namespace: str, log: Path) -> None:
        self.name = name
        self.liveness = f"http://127.0.0.1:{free_port()}/healthz"
        env = {
            **os.environ,
            **OPERATOR_ENV,
            "KUBECONFIG": kubeconfig,
            "POD_NAME": name,
            "SHADOW_LEASE_DURATION": "4",
            "SHADOW_RENEW_DEADLINE": "3",
            "SHADOW_RETRY_PERIOD": "0.5",
        }
        args = ["run", "--leader-elect", "-A", f"--leader-election-namespace={namespace}"]
        with log.open("ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "shadow_operator", *args, f"--liveness={self.liveness}"],
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=ROOT,
            )
        self.log = log

    def health(self) -> dict[str, Any] | None:
        """The liveness answer: {"leader": false, ...} from a standby, kopf's probe results from the leader."""
        try:
            with urllib.request.urlopen(self.liveness, timeout=2) as response:
                answer: dict[str, Any] = json.loads(response.read())
                return answer
        except OSError:
            return None

    def standing_by(self) -> bool:
        answer = self.health()
        return answer is not None and answer.get("leader") is False

    def operating(self) -> bool:
        answer = self.health()
        return answer is not None and "leader" not in answer

    def holds(self, k8s_api: client.ApiClient, namespace: str) -> bool:
        """Whether this replica holds the Lease; raises 404 while there is no Lease (`wait_for` waits)."""
        holder = read_lease(k8s_api, namespace)["spec"].get("holderIdentity") or ""
        return holder.startswith(self.name + "_")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)


@pytest.fixture
def replicas(
    k8s_api: client.ApiClient, kubeconfig: str, namespace: str, tmp_path: Path
) -> Iterator[Callable[[int], list[Replica]]]:
    """Start n operator processes competing for one Lease in the test namespace."""
    install_crds(k8s_api)
    started: list[Replica] = []

    def spawn(n: int) -> list[Replica]:
        names = [f"op-{chr(ord('a') + i)}" for i in range(n)]
        started.extend(Replica(name, kubeconfig, namespace, tmp_path / f"{name}.log") for name in names)
        return list(started)

    try:
        yield spawn
    finally:
        for replica in started:
            replica.stop()
        for replica in started:
            print(f"--- {replica.name} (exit code {replica.proc.returncode}), log tail ---")
            print("\n".join(replica.log.read_text(errors="replace").splitlines()[-12:]))


def elect(
    replicas: list[Replica], k8s_api: client.ApiClient, namespace: str
) -> tuple[Replica, list[Replica]]:
    """Wait until one replica holds the Lease and runs the operator and the others stand by."""
    wait_for(
        lambda: any(r.holds(k8s_api, namespace) for r in replicas),
        timeout=25,
        what="an operator process to take the Lease",
    )
    (holder,) = [r for r in replicas if r.holds(k8s_api, namespace)]
    standbys = [r for r in replicas if r is not holder]
    wait_for(holder.operating, timeout=15, what=f"{holder.name} to run the operator")
    for standby in standbys:
        wait_for(standby.standing_by, timeout=15, what=f"{standby.name} to stand by")
    return holder, standbys


def test_two_operator_processes_one_leads_and_the_other_takes_over_after_sigkill(
    replicas: Callable[[int], list[Replica]], k8s_api: client.ApiClient, namespace: str
) -> None:
    holder, (standby,) = elect(replicas(2), k8s_api, namespace)
    # The standby keeps standing by (answering its liveness probe) while the leader renews.
    time.sleep(2)
    assert holder.holds(k8s_api, namespace) and standby.standing_by()
    assert holder.proc.poll() is None and standby.proc.poll() is None

    killed = time.monotonic()
    holder.proc.send_signal(signal.SIGKILL)
    wait_for(
        lambda: standby.holds(k8s_api, namespace),
        timeout=15,
        what=f"{standby.name} to take over",
        interval=0.05,
    )
    took_lease = time.monotonic() - killed
    wait_for(standby.operating, timeout=15, what=f"{standby.name} to run the operator", interval=0.05)
    operating = time.monotonic() - killed
    print(
        f"\nSIGKILL fail-over (lease 4s, retry 0.5s): Lease taken after {took_lease:.2f}s, "
        f"operator serving after {operating:.2f}s"
    )
    assert 4 - 0.6 - 0.3 <= took_lease <= 4 + 0.6 + 2.0
    assert read_lease(k8s_api, namespace)["spec"]["leaseTransitions"] == 1


def test_operator_processes_hand_over_on_sigterm_and_a_frozen_leader_exits_when_it_wakes(
    replicas: Callable[[int], list[Replica]], k8s_api: client.ApiClient, namespace: str
) -> None:
    first, standbys = elect(replicas(3), k8s_api, namespace)

    # Graceful: SIGTERM -> kopf stops, the Lease is released, a standby takes it on its next retry.
    stopped = time.monotonic()
    first.proc.send_signal(signal.SIGTERM)
    wait_for(
        lambda: any(r.holds(k8s_api, namespace) for r in standbys),
        timeout=15,
        what="a standby to take over after SIGTERM",
        interval=0.05,
    )
    took = time.monotonic() - stopped
    assert first.proc.wait(timeout=15) == 0
    print(f"\nSIGTERM hand-over (retry 0.5s): Lease taken after {took:.2f}s")
    assert took <= 4, "a released lease is taken without waiting for it to expire"
    (second,) = [r for r in standbys if r.holds(k8s_api, namespace)]
    (third,) = [r for r in standbys if r is not second]
    wait_for(second.operating, timeout=15, what=f"{second.name} to run the operator")

    # Frozen (SIGSTOP) past the lease: the last standby takes over; the old leader, woken up, finds its renew
    # deadline passed and exits non-zero instead of acting on.
    frozen = time.monotonic()
    second.proc.send_signal(signal.SIGSTOP)
    try:
        wait_for(
            lambda: third.holds(k8s_api, namespace),
            timeout=15,
            what=f"{third.name} to take over",
            interval=0.05,
        )
        print(f"takeover from a frozen leader: {time.monotonic() - frozen:.2f}s")
    finally:
        second.proc.send_signal(signal.SIGCONT)
    woke = time.monotonic()
    assert second.proc.wait(timeout=10) == leader.LOST_EXIT_CODE
    print(f"the woken leader exited with {leader.LOST_EXIT_CODE} after {time.monotonic() - woke:.2f}s")
    assert third.holds(k8s_api, namespace)
    assert read_lease(k8s_api, namespace)["spec"]["leaseTransitions"] == 2
