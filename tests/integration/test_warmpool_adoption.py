"""SandboxWarmPool: replicas, adoption (including racing claims), replenish, kubectl scale, Recreate."""

from __future__ import annotations

import os
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from kubernetes import client
from prometheus_client import REGISTRY
from shadow_operator.api import constants as c
from shadow_operator.api import naming

from tests.support.controlplane import wait_for
from tests.support.sandbox_operator import (
    CLAIM,
    POOL,
    SANDBOX,
    TEMPLATE,
    Objects,
    ready,
    template_body,
)

pytestmark = pytest.mark.integration


def warm(objs: Objects, pool: str) -> list[dict[str, Any]]:
    return objs.list(SANDBOX, f"{c.LABEL_WARM_POOL}={naming.name_hash(pool)}")


def make_pool(objs: Objects, replicas: int, template: str = "tpl", **spec: Any) -> None:
    objs.create(TEMPLATE, template_body(template))
    objs.create(
        POOL,
        {
            "metadata": {"name": "pool"},
            "spec": {"replicas": replicas, "sandboxTemplateRef": {"name": template}, **spec},
        },
    )
    objs.wait(
        POOL, "pool", lambda p: (p.get("status") or {}).get("readyReplicas") == replicas, what="pool ready"
    )


def test_pool_fills_and_reports_status(objs: Objects) -> None:
    make_pool(objs, 2)
    pool = objs.get(POOL, "pool")
    assert pool is not None
    assert pool["status"]["replicas"] == 2
    assert pool["status"]["selector"] == f"{c.LABEL_WARM_POOL}={naming.name_hash('pool')}"
    assert pool["status"]["observedGeneration"] == pool["metadata"]["generation"]
    members = warm(objs, "pool")
    assert len(members) == 2 and all(s["metadata"]["name"].startswith("pool-") for s in members)
    assert all(s["metadata"]["ownerReferences"][0]["kind"] == "SandboxWarmPool" for s in members)


def test_claim_adopts_a_ready_warm_sandbox_and_pool_replenishes(objs: Objects) -> None:
    make_pool(objs, 1)
    [candidate] = warm(objs, "pool")
    extra = {"labels": {"team": "blue", "app": "not-overriding"}, "annotations": {"note": "hi"}}
    spec = {"warmPoolRef": {"name": "pool"}, "additionalPodMetadata": extra}
    objs.create(CLAIM, {"metadata": {"name": "fast"}, "spec": spec})
    claim = objs.wait_condition(CLAIM, "fast", "True")
    assert claim["status"]["sandbox"]["name"] == candidate["metadata"]["name"]
    adopted = objs.get(SANDBOX, candidate["metadata"]["name"])
    assert adopted is not None
    owner = adopted["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["uid"]) == ("SandboxClaim", claim["metadata"]["uid"])
    assert adopted["metadata"]["labels"][c.LABEL_LAUNCH_TYPE] == c.LAUNCH_WARM
    assert c.LABEL_WARM_POOL not in adopted["metadata"]["labels"]
    # The claim names its sandbox before its status says Ready (as upstream).
    assert claim["metadata"]["annotations"][c.ANNOTATION_ASSIGNED_SANDBOX] == candidate["metadata"]["name"]

    warm_starts = REGISTRY.get_sample_value(
        "agent_sandbox_claim_startup_latency_ms_count", {"namespace": objs.namespace, "launch_type": "warm"}
    )
    assert warm_starts == 1

    # The claim's pod metadata reaches the running pod without overriding the template's.
    def pod_relabelled() -> bool:
        pod = objs.core.read_namespaced_pod(candidate["metadata"]["name"], objs.namespace)
        labels = pod.metadata.labels
        return (
            labels.get("team") == "blue"
            and labels.get(c.LABEL_CLAIM_UID) == claim["metadata"]["uid"]
            and c.LABEL_WARM_POOL not in labels
            and (pod.metadata.annotations or {}).get("note") == "hi"
        )

    wait_for(pod_relabelled, timeout=30, what="adopted pod carries the claim's metadata")
    pod = objs.core.read_namespaced_pod(candidate["metadata"]["name"], objs.namespace)
    assert pod.metadata.labels["app"] == "sandbox"
    # The pool replaces what was taken.
    wait_for(
        lambda: len([s for s in warm(objs, "pool") if ready(s)]) == 1, timeout=60, what="replenished pool"
    )
    assert warm(objs, "pool")[0]["metadata"]["name"] != candidate["metadata"]["name"]


def test_two_concurrent_claims_never_share_a_sandbox(objs: Objects) -> None:
    make_pool(objs, 1)
    names = [f"race-{i}" for i in range(4)]
    with ThreadPoolExecutor(len(names)) as pool:
        list(
            pool.map(
                lambda n: objs.create(
                    CLAIM, {"metadata": {"name": n}, "spec": {"warmPoolRef": {"name": "pool"}}}
                ),
                names,
            )
        )
    bound = [objs.wait_condition(CLAIM, n, "True", timeout=90)["status"]["sandbox"]["name"] for n in names]
    assert len(set(bound)) == len(names), bound
    owners = {}
    for sandbox in objs.list(SANDBOX):
        controllers = [r for r in sandbox["metadata"]["ownerReferences"] if r.get("controller")]
        assert len(controllers) == 1
        owners[sandbox["metadata"]["name"]] = controllers[0]["name"]
    assert sorted(owners[b] for b in bound) == sorted(names)
    # Exactly one pod per sandbox.
    for sandbox_name in bound:
        assert len(objs.pods(f"{c.LABEL_SANDBOX_NAME_HASH}={naming.name_hash(sandbox_name)}")) == 1


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is needed for `kubectl scale`")
def test_kubectl_scale_uses_the_scale_subresource(objs: Objects, kubeconfig: str) -> None:
    make_pool(objs, 1)
    subprocess.run(
        ["kubectl", "scale", "sandboxwarmpool/pool", "--replicas=3", "-n", objs.namespace],
        check=True,
        env={**os.environ, "KUBECONFIG": kubeconfig},
        capture_output=True,
    )
    objs.wait(POOL, "pool", lambda p: (p.get("status") or {}).get("readyReplicas") == 3, what="scaled up")
    scale = client.CustomObjectsApi(objs.api).get_namespaced_custom_object_scale(
        "extensions.agents.x-k8s.io", "v1beta1", objs.namespace, "sandboxwarmpools", "pool"
    )
    assert scale["spec"]["replicas"] == 3 and scale["status"]["replicas"] == 3
    assert scale["status"]["selector"] == f"{c.LABEL_WARM_POOL}={naming.name_hash('pool')}"
    objs.patch(POOL, "pool", {"spec": {"replicas": 1}})
    wait_for(lambda: len(warm(objs, "pool")) == 1, timeout=60, what="scaled down to 1")


def test_recreate_strategy_rolls_warm_sandboxes_on_template_change(objs: Objects) -> None:
    make_pool(objs, 2, updateStrategy={"type": "Recreate"})
    before = {s["metadata"]["name"] for s in warm(objs, "pool")}
    template = objs.get(TEMPLATE, "tpl")
    assert template is not None
    containers = template["spec"]["podTemplate"]["spec"]["containers"]
    containers[0]["env"] = [{"name": "REV", "value": "2"}]
    objs.patch(TEMPLATE, "tpl", {"spec": {"podTemplate": {"spec": {"containers": containers}}}})

    def rolled() -> bool:
        members = warm(objs, "pool")
        names = {s["metadata"]["name"] for s in members}
        return len(members) == 2 and not names & before and all(ready(s) for s in members)

    wait_for(rolled, timeout=90, what="warm sandboxes recreated from the new template")


def test_recreate_strategy_keeps_warm_sandboxes_on_a_metadata_only_change(objs: Objects) -> None:
    """A new label on the template's pod metadata changes nothing a running sandbox is made of: upstream keeps
    the pool's sandboxes (its TestWarmPoolRolloutMetadataUpdate); they were all replaced before."""
    make_pool(objs, 2, updateStrategy={"type": "Recreate"})
    before = {s["metadata"]["name"] for s in warm(objs, "pool")}
    objs.patch(TEMPLATE, "tpl", {"spec": {"podTemplate": {"metadata": {"labels": {"rev": "2"}}}}})
    # Growing the pool makes it reconcile with the changed template (the new member is made from it).
    objs.patch(POOL, "pool", {"spec": {"replicas": 3}})

    def grown() -> bool:
        members = warm(objs, "pool")
        return len(members) == 3 and all(ready(s) for s in members)

    wait_for(grown, timeout=90, what="the pool grown to 3 after the template's label change")
    members = warm(objs, "pool")
    assert before <= {s["metadata"]["name"] for s in members}
    assert not any(s["metadata"].get("deletionTimestamp") for s in members)
    labels = [s["spec"]["podTemplate"]["metadata"]["labels"].get("rev") for s in members]
    assert sorted(labels, key=str) == ["2", None, None]


def test_recreate_strategy_rolls_warm_sandboxes_when_the_pool_switches_template(objs: Objects) -> None:
    """Another template of the same shape is still another template: its sandboxes replace the pool's
    (upstream's TestWarmPoolRolloutSwitchTemplate)."""
    make_pool(objs, 1, updateStrategy={"type": "Recreate"})
    [old] = warm(objs, "pool")
    objs.create(TEMPLATE, template_body("other"))
    objs.patch(POOL, "pool", {"spec": {"sandboxTemplateRef": {"name": "other"}}})

    def switched() -> bool:
        members = warm(objs, "pool")
        return (
            len(members) == 1
            and members[0]["metadata"]["name"] != old["metadata"]["name"]
            and members[0]["metadata"]["annotations"][c.ANNOTATION_TEMPLATE_REF] == "other"
        )

    wait_for(switched, timeout=90, what="the pool's sandbox made from the new template")


def test_adopted_sandbox_names_its_pod_before_it_is_ready(objs: Objects) -> None:
    """agents.x-k8s.io/pod-name is set by the adoption itself, so no one sees the claim's Sandbox Ready without it
    (upstream's TestWarmPoolPodNameAnnotationBeforeReady); a cold-started one carries it from its creation."""
    make_pool(objs, 1)
    [candidate] = warm(objs, "pool")
    name = candidate["metadata"]["name"]
    objs.create(CLAIM, {"metadata": {"name": "named"}, "spec": {"warmPoolRef": {"name": "pool"}}})
    objs.wait_condition(CLAIM, "named", "True")
    adopted = objs.get(SANDBOX, name)
    assert adopted is not None
    assert adopted["metadata"]["annotations"][c.ANNOTATION_POD_NAME] == name
    objs.create(CLAIM, {"metadata": {"name": "cold"}, "spec": {"sandboxTemplateRef": {"name": "tpl"}}})
    cold = objs.wait_condition(SANDBOX, "cold", "True")
    assert cold["metadata"]["annotations"][c.ANNOTATION_POD_NAME] == "cold"


def test_on_replenish_keeps_stale_sandboxes_until_used(objs: Objects) -> None:
    make_pool(objs, 1)
    before = {s["metadata"]["name"] for s in warm(objs, "pool")}
    objs.patch(TEMPLATE, "tpl", {"spec": {"podTemplate": {"metadata": {"labels": {"rev": "2"}}}}})
    objs.create(CLAIM, {"metadata": {"name": "user"}, "spec": {"warmPoolRef": {"name": "pool"}}})
    claim = objs.wait_condition(CLAIM, "user", "True")
    assert claim["status"]["sandbox"]["name"] in before
    wait_for(lambda: len([s for s in warm(objs, "pool") if ready(s)]) == 1, timeout=60, what="replenished")
    [fresh] = warm(objs, "pool")
    assert fresh["spec"]["podTemplate"]["metadata"]["labels"]["rev"] == "2"


@pytest.mark.parametrize("warmpool", ["default", "pool"])
def test_v1alpha1_claim_adopts_when_warmpool_is_set(objs: Objects, warmpool: str) -> None:
    make_pool(objs, 1)
    [candidate] = warm(objs, "pool")
    spec = {"sandboxTemplateRef": {"name": "tpl"}, "warmpool": warmpool}
    objs.create(CLAIM, {"metadata": {"name": "legacy"}, "spec": spec}, version="v1alpha1")
    claim = objs.wait_condition(CLAIM, "legacy", "True", version="v1alpha1")
    assert claim["status"]["sandbox"]["name"] == candidate["metadata"]["name"]


def test_v1alpha1_claim_with_warmpool_none_cold_starts(objs: Objects) -> None:
    make_pool(objs, 1)
    spec = {"sandboxTemplateRef": {"name": "tpl"}, "warmpool": "none"}
    objs.create(CLAIM, {"metadata": {"name": "fresh"}, "spec": spec}, version="v1alpha1")
    claim = objs.wait_condition(CLAIM, "fresh", "True", version="v1alpha1")
    assert claim["status"]["sandbox"]["name"] == "fresh"
    assert len(warm(objs, "pool")) == 1
