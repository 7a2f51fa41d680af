"""ShadowEnvironmentPool on the local control plane: instances started ahead, taken by environments.

kwok plays the kubelet (the instances' Pods become Ready without running anything); volumes are static
PersistentVolumes bound to each instance's claim as it appears (no provisioner here); the instances' Gitea is
the real binary on loopback, started with the credentials of the instance an environment takes.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from shadow_operator.api import constants as c
from shadow_operator.api import naming
from shadow_operator.controllers import metrics
from shadow_operator.resources import environment as res
from shadow_operator.resources import gitea_policy

from tests.support.controlplane import free_port, volume_report, wait_for
from tests.support.gitea import GiteaServer
from tests.support.sandbox_operator import (
    ENVIRONMENT,
    ENVIRONMENT_POOL,
    SANDBOX,
    TEMPLATE,
    Objects,
    gitea_operator,
    template_body,
)
from tests.support.volumes import bind_volumes

pytestmark = pytest.mark.integration
V = "v1alpha1"
GITEA_PORT = free_port()
SHAPE = {
    "workspace": {"size": "1Gi"},
    "gitRewrites": [{"from": "https://github.com/microsoft/", "to": "microsoft"}],
}


@pytest.fixture(scope="module")
def operator(k8s_api: client.ApiClient) -> Iterator[Any]:
    with gitea_operator(k8s_api, f"http://127.0.0.1:{GITEA_PORT}") as runner:
        yield runner


class Volumes:
    """Static PersistentVolumes pre-bound to the workspace claims of the pool's instances, as they appear."""

    def __init__(self, objs: Objects, root: Path) -> None:
        self.objs, self.root, self.made = objs, root, set[str]()
        self.prefix = f"pool-{naming.name_hash(objs.namespace)}"

    def pv_name(self, claim: str) -> str:
        return f"{self.prefix}-{claim}"[:63]

    def bind_new(self) -> None:
        for pvc in self.objs.core.list_namespaced_persistent_volume_claim(self.objs.namespace).items:
            claim = pvc.metadata.name
            if claim in self.made or pvc.status.phase == "Bound":
                continue
            bind_volumes(self.objs, [claim], self.root, prefix=self.prefix)
            self.made.add(claim)

    def remove(self) -> None:
        for claim in self.made:
            with contextlib.suppress(ApiException):
                self.objs.core.delete_persistent_volume(self.pv_name(claim))


def pool_body(name: str, replicas: int, **spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {"replicas": replicas, **SHAPE, **spec}}


def env_body(name: str, pool: str, **spec: Any) -> dict[str, Any]:
    sources = [{"name": "core", "repo": "microsoft/amplifier-core", "upload": {}}]
    return {"metadata": {"name": name}, "spec": {"sources": sources, "pool": pool, **SHAPE, **spec}}


def controller(obj: Any) -> dict[str, Any] | None:
    refs = obj["metadata"].get("ownerReferences") if isinstance(obj, dict) else obj.metadata.owner_references
    for ref in refs or ():
        ref = ref if isinstance(ref, dict) else ref.to_dict()
        if ref.get("controller"):
            return ref
    return None


def instances(objs: Objects, pool: str) -> list[dict[str, Any]]:
    return objs.list(SANDBOX, f"{c.LABEL_POOL}={pool}")


def instance_ready(objs: Objects, sandbox: dict[str, Any]) -> bool:
    """What the operator takes: a Ready Sandbox whose Gitea has a ready replica."""
    conditions = (sandbox.get("status") or {}).get("conditions") or ()
    if not any(x["type"] == "Ready" and x["status"] == "True" for x in conditions):
        return False
    sts = client.AppsV1Api(objs.api).read_namespaced_stateful_set(
        res.gitea_name(sandbox["metadata"]["name"]), objs.namespace
    )
    return (sts.status.ready_replicas or 0) >= 1


def wait_ready_instances(objs: Objects, volumes: Volumes, pool: str, count: int) -> dict[str, Any]:
    def ready() -> bool:
        volumes.bind_new()
        status = (objs.get(ENVIRONMENT_POOL, pool, V) or {}).get("status") or {}
        # The status lags a take by a pass (it may still count a taken instance as Ready while its successor
        # starts): the unclaimed Sandboxes (still labelled) must agree with it, each Ready with its Gitea.
        counted = status.get("readyReplicas") == count and status.get("replicas") == count
        members = instances(objs, pool)
        return counted and len(members) == count and all(instance_ready(objs, m) for m in members)

    try:
        wait_for(ready, timeout=120, what=f"{count} Ready instances of pool {pool}", interval=0.25)
    except TimeoutError as exc:
        pytest.fail(f"{exc}\n{report(objs, pool)}", pytrace=False)
    return objs.get(ENVIRONMENT_POOL, pool, V) or {}


def report(objs: Objects, pool: str) -> str:
    """What the pool, its Sandboxes, StatefulSets, Pods and claims look like (for a failure message)."""
    lines = [f"pool status: {(objs.get(ENVIRONMENT_POOL, pool, V) or {}).get('status')}"]
    for sandbox in objs.list(SANDBOX):
        ready = [x for x in (sandbox.get("status") or {}).get("conditions") or () if x["type"] == "Ready"]
        lines.append(f"sandbox {sandbox['metadata']['name']} controller={controller(sandbox)} ready={ready}")
    for sts in client.AppsV1Api(objs.api).list_namespaced_stateful_set(objs.namespace).items:
        lines.append(f"statefulset {sts.metadata.name} readyReplicas={sts.status.ready_replicas}")
    for pod in objs.pods():
        lines.append(f"pod {pod.metadata.name} phase={pod.status.phase} conditions={pod.status.conditions}")
    return "\n".join([*lines, volume_report(objs.core, objs.namespace)])


def gitea_objects(objs: Objects, instance: str) -> list[Any]:
    apps, net = client.AppsV1Api(objs.api), client.NetworkingV1Api(objs.api)
    return [
        objs.core.read_namespaced_secret(res.gitea_secret_name(instance), objs.namespace),
        objs.core.read_namespaced_service(res.gitea_name(instance), objs.namespace),
        net.read_namespaced_network_policy(gitea_policy.gitea_network_policy_name(instance), objs.namespace),
        net.read_namespaced_network_policy(gitea_policy.workspace_policy_name(instance), objs.namespace),
        apps.read_namespaced_stateful_set(res.gitea_name(instance), objs.namespace),
    ]


def gauge(objs: Objects, state: str) -> float:
    return float(metrics.ENVIRONMENT_POOL_INSTANCES.labels(objs.namespace, "warm", state)._value.get())


def takes(objs: Objects, reason: str) -> float:
    return float(metrics.POOL_TAKES.labels(objs.namespace, "warm", reason)._value.get())


def scale(objs: Objects, pool: str, replicas: int) -> None:
    objs.custom.patch_namespaced_custom_object_scale(
        "shadow.dev", V, objs.namespace, "shadowenvironmentpools", pool, {"spec": {"replicas": replicas}}
    )


def test_an_environment_takes_a_started_instance_and_the_pool_refills(objs: Objects, tmp_path: Path) -> None:
    objs.create(TEMPLATE, template_body("workspace"))
    volumes = Volumes(objs, tmp_path)
    try:
        objs.create(ENVIRONMENT_POOL, pool_body("warm", 1), version=V)
        pool = wait_ready_instances(objs, volumes, "warm", 1)
        assert pool["status"]["selector"] == f"{c.LABEL_POOL}=warm"
        # Exported for the platform team (the operator runs in this process).
        assert gauge(objs, "ready") == 1 and gauge(objs, "desired") == 1 and gauge(objs, "starting") == 0
        [instance] = instances(objs, "warm")
        name = instance["metadata"]["name"]
        assert name.startswith("warm-") and controller(instance)["kind"] == "ShadowEnvironmentPool"
        assert all(controller(o)["kind"] == "ShadowEnvironmentPool" for o in gitea_objects(objs, name))
        # The instance's workspace Pod carries the label its Gitea's NetworkPolicy admits (its own name).
        [pod] = [p for p in objs.pods() if p.metadata.name == name]
        assert pod.metadata.labels[c.LABEL_ENVIRONMENT] == name

        # An environment naming the pool takes the instance: Sandbox and Gitea become its children.
        creds = objs.secret_data(res.gitea_secret_name(name))
        with GiteaServer.standing_in(tmp_path / "gitea", creds, GITEA_PORT) as gitea:
            env = objs.create(ENVIRONMENT, env_body("taker", "warm"), version=V)
            uid = env["metadata"]["uid"]
            env = objs.wait_condition(ENVIRONMENT, "taker", type_="GiteaReady", timeout=60, version=V)
            assert env["status"]["sandbox"] == name
            assert env["status"]["pool"] == {
                "name": "warm",
                "adopted": True,
                "reason": "Adopted",
                "message": f"took instance {name} of ShadowEnvironmentPool warm",
            }
            assert env["status"]["giteaURL"] == (
                f"http://{res.gitea_name(name)}.{objs.namespace}.svc.cluster.local:3000"
            )
            sandbox = objs.get(SANDBOX, name)
            assert sandbox is not None and controller(sandbox)["uid"] == uid
            assert c.LABEL_POOL not in (sandbox["metadata"].get("labels") or {})
            assert all(controller(o)["uid"] == uid for o in gitea_objects(objs, name))
            # Its Gitea was set up for the environment's sources, with the instance's credentials.
            assert [o["username"] for o in gitea.api("GET", "admin/orgs")] == ["microsoft"]
            assert objs.get(SANDBOX, "taker") is None

        assert takes(objs, "Adopted") == 1

        # The pool starts another instance in the background.
        wait_ready_instances(objs, volumes, "warm", 1)
        [fresh] = instances(objs, "warm")
        assert fresh["metadata"]["name"] != name

        # Two environments racing for the one instance: exactly one takes it, the other starts cold.
        for racer in ("racer-a", "racer-b"):
            objs.create(ENVIRONMENT, env_body(racer, "warm"), version=V)
        pools = [
            objs.wait(ENVIRONMENT, r, lambda o: bool((o.get("status") or {}).get("pool")), version=V)[
                "status"
            ]
            for r in ("racer-a", "racer-b")
        ]
        assert sorted(p["pool"]["reason"] for p in pools) == ["Adopted", "PoolEmpty"]
        taken = next(p for p in pools if p["pool"]["adopted"])
        cold = next(p for p in pools if not p["pool"]["adopted"])
        assert taken["sandbox"] == fresh["metadata"]["name"]
        assert cold["sandbox"] in ("racer-a", "racer-b")

        # An environment whose fields differ starts its own, and says which fields.
        objs.create(ENVIRONMENT, env_body("other", "warm", workspace={"size": "2Gi"}), version=V)
        other = objs.wait(
            ENVIRONMENT, "other", lambda o: bool((o.get("status") or {}).get("pool")), version=V
        )
        assert other["status"]["pool"]["reason"] == "PoolMismatch"
        assert "spec.workspace.size" in other["status"]["pool"]["message"]
        assert takes(objs, "PoolMismatch") == 1 and takes(objs, "PoolEmpty") == 1
        assert other["status"]["sandbox"] == "other"

        wait_ready_instances(objs, volumes, "warm", 1)
        [spare] = instances(objs, "warm")

        # Another tenant's namespace cannot name this pool: pools are looked up in the environment's own.
        other = Objects(objs.api, f"{objs.namespace[:50]}-other")
        objs.core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=other.namespace)))
        try:
            other.create(TEMPLATE, template_body("workspace"))
            other.create(ENVIRONMENT, env_body("thief", "warm"), version=V)
            thief = other.wait(
                ENVIRONMENT, "thief", lambda o: bool((o.get("status") or {}).get("pool")), version=V
            )
            assert thief["status"]["pool"]["reason"] == "PoolNotFound"
            assert thief["status"]["sandbox"] == "thief"
            # The pool's spare was not taken.
            assert controller(objs.get(SANDBOX, spare["metadata"]["name"]))["kind"] == "ShadowEnvironmentPool"
        finally:
            objs.core.delete_namespace(other.namespace, propagation_policy="Background")

        # `kubectl scale` to 0: the unclaimed instance goes, the taken ones stay with their environments.
        scale(objs, "warm", 0)
        wait_for(lambda: objs.get(SANDBOX, spare["metadata"]["name"]) is None, timeout=60, what="spare gone")
        wait_for(
            lambda: not objs.secret_exists(res.gitea_secret_name(spare["metadata"]["name"])),
            timeout=60,
            what="the spare's Gitea Secret gone",
        )
        assert objs.get(SANDBOX, name) is not None and objs.get(SANDBOX, taken["sandbox"]) is not None
        wait_ready_instances(objs, volumes, "warm", 0)

        # Deleting the environment removes what it took (garbage collection through the moved references).
        objs.custom.delete_namespaced_custom_object(
            "shadow.dev", V, objs.namespace, "shadowenvironments", "taker"
        )
        wait_for(lambda: objs.get(SANDBOX, name) is None, timeout=60, what="the taken Sandbox to go")
        wait_for(
            lambda: not objs.secret_exists(res.gitea_secret_name(name)),
            timeout=60,
            what="its Gitea Secret to go",
        )
    finally:
        volumes.remove()
