"""The GitOps side of the ArgoCD tests: the git server's repositories, what a platform team and a team put in
them, and reading ArgoCD's Applications.

Repositories (on the Gitea hack/kind/argocd.sh runs as gitops-git in namespace argocd):
  gitops/platform   apps/ (the root Application's path: the team-a namespace and two Applications),
                    charts/shadow-operator (the released chart), tenants/team-a (the team's objects)
  gitops/shadowpkg  the Python package team-a's ShadowEnvironment is made from (a git source)
"""

from __future__ import annotations

import base64
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from kubernetes.client.exceptions import ApiException

from tests.e2e.cluster import OPERATOR_NAMESPACE, RELEASE, Cluster
from tests.support.hostile_repo import git

ARGOCD_NS = "argocd"
GIT_URL = f"http://gitops-git.{ARGOCD_NS}.svc.cluster.local:3000"
PLATFORM_REPO = f"{GIT_URL}/gitops/platform.git"
PACKAGE_REPO = f"{GIT_URL}/gitops/shadowpkg.git"
TEAM_NS = "team-a"
ROOT_APP, CHART_APP, TEAM_APP = "gitops", "shadow-operator", "team-a"
ARGO_GROUP, ARGO_VERSION = "argoproj.io", "v1alpha1"
FINALIZER = "resources-finalizer.argocd.argoproj.io"


@dataclass
class GitServer:
    """Pushes commits to the git server through a port-forward, as a person with push rights would."""

    url: str
    user: str
    password: str
    workdir: Path

    def push(self, repo: str, files: dict[str, str | Path], message: str) -> str:
        """Make the repository's main branch hold exactly `files` (path: text, or a directory to copy);
        returns the commit. The repository is created by the first push."""
        tree = self.workdir / repo
        if tree.exists():
            shutil.rmtree(tree)
        tree.mkdir(parents=True)
        for path, content in files.items():
            target = tree / path
            target.parent.mkdir(parents=True, exist_ok=True)
            if isinstance(content, Path):
                shutil.copytree(content, target)
            else:
                target.write_text(content)
        git(tree, "init", "-q", "-b", "main")
        git(tree, "add", "-A")
        git(tree, "commit", "-q", "-m", message)
        auth = base64.b64encode(f"{self.user}:{self.password}".encode()).decode()
        git(
            tree,
            "-c",
            f"http.extraHeader=Authorization: Basic {auth}",
            "push",
            "-q",
            "--force",
            f"{self.url}/{self.user}/{repo}.git",
            "main",
        )
        return git(tree, "rev-parse", "HEAD")


def dump(*objects: dict[str, Any]) -> str:
    return "---\n".join(yaml.safe_dump(o, sort_keys=False) for o in objects)


# ------------------------------------------------------------------------------------------- contents
def application(
    name: str, path: str, namespace: str, *, helm: dict[str, Any] | None = None, wave: int = 0
) -> dict[str, Any]:
    """An Application of the platform repository, automated with prune (what is deleted from git goes)
    and the resources finalizer (deleting the Application deletes what it made)."""
    source: dict[str, Any] = {"repoURL": PLATFORM_REPO, "targetRevision": "main", "path": path}
    if helm:
        source["helm"] = helm
    return {
        "apiVersion": f"{ARGO_GROUP}/{ARGO_VERSION}",
        "kind": "Application",
        "metadata": {
            "name": name,
            "namespace": ARGOCD_NS,
            "finalizers": [FINALIZER],
            "annotations": {"argocd.argoproj.io/sync-wave": str(wave)},
        },
        "spec": {
            "project": "default",
            "source": source,
            "destination": {"server": "https://kubernetes.default.svc", "namespace": namespace},
            "syncPolicy": {
                "automated": {"prune": True, "selfHeal": True},
                "syncOptions": ["CreateNamespace=true"],
                # The team's Application may sync before the chart has created the CRDs of its objects.
                "retry": {"limit": 20, "backoff": {"duration": "5s", "factor": 2, "maxDuration": "30s"}},
            },
        },
    }


# The values a platform team sets on this cluster (the same as hack/kind/deploy.sh's release): images come
# from the released chart's defaults (pinned by digest in the local registry); one 2-CPU node, so the
# environments' Gitea and the default template ask for 10m of CPU.
CHART_VALUES: dict[str, Any] = {
    "tenants": {"namespaces": [TEAM_NS]},
    "networkPolicy": {"clusterCIDRs": ["10.244.0.0/16", "10.96.0.0/16"]},
    "gitea": {"resources": {"requests": {"cpu": "10m"}}},
    "defaultTemplate": {"resources": {"requests": {"cpu": "10m"}}},
}


def platform_apps(tenant: bool) -> dict[str, str]:
    """apps/: the tenant namespace (wave -1), the chart's Application and, with `tenant`, team-a's."""
    namespace = {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": TEAM_NS, "annotations": {"argocd.argoproj.io/sync-wave": "-1"}},
    }
    apps = {
        "apps/namespaces.yaml": dump(namespace),
        "apps/shadow-operator.yaml": dump(
            application(
                CHART_APP,
                "charts/shadow-operator",
                OPERATOR_NAMESPACE,
                helm={"releaseName": RELEASE, "valuesObject": CHART_VALUES},
            )
        ),
    }
    if tenant:
        apps["apps/team-a.yaml"] = dump(application(TEAM_APP, "tenants/team-a", TEAM_NS))
    return apps


def environment(name: str, url: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "shadow.dev/v1alpha1",
        "kind": "ShadowEnvironment",
        "metadata": {"name": name, "namespace": TEAM_NS},
        "spec": {
            "sources": [{"name": "pkg", "repo": "gitops/shadowpkg", "git": {"url": url, "ref": "main"}}],
            "workspace": {"size": "1Gi"},
            "gitea": {"persistence": {"size": "1Gi"}},
            "resources": {"requests": {"cpu": "10m", "memory": "64Mi"}, "limits": {"memory": "1Gi"}},
            "verify": {
                "commands": [
                    {
                        "name": "import",
                        "command": "cd pkg && python3 -c 'import shadowpkg; print(shadowpkg.VERSION)'",
                    }
                ]
            },
            **spec,
        },
    }


# Workspaces may not reach cluster addresses (the managed NetworkPolicy); the team opens the one it clones
# its git sources from (policies add up).
GIT_EGRESS = {
    "apiVersion": "networking.k8s.io/v1",
    "kind": "NetworkPolicy",
    "metadata": {"name": "workspaces-to-gitops-git", "namespace": TEAM_NS},
    "spec": {
        "podSelector": {"matchLabels": {"app.kubernetes.io/name": "shadow-workspace"}},
        "policyTypes": ["Egress"],
        "egress": [
            {
                "to": [
                    {
                        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ARGOCD_NS}},
                        "podSelector": {"matchLabels": {"app.kubernetes.io/name": "gitops-git"}},
                    }
                ],
                "ports": [{"protocol": "TCP", "port": 3000}],
            }
        ],
    },
}

CLAIM = {
    "apiVersion": "extensions.agents.x-k8s.io/v1beta1",
    "kind": "SandboxClaim",
    "metadata": {"name": "scratch", "namespace": TEAM_NS},
    "spec": {"sandboxTemplateRef": {"name": "workspace"}},
}


def team_objects(*extra: dict[str, Any], idle_timeout: int | None = None) -> dict[str, str]:
    """tenants/team-a/: the environment `shop` from the git source, a claim, the egress to the git server."""
    spec = {"idleTimeoutSeconds": idle_timeout} if idle_timeout else {}
    files = {
        "tenants/team-a/shop.yaml": dump(environment("shop", PACKAGE_REPO, **spec)),
        "tenants/team-a/scratch.yaml": dump(CLAIM),
        "tenants/team-a/egress.yaml": dump(GIT_EGRESS),
    }
    for obj in extra:
        files[f"tenants/team-a/{obj['metadata']['name']}.yaml"] = dump(obj)
    return files


PACKAGE = {
    "pyproject.toml": '[build-system]\nrequires = ["setuptools"]\nbuild-backend = "setuptools.build_meta"\n\n'
    '[project]\nname = "shadowpkg"\nversion = "0.1.0"\n\n[tool.setuptools]\npackages = ["shadowpkg"]\n',
    "shadowpkg/__init__.py": 'VERSION = "from gitops"\n',
}


# -------------------------------------------------------------------------------------------- ArgoCD
def get_app(cluster: Cluster, name: str) -> dict[str, Any] | None:
    try:
        return dict(
            cluster.custom.get_namespaced_custom_object(
                ARGO_GROUP, ARGO_VERSION, ARGOCD_NS, "applications", name
            )
        )
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def apply_app(cluster: Cluster, body: dict[str, Any]) -> None:
    try:
        cluster.custom.create_namespaced_custom_object(
            ARGO_GROUP, ARGO_VERSION, ARGOCD_NS, "applications", body
        )
    except ApiException as exc:
        if exc.status != 409:
            raise
        cluster.custom.patch_namespaced_custom_object(
            ARGO_GROUP,
            ARGO_VERSION,
            ARGOCD_NS,
            "applications",
            body["metadata"]["name"],
            {"spec": body["spec"]},
        )


def refresh(cluster: Cluster, name: str, kind: str = "normal") -> None:
    """Ask ArgoCD to look at git again now (`hard`: and render the manifests again, no cache)."""
    cluster.custom.patch_namespaced_custom_object(
        ARGO_GROUP,
        ARGO_VERSION,
        ARGOCD_NS,
        "applications",
        name,
        {"metadata": {"annotations": {"argocd.argoproj.io/refresh": kind}}},
    )


def health(app: dict[str, Any] | None) -> str:
    return str((((app or {}).get("status") or {}).get("health") or {}).get("status") or "")


def sync_status(app: dict[str, Any] | None) -> str:
    return str((((app or {}).get("status") or {}).get("sync") or {}).get("status") or "")


def resource(app: dict[str, Any] | None, kind: str, name: str) -> dict[str, Any]:
    """The Application's status entry for one of its objects (sync status, health status and message)."""
    for entry in ((app or {}).get("status") or {}).get("resources") or []:
        if entry.get("kind") == kind and entry.get("name") == name:
            return dict(entry)
    return {}


def out_of_sync(app: dict[str, Any] | None) -> list[str]:
    return [
        f"{r.get('kind')}/{r.get('namespace', '')}/{r.get('name')}"
        for r in ((app or {}).get("status") or {}).get("resources") or []
        if r.get("status") != "Synced"
    ]
