"""ShadowEnvironment on the local control plane, bootstrapping a real Gitea binary on loopback.

kwok plays the kubelet, so the workspace and Gitea Pods become Ready without running anything; the operator
reaches "their" Gitea at the loopback address SHADOW_GITEA_API_URL names, where the test starts the pinned
Gitea with the credentials the operator generated into the environment's Secret, as the Gitea Pod would.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from shadow_operator.api import constants as c
from shadow_operator.common.verdict import SOURCE_VERIFICATION, CheckResult, score_verdict

from tests.support.controlplane import free_port, wait_for
from tests.support.gitea import GiteaServer
from tests.support.sandbox_operator import (
    ENVIRONMENT,
    SANDBOX,
    TEMPLATE,
    Objects,
    condition,
    gitea_operator,
    template_body,
)
from tests.support.volumes import bind_volumes, wait_bound

pytestmark = pytest.mark.integration
V = "v1alpha1"
GITEA_PORT = free_port()


@pytest.fixture(scope="module")
def operator(k8s_api: client.ApiClient) -> Iterator[Any]:
    with gitea_operator(k8s_api, f"http://127.0.0.1:{GITEA_PORT}") as runner:
        yield runner


def env_body(name: str, **spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "spec": {
            "sources": [
                {"name": "core", "repo": "microsoft/amplifier-core", "upload": {}},
                {"name": "tools", "repo": "tools", "upload": {}},
            ],
            "workspace": {"size": "1Gi"},
            "gitRewrites": [{"from": "https://github.com/microsoft/", "to": "microsoft"}],
            **spec,
        },
    }


def events_text(objs: Objects) -> str:
    return json.dumps(
        [e.to_dict() for e in objs.core.list_namespaced_event(objs.namespace).items], default=str
    )


def controller_of(obj: Any) -> Any:
    refs = obj.metadata.owner_references if hasattr(obj, "metadata") else obj["metadata"]["ownerReferences"]
    return next(r for r in refs if (r.controller if hasattr(r, "controller") else r.get("controller")))


def test_children_gitea_bootstrap_and_no_secret_leaks(objs: Objects, tmp_path: Path) -> None:
    objs.create(TEMPLATE, template_body("workspace"))
    # Gitea's data is on an emptyDir (no persistence asked for): only the workspace has a claim.
    volumes = bind_volumes(objs, ["workspace-env1"], tmp_path)
    try:
        env = objs.create(ENVIRONMENT, env_body("env1"), version=V)
        uid = env["metadata"]["uid"]
        wait_for(lambda: objs.secret_exists("env1-gitea-admin"), timeout=30, what="Gitea admin Secret")
        wait_bound(objs, ["workspace-env1"], timeout=120)
        creds = objs.secret_data("env1-gitea-admin")
        with GiteaServer.standing_in(tmp_path / "gitea", creds, GITEA_PORT) as gitea:
            env = objs.wait_condition(ENVIRONMENT, "env1", type_="GiteaReady", timeout=120, version=V)

            # Children, each controlled by the environment.
            sandbox = objs.get(SANDBOX, "env1")
            assert sandbox is not None and controller_of(sandbox)["uid"] == uid
            sts = client.AppsV1Api(objs.api).read_namespaced_stateful_set("env1-gitea", objs.namespace)
            assert controller_of(sts).uid == uid and controller_of(sts).kind == "ShadowEnvironment"
            assert sts.spec.volume_claim_templates is None
            assert sts.spec.template.spec.volumes[0].empty_dir.size_limit == "1Gi"
            svc = objs.core.read_namespaced_service("env1-gitea", objs.namespace)
            assert controller_of(svc).uid == uid
            secret = objs.core.read_namespaced_secret("env1-gitea-admin", objs.namespace)
            assert controller_of(secret).uid == uid
            policies = client.NetworkingV1Api(objs.api).list_namespaced_network_policy(
                objs.namespace, label_selector=f"{c.LABEL_ENVIRONMENT}=env1"
            )
            assert sorted(p.metadata.name for p in policies.items) == [
                "env1-gitea",
                "env1-workspace-to-gitea",
            ]
            assert all(controller_of(p).uid == uid for p in policies.items)

            # The workspace Pod carries the label those policies select it by (a Sandbox's own labels of the
            # operator's prefix are dropped; only the environment's Sandbox gets it).
            def pod_labels() -> dict[str, str] | None:
                pods = objs.core.list_namespaced_pod(
                    objs.namespace, label_selector=f"{c.LABEL_ENVIRONMENT}=env1"
                )
                return next((p.metadata.labels for p in pods.items if p.metadata.name == "env1"), None)

            wait_for(pod_labels, timeout=60, what="the workspace Pod labelled with its environment")
            # Written once, not on every pass (an `egress: []` re-applied bumped the generation in a hot loop).
            assert all(p.metadata.generation == 1 for p in policies.items), [
                (p.metadata.name, p.metadata.generation) for p in policies.items
            ]
            container = sandbox["spec"]["podTemplate"]["spec"]["containers"][0]
            env_vars = {e["name"]: e.get("value") for e in container["env"]}
            gitea_url = f"http://env1-gitea.{objs.namespace}.svc.cluster.local:3000"
            assert env_vars["GIT_CONFIG_KEY_0"] == f"url.{gitea_url}/microsoft/.insteadOf"
            assert env_vars["GIT_CONFIG_VALUE_0"] == "https://github.com/microsoft/"
            assert env["status"]["giteaURL"] == gitea_url

            # Bootstrap: one organization per owner, one repository per source, the token kept.
            token = objs.secret_data("env1-gitea-admin")["token"]
            orgs = sorted(o["username"] for o in gitea.api("GET", "admin/orgs"))
            assert orgs == ["microsoft", "shadow"]
            assert [r["name"] for r in gitea.api("GET", "orgs/microsoft/repos")] == ["amplifier-core"]
            assert [r["name"] for r in gitea.api("GET", "orgs/shadow/repos")] == ["tools"]

            # Uploads are awaited, not guessed.
            env = objs.wait_condition(
                ENVIRONMENT, "env1", "False", "WaitingForUpload", type_="SourcesReady", timeout=60, version=V
            )
            assert condition(env, "WorkspaceReady")["status"] == "True"
            assert condition(env, "Ready")["status"] == "False"

            # Run the bootstrap again (a new generation): nothing is duplicated, the token is reused.
            objs.custom.patch_namespaced_custom_object(
                "shadow.dev",
                V,
                objs.namespace,
                "shadowenvironments",
                "env1",
                {"spec": {"verify": {"passThreshold": 80}}},
            )
            objs.wait(
                ENVIRONMENT,
                "env1",
                lambda o: (
                    condition(o, "GiteaReady").get("observedGeneration") == 2
                    and condition(o, "GiteaReady").get("status") == "True"
                ),
                timeout=60,
                version=V,
            )
            assert sorted(o["username"] for o in gitea.api("GET", "admin/orgs")) == orgs
            assert len(gitea.api("GET", "orgs/microsoft/repos")) == 1
            tokens = gitea.api("GET", f"users/{creds['username']}/tokens")
            assert [t["name"] for t in tokens] == ["shadow-operator"]
            assert objs.secret_data("env1-gitea-admin")["token"] == token

            # No credential in status or events.
            text = json.dumps(objs.get(ENVIRONMENT, "env1", V)) + events_text(objs)
            for value in (creds["password"], token):
                assert value not in text

        # Deleting the environment removes every child (garbage collection through owner references).
        objs.custom.delete_namespaced_custom_object(
            "shadow.dev", V, objs.namespace, "shadowenvironments", "env1"
        )
        wait_for(lambda: objs.get(SANDBOX, "env1") is None, timeout=60, what="workspace Sandbox to go")
        wait_for(lambda: not objs.secret_exists("env1-gitea-admin"), timeout=60, what="Gitea Secret to go")
        wait_for(
            lambda: (
                not objs.core.list_namespaced_service(
                    objs.namespace, label_selector=f"{c.LABEL_ENVIRONMENT}=env1"
                ).items
            ),
            timeout=60,
            what="Gitea Service to go",
        )
    finally:
        for name in volumes:
            with contextlib.suppress(ApiException):
                objs.core.delete_persistent_volume(name)


def test_missing_template_is_reported_and_heals(objs: Objects) -> None:
    objs.create(ENVIRONMENT, env_body("lost", template="no-such-template"), version=V)
    env = objs.wait(
        ENVIRONMENT, "lost", lambda o: (o.get("status") or {}).get("failure"), timeout=30, version=V
    )
    assert env["status"]["failure"]["code"] == "TemplateNotFound"
    assert "no-such-template" in env["status"]["failure"]["message"]
    assert condition(env, "Ready")["reason"] == "TemplateNotFound"
    assert objs.get(SANDBOX, "lost") is None
    objs.create(TEMPLATE, template_body("no-such-template"))
    env = objs.wait(
        ENVIRONMENT, "lost", lambda o: not (o.get("status") or {}).get("failure"), timeout=30, version=V
    )
    wait_for(lambda: objs.get(SANDBOX, "lost") is not None, timeout=30, what="workspace Sandbox")


def test_missing_storage_class_is_reported(objs: Objects) -> None:
    objs.create(TEMPLATE, template_body("workspace"))
    body = env_body("nostorage", workspace={"storageClassName": "no-such-class"})
    objs.create(ENVIRONMENT, body, version=V)
    env = objs.wait(
        ENVIRONMENT, "nostorage", lambda o: (o.get("status") or {}).get("failure"), timeout=30, version=V
    )
    assert env["status"]["failure"]["code"] == "StorageUnavailable"
    assert "no-such-class" in env["status"]["failure"]["message"]
    events = objs.core.list_namespaced_event(
        objs.namespace, field_selector="involvedObject.name=nostorage"
    ).items
    assert any(e.reason == "StorageUnavailable" for e in events)


def test_runtime_class_is_checked_then_given_to_the_workspace_pod(objs: Objects) -> None:
    """spec.runtimeClassName names a class the cluster lacks: RuntimeClassNotFound; once it exists the workspace
    Sandbox and its Pod carry it."""
    runtime_class = f"gvisor-{objs.namespace}"[:63]
    objs.create(TEMPLATE, template_body("workspace"))
    objs.create(ENVIRONMENT, env_body("otherkernel", runtimeClassName=runtime_class), version=V)
    env = objs.wait(
        ENVIRONMENT, "otherkernel", lambda o: (o.get("status") or {}).get("failure"), timeout=30, version=V
    )
    assert env["status"]["failure"]["code"] == "RuntimeClassNotFound"
    assert runtime_class in env["status"]["failure"]["message"]
    assert objs.get(SANDBOX, "otherkernel") is None
    node = client.NodeV1Api(objs.api)
    node.create_runtime_class(
        client.V1RuntimeClass(metadata=client.V1ObjectMeta(name=runtime_class), handler="runsc")
    )
    try:
        sandbox = objs.wait(SANDBOX, "otherkernel", lambda o: o is not None, timeout=60)
        assert sandbox["spec"]["podTemplate"]["spec"]["runtimeClassName"] == runtime_class
        pod = wait_for(
            lambda: objs.core.read_namespaced_pod("otherkernel", objs.namespace),
            timeout=60,
            what="the workspace Pod of environment otherkernel",
        )
        assert pod.spec.runtime_class_name == runtime_class
    finally:
        node.delete_runtime_class(runtime_class)


def test_verdict_round_trips_through_the_api(objs: Objects) -> None:
    """The schema keeps every field of a verdict (nothing pruned by the structural schema)."""
    objs.create(ENVIRONMENT, env_body("judged", template="absent"), version=V)
    objs.wait(ENVIRONMENT, "judged", lambda o: (o.get("status") or {}).get("failure"), timeout=30, version=V)
    verdict = score_verdict(
        {
            SOURCE_VERIFICATION: [
                CheckResult("core: workspace has abc", True),
                CheckResult("core: Gitea", False, "branch main is at nothing"),
            ]
        },
        pass_threshold=75,
        verified_at=datetime(2026, 11, 23, 12, 0, tzinfo=UTC),
        generation=1,
    )
    objs.custom.patch_namespaced_custom_object_status(
        "shadow.dev", V, objs.namespace, "shadowenvironments", "judged", {"status": {"verdict": verdict}}
    )
    stored = objs.get(ENVIRONMENT, "judged", V)
    assert stored is not None and stored["status"]["verdict"] == verdict


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (
            {"sources": [{"name": "a", "repo": "a", "upload": {}, "git": {"url": "https://x/a.git"}}]},
            "exactly one of git",
        ),
        (
            {"sources": [{"name": "a", "repo": "a", "path": "../escape", "upload": {}}]},
            "spec.sources[0].path",
        ),
        (
            {"sources": [{"name": "a", "repo": "a", "upload": {}}], "workspace": {"mountPath": "relative"}},
            "mountPath",
        ),
        (
            {
                "sources": [
                    {"name": "a", "repo": "o/a", "upload": {}},
                    {"name": "b", "repo": "o/a", "upload": {}},
                ]
            },
            "share one Gitea repo",
        ),
        (
            {
                "sources": [{"name": "a", "repo": "a", "upload": {}}],
                "gitRewrites": [{"from": "https://github.com/x", "to": "x"}],
            },
            "gitRewrites",
        ),
        (
            {
                "sources": [{"name": "a", "repo": "a", "upload": {}}],
                "gitea": {"persistence": {"retain": True}},
            },
            "set spec.gitea.persistence.enabled: true too, or drop retain",
        ),
    ],
)
def test_admission_rejects_bad_environments(objs: Objects, spec: dict[str, Any], message: str) -> None:
    with pytest.raises(ApiException) as err:
        objs.create(ENVIRONMENT, {"metadata": {"name": "bad"}, "spec": spec}, version=V)
    assert err.value.status == 422
    assert message in err.value.body


def test_sources_are_immutable(objs: Objects) -> None:
    objs.create(ENVIRONMENT, env_body("fixed", template="absent"), version=V)
    with pytest.raises(ApiException) as err:
        objs.custom.patch_namespaced_custom_object(
            "shadow.dev",
            V,
            objs.namespace,
            "shadowenvironments",
            "fixed",
            {"spec": {"sources": [{"name": "core", "repo": "other/repo", "upload": {}}]}},
        )
    assert err.value.status == 422 and "immutable" in err.value.body


def test_gitea_persistence_when_asked_for_and_immutable(objs: Objects) -> None:
    """persistence.enabled gives Gitea a claim of its own; the storage choice cannot change afterwards."""
    objs.create(TEMPLATE, template_body("workspace"))
    persistence = {"enabled": True, "size": "2Gi", "retain": True}
    objs.create(ENVIRONMENT, env_body("kept", gitea={"persistence": persistence}), version=V)
    apps = client.AppsV1Api(objs.api)

    [template] = wait_for(
        lambda: apps.read_namespaced_stateful_set("kept-gitea", objs.namespace).spec.volume_claim_templates,
        timeout=60,
        what="Gitea's StatefulSet with a claim template",
    )
    assert template.spec.resources.requests == {"storage": "2Gi"}
    wait_for(
        lambda: any(
            p.metadata.name == "data-kept-gitea-0"
            for p in objs.core.list_namespaced_persistent_volume_claim(objs.namespace).items
        ),
        timeout=60,
        what="Gitea's claim data-kept-gitea-0",
    )
    sts = apps.read_namespaced_stateful_set("kept-gitea", objs.namespace)
    assert sts.spec.persistent_volume_claim_retention_policy.when_deleted == "Retain"
    # retain may change (it is read when the environment goes); the storage may not.
    objs.custom.patch_namespaced_custom_object(
        "shadow.dev",
        V,
        objs.namespace,
        "shadowenvironments",
        "kept",
        {"spec": {"gitea": {"persistence": {"retain": False}}}},
    )
    for change in ({"enabled": False, "retain": False}, {"size": "3Gi"}):
        with pytest.raises(ApiException) as err:
            objs.custom.patch_namespaced_custom_object(
                "shadow.dev",
                V,
                objs.namespace,
                "shadowenvironments",
                "kept",
                {"spec": {"gitea": {"persistence": change}}},
            )
        assert err.value.status == 422 and "cannot change once the environment exists" in err.value.body
