"""A real ArgoCD (core install, built from its Go module) installs the chart and a team's environments from a
git server on the cluster: app-of-apps, as a platform team runs it. The tests run in order, each on what the
previous one left: the chart syncs (CRDs first, no manual step) and stays in sync after a hard refresh; the
team's Application turns Healthy once its environment is Ready with its verdict; a broken environment shows
Degraded with its failure code; an idle one Suspended; removing the Applications removes everything but the
CRDs (ArgoCD, like Helm, never deletes them)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tests.e2e.cluster import OPERATOR_NAMESPACE, RELEASE, Cluster, condition, eventually, is_ready, pod_ready
from tests.e2e_argocd.gitops import (
    ARGOCD_NS,
    CHART_APP,
    GIT_URL,
    PACKAGE,
    ROOT_APP,
    TEAM_APP,
    TEAM_NS,
    GitServer,
    application,
    apply_app,
    environment,
    get_app,
    health,
    out_of_sync,
    platform_apps,
    refresh,
    resource,
    sync_status,
    team_objects,
)

# Each test waits for environments on one shared 2-CPU node: longer than the suite's default of 300 s.
pytestmark = [pytest.mark.argocd, pytest.mark.timeout(900)]

CHART_CRDS = (
    "sandboxes.agents.x-k8s.io",
    "sandboxclaims.extensions.agents.x-k8s.io",
    "sandboxtemplates.extensions.agents.x-k8s.io",
    "sandboxwarmpools.extensions.agents.x-k8s.io",
    "shadowenvironments.shadow.dev",
)
SYNC_TIMEOUT = 420.0
ENV_TIMEOUT = 600.0
IDLE_SECONDS = 60
BROKEN = environment("broken", f"{GIT_URL}/gitops/does-not-exist.git")


def crd(cluster: Cluster, name: str) -> client.V1CustomResourceDefinition | None:
    try:
        return client.ApiextensionsV1Api(cluster.api).read_custom_resource_definition(name)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def push_platform(
    git_server: GitServer, chart_dir: Path, *, tenant: bool, extra: tuple[dict[str, Any], ...] = ()
) -> None:
    files: dict[str, str | Path] = {"charts/shadow-operator": chart_dir}
    files.update(platform_apps(tenant))
    files.update(team_objects(*extra, idle_timeout=IDLE_SECONDS))
    git_server.push("platform", files, "platform: shadow-operator and team-a")


def synced_and_healthy(cluster: Cluster, name: str) -> dict[str, Any] | None:
    app = get_app(cluster, name)
    return app if sync_status(app) == "Synced" and health(app) == "Healthy" else None


def refreshed(cluster: Cluster, name: str, kind: str) -> dict[str, Any]:
    """Refresh the Application and wait until ArgoCD has done it (it removes the annotation)."""
    refresh(cluster, name, kind)

    def done() -> dict[str, Any] | None:
        app = get_app(cluster, name) or {}
        pending = ((app.get("metadata") or {}).get("annotations") or {}).get("argocd.argoproj.io/refresh")
        return app if app and not pending else None

    return eventually(done, f"Application {name} {kind}-refreshed", 120)


@pytest.fixture(scope="module")
def root(cluster: Cluster, git_server: GitServer, chart_dir: Path) -> dict[str, Any]:
    """The package and platform repositories pushed (no team Application yet) and the root Application
    applied: the one object made by hand, as ArgoCD's own docs bootstrap an app-of-apps."""
    existing = {name: crd(cluster, name) is not None for name in CHART_CRDS}
    git_server.push("shadowpkg", dict(PACKAGE), "shadowpkg 0.1.0")
    push_platform(git_server, chart_dir, tenant=False)
    body = application(ROOT_APP, "apps", ARGOCD_NS)
    apply_app(cluster, body)
    return {"crds_before": existing, "started": time.time()}


def test_chart_syncs_with_crds_first_and_no_drift_after_hard_refresh(
    cluster: Cluster, root: dict[str, Any]
) -> None:
    app = eventually(
        lambda: synced_and_healthy(cluster, CHART_APP),
        f"Application {CHART_APP} Synced and Healthy",
        SYNC_TIMEOUT,
    )
    pods = cluster.core.list_namespaced_pod(
        OPERATOR_NAMESPACE, label_selector="app.kubernetes.io/component=operator"
    )
    assert [p.metadata.name for p in pods.items if pod_ready(p)], "no Ready operator pod"
    assert (app["status"].get("sync") or {}).get("revision"), app["status"]
    # The CRDs are applied in the same sync as the objects that need them (the chart's SandboxTemplates):
    # ArgoCD orders them first, nobody applies them by hand. Created by it when the cluster had none.
    for name in CHART_CRDS:
        obj = crd(cluster, name)
        assert obj is not None, f"CRD {name} missing"
        entry = resource(app, "CustomResourceDefinition", name)
        assert entry.get("status") == "Synced", f"CRD {name} is not in the chart's Application: {entry}"
        if not root["crds_before"][name]:
            assert obj.metadata.creation_timestamp.timestamp() >= root["started"] - 1, name
    template = cluster.get(TEAM_NS, "sandboxtemplates", "workspace")
    assert template is not None, "the chart's default template in team-a"

    # Nothing random in the chart, nothing the operator changes in fields ArgoCD owns: after a hard refresh
    # (manifests rendered again, no cache) every object is still Synced and no self-heal sync ran.
    syncs = len(app["status"].get("history") or [])
    app = refreshed(cluster, CHART_APP, "hard")
    time.sleep(20)  # a drift would show within a reconciliation; selfHeal would then add a sync
    app = get_app(cluster, CHART_APP) or {}
    assert sync_status(app) == "Synced", out_of_sync(app)
    assert not out_of_sync(app), out_of_sync(app)
    assert health(app) == "Healthy", app["status"].get("health")
    assert len(app["status"].get("history") or []) == syncs, app["status"].get("history")
    assert synced_and_healthy(cluster, ROOT_APP), get_app(cluster, ROOT_APP)


def test_team_application_healthy_once_environment_ready_with_verdict(
    cluster: Cluster, root: dict[str, Any], git_server: GitServer, chart_dir: Path
) -> None:
    push_platform(git_server, chart_dir, tenant=True)
    refresh(cluster, ROOT_APP)

    def healthy() -> dict[str, Any] | None:
        app = get_app(cluster, TEAM_APP)
        env = cluster.get(TEAM_NS, "shadowenvironments", "shop")
        if health(app) != "Healthy":
            return None
        # Healthy is never reported before the environment is Ready with its verdict.
        assert is_ready(env), (env or {}).get("status")
        return app

    app = eventually(healthy, f"Application {TEAM_APP} Healthy", ENV_TIMEOUT)
    env = cluster.get(TEAM_NS, "shadowenvironments", "shop") or {}
    assert env["status"]["verdict"]["result"] == "PASS", env["status"]["verdict"]
    assert (condition(env, "Verified") or {}).get("status") == "True"
    assert env["status"]["sources"][0]["commit"], env["status"]["sources"]
    assert resource(app, "ShadowEnvironment", "shop").get("health", {}).get("status") == "Healthy"
    assert resource(app, "SandboxClaim", "scratch").get("health", {}).get("status") == "Healthy"
    assert sync_status(app) == "Synced", out_of_sync(app)


def test_broken_environment_is_degraded_with_its_failure_code(
    cluster: Cluster, root: dict[str, Any], git_server: GitServer, chart_dir: Path
) -> None:
    push_platform(git_server, chart_dir, tenant=True, extra=(BROKEN,))
    refresh(cluster, TEAM_APP)

    def degraded() -> dict[str, Any] | None:
        app = get_app(cluster, TEAM_APP)
        entry = resource(app, "ShadowEnvironment", "broken").get("health") or {}
        return app if entry.get("status") == "Degraded" and health(app) == "Degraded" else None

    app = eventually(degraded, "the broken environment Degraded in ArgoCD", ENV_TIMEOUT)
    message = resource(app, "ShadowEnvironment", "broken")["health"].get("message", "")
    assert message.startswith("SourceFetchFailed: "), message
    assert "does-not-exist" in message, message

    # Removed from git, it is pruned.
    push_platform(git_server, chart_dir, tenant=True)
    refresh(cluster, TEAM_APP)
    eventually(
        lambda: cluster.get(TEAM_NS, "shadowenvironments", "broken") is None or None,
        "the broken environment pruned",
        300,
    )


def test_idle_environment_is_suspended_not_progressing(cluster: Cluster, root: dict[str, Any]) -> None:
    def suspended() -> dict[str, Any] | None:
        app = get_app(cluster, TEAM_APP)
        entry = resource(app, "ShadowEnvironment", "shop").get("health") or {}
        return app if entry.get("status") == "Suspended" else None

    app = eventually(suspended, f"shop Suspended in ArgoCD after {IDLE_SECONDS}s idle", 300)
    env = cluster.get(TEAM_NS, "shadowenvironments", "shop") or {}
    assert env["status"]["idle"]["suspendedAt"], env["status"]
    assert health(app) == "Suspended", app["status"].get("health")
    assert sync_status(app) == "Synced", out_of_sync(app)


def leftovers(cluster: Cluster, namespace: str, prefixes: tuple[str, ...]) -> list[str]:
    found = [f"pod/{p.metadata.name}" for p in cluster.core.list_namespaced_pod(namespace).items]
    found += [
        f"pvc/{p.metadata.name}"
        for p in cluster.core.list_namespaced_persistent_volume_claim(namespace).items
    ]
    found += [
        f"{kind}/{o.metadata.name}"
        for kind, items in (
            ("secret", cluster.core.list_namespaced_secret(namespace).items),
            ("service", cluster.core.list_namespaced_service(namespace).items),
        )
        for o in items
        if o.metadata.name.startswith(prefixes)
    ]
    return found


def test_deleting_the_applications_removes_everything(
    cluster: Cluster, root: dict[str, Any], git_server: GitServer, chart_dir: Path
) -> None:
    # The team's Application leaves git: the root prunes it, its finalizer deletes what it made, and the
    # operator (still running) finalizes the environment: no Pod, volume, Secret or Service is left.
    push_platform(git_server, chart_dir, tenant=False)
    refresh(cluster, ROOT_APP)
    eventually(lambda: get_app(cluster, TEAM_APP) is None or None, f"Application {TEAM_APP} deleted", 300)
    assert cluster.get(TEAM_NS, "shadowenvironments", "shop") is None
    assert not cluster.list(TEAM_NS, "sandboxclaims")
    assert not cluster.list(TEAM_NS, "sandboxes")
    eventually(
        lambda: not leftovers(cluster, TEAM_NS, ("shop", "scratch")) or None,
        "no Pod, PVC, Secret or Service of team-a's environment and claim",
        300,
    )

    # The root goes: the chart's Application with it, and everything the chart made but its CRDs, which
    # ArgoCD never deletes on a cascade (controller/appcontroller.go shouldBeDeleted), as Helm keeps crds/.
    # They carry no tracking annotation and keep the chart's part-of label: a later `helm install` of the
    # chart (hack/kind/deploy.sh) adopts them and meets no other object it does not own.
    cluster.custom.delete_namespaced_custom_object(
        "argoproj.io", "v1alpha1", ARGOCD_NS, "applications", ROOT_APP
    )
    eventually(
        lambda: (get_app(cluster, ROOT_APP) is None and get_app(cluster, CHART_APP) is None) or None,
        "the root and chart Applications deleted",
        300,
    )
    for name in CHART_CRDS:
        obj = crd(cluster, name)
        assert obj is not None, f"CRD {name} was deleted with the Application"
        assert "argocd.argoproj.io/tracking-id" not in (obj.metadata.annotations or {}), name
        assert (obj.metadata.labels or {}).get("app.kubernetes.io/part-of") == "shadow-operator", name
    selector = f"app.kubernetes.io/instance={RELEASE}"
    rbac = client.RbacAuthorizationV1Api(cluster.api)
    admission = client.AdmissionregistrationV1Api(cluster.api)
    apps = client.AppsV1Api(cluster.api)

    listers = {
        "clusterrole": rbac.list_cluster_role,
        "clusterrolebinding": rbac.list_cluster_role_binding,
        "validatingadmissionpolicy": admission.list_validating_admission_policy,
        "validatingadmissionpolicybinding": admission.list_validating_admission_policy_binding,
        "deployment": apps.list_deployment_for_all_namespaces,
        "serviceaccount": cluster.core.list_service_account_for_all_namespaces,
        "configmap": cluster.core.list_config_map_for_all_namespaces,
        "role": rbac.list_role_for_all_namespaces,
        "rolebinding": rbac.list_role_binding_for_all_namespaces,
    }

    def orphans() -> list[str]:
        return [
            "/".join(filter(None, (kind, o.metadata.namespace, o.metadata.name)))
            for kind, list_all in listers.items()
            for o in list_all(label_selector=selector).items
        ]

    eventually(lambda: not orphans() or None, f"no object labelled {selector} left", 180)
    assert not orphans()
    eventually(
        lambda: TEAM_NS not in {n.metadata.name for n in cluster.core.list_namespace().items} or None,
        f"namespace {TEAM_NS} (the root's) deleted",
        300,
    )
