"""The Helm chart: lint, schema-valid manifests for Kubernetes 1.34, deterministic output, contract details.

Every manifest `helm template` renders is validated against the Kubernetes 1.34 OpenAPI schema
(kubernetes-validate, strict: unknown fields fail); custom resources are validated against the
openAPIV3Schema of the chart's own CRDs.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from shadow_operator.controllers.config import Config
from shadow_operator.resources.environment import build_gitea_statefulset

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "shadow-operator"
KUBERNETES_VERSION = "1.34.0"
SANDBOX_GROUPS = {"agents.x-k8s.io", "extensions.agents.x-k8s.io"}

# Value sets covering every template branch: defaults, everything on, an air-gapped install.
VALUE_SETS: dict[str, list[str]] = {
    "defaults": [],
    "everything": [
        "--set=warmPool.enabled=true",
        "--set=previewRouter.enabled=true",
        "--set=previewRouter.ingress.enabled=true",
        "--set=previewRouter.ingress.tlsSecret=preview-tls",
        "--set=previewRouter.ingress.className=nginx",
        "--set=previewRouter.sdk.authorizationMode=insecure-allow-all",
        "--set=previewRouter.sdk.trustPortForward=false",
        "--set=previewRouter.networkPolicy.sdkFrom[0].namespaceSelector.matchLabels.team=agents",
        "--set=previewRouter.sandboxNamespaces={team-a,team-b}",
        "--set=previewRouter.access=private",
        "--set=operator.watchNamespaces={team-a,team-b}",
        "--set=tenants.namespaces={team-c,team-a}",
        "--set=tenants.rbac.clusterReadSubjects[0].kind=Group",
        "--set=tenants.rbac.clusterReadSubjects[0].apiGroup=rbac.authorization.k8s.io",
        "--set=tenants.rbac.clusterReadSubjects[0].name=tenants",
        "--set=networkPolicy.clusterCIDRs={10.244.0.0/16,fd00:10:244::/56}",
        "--set=global.imagePullSecrets={regcred}",
        "--set=operator.extraEnv[0].name=EXTRA",
        "--set-string=operator.extraEnv[0].value=1",
        "--set=operator.tolerations[0].operator=Exists",
        "--set=operator.priorityClassName=system-cluster-critical",
        "--set=egressGateway.enabled=true",
        "--set=egressGateway.allowPrivateRanges={10.96.0.0/12}",
        "--set=egressGateway.replicas=2",
    ],
    "standalone": [
        "--set=operator.leaderElection.enabled=false",
        "--set=operator.replicas=1",
    ],
    "air-gapped": [
        "--set=global.imageRegistry=registry.internal:5000",
        "--set=operator.image.digest=sha256:" + "a" * 64,
        "--set=workspace.image.tag=dev",
        "--set=defaultTemplate.namespace=sandboxes",
        "--set=warmPool.enabled=true",
    ],
}


def _helm() -> str:
    candidates = [
        os.environ.get("HELM", ""),
        str(
            Path(os.environ.get("SHADOW_CACHE", Path.home() / ".cache" / "shadow-operator")) / "bin" / "helm"
        ),
        shutil.which("helm") or "",
    ]
    for candidate in candidates:
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    message = "helm not found: build it with `hack/build-tools.sh helm` (or set HELM)"
    if os.environ.get("SHADOW_REQUIRE_INTEGRATION") == "1":
        pytest.fail(message)
    pytest.skip(message)


@pytest.fixture(scope="module")
def helm() -> str:
    return _helm()


def run_helm(helm: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run([helm, *args], capture_output=True, text=True, check=check, timeout=120)


def render(helm: str, *values: str, include_crds: bool = True) -> str:
    args = ["template", "shadow", str(CHART), "--namespace", "shadow-system", *values]
    if include_crds:
        args.append("--include-crds")
    return run_helm(helm, *args).stdout


def documents(text: str) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(text) if doc]


def crd_schemas() -> dict[tuple[str, str, str], dict[str, Any]]:
    """(group, version, kind) -> openAPIV3Schema, from the chart's crds/."""
    schemas = {}
    for path in sorted((CHART / "crds").glob("*.yaml")):
        crd = yaml.safe_load(path.read_text())
        spec = crd["spec"]
        for version in spec["versions"]:
            key = (spec["group"], version["name"], spec["names"]["kind"])
            schemas[key] = version["schema"]["openAPIV3Schema"]
    return schemas


def by_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def operator_rbac(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    """The operator's own RBAC objects of this kind (not the tenants' roles, tenant-rbac.yaml)."""
    return [
        d
        for d in by_kind(docs, kind)
        if d["metadata"]["labels"].get("app.kubernetes.io/component") != "tenant-rbac"
    ]


def test_chart_has_crds_for_the_sandbox_api() -> None:
    kinds = {key[2] for key in crd_schemas()}
    assert {"Sandbox", "SandboxClaim", "SandboxTemplate", "SandboxWarmPool"} <= kinds


@pytest.mark.parametrize("values", VALUE_SETS.values(), ids=VALUE_SETS.keys())
def test_helm_lint(helm: str, values: list[str]) -> None:
    result = run_helm(helm, "lint", "--strict", str(CHART), *values, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("values", VALUE_SETS.values(), ids=VALUE_SETS.keys())
def test_every_rendered_manifest_is_valid(helm: str, values: list[str]) -> None:
    schemas = crd_schemas()
    docs = documents(render(helm, *values))
    assert docs, "the chart rendered nothing"
    for doc in docs:
        group, _, version = doc["apiVersion"].rpartition("/")
        name = f"{doc['kind']}/{doc['metadata']['name']}"
        if group in SANDBOX_GROUPS:
            schema = schemas.get((group, version, doc["kind"]))
            assert schema is not None, f"{name}: no CRD in the chart serves {doc['apiVersion']}"
            try:
                jsonschema.validate(doc, schema)
            except jsonschema.ValidationError as exc:
                pytest.fail(
                    f"{name} does not match its CRD schema: {exc.message} at {list(exc.absolute_path)}"
                )
        else:
            try:
                kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
            except kubernetes_validate.ValidationError as exc:
                pytest.fail(f"{name} is not a valid Kubernetes {KUBERNETES_VERSION} object: {exc.message}")


@pytest.mark.parametrize("values", VALUE_SETS.values(), ids=VALUE_SETS.keys())
def test_rendering_is_deterministic(helm: str, values: list[str]) -> None:
    # ArgoCD compares renders: anything random or time-based would show as permanent drift.
    assert render(helm, *values) == render(helm, *values)


def test_operator_deployment_contract(helm: str) -> None:
    docs = documents(render(helm, include_crds=False))
    (deployment,) = by_kind(docs, "Deployment")
    spec = deployment["spec"]
    # Two replicas behind a Lease, rolled one at a time without ever dropping below two.
    assert spec["replicas"] == 2
    assert spec["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
    }
    (container,) = spec["template"]["spec"]["containers"]
    assert container["args"][:2] == ["run", "--leader-elect"]
    assert "--standalone" not in container["args"]
    args = container["args"]
    election = {
        flag: args[args.index(flag) + 1]
        for flag in args
        if flag.startswith(("--lease", "--re", "--leader-election-"))
    }
    assert election == {
        "--leader-election-id": "shadow-shadow-operator",
        "--lease-duration": "15",
        "--renew-deadline": "10",
        "--retry-period": "2",
    }
    assert "http://0.0.0.0:8080/healthz" in container["args"]
    probe = container["livenessProbe"]["httpGet"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert probe["path"] == "/healthz" and ports[probe["port"]] == 8080
    assert ports["metrics"] == 9090
    env = {e["name"]: e.get("value") for e in container["env"]}
    fields = {
        e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in container["env"] if "valueFrom" in e
    }
    assert fields == {"POD_NAME": "metadata.name", "POD_NAMESPACE": "metadata.namespace"}
    assert env["SHADOW_LOG_FORMAT"] == "json"
    assert env["SHADOW_METRICS_PORT"] == "9090"
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["image"] == "ghcr.io/shadow-operator/operator:0.1.0"
    # Snapshot bundles are verified and pushed to Gitea from a writable emptyDir of bounded size.
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert env["SHADOW_GIT_WORK_DIR"] == mounts["git-work"] == "/var/lib/shadow-operator/git"
    assert env["SHADOW_MAX_BUNDLE_BYTES"] == "1073741824" and env["SHADOW_GIT_PUSH_CONCURRENCY"] == "2"
    assert (env["SHADOW_WARM_POOL_REFILL_DELAY"], env["SHADOW_WARM_POOL_REFILL_MAX_DELAY"]) == ("1", "10")
    volumes = {v["name"]: v for v in spec["template"]["spec"]["volumes"]}
    assert volumes["git-work"]["emptyDir"] == {"sizeLimit": "5Gi"}


def test_leader_election_may_act_on_its_lease_only(helm: str) -> None:
    docs = documents(render(helm, include_crds=False))
    (role,) = operator_rbac(docs, "Role")
    assert role["metadata"]["namespace"] == "shadow-system"
    assert role["rules"] == [
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["get", "create", "update"]}
    ]
    (binding,) = operator_rbac(docs, "RoleBinding")
    assert binding["metadata"]["namespace"] == "shadow-system"
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": role["metadata"]["name"],
    }
    (account,) = by_kind(docs, "ServiceAccount")
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": account["metadata"]["name"], "namespace": "shadow-system"}
    ]
    (cluster_role,) = operator_rbac(docs, "ClusterRole")
    assert not any("coordination.k8s.io" in rule["apiGroups"] for rule in cluster_role["rules"])


def test_without_leader_election_one_standalone_replica_is_replaced(helm: str) -> None:
    docs = documents(render(helm, *VALUE_SETS["standalone"], include_crds=False))
    (deployment,) = by_kind(docs, "Deployment")
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["args"][:2] == ["run", "--standalone"]
    assert not any(arg.startswith("--lea") for arg in container["args"])
    assert not operator_rbac(docs, "Role") and not operator_rbac(docs, "RoleBinding")


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        (
            ["--set=operator.leaderElection.enabled=false"],
            "operator.replicas > 1 needs operator.leaderElection.enabled",
        ),
        (
            ["--set=operator.leaderElection.leaseDuration=10"],
            "leaseDuration must be longer than renewDeadline",
        ),
        (
            ["--set=operator.leaderElection.retryPeriod=9"],
            "renewDeadline must be longer than 1.2 x retryPeriod",
        ),
    ],
)
def test_unsafe_replica_and_election_settings_are_refused(
    helm: str, values: list[str], expected: str
) -> None:
    result = run_helm(helm, "template", "shadow", str(CHART), *values, check=False)
    assert result.returncode != 0
    assert expected in result.stderr


def test_default_template_runs_the_workspace_runtime(helm: str) -> None:
    docs = documents(render(helm, include_crds=False))
    (template,) = by_kind(docs, "SandboxTemplate")
    assert template["metadata"]["namespace"] == "shadow-system"
    pod = template["spec"]["podTemplate"]["spec"]
    assert pod["automountServiceAccountToken"] is False
    assert pod["securityContext"]["runAsUser"] == 1000
    (container,) = pod["containers"]
    assert container["image"] == "ghcr.io/shadow-operator/workspace:0.1.0"
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"runtime": 8888, "preview": 3000}
    assert container["readinessProbe"]["tcpSocket"] == {"port": 8888}
    assert not by_kind(docs, "SandboxWarmPool"), "the warm pool is opt-in"


def test_default_template_runtime_class(helm: str) -> None:
    (template,) = by_kind(
        documents(render(helm, "--set=defaultTemplate.runtimeClassName=gvisor", include_crds=False)),
        "SandboxTemplate",
    )
    assert template["spec"]["podTemplate"]["spec"]["runtimeClassName"] == "gvisor"
    (default,) = by_kind(documents(render(helm, include_crds=False)), "SandboxTemplate")
    assert "runtimeClassName" not in default["spec"]["podTemplate"]["spec"]
    result = run_helm(
        helm, "template", "shadow", str(CHART), "--set=defaultTemplate.runtimeClassName=No_Such", check=False
    )
    assert result.returncode != 0 and "runtimeClassName" in result.stderr


def test_global_registry_redirects_every_image(helm: str) -> None:
    docs = documents(render(helm, *VALUE_SETS["air-gapped"], "--set=previewRouter.enabled=true"))
    images = []
    for doc in docs:
        pod = (doc.get("spec") or {}).get("template", {}).get("spec") or (doc.get("spec") or {}).get(
            "podTemplate", {}
        ).get("spec")
        if pod:
            images += [c["image"] for c in pod["containers"]]
    # operator, workspace, and the router's nginx + router-auth (the operator image).
    assert len(images) == 4
    assert all(image.startswith("registry.internal:5000/shadow-operator/") for image in images), images
    assert "registry.internal:5000/shadow-operator/operator@sha256:" + "a" * 64 in images
    assert "registry.internal:5000/shadow-operator/workspace:dev" in images


def test_warm_pool_targets_the_default_template(helm: str) -> None:
    docs = documents(
        render(helm, "--set=warmPool.enabled=true", "--set=warmPool.replicas=3", include_crds=False)
    )
    (pool,) = by_kind(docs, "SandboxWarmPool")
    assert pool["spec"] == {"replicas": 3, "sandboxTemplateRef": {"name": "workspace"}}


def test_warm_pool_without_template_is_refused(helm: str) -> None:
    result = run_helm(
        helm,
        "template",
        "shadow",
        str(CHART),
        "--set=warmPool.enabled=true",
        "--set=defaultTemplate.enabled=false",
        check=False,
    )
    assert result.returncode != 0
    assert "warmPool.enabled needs defaultTemplate.enabled" in result.stderr


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("operator.workers=0", "/operator/workers"),
        ("operator.replicas=-1", "/operator/replicas"),
        ("operator.leaderElection.retryPeriod=0", "/operator/leaderElection/retryPeriod"),
        ("operator.logFormat=xml", "/operator/logFormat"),
        ("operator.gitPush.maxBundleBytes=10", "/operator/gitPush/maxBundleBytes"),
        ("operator.image.digest=latest", "/operator/image/digest"),
        ("operator.unknownKey=1", "unknownKey"),
        ("previewRouter.domain=Not_A_Domain", "/previewRouter/domain"),
        ("previewRouter.access=secret", "/previewRouter/access"),
        ("previewRouter.sdk.authorizationMode=basic", "/previewRouter/sdk/authorizationMode"),
        # The old modes: `none` and `tokenreview` (authenticated, never authorized) are gone.
        ("previewRouter.sdk.authorizationMode=none", "/previewRouter/sdk/authorizationMode"),
        ("previewRouter.sdk.authorizationMode=tokenreview", "/previewRouter/sdk/authorizationMode"),
        ("previewRouter.maxTokenSeconds=0", "/previewRouter/maxTokenSeconds"),
        ("previewRouter.ports.auth=0", "/previewRouter/ports/auth"),
        ("previewRouter.sandboxNamespaces={Bad_NS}", "/previewRouter/sandboxNamespaces"),
        ("networkPolicy.clusterCIDRs={pods}", "/networkPolicy/clusterCIDRs"),
        ("podSecurity.allowHostPath=yes", "/podSecurity/allowHostPath"),
        ("operator.runtimeMaxAnswerBytes=1024", "/operator/runtimeMaxAnswerBytes"),
        ("operator.warmPoolRefill.delay=-1", "/operator/warmPoolRefill/delay"),
    ],
)
def test_values_schema_rejects_bad_input(helm: str, value: str, expected: str) -> None:
    result = run_helm(helm, "template", "shadow", str(CHART), f"--set={value}", check=False)
    assert result.returncode != 0
    assert expected in result.stderr


def granted_by(rules: list[dict[str, Any]]) -> dict[tuple[str, str], set[str]]:
    """(apiGroup, resource) -> verbs, from RBAC rules that never use wildcards."""
    granted: dict[tuple[str, str], set[str]] = {}
    for rule in rules:
        assert "*" not in rule["verbs"] and "*" not in rule["resources"] and "*" not in rule["apiGroups"]
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                granted.setdefault((group, resource), set()).update(rule["verbs"])
    return granted


RW = {"get", "list", "watch", "create", "update", "patch", "delete"}
# What the operator reads cluster-wide in every mode: classes, and kopf's discovery and namespace tracking.
CLUSTER_READS = {
    ("storage.k8s.io", "storageclasses"): {"get", "list"},
    ("snapshot.storage.k8s.io", "volumesnapshotclasses"): {"get", "list"},
    ("node.k8s.io", "runtimeclasses"): {"get"},
    ("apiextensions.k8s.io", "customresourcedefinitions"): {"get", "list", "watch"},
    ("", "namespaces"): {"get", "list", "watch"},
}


def assert_namespaced_rights(granted: dict[tuple[str, str], set[str]]) -> None:
    """Exactly what the operator does in a namespace it serves: no more."""
    assert granted[("agents.x-k8s.io", "sandboxes")] == RW
    for sub in ("sandboxes/status", "sandboxes/scale"):
        assert {"get", "update", "patch"} <= granted[("agents.x-k8s.io", sub)]
    for kind in ("sandboxclaims", "sandboxtemplates", "sandboxwarmpools"):
        assert {"get", "list", "watch", "patch"} <= granted[("extensions.agents.x-k8s.io", kind)]
        assert "create" not in granted[("extensions.agents.x-k8s.io", kind)], "users create these, not us"
        assert "patch" in granted[("extensions.agents.x-k8s.io", f"{kind}/status")]
    assert "patch" in granted[("extensions.agents.x-k8s.io", "sandboxwarmpools/scale")]
    for resource in ("pods", "services", "persistentvolumeclaims", "secrets"):
        assert granted[("", resource)] == RW
    assert granted[("networking.k8s.io", "networkpolicies")] == RW
    assert granted[("", "events")] == {"create", "patch"}
    # ShadowEnvironments: read and status, a Gitea StatefulSet each.
    assert "create" not in granted[("shadow.dev", "shadowenvironments")], "users create these, not us"
    assert "patch" in granted[("shadow.dev", "shadowenvironments/status")]
    assert granted[("apps", "statefulsets")] == RW
    # Forks: snapshots of workspace volumes (never their contents, which are cluster-scoped).
    assert granted[("snapshot.storage.k8s.io", "volumesnapshots")] == {
        "get",
        "list",
        "create",
        "patch",
        "delete",
    }
    assert ("snapshot.storage.k8s.io", "volumesnapshotcontents") not in granted
    # Nothing beyond the list above: no nodes, no RBAC, no cluster-scoped writes.
    allowed_groups = SANDBOX_GROUPS | {
        "shadow.dev",
        "apps",
        "snapshot.storage.k8s.io",
        "",
        "networking.k8s.io",
    }
    assert {group for group, _ in granted} <= allowed_groups | {"events.k8s.io"}
    core = {resource for group, resource in granted if group == ""}
    assert core == {"pods", "services", "persistentvolumeclaims", "secrets", "events"}


def test_serving_the_whole_cluster_takes_one_least_privilege_cluster_role(helm: str) -> None:
    docs = documents(render(helm, include_crds=False))
    (role,) = operator_rbac(docs, "ClusterRole")
    granted = granted_by(role["rules"])
    for key, verbs in CLUSTER_READS.items():
        assert granted.pop(key) == verbs
    assert_namespaced_rights(granted)
    (binding,) = operator_rbac(docs, "ClusterRoleBinding")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]


def test_watch_namespaces_grant_namespaced_rights_only_there(helm: str) -> None:
    docs = documents(render(helm, "--set=operator.watchNamespaces={team-a,team-b}", include_crds=False))
    # Cluster-wide: the class and discovery reads, nothing else (no secrets, pods, services, ... anywhere).
    (cluster_role,) = operator_rbac(docs, "ClusterRole")
    assert granted_by(cluster_role["rules"]) == CLUSTER_READS
    (account,) = by_kind(docs, "ServiceAccount")
    subject = {"kind": "ServiceAccount", "name": account["metadata"]["name"], "namespace": "shadow-system"}
    (cluster_binding,) = operator_rbac(docs, "ClusterRoleBinding")
    assert cluster_binding["roleRef"]["name"] == cluster_role["metadata"]["name"]
    assert cluster_binding["subjects"] == [subject]
    # Per served namespace: a Role with the namespaced rights, bound to the operator's account.
    roles = {
        r["metadata"]["namespace"]: r
        for r in operator_rbac(docs, "Role")
        if "leader" not in r["metadata"]["name"]
    }
    assert sorted(roles) == ["team-a", "team-b"]
    for role in roles.values():
        assert_namespaced_rights(granted_by(role["rules"]))
    bindings = {
        b["metadata"]["namespace"]: b
        for b in operator_rbac(docs, "RoleBinding")
        if "leader" not in b["metadata"]["name"]
    }
    assert sorted(bindings) == ["team-a", "team-b"]
    for namespace, binding in bindings.items():
        assert binding["roleRef"] == {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "Role",
            "name": roles[namespace]["metadata"]["name"],
        }
        assert binding["subjects"] == [subject]
    # The operator is told the same namespaces, so it watches each of them and never the cluster.
    (deployment,) = by_kind(docs, "Deployment")
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert [args[i + 1] for i, arg in enumerate(args) if arg == "--namespace"] == ["team-a", "team-b"]


def router_docs(helm: str, *values: str) -> list[dict[str, Any]]:
    return documents(render(helm, "--set=previewRouter.enabled=true", *values, include_crds=False))


def router_deployment(docs: list[dict[str, Any]]) -> dict[str, Any]:
    (deployment,) = [
        d for d in by_kind(docs, "Deployment") if d["metadata"]["name"].endswith("preview-router")
    ]
    return deployment


def test_preview_router_routes_only_through_router_auth(helm: str) -> None:
    docs = router_docs(helm, "--set=previewRouter.domain=preview.dev.test")
    (config,) = [d for d in by_kind(docs, "ConfigMap") if d["metadata"]["name"].endswith("preview-router")]
    conf = config["data"]["router.conf"]
    assert r'\.preview\.dev\.test$";' in conf
    # Every proxied request is decided by router-auth; the upstream is the address it returns, never a name
    # built from the Host header, and nginx resolves no names at all.
    assert conf.count("auth_request /_shadow/auth;") == 2
    # Asked again (never from the cache, and the cached answer replaced) when the upstream refused the
    # connection: its Pod went down. A request with a body is held the same way, then sent back with a 307.
    assert conf.count("auth_request /_shadow/auth-retry;") == 4
    assert conf.count("proxy_pass http://$shadow_upstream;") == 4
    assert (
        conf.count("proxy_cache_bypass 1;") == 2 and conf.count("error_page 502 = $shadow_on_refused;") == 2
    )
    assert '  ""      @shadow_retry;' in conf and "  default @shadow_resend;" in conf
    # A request for a sleeping sandbox waits in router-auth up to holdSeconds (15): nginx waits longer.
    assert conf.count("proxy_read_timeout 25s;") == 6
    assert "svc.cluster.local" not in conf and "resolver" not in conf
    assert 'proxy_set_header Authorization "";' in conf
    assert "proxy_set_header X-Sandbox-Runtime-Token $shadow_runtime_token;" in conf
    assert "proxy_cache_valid 200 5s;" in conf
    # The SDK path's authorization sees the address the connection came from (loopback: a port-forward), set by
    # nginx over any header of that name, in the auth subrequest and the refusal page alike; and nginx never
    # reuses an answer for another peer. No real_ip module rewrites $remote_addr from a header.
    sdk_server = conf[conf.index("listen 8081") :]
    assert sdk_server.count("proxy_set_header X-Shadow-Peer $remote_addr;") == 5
    assert 'proxy_cache_key "sdk|$remote_addr|' in sdk_server
    assert "real_ip" not in conf and "set_real_ip_from" not in conf
    assert "proxy_set_header Upgrade $http_upgrade;" in conf and "proxy_buffering off;" in conf
    assert "client_max_body_size 1g;" in conf and "proxy_read_timeout 3600s;" in conf
    deployment = router_deployment(docs)
    operator = next(d for d in by_kind(docs, "Deployment") if d is not deployment)
    env = {e["name"]: e.get("value") for e in operator["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["SHADOW_PREVIEW_DOMAIN"] == "preview.dev.test"
    assert "SHADOW_INGRESS_NAMESPACES" not in env
    # A config change rolls the router; the same config keeps the same pod template.
    other = router_deployment(router_docs(helm, "--set=previewRouter.domain=other.test"))
    checksum = deployment["spec"]["template"]["metadata"]["annotations"]["checksum/config"]
    assert checksum != other["spec"]["template"]["metadata"]["annotations"]["checksum/config"]


def test_router_pod_runs_nginx_and_router_auth(helm: str) -> None:
    docs = router_docs(helm)
    deployment = router_deployment(docs)
    assert deployment["spec"]["replicas"] == 2
    pod = deployment["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False
    containers = {c["name"]: c for c in pod["containers"]}
    assert set(containers) == {"nginx", "router-auth"}
    auth = containers["router-auth"]
    assert auth["image"] == "ghcr.io/shadow-operator/operator:0.1.0"
    args = auth["args"]
    flags = {
        flag: args[args.index(flag) + 1]
        for flag in ("--listen", "--domain", "--default-access", "--authz-mode", "--max-token-seconds")
    }
    assert flags == {
        "--listen": "127.0.0.1:8090",
        "--domain": "preview.example.com",
        "--default-access": "public",
        "--authz-mode": "subjectaccessreview",
        "--max-token-seconds": "86400",
    }
    assert "--trust-loopback" in args
    # A mesh sidecar would make every connection loopback, i.e. a trusted port-forward.
    annotations = deployment["spec"]["template"]["metadata"]["annotations"]
    assert (
        annotations["sidecar.istio.io/inject"] == "false" and annotations["linkerd.io/inject"] == "disabled"
    )
    assert args[args.index("--namespace") + 1] == "shadow-system"
    assert args[args.index("--preview-port") + 1] == "3000"
    # Only router-auth holds API credentials.
    mounts = {m["mountPath"] for m in auth["volumeMounts"]}
    assert "/var/run/secrets/kubernetes.io/serviceaccount" in mounts
    assert all("serviceaccount" not in m["mountPath"] for m in containers["nginx"]["volumeMounts"])
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["tmp"]["emptyDir"]["medium"] == "Memory"
    assert volumes["preview-keys"]["secret"] == {
        "secretName": "shadow-shadow-operator-preview-keys",
        "optional": True,
    }
    (pdb,) = by_kind(docs, "PodDisruptionBudget")
    assert pdb["spec"]["minAvailable"] == 1
    services = {s["metadata"]["name"]: s for s in by_kind(docs, "Service")}
    sdk = services["sandbox-router-svc"]
    assert sdk["metadata"]["namespace"] == "shadow-system"
    assert sdk["spec"]["ports"] == [{"name": "http", "port": 8080, "targetPort": "sdk", "protocol": "TCP"}]
    preview = services["shadow-shadow-operator-preview-router"]
    assert (
        preview["spec"]["ports"][0]["port"] == 80 and preview["spec"]["ports"][0]["targetPort"] == "preview"
    )
    assert not by_kind(docs, "Ingress")


def test_router_metrics_per_sandbox_from_nginx_access_log(helm: str) -> None:
    docs = router_docs(helm, "--set=previewRouter.metrics.maxSandboxes=50")
    (config,) = [d for d in by_kind(docs, "ConfigMap") if d["metadata"]["name"].endswith("preview-router")]
    conf = config["data"]["router.conf"]
    # Only requests router-auth routed are sent (it names their sandbox), to its UDP port on loopback; the
    # stdout access log stays beside them.
    assert conf.count("auth_request_set $shadow_sandbox $upstream_http_x_shadow_sandbox;") == 4
    for route in ("preview", "sdk"):
        assert (
            "access_log syslog:server=127.0.0.1:8091,nohostname,tag=shadow_metrics "
            f"shadow_metrics_{route} if=$shadow_sandbox;"
        ) in conf
    assert conf.count("access_log /dev/stdout;") == 2
    deployment = router_deployment(docs)
    template = deployment["spec"]["template"]
    annotations = template["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true" and annotations["prometheus.io/port"] == "9091"
    auth = next(c for c in template["spec"]["containers"] if c["name"] == "router-auth")
    args = auth["args"]
    assert args[args.index("--metrics-listen") + 1] == ":9091"
    assert args[args.index("--access-log-listen") + 1] == "127.0.0.1:8091"
    assert args[args.index("--metrics-max-sandboxes") + 1] == "50"
    assert auth["ports"] == [{"name": "metrics", "containerPort": 9091, "protocol": "TCP"}]
    services = {s["metadata"]["name"]: s for s in by_kind(docs, "Service")}
    metrics = services["shadow-shadow-operator-preview-router-metrics"]
    assert metrics["spec"]["ports"] == [
        {"name": "metrics", "port": 9091, "targetPort": "metrics", "protocol": "TCP"}
    ]
    # The preview Service (what an Ingress points at) never carries the metrics port.
    assert [p["name"] for p in services["shadow-shadow-operator-preview-router"]["spec"]["ports"]] == ["http"]

    off = router_docs(helm, "--set=previewRouter.metrics.enabled=false")
    (config,) = [d for d in by_kind(off, "ConfigMap") if d["metadata"]["name"].endswith("preview-router")]
    assert "syslog" not in config["data"]["router.conf"]
    assert "--metrics-listen" not in str(router_deployment(off))
    assert "shadow-shadow-operator-preview-router-metrics" not in {
        s["metadata"]["name"] for s in by_kind(off, "Service")
    }


def test_router_auth_reads_only_what_it_routes(helm: str) -> None:
    docs = router_docs(helm, "--set=previewRouter.sandboxNamespaces={team-a,team-b}")
    roles = [r for r in by_kind(docs, "Role") if r["metadata"]["name"].endswith("preview-router")]
    assert sorted(r["metadata"]["namespace"] for r in roles) == ["team-a", "team-b"]
    for role in roles:
        for rule in role["rules"]:
            # patch: Sandboxes only, for shadow.dev/resume-requested and shadow.dev/last-activity.
            allowed = (
                {"get", "list", "watch", "patch"}
                if rule["resources"] == ["sandboxes"]
                else {"get", "list", "watch"}
            )
            assert set(rule["verbs"]) <= allowed
        assert {res for rule in role["rules"] for res in rule["resources"]} == {
            "sandboxes",
            "sandboxtemplates",
            "pods",
            "secrets",
        }
    # The SDK path asks the API server who a bearer token is and what it may do (in every mode: private
    # sandboxes need it even with insecure-allow-all), and nothing more.
    cluster_roles = {r["metadata"]["name"]: r for r in by_kind(docs, "ClusterRole")}
    review = cluster_roles["shadow-shadow-operator-preview-router-access-review"]
    assert review["rules"] == [
        {"apiGroups": ["authentication.k8s.io"], "resources": ["tokenreviews"], "verbs": ["create"]},
        {"apiGroups": ["authorization.k8s.io"], "resources": ["subjectaccessreviews"], "verbs": ["create"]},
    ]
    (binding,) = [
        b for b in by_kind(docs, "ClusterRoleBinding") if b["roleRef"]["name"] == review["metadata"]["name"]
    ]
    assert binding["subjects"] == [
        {
            "kind": "ServiceAccount",
            "name": "shadow-shadow-operator-preview-router",
            "namespace": "shadow-system",
        }
    ]
    # What SDK callers are checked for, aggregated where pods/exec already is (admin, edit).
    proxy = cluster_roles["shadow-shadow-operator-preview-router-sandbox-proxy"]
    assert proxy["rules"] == [
        {"apiGroups": ["agents.x-k8s.io"], "resources": ["sandboxes/proxy"], "verbs": ["create"]}
    ]
    labels = proxy["metadata"]["labels"]
    assert labels["rbac.authorization.k8s.io/aggregate-to-edit"] == "true"
    assert labels["rbac.authorization.k8s.io/aggregate-to-admin"] == "true"
    assert "rbac.authorization.k8s.io/aggregate-to-view" not in labels
    insecure = router_docs(helm, "--set=previewRouter.sdk.authorizationMode=insecure-allow-all")
    assert review["metadata"]["name"] in {r["metadata"]["name"] for r in by_kind(insecure, "ClusterRole")}
    without_sdk = router_docs(helm, "--set=previewRouter.sdk.enabled=false")
    (role,) = [r for r in by_kind(without_sdk, "Role") if r["metadata"]["name"].endswith("preview-router")]
    assert all("secrets" not in rule["resources"] for rule in role["rules"])
    assert "sandbox-router-svc" not in {s["metadata"]["name"] for s in by_kind(without_sdk, "Service")}
    assert all("preview-router" not in r["metadata"]["name"] for r in by_kind(without_sdk, "ClusterRole"))


def test_router_may_not_list_or_watch_secrets(helm: str) -> None:
    """Issue 28 L4: the internet-facing router gets a sandbox's runtime token Secret by name, never a listing
    (or a watch) of every Secret of the namespaces it serves."""
    docs = router_docs(helm, "--set=previewRouter.sandboxNamespaces={team-a,team-b}")
    roles = [r for r in by_kind(docs, "Role") if r["metadata"]["name"].endswith("preview-router")]
    assert len(roles) == 2
    for role in roles:
        secrets = [
            rule for rule in role["rules"] if "secrets" in rule["resources"] or "*" in rule["resources"]
        ]
        assert [rule["verbs"] for rule in secrets] == [["get"]], role
    router_account = "shadow-shadow-operator-preview-router"
    for kind in ("RoleBinding", "ClusterRoleBinding"):
        for binding in by_kind(docs, kind):
            if any(s.get("name") == router_account for s in binding["subjects"]):
                assert binding["roleRef"]["name"].startswith(router_account), binding


def test_operator_publishes_each_served_namespaces_link_keys(
    helm: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 28 L3: the operator reads the router's keys Secret (by name) and writes each served namespace
    its own link keys (the Secret shadow-preview-link-keys, by name after creating it)."""
    docs = router_docs(helm, "--set=previewRouter.sandboxNamespaces={team-a,team-b}")
    (operator,) = [d for d in by_kind(docs, "Deployment") if not d["metadata"]["name"].endswith("router")]
    env = {e["name"]: e.get("value") for e in operator["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["SHADOW_PREVIEW_KEYS_SECRET"] == "shadow-system/shadow-shadow-operator-preview-keys"
    assert env["SHADOW_PREVIEW_NAMESPACES"] == "team-a,team-b"
    for name in ("SHADOW_PREVIEW_KEYS_SECRET", "SHADOW_PREVIEW_NAMESPACES"):
        monkeypatch.setenv(name, str(env[name]))
    config = Config.from_env()
    assert config.preview_keys_secret == "shadow-system/shadow-shadow-operator-preview-keys"
    assert config.preview_namespaces == ("team-a", "team-b")
    for bad in ("no-slash", "/name", "ns/", "a/b/c"):
        monkeypatch.setenv("SHADOW_PREVIEW_KEYS_SECRET", bad)
        with pytest.raises(ValueError, match=r"SHADOW_PREVIEW_KEYS_SECRET: .* is not NAMESPACE/NAME"):
            Config.from_env()
    roles = {
        (r["metadata"]["namespace"], r["metadata"]["name"]): r["rules"]
        for r in by_kind(docs, "Role")
        if "preview-keys" in r["metadata"]["name"] or "preview-link-keys" in r["metadata"]["name"]
    }
    assert roles[("shadow-system", "shadow-shadow-operator-preview-keys")] == [
        {
            "apiGroups": [""],
            "resources": ["secrets"],
            "resourceNames": ["shadow-shadow-operator-preview-keys"],
            "verbs": ["get"],
        }
    ]
    for namespace in ("team-a", "team-b"):
        assert roles[(namespace, "shadow-shadow-operator-preview-link-keys")] == [
            {"apiGroups": [""], "resources": ["secrets"], "verbs": ["create"]},
            {
                "apiGroups": [""],
                "resources": ["secrets"],
                "resourceNames": ["shadow-preview-link-keys"],
                "verbs": ["get", "update"],
            },
        ]
    bindings = [
        b
        for b in by_kind(docs, "RoleBinding")
        if "preview-" in b["roleRef"]["name"] and "keys" in b["roleRef"]["name"]
    ]
    assert len(bindings) == 3
    assert all(b["subjects"][0]["name"] == "shadow-shadow-operator" for b in bindings)


def test_router_in_its_own_namespace_with_a_wildcard_ingress(helm: str) -> None:
    docs = router_docs(
        helm,
        "--set=previewRouter.namespace=agent-sandbox-system",
        "--set=previewRouter.domain=preview.dev.test",
        "--set=previewRouter.ingress.enabled=true",
        "--set=previewRouter.ingress.tlsSecret=wildcard-tls",
    )
    (ingress,) = by_kind(docs, "Ingress")
    assert ingress["metadata"]["namespace"] == "agent-sandbox-system"
    assert ingress["spec"]["tls"] == [{"hosts": ["*.preview.dev.test"], "secretName": "wildcard-tls"}]
    assert ingress["spec"]["rules"][0]["host"] == "*.preview.dev.test"
    services = {s["metadata"]["name"]: s["metadata"]["namespace"] for s in by_kind(docs, "Service")}
    assert services["sandbox-router-svc"] == "agent-sandbox-system"
    deployment = router_deployment(docs)
    assert deployment["metadata"]["namespace"] == "agent-sandbox-system"
    operator = next(d for d in by_kind(docs, "Deployment") if d is not deployment)
    env = {e["name"]: e.get("value") for e in operator["spec"]["template"]["spec"]["containers"][0]["env"]}
    # The sandboxes' managed NetworkPolicy must admit the router where it runs.
    assert env["SHADOW_INGRESS_NAMESPACES"] == "agent-sandbox-system"


def test_router_has_its_own_narrow_network_policy(helm: str) -> None:
    docs = router_docs(helm)
    (policy,) = [p for p in by_kind(docs, "NetworkPolicy") if "preview-router" in p["metadata"]["name"]]
    spec = policy["spec"]
    assert spec["policyTypes"] == ["Ingress", "Egress"]
    # In: only its listeners (the SDK one from anywhere unless sdkFrom narrows it). Out: sandboxes, cluster
    # DNS, the API server's ports.
    open_ports, sdk_ports = spec["ingress"]
    assert {p["port"] for p in open_ports["ports"]} == {8080, 9091} and "from" not in open_ports
    assert sdk_ports == {"ports": [{"protocol": "TCP", "port": 8081}]}
    peers = [{"namespaceSelector": {"matchLabels": {"team": "agents"}}}]
    narrowed_sdk = router_docs(
        helm, "--set=previewRouter.networkPolicy.sdkFrom[0].namespaceSelector.matchLabels.team=agents"
    )
    (policy,) = [
        p for p in by_kind(narrowed_sdk, "NetworkPolicy") if "preview-router" in p["metadata"]["name"]
    ]
    assert policy["spec"]["ingress"][1] == {"ports": [{"protocol": "TCP", "port": 8081}], "from": peers}
    to_sandboxes, to_dns, to_api = spec["egress"]
    assert to_sandboxes["to"][0]["podSelector"]["matchExpressions"] == [
        {"key": "agents.x-k8s.io/sandbox-name-hash", "operator": "Exists"}
    ]
    assert to_dns["to"][0]["podSelector"] == {"matchLabels": {"k8s-app": "kube-dns"}}
    assert [p["port"] for p in to_api["ports"]] == [443, 6443] and "to" not in to_api
    narrowed = router_docs(helm, "--set=previewRouter.networkPolicy.apiServerCIDRs[0]=172.18.0.2/32")
    (policy,) = [p for p in by_kind(narrowed, "NetworkPolicy") if "preview-router" in p["metadata"]["name"]]
    assert policy["spec"]["egress"][2]["to"] == [{"ipBlock": {"cidr": "172.18.0.2/32"}}]
    off = router_docs(helm, "--set=previewRouter.networkPolicy.enabled=false")
    assert not [p for p in by_kind(off, "NetworkPolicy") if "preview-router" in p["metadata"]["name"]]


def operator_env(docs: list[dict[str, Any]]) -> dict[str, str]:
    (deployment,) = by_kind(docs, "Deployment")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    return {e["name"]: e["value"] for e in container["env"] if "value" in e}


def test_pod_security_is_refused_at_admission_and_by_the_operator(helm: str) -> None:
    docs = documents(render(helm, include_crds=False))
    (policy,) = by_kind(docs, "ValidatingAdmissionPolicy")
    (binding,) = by_kind(docs, "ValidatingAdmissionPolicyBinding")
    assert binding["spec"] == {"policyName": policy["metadata"]["name"], "validationActions": ["Deny"]}
    rules = {
        (tuple(r["apiGroups"]), tuple(r["resources"]))
        for r in policy["spec"]["matchConstraints"]["resourceRules"]
    }
    assert rules == {
        (("agents.x-k8s.io",), ("sandboxes",)),
        (("extensions.agents.x-k8s.io",), ("sandboxtemplates",)),
    }
    assert policy["spec"]["failurePolicy"] == "Fail"
    messages = [v["message"] for v in policy["spec"]["validations"]]
    # At the default level (restricted), the level decides; only the service account has a value of its own.
    assert any('Pod Security "restricted"' in m for m in messages)
    for value in ("allowPrivileged", "allowHostNamespaces", "allowHostPath"):
        assert any(
            f"set podSecurity.level=privileged and podSecurity.{value}=true in the shadow release" in m
            for m in messages
        ), value
    assert any("set podSecurity.allowServiceAccount=true in the shadow release" in m for m in messages)
    # The capabilities, sysctls and SELinux types it lets through are the operator's own lists.
    from shadow_operator.resources.podsecurity import SAFE_CAPABILITIES, SAFE_SELINUX_TYPES, SAFE_SYSCTLS

    expressions = [v["expression"] for v in policy["spec"]["validations"]]
    for marker, names in (
        ("cap in [", SAFE_CAPABILITIES),
        ("s.name in [", SAFE_SYSCTLS),
        ("s.seLinuxOptions.type in [", SAFE_SELINUX_TYPES),
    ):
        (expression,) = [e for e in expressions if marker in e]
        listed = expression.split(marker, 1)[1].split("]", 1)[0]
        assert {name.strip(" '") for name in listed.split(",")} == names, marker
    env = operator_env(docs)
    assert env["SHADOW_POD_SECURITY_LEVEL"] == "restricted"
    assert [
        env[f"SHADOW_ALLOW_{name}"]
        for name in ("PRIVILEGED", "HOST_NAMESPACES", "HOST_PATH", "SERVICE_ACCOUNT")
    ] == ["false"] * 4


def test_pod_security_values_drop_what_they_allow(helm: str) -> None:
    privileged = "--set=podSecurity.level=privileged"
    docs = documents(render(helm, privileged, "--set=podSecurity.allowHostPath=true", include_crds=False))
    (policy,) = by_kind(docs, "ValidatingAdmissionPolicy")
    assert not any("hostPath" in v["expression"] for v in policy["spec"]["validations"])
    assert operator_env(docs)["SHADOW_ALLOW_HOST_PATH"] == "true"
    everything = [
        f"--set=podSecurity.{v}=true"
        for v in ("allowPrivileged", "allowHostNamespaces", "allowHostPath", "allowServiceAccount")
    ]
    for values in ([privileged, *everything], ["--set=podSecurity.admissionPolicy=false"]):
        docs = documents(render(helm, *values, include_crds=False))
        assert not by_kind(docs, "ValidatingAdmissionPolicy") and not by_kind(
            docs, "ValidatingAdmissionPolicyBinding"
        )


@pytest.mark.parametrize("level", ["baseline", "restricted"])
def test_a_value_that_loosens_what_the_level_refuses_fails_the_install(helm: str, level: str) -> None:
    result = run_helm(
        helm, "template", "shadow", str(CHART), f"--set=podSecurity.level={level}",
        "--set=podSecurity.allowHostNamespaces=true", check=False,
    )  # fmt: skip
    assert result.returncode != 0
    assert (
        f'podSecurity.allowHostNamespaces=true needs podSecurity.level=privileged: Pod Security "{level}"'
        in result.stderr
    )


def test_tenant_namespaces_are_labelled_by_the_operator_alone(helm: str) -> None:
    docs = documents(
        render(
            helm,
            "--set=tenants.namespaces={team-a,team-b}",
            "--set=podSecurity.level=baseline",
            include_crds=False,
        )
    )
    env = operator_env(docs)
    assert env["SHADOW_POD_SECURITY_NAMESPACES"] == "team-a,team-b"
    assert (
        env["SHADOW_POD_SECURITY_LEVEL"],
        env["SHADOW_POD_SECURITY_WARN"],
        env["SHADOW_POD_SECURITY_AUDIT"],
    ) == ("baseline", "restricted", "restricted")
    (role,) = [r for r in by_kind(docs, "ClusterRole") if r["metadata"]["name"].endswith("-namespace-labels")]
    # Patch on those namespaces by name, nothing else.
    assert role["rules"] == [
        {
            "apiGroups": [""],
            "resources": ["namespaces"],
            "verbs": ["patch"],
            "resourceNames": ["team-a", "team-b"],
        }
    ]
    (binding,) = [
        b for b in by_kind(docs, "ClusterRoleBinding") if b["metadata"]["name"].endswith("-namespace-labels")
    ]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    # No tenants, or labels off: no permission and nothing to label.
    for values in (
        [],
        ["--set=tenants.namespaces={team-a}", "--set=podSecurity.namespaceLabels.enabled=false"],
    ):
        docs = documents(render(helm, *values, include_crds=False))
        assert "SHADOW_POD_SECURITY_NAMESPACES" not in operator_env(docs)
        assert not [
            r for r in by_kind(docs, "ClusterRole") if r["metadata"]["name"].endswith("-namespace-labels")
        ]


def test_pod_security_binds_only_the_served_namespaces(helm: str) -> None:
    docs = documents(render(helm, "--set=operator.watchNamespaces={team-a,team-b}", include_crds=False))
    (binding,) = by_kind(docs, "ValidatingAdmissionPolicyBinding")
    assert binding["spec"]["matchResources"]["namespaceSelector"]["matchExpressions"] == [
        {"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["team-a", "team-b"]}
    ]


def test_cluster_cidrs_and_answer_bound_reach_the_operator(helm: str) -> None:
    docs = documents(
        render(
            helm,
            "--set=networkPolicy.clusterCIDRs={34.118.224.0/20,2600:1900:4000:1::/64}",
            "--set=operator.runtimeMaxAnswerBytes=1048576",
            include_crds=False,
        )
    )
    env = operator_env(docs)
    assert env["SHADOW_CLUSTER_CIDRS"] == "34.118.224.0/20,2600:1900:4000:1::/64"
    assert env["SHADOW_RUNTIME_MAX_ANSWER_BYTES"] == "1048576"
    assert "SHADOW_CLUSTER_CIDRS" not in operator_env(documents(render(helm, include_crds=False)))


def test_gitea_resources_reach_every_environments_gitea(helm: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A platform team sizes the per-environment Gitea from the chart; the operator builds it with that."""
    env = operator_env(documents(render(helm, "--set=gitea.resources.requests.cpu=10m", include_crds=False)))
    monkeypatch.setenv("SHADOW_GITEA_RESOURCES", env["SHADOW_GITEA_RESOURCES"])
    resources = Config.from_env().gitea_resources
    assert resources == {"requests": {"cpu": "10m", "memory": "128Mi"}, "limits": {"memory": "1Gi"}}
    sts = build_gitea_statefulset(
        {"metadata": {"name": "demo", "namespace": "team"}, "spec": {}},
        image="gitea:1",
        cluster_domain="cluster.local",
        resources=dict(resources),
    )
    assert sts["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"]["cpu"] == "10m"
    for bad, message in (("{", "not JSON"), ('{"requests": 1}', "resource names"), ("[]", "only")):
        monkeypatch.setenv("SHADOW_GITEA_RESOURCES", bad)
        with pytest.raises(ValueError, match=f"SHADOW_GITEA_RESOURCES: .*{message}"):
            Config.from_env()


@pytest.mark.parametrize("name", sorted(VALUE_SETS))
def test_the_operator_reads_every_setting_the_chart_renders(
    helm: str, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The operator's own settings parser takes the Deployment's environment as rendered: a number Helm
    prints in exponent form (4.194304e+06) crash-looped the operator before."""
    (deployment,) = [
        d
        for d in by_kind(documents(render(helm, *VALUE_SETS[name], include_crds=False)), "Deployment")
        if d["metadata"]["labels"].get("app.kubernetes.io/component") == "operator"
    ]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    for entry in container["env"]:
        if "value" in entry:
            monkeypatch.setenv(entry["name"], entry["value"])
    config = Config.from_env()
    assert config.runtime_max_answer_bytes == 4 * 1024 * 1024


def test_clients_find_the_release_wherever_it_is(helm: str) -> None:
    """The discovery ConfigMap in the release namespace and each tenant namespace names the release, its Lease,
    Deployment and preview keys; tenants may get the Lease and Deployment by name, nothing else there."""
    from shadow_operator.sdk.discovery import OperatorLocation

    docs = documents(render(helm, "--set=tenants.namespaces={team-a}", include_crds=False))
    maps = {
        d["metadata"]["namespace"]: d
        for d in by_kind(docs, "ConfigMap")
        if d["metadata"]["name"] == "shadow-operator-discovery"
    }
    assert sorted(maps) == ["shadow-system", "team-a"]
    (deployment,) = by_kind(docs, "Deployment")
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    where = OperatorLocation.from_config_map(maps["team-a"])
    assert (where.release, where.namespace, where.leader_election) == ("shadow", "shadow-system", True)
    assert where.deployment == deployment["metadata"]["name"]
    assert where.lease == args[args.index("--leader-election-id") + 1]
    assert (
        where.keys_secret == "shadow-shadow-operator-preview-keys" and where.keys_namespace == "shadow-system"
    )
    (status,) = [r for r in by_kind(docs, "Role") if r["metadata"]["name"].endswith("-status-read")]
    assert all(
        rule["verbs"] == ["get"] and rule["resourceNames"] == [where.lease] for rule in status["rules"]
    )
    standalone = documents(render(helm, *VALUE_SETS["standalone"], include_crds=False))
    (cm,) = [
        d for d in by_kind(standalone, "ConfigMap") if d["metadata"]["name"] == "shadow-operator-discovery"
    ]
    assert OperatorLocation.from_config_map(cm).leader_election is False


def test_the_egress_gateway_is_what_sandboxes_network_policy_admits(helm: str) -> None:
    from shadow_operator.api import constants as c

    docs = documents(render(helm, "--set=egressGateway.enabled=true", include_crds=False))
    gateway = next(
        d for d in by_kind(docs, "Deployment") if d["metadata"]["name"] == "shadow-shadow-operator-egress"
    )
    labels = gateway["spec"]["template"]["metadata"]["labels"]
    assert c.EGRESS_GATEWAY_LABELS.items() <= labels.items()
    (container,) = gateway["spec"]["template"]["spec"]["containers"]
    assert {p["containerPort"] for p in container["ports"]} == {c.EGRESS_PROXY_PORT, c.EGRESS_ADMIN_PORT}
    assert (
        container["args"][container["args"].index("--key-secret") + 1]
        == "shadow-system/shadow-shadow-operator-egress-key"
    )
    operator = next(
        d for d in by_kind(docs, "Deployment") if d["metadata"]["name"] == "shadow-shadow-operator"
    )
    env = {e["name"]: e.get("value") for e in operator["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert (
        env["SHADOW_EGRESS_PROXY"]
        == f"shadow-shadow-operator-egress.shadow-system.svc.cluster.local:{c.EGRESS_PROXY_PORT}"
    )
    # Its decision log is Events on the tenants' Sandboxes: it may write them (create, then count in their
    # series), never read or delete them.
    role = next(
        d for d in by_kind(docs, "ClusterRole") if d["metadata"]["name"] == "shadow-shadow-operator-egress"
    )
    events = [r for r in role["rules"] if "events" in r["resources"]]
    assert events == [{"apiGroups": ["events.k8s.io"], "resources": ["events"], "verbs": ["create", "patch"]}]
    # The key is the gateway's to make: no render carries it.
    assert not [d for d in by_kind(docs, "Secret") if "egress" in d["metadata"]["name"]]
    # Off by default: nothing of it is rendered, and the operator is not told of a gateway.
    default = documents(render(helm, include_crds=False))
    assert not [d for d in default if "egress" in d["metadata"]["name"]]


def test_the_egress_gateway_writes_secrets_in_its_own_namespace_only_and_may_run_replicas(helm: str) -> None:
    one = documents(render(helm, "--set=egressGateway.enabled=true", include_crds=False))
    mine = [d for d in one if d["metadata"]["name"] == "shadow-shadow-operator-egress"]
    # Its key and the namespaces' CAs: get and create on Secrets by a Role in the release namespace; no
    # cluster-wide grant creates or changes a Secret.
    (role,) = by_kind(mine, "Role")
    assert role["metadata"]["namespace"] == "shadow-system"
    assert role["rules"] == [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get", "create"]}]
    (cluster_role,) = by_kind(mine, "ClusterRole")
    for rule in cluster_role["rules"]:
        if "secrets" in rule["resources"]:
            assert set(rule["verbs"]) <= {"get", "list", "watch"}
    (deployment,) = by_kind(mine, "Deployment")
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"] == {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0}}
    assert not by_kind(mine, "PodDisruptionBudget")
    two = documents(render(helm, "--set=egressGateway.enabled=true", "--set=egressGateway.replicas=2"))
    mine = [d for d in two if d["metadata"]["name"] == "shadow-shadow-operator-egress"]
    (deployment,) = by_kind(mine, "Deployment")
    assert deployment["spec"]["replicas"] == 2
    (budget,) = by_kind(mine, "PodDisruptionBudget")
    assert budget["spec"]["minAvailable"] == 1
    assert (
        budget["spec"]["selector"]["matchLabels"].items()
        <= deployment["spec"]["template"]["metadata"]["labels"].items()
    )
