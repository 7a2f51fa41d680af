"""Running as a ServiceAccount with exactly the RBAC the chart renders: the rendered objects applied (and
removed after), and a kubeconfig that authenticates with the account's token."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client, utils

KINDS = ("ServiceAccount", "Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding")


def rendered(release: str, namespace: str, values: list[str], *templates: str) -> list[dict[str, Any]]:
    """The ServiceAccounts and RBAC objects of the chart's `templates` as `helm template` renders them for
    `release` in `namespace` with these `--set`s."""
    import subprocess

    from tests.support.router import CHART, helm_binary

    shown = [f"--show-only={template}" for template in templates]
    out = subprocess.run(
        [helm_binary(), "template", release, str(CHART), "--namespace", namespace, *values, *shown],
        capture_output=True, text=True, check=True, timeout=120,
    ).stdout  # fmt: skip
    return [d for d in yaml.safe_load_all(out) if d and d["kind"] in KINDS]


@contextlib.contextmanager
def applied(k8s_api: client.ApiClient, docs: list[dict[str, Any]], home: str) -> Iterator[str]:
    """Create the namespace `home` and the rendered `docs` (a ServiceAccount in `home` among them) and yield the
    account's name; afterwards delete the cluster-scoped objects, the namespaced ones elsewhere, and `home`."""
    core, rbac = client.CoreV1Api(k8s_api), client.RbacAuthorizationV1Api(k8s_api)
    deletes = {
        "ClusterRole": lambda meta: rbac.delete_cluster_role(meta["name"]),
        "ClusterRoleBinding": lambda meta: rbac.delete_cluster_role_binding(meta["name"]),
        "Role": lambda meta: rbac.delete_namespaced_role(meta["name"], meta["namespace"]),
        "RoleBinding": lambda meta: rbac.delete_namespaced_role_binding(meta["name"], meta["namespace"]),
    }
    core.create_namespace({"metadata": {"name": home}})
    try:
        utils.create_from_yaml(k8s_api, yaml_objects=docs)
        (account,) = [d["metadata"]["name"] for d in docs if d["kind"] == "ServiceAccount"]
        yield account
    finally:
        for doc in docs:
            meta, delete = doc["metadata"], deletes.get(doc["kind"])
            if delete is not None and meta.get("namespace") != home:
                delete(meta)
        core.delete_namespace(home)


def token_kubeconfig(admin_kubeconfig: str, token: str, path: Path) -> str:
    """A kubeconfig for the admin kubeconfig's cluster that authenticates with `token`."""
    config = yaml.safe_load(Path(admin_kubeconfig).read_text())
    context = next(c for c in config["contexts"] if c["name"] == config["current-context"])["context"]
    cluster = next(c for c in config["clusters"] if c["name"] == context["cluster"])
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [cluster],
                "users": [{"name": "account", "user": {"token": token}}],
                "contexts": [{"name": "account", "context": {"cluster": cluster["name"], "user": "account"}}],
                "current-context": "account",
            }
        )
    )
    return str(path)


def render_rbac(release: str, release_namespace: str, served: str, *values: str) -> list[dict[str, Any]]:
    """The chart's RBAC and ServiceAccount for a release serving `served` (`values`: more --set)."""
    settings = [
        f"--set=operator.watchNamespaces={{{served}}}",
        "--set=operator.leaderElection.enabled=false",
        "--set=operator.replicas=1",
        *(f"--set={v}" for v in values),
    ]
    return rendered(
        release, release_namespace, settings, "templates/rbac.yaml", "templates/serviceaccount.yaml"
    )


def configuration(kubeconfig: str) -> client.Configuration:
    """A client configuration from a kubeconfig file (an account's, from token_kubeconfig)."""
    from kubernetes import config as kube_config

    configuration = client.Configuration()
    kube_config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
    return configuration
