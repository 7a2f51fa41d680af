"""Operator configuration, read once at start-up from the environment (the chart sets these)."""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class Config:
    cluster_domain: str = "cluster.local"
    preview_domain: str | None = None
    preview_scheme: str = "https"
    operator_namespace: str = "shadow-system"
    # Namespaces the default NetworkPolicy lets in (the operator's plus, e.g., a separate preview router's).
    ingress_namespaces: tuple[str, ...] = ("shadow-system",)
    metrics_port: int = 8081
    json_logs: bool = False
    # ShadowEnvironment: the SandboxTemplate a workspace starts from unless it names one, and Gitea's image.
    default_template: str = "workspace"
    gitea_image: str = "shadow-operator/gitea:latest"
    gitea_image_pull_policy: str = "IfNotPresent"
    # Where the operator reaches an environment's Gitea API; default: its in-cluster Service. Set it when the
    # operator runs outside the cluster (with a port-forward) or in tests against a Gitea on loopback.
    gitea_api_url: str | None = None
    # Likewise for workspace runtimes (default: each workspace's status.runtimeURL): one runtime on loopback
    # answering for every workspace, for an operator outside the cluster or tests without a kubelet.
    runtime_api_url: str | None = None
    # Pushes to Gitea (clients/gitpush.py): where the temporary repositories go (an emptyDir in the chart) and
    # the largest snapshot bundle taken from a workspace.
    git_work_dir: str | None = None
    max_bundle_bytes: int = 1 << 30
    git_push_concurrency: int = 2

    @classmethod
    def from_env(cls) -> Config:
        env = os.environ
        operator_namespace = (
            env.get("SHADOW_OPERATOR_NAMESPACE") or env.get("POD_NAMESPACE") or "shadow-system"
        )
        extra = [ns.strip() for ns in env.get("SHADOW_INGRESS_NAMESPACES", "").split(",") if ns.strip()]
        return cls(
            cluster_domain=env.get("SHADOW_CLUSTER_DOMAIN", "cluster.local"),
            preview_domain=env.get("SHADOW_PREVIEW_DOMAIN") or None,
            preview_scheme=env.get("SHADOW_PREVIEW_SCHEME", "https"),
            operator_namespace=operator_namespace,
            ingress_namespaces=tuple(dict.fromkeys([operator_namespace, *extra])),
            metrics_port=int(env.get("SHADOW_METRICS_PORT", "8081")),
            json_logs=env.get("SHADOW_LOG_FORMAT", "").lower() == "json",
            default_template=env.get("SHADOW_DEFAULT_TEMPLATE") or "workspace",
            gitea_image=env.get("SHADOW_GITEA_IMAGE") or "shadow-operator/gitea:latest",
            gitea_image_pull_policy=env.get("SHADOW_GITEA_IMAGE_PULL_POLICY") or "IfNotPresent",
            gitea_api_url=env.get("SHADOW_GITEA_API_URL") or None,
            runtime_api_url=env.get("SHADOW_RUNTIME_API_URL") or None,
            git_work_dir=env.get("SHADOW_GIT_WORK_DIR") or None,
            max_bundle_bytes=int(env.get("SHADOW_MAX_BUNDLE_BYTES") or 1 << 30),
            git_push_concurrency=int(env.get("SHADOW_GIT_PUSH_CONCURRENCY") or 2),
        )
