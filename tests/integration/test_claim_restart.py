"""The operator is SIGKILLed in the middle of a burst of claims and restarted: nothing is duplicated or orphaned."""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client
from shadow_operator.api import constants as c

from tests.support.controlplane import wait_for
from tests.support.sandbox_operator import (
    CLAIM,
    POOL,
    SANDBOX,
    TEMPLATE,
    Objects,
    OperatorProcess,
    install_crds,
    ready,
    template_body,
)

pytestmark = pytest.mark.integration

CLAIMS = 12
POOL_SIZE = 3


@pytest.fixture
def operator_process(k8s_api: client.ApiClient, kubeconfig: str, tmp_path: Path) -> Iterator[OperatorProcess]:
    install_crds(k8s_api)
    proc = OperatorProcess(kubeconfig, tmp_path / "operator.log")
    try:
        yield proc
    finally:
        proc.stop()


def start_with_pool(objs: Objects, operator_process: OperatorProcess, size: int) -> None:
    """A template, a pool of `size`, the operator started, the pool Ready."""
    objs.create(TEMPLATE, template_body("tpl"))
    objs.create(
        POOL,
        {"metadata": {"name": "pool"}, "spec": {"replicas": size, "sandboxTemplateRef": {"name": "tpl"}}},
    )
    operator_process.start()
    wait_pool_ready(objs, size, "warm pool")


def wait_pool_ready(objs: Objects, size: int, what: str) -> None:
    objs.wait(
        POOL, "pool", lambda p: (p.get("status") or {}).get("readyReplicas") == size, what=what, timeout=180
    )


def assert_nothing_doubled_or_orphaned(objs: Objects, claims: list[str], pool_size: int) -> None:
    """Every claim Ready on a sandbox of its own, the pool full, one pod per sandbox, no orphans."""
    bound = [
        objs.wait_condition(CLAIM, name, "True", timeout=180)["status"]["sandbox"]["name"] for name in claims
    ]
    assert len(set(bound)) == len(claims), [n for n, k in Counter(bound).items() if k > 1]
    wait_pool_ready(objs, pool_size, "refilled pool")

    def settled() -> bool:
        sandboxes = objs.list(SANDBOX)
        return len(sandboxes) == len(claims) + pool_size and all(ready(s) for s in sandboxes)

    wait_for(settled, timeout=180, what="every sandbox Ready, none extra")
    sandboxes = objs.list(SANDBOX)
    claim_uids = {cl["metadata"]["uid"] for cl in objs.list(CLAIM)}
    per_claim: Counter[str] = Counter()
    for sandbox in sandboxes:
        controllers = [r for r in sandbox["metadata"].get("ownerReferences", []) if r.get("controller")]
        assert len(controllers) == 1, sandbox["metadata"]
        if controllers[0]["kind"] == "SandboxClaim":
            assert controllers[0]["uid"] in claim_uids, f"orphan: {sandbox['metadata']['name']}"
            per_claim[controllers[0]["uid"]] += 1
    assert len(per_claim) == len(claims) and max(per_claim.values()) == 1
    pods = objs.pods()
    owners = Counter(p.metadata.owner_references[0].uid for p in pods if p.metadata.owner_references)
    assert set(owners) == {s["metadata"]["uid"] for s in sandboxes}, "every pod belongs to a live sandbox"
    assert max(owners.values()) == 1, "no sandbox has two pods"
    assert len(pods) == len(sandboxes)


def test_kill_mid_burst_then_restart(
    operator_process: OperatorProcess, k8s_api: client.ApiClient, namespace: str
) -> None:
    objs = Objects(k8s_api, namespace)
    start_with_pool(objs, operator_process, POOL_SIZE)

    def claim(i: int) -> None:
        # Half warm (pool), half the v1alpha1 cold form.
        spec = {"warmPoolRef": {"name": "pool"}} if i % 2 else {"sandboxTemplateRef": {"name": "tpl"}}
        objs.create(CLAIM, {"metadata": {"name": f"burst-{i}"}, "spec": spec})

    for i in range(CLAIMS // 2):
        claim(i)
    # Kill as soon as the operator has started acting on the burst.
    wait_for(lambda: len(objs.list(SANDBOX, c.LABEL_CLAIM_UID)) >= 2, timeout=60, what="first claims served")
    operator_process.kill()
    for i in range(CLAIMS // 2, CLAIMS):
        claim(i)
    operator_process.start()

    assert_nothing_doubled_or_orphaned(objs, [f"burst-{i}" for i in range(CLAIMS)], POOL_SIZE)


CHAOS_CLAIMS = 200
CHAOS_KILLS = 20
CHAOS_POOL = 40


def test_chaos_twenty_kills_during_a_200_claim_burst(
    operator_process: OperatorProcess, k8s_api: client.ApiClient, namespace: str
) -> None:
    """SIGKILL the operator 20 times while 200 claims arrive (warm and cold): all end Ready, nothing doubled."""
    objs = Objects(k8s_api, namespace)
    start_with_pool(objs, operator_process, CHAOS_POOL)

    stop = threading.Event()
    created: list[str] = []
    errors: list[BaseException] = []

    def burst() -> None:
        # 200 claims over the whole chaos period: every third one cold (v1alpha1 form), the rest warm.
        try:
            for i in range(CHAOS_CLAIMS):
                if stop.is_set():
                    return
                spec = (
                    {"sandboxTemplateRef": {"name": "tpl"}}
                    if i % 3 == 0
                    else {"warmPoolRef": {"name": "pool"}}
                )
                objs.create(CLAIM, {"metadata": {"name": f"chaos-{i}"}, "spec": spec})
                created.append(f"chaos-{i}")
                time.sleep(0.12)
        except BaseException as exc:
            errors.append(exc)

    producer = threading.Thread(target=burst, daemon=True)
    producer.start()
    rng = random.Random(8)
    kills = 0
    try:
        while kills < CHAOS_KILLS:
            # Long enough for the operator to start and act, short enough to die mid-burst.
            time.sleep(rng.uniform(0.8, 2.0))
            operator_process.kill()
            kills += 1
            operator_process.start()
    finally:
        producer.join(timeout=120)
        stop.set()
    assert not errors, errors
    assert len(created) == CHAOS_CLAIMS

    assert_nothing_doubled_or_orphaned(objs, created, CHAOS_POOL)
