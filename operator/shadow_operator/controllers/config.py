"""Operator configuration, read once at start-up from the environment (the chart sets these)."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from shadow_operator.clients.runtime import DEFAULT_MAX_ANSWER_BYTES
from shadow_operator.common.podsecurity import LEVELS
from shadow_operator.resources.environment import GITEA_RESOURCES
from shadow_operator.resources.gitea_policy import GiteaSettings
from shadow_operator.resources.networkpolicy import denied_ranges
from shadow_operator.resources.podsecurity import PodSecurity


@dataclass(frozen=True)
class Config:
    cluster_domain: str = "cluster.local"
    preview_domain: str | None = None
    preview_scheme: str = "https"
    # The preview router's keys Secret (`namespace/name`) and the namespaces it serves: the operator writes each
    # of those namespaces its own link keys, derived from that Secret's (controllers/previewkeys.py).
    preview_keys_secret: str | None = None
    preview_namespaces: tuple[str, ...] = ()
    operator_namespace: str = "shadow-system"
    # Namespaces the default NetworkPolicy lets in (the operator's plus, e.g., a separate preview router's).
    ingress_namespaces: tuple[str, ...] = ("shadow-system",)
    # The cluster's pod and service ranges, denied to sandboxes' egress beside every non-global range (they
    # must be named where they are globally routable addresses; RFC 1918 ranges are denied anyway).
    cluster_cidrs: tuple[str, ...] = ()
    metrics_port: int = 8081
    json_logs: bool = False
    # ShadowEnvironment: the SandboxTemplate a workspace starts from unless it names one, and Gitea's image.
    default_template: str = "workspace"
    gitea_image: str = "shadow-operator/gitea:latest"
    gitea_image_pull_policy: str = "IfNotPresent"
    # Each environment's Gitea container resources (core/v1 ResourceRequirements).
    gitea_resources: Mapping[str, Any] = field(default_factory=lambda: GITEA_RESOURCES)
    # Where the operator reaches an environment's Gitea API; default: its in-cluster Service. Set it when the
    # operator runs outside the cluster (with a port-forward) or in tests against a Gitea on loopback.
    gitea_api_url: str | None = None
    # Likewise for workspace runtimes (default: each workspace's status.runtimeURL): one runtime on loopback
    # answering for every workspace, for an operator outside the cluster or tests without a kubelet.
    runtime_api_url: str | None = None
    # The most the operator reads of one answer of a workspace runtime (which the tenant's code controls).
    runtime_max_answer_bytes: int = DEFAULT_MAX_ANSWER_BYTES
    # What a sandbox's pod may ask of its node (the chart's podSecurity values; its admission policy agrees).
    pod_security: PodSecurity = field(default_factory=PodSecurity)
    # The tenant namespaces labelled at start-up to enforce pod_security.level (Pod Security admission), and
    # the levels of its warn and audit modes there.
    pod_security_namespaces: tuple[str, ...] = ()
    pod_security_warn: str = "restricted"
    pod_security_audit: str = "restricted"
    # Pushes to Gitea (clients/gitpush.py): where the temporary repositories go (an emptyDir in the chart) and
    # the largest snapshot bundle taken from a workspace.
    git_work_dir: str | None = None
    max_bundle_bytes: int = 1 << 30
    git_push_concurrency: int = 2

    @property
    def gitea(self) -> GiteaSettings:
        return GiteaSettings(
            operator_namespace=self.operator_namespace,
            image=self.gitea_image,
            cluster_domain=self.cluster_domain,
            pull_policy=self.gitea_image_pull_policy,
            resources=self.gitea_resources,
        )

    @classmethod
    def from_env(cls) -> Config:
        env = os.environ
        operator_namespace = (
            env.get("SHADOW_OPERATOR_NAMESPACE") or env.get("POD_NAMESPACE") or "shadow-system"
        )
        extra = [ns.strip() for ns in env.get("SHADOW_INGRESS_NAMESPACES", "").split(",") if ns.strip()]
        cluster_cidrs = tuple(
            cidr.strip() for cidr in env.get("SHADOW_CLUSTER_CIDRS", "").split(",") if cidr.strip()
        )
        try:
            denied_ranges(cluster_cidrs)
        except ValueError as exc:
            raise ValueError(f"SHADOW_CLUSTER_CIDRS: {exc}") from None
        return cls(
            cluster_domain=env.get("SHADOW_CLUSTER_DOMAIN", "cluster.local"),
            preview_domain=env.get("SHADOW_PREVIEW_DOMAIN") or None,
            preview_scheme=env.get("SHADOW_PREVIEW_SCHEME", "https"),
            preview_keys_secret=_namespaced_name(env, "SHADOW_PREVIEW_KEYS_SECRET"),
            preview_namespaces=tuple(
                dict.fromkeys(
                    ns.strip() for ns in env.get("SHADOW_PREVIEW_NAMESPACES", "").split(",") if ns.strip()
                )
            ),
            operator_namespace=operator_namespace,
            ingress_namespaces=tuple(dict.fromkeys([operator_namespace, *extra])),
            cluster_cidrs=cluster_cidrs,
            metrics_port=int(env.get("SHADOW_METRICS_PORT", "8081")),
            json_logs=env.get("SHADOW_LOG_FORMAT", "").lower() == "json",
            default_template=env.get("SHADOW_DEFAULT_TEMPLATE") or "workspace",
            gitea_image=env.get("SHADOW_GITEA_IMAGE") or "shadow-operator/gitea:latest",
            gitea_image_pull_policy=env.get("SHADOW_GITEA_IMAGE_PULL_POLICY") or "IfNotPresent",
            gitea_resources=_resources(env, "SHADOW_GITEA_RESOURCES", GITEA_RESOURCES),
            gitea_api_url=env.get("SHADOW_GITEA_API_URL") or None,
            runtime_api_url=env.get("SHADOW_RUNTIME_API_URL") or None,
            pod_security=PodSecurity(
                level=_level(env, "SHADOW_POD_SECURITY_LEVEL"),
                allow_privileged=_flag(env, "SHADOW_ALLOW_PRIVILEGED"),
                allow_host_namespaces=_flag(env, "SHADOW_ALLOW_HOST_NAMESPACES"),
                allow_host_path=_flag(env, "SHADOW_ALLOW_HOST_PATH"),
                allow_service_account=_flag(env, "SHADOW_ALLOW_SERVICE_ACCOUNT"),
            ),
            pod_security_namespaces=_names(env.get("SHADOW_POD_SECURITY_NAMESPACES", "")),
            pod_security_warn=_level(env, "SHADOW_POD_SECURITY_WARN"),
            pod_security_audit=_level(env, "SHADOW_POD_SECURITY_AUDIT"),
            runtime_max_answer_bytes=int(
                env.get("SHADOW_RUNTIME_MAX_ANSWER_BYTES") or DEFAULT_MAX_ANSWER_BYTES
            ),
            git_work_dir=env.get("SHADOW_GIT_WORK_DIR") or None,
            max_bundle_bytes=int(env.get("SHADOW_MAX_BUNDLE_BYTES") or 1 << 30),
            git_push_concurrency=int(env.get("SHADOW_GIT_PUSH_CONCURRENCY") or 2),
        )


def _names(value: str) -> tuple[str, ...]:
    return tuple(dict.fromkeys(name.strip() for name in value.split(",") if name.strip()))


def _level(env: Mapping[str, str], name: str) -> str:
    value = env.get(name, "").strip() or "restricted"
    if value not in LEVELS:
        raise ValueError(f"{name}: {value!r} is not a Pod Security level ({', '.join(LEVELS)})")
    return value


def _namespaced_name(env: Mapping[str, str], name: str) -> str | None:
    value = env.get(name, "").strip()
    if not value:
        return None
    namespace, slash, rest = value.partition("/")
    if not slash or not namespace or not rest or "/" in rest:
        raise ValueError(f"{name}: {value!r} is not NAMESPACE/NAME")
    return value


def _flag(env: Mapping[str, str], name: str) -> bool:
    value = env.get(name, "").strip().lower()
    if value not in ("", "true", "false"):
        raise ValueError(f"{name}: {value!r} is neither true nor false")
    return value == "true"


def _resources(env: Mapping[str, str], name: str, default: Mapping[str, Any]) -> Mapping[str, Any]:
    """A core/v1 ResourceRequirements given as JSON (the chart's toJson), or `default` when unset."""
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{name}: not JSON ({exc.msg})") from None
    if not isinstance(value, dict) or set(value) - {"requests", "limits"}:
        raise ValueError(f"{name}: expected an object with only `requests` and `limits`, got {raw[:200]!r}")
    for part, quantities in value.items():
        if not isinstance(quantities, dict) or not all(
            isinstance(k, str) and isinstance(v, str | int | float) for k, v in quantities.items()
        ):
            raise ValueError(f"{name}: `{part}` must map resource names to quantities, got {quantities!r}")
    return value
