"""A tenant, as a platform team sets one up on a shared cluster: a namespace the chart prepared
(`tenants.namespaces`, hack/kind/deploy.sh lists TENANT_NAMESPACE) and the built-in `edit` ClusterRole bound there,
nothing else. With only that, a user runs the whole CLI flow in their namespace and is refused in another.

The user is a ServiceAccount logged in the way managed clusters log users in: the kubeconfig names an exec
credential plugin (a script printing an ExecCredential with a token from `kubectl create token`), so no admin
credentials reach shadowctl and the token is fetched fresh on each run.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from kubernetes import client
from kubernetes import config as config_module
from kubernetes.client.exceptions import ApiException

from tests.e2e.cluster import CACHE, Cluster
from tests.e2e.test_cli_sdk import REQUESTS, TIMEOUT, ctl, ok
from tests.e2e.test_environment import python_package
from tests.support.tenant_pods import every_escape_is_refused

pytestmark = pytest.mark.e2e

# hack/kind/deploy.sh creates it and passes it to the chart as tenants.namespaces.
TENANT_NAMESPACE = "team-a"
KUBECTL = CACHE / "bin" / "kubectl"


def tenant_kubeconfig(cluster: Cluster, directory: Path, user: str, namespace: str) -> Path:
    """The admin kubeconfig's cluster (server, CA) with an exec-plugin user and `namespace` as the context's."""
    admin = yaml.safe_load(Path(cluster.kubeconfig).read_text())
    context = next(c for c in admin["contexts"] if c["name"] == admin["current-context"])["context"]
    server = next(c for c in admin["clusters"] if c["name"] == context["cluster"])
    plugin = directory / "token-plugin.sh"
    plugin.write_text(
        "#!/bin/sh\nset -e\n"
        'token=$("$KUBECTL" --kubeconfig "$ADMIN_KUBECONFIG" create token "$SA" -n "$SA_NAMESPACE" --duration 1h)\n'
        'printf \'{"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential",'
        '"status":{"token":"%s"}}\\n\' "$token"\n'
    )
    plugin.chmod(0o755)
    env = {
        "KUBECTL": str(KUBECTL),
        "ADMIN_KUBECONFIG": cluster.kubeconfig,
        "SA": user,
        "SA_NAMESPACE": namespace,
    }
    exec_user = {
        "apiVersion": "client.authentication.k8s.io/v1",
        "command": str(plugin),
        "env": [{"name": k, "value": v} for k, v in env.items()],
        "interactiveMode": "Never",
    }
    path = directory / "kubeconfig"
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [server],
                "users": [{"name": "tenant", "user": {"exec": exec_user}}],
                "contexts": [
                    {
                        "name": "tenant",
                        "context": {"cluster": server["name"], "user": "tenant", "namespace": namespace},
                    }
                ],
                "current-context": "tenant",
            }
        )
    )
    path.chmod(0o600)
    return path


@contextlib.contextmanager
def editor(cluster: Cluster, directory: Path, user: str) -> Iterator[Path]:
    """A ServiceAccount `user` in the tenant namespace with the built-in `edit` there and nothing else: its
    exec-plugin kubeconfig; the account and its binding go afterwards."""
    core = client.CoreV1Api(cluster.api)
    rbac = client.RbacAuthorizationV1Api(cluster.api)
    core.create_namespaced_service_account(
        TENANT_NAMESPACE, client.V1ServiceAccount(metadata=client.V1ObjectMeta(name=user))
    )
    binding = client.V1RoleBinding(
        metadata=client.V1ObjectMeta(name=f"{user}-edit"),
        role_ref=client.V1RoleRef(api_group="rbac.authorization.k8s.io", kind="ClusterRole", name="edit"),
        subjects=[client.RbacV1Subject(kind="ServiceAccount", name=user, namespace=TENANT_NAMESPACE)],
    )
    rbac.create_namespaced_role_binding(TENANT_NAMESPACE, binding)
    try:
        yield tenant_kubeconfig(cluster, directory, user, TENANT_NAMESPACE)
    finally:
        rbac.delete_namespaced_role_binding(f"{user}-edit", TENANT_NAMESPACE)
        core.delete_namespaced_service_account(user, TENANT_NAMESPACE)


def test_a_tenant_with_edit_runs_the_whole_flow_in_its_namespace_only(
    cluster: Cluster, tmp_path: Path
) -> None:
    stack = contextlib.ExitStack()
    core = client.CoreV1Api(cluster.api)
    suffix = uuid.uuid4().hex[:6]
    other_ns = f"team-b-{suffix}"
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=other_ns)))
    name = f"tenant-{suffix}"
    try:
        config = stack.enter_context(editor(cluster, tmp_path, f"alice-{suffix}"))

        def as_tenant(*args: str) -> subprocess.CompletedProcess[str]:
            return ctl(cluster, "--kubeconfig", str(config), *args)

        repo = python_package(tmp_path / "app")

        # No -n: the context's namespace, the tenant's.
        created = json.loads(
            ok(
                as_tenant(
                    "create", name, "--local", str(repo), "--verify", "cd app && python3 -c 'import shadowpkg'",
                    "--cpu", REQUESTS["cpu"], "--memory", REQUESTS["memory"], "--timeout", TIMEOUT, "-o", "json",
                )
            )
        )  # fmt: skip
        # -o json prints the object, as kubectl does.
        assert created["status"]["verdict"]["result"] == "PASS", created
        ok(
            as_tenant(
                "exec", name, "--", "sh", "-c", "echo 'VERSION = \"after\"' > app/shadowpkg/__init__.py"
            )
        )
        assert "M app/shadowpkg/__init__.py" in ok(as_tenant("diff", name, "--stat"))
        ok(as_tenant("promote", name, "--force"))
        assert (repo / "shadowpkg" / "__init__.py").read_text() == 'VERSION = "after"\n'
        ok(as_tenant("destroy", name))
        gone = as_tenant("status", name)
        assert gone.returncode == 1 and "does not exist" in gone.stderr

        # Elsewhere the same user is refused, in one line that says what is missing.
        refused = as_tenant("create", name, "-n", other_ns, "--local", str(repo), "--timeout", "60")
        assert refused.returncode == 1, refused
        assert "Traceback" not in refused.stderr and "forbidden" in refused.stderr.lower(), refused.stderr
        listed = as_tenant("list", "-n", other_ns)
        assert listed.returncode == 1 and "forbidden" in listed.stderr.lower(), listed.stderr
    finally:
        try:  # left behind only when the flow failed before destroy
            cluster.custom.delete_namespaced_custom_object(
                "shadow.dev", "v1alpha1", TENANT_NAMESPACE, "shadowenvironments", name
            )
        except ApiException as exc:
            if exc.status != 404:
                raise
        stack.close()
        core.delete_namespace(other_ns)


def test_a_tenant_with_edit_cannot_reach_the_node(cluster: Cluster, tmp_path: Path) -> None:
    """The built-in `edit` creates Pods, Deployments and Jobs directly: in a namespace the chart prepared,
    which the operator labels to enforce restricted, a privileged, hostPath or hostPID pod gets no node."""
    core = client.CoreV1Api(cluster.api)
    labels = core.read_namespace(TENANT_NAMESPACE).metadata.labels or {}
    assert labels.get("pod-security.kubernetes.io/enforce") == "restricted", labels
    prefix = f"esc-{uuid.uuid4().hex[:6]}-"
    try:
        with (
            editor(cluster, tmp_path, f"{prefix}mallory") as config,
            config_module.new_client_from_config(str(config)) as api,
        ):
            every_escape_is_refused(api, TENANT_NAMESPACE, prefix)
    finally:
        apps, batch = client.AppsV1Api(cluster.api), client.BatchV1Api(cluster.api)
        for deployment in apps.list_namespaced_deployment(TENANT_NAMESPACE).items:
            if deployment.metadata.name.startswith(prefix):
                apps.delete_namespaced_deployment(deployment.metadata.name, TENANT_NAMESPACE)
        for job in batch.list_namespaced_job(TENANT_NAMESPACE).items:
            if job.metadata.name.startswith(prefix):
                batch.delete_namespaced_job(
                    job.metadata.name, TENANT_NAMESPACE, propagation_policy="Background"
                )
        for pod in core.list_namespaced_pod(TENANT_NAMESPACE).items:
            if pod.metadata.name.startswith(prefix):
                core.delete_namespaced_pod(pod.metadata.name, TENANT_NAMESPACE)
