"""The operator is SIGKILLed in the middle of a burst of claims and restarted: nothing is duplicated or orphaned."""

from __future__ import annotations

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


def test_kill_mid_burst_then_restart(
    operator_process: OperatorProcess, k8s_api: client.ApiClient, namespace: str
) -> None:
    objs = Objects(k8s_api, namespace)
    objs.create(TEMPLATE, template_body("tpl"))
    objs.create(
        POOL,
        {
            "metadata": {"name": "pool"},
            "spec": {"replicas": POOL_SIZE, "sandboxTemplateRef": {"name": "tpl"}},
        },
    )
    operator_process.start()
    objs.wait(
        POOL,
        "pool",
        lambda p: (p.get("status") or {}).get("readyReplicas") == POOL_SIZE,
        what="warm pool",
        timeout=90,
    )

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

    bound = [
        objs.wait_condition(CLAIM, f"burst-{i}", "True", timeout=120)["status"]["sandbox"]["name"]
        for i in range(CLAIMS)
    ]
    assert len(set(bound)) == CLAIMS, Counter(bound)
    objs.wait(
        POOL,
        "pool",
        lambda p: (p.get("status") or {}).get("readyReplicas") == POOL_SIZE,
        what="refilled pool",
        timeout=90,
    )

    def settled() -> bool:
        return len(objs.list(SANDBOX)) == CLAIMS + POOL_SIZE and all(ready(s) for s in objs.list(SANDBOX))

    wait_for(settled, timeout=90, what="every sandbox Ready, none extra")
    sandboxes = objs.list(SANDBOX)
    uids = {s["metadata"]["uid"] for s in sandboxes}
    for sandbox in sandboxes:
        controllers = [r for r in sandbox["metadata"].get("ownerReferences", []) if r.get("controller")]
        assert len(controllers) == 1, sandbox["metadata"]
    pods = objs.pods()
    owners = Counter(p.metadata.owner_references[0].uid for p in pods if p.metadata.owner_references)
    assert set(owners) == uids, "every pod belongs to a live sandbox and every sandbox has a pod"
    assert max(owners.values()) == 1, owners
    assert len(pods) == len(sandboxes)
