"""The registry of kinds: group, version, plural and model of every resource the operator reads or writes.

One table feeds the CRD generator (`crdgen`), the engine's watches and caches (kopf registrations) and the
API paths the clients use. Adding a custom kind is one `ResourceKind` with a `crd` entry and a model.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

from shadow_operator.api import constants as c
from shadow_operator.api import environment as env
from shadow_operator.api import models as m
from shadow_operator.api import pool

READY_COLUMNS: tuple[dict[str, Any], ...] = (
    {
        "name": "Ready",
        "type": "string",
        "jsonPath": '.status.conditions[?(@.type=="Ready")].status',
        "description": "Whether the sandbox can be used.",
    },
    {
        "name": "Reason",
        "type": "string",
        "jsonPath": '.status.conditions[?(@.type=="Ready")].reason',
        "description": "Why it is (not) ready.",
    },
)
AGE_COLUMN: dict[str, Any] = {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}
# Kinds with `spec.replicas` (pools): their columns and scale subresource (`kubectl scale`, HPA).
REPLICA_COLUMNS: tuple[dict[str, Any], ...] = (
    {"name": "Desired", "type": "integer", "jsonPath": ".spec.replicas"},
    {"name": "Current", "type": "integer", "jsonPath": ".status.replicas"},
    {"name": "Ready", "type": "integer", "jsonPath": ".status.readyReplicas"},
)
REPLICAS_SCALE: dict[str, str] = {
    "specReplicasPath": ".spec.replicas",
    "statusReplicasPath": ".status.replicas",
    "labelSelectorPath": ".status.selector",
}
# shadow.dev kinds: one version, not deprecated, in the `shadow` category.
SHADOW_CRD: dict[str, Any] = {
    "versions": (c.SHADOW_VERSION,),
    "storage_version": c.SHADOW_VERSION,
    "deprecated_versions": (),
    "categories": ("shadow",),
}


def resource_path(
    api_version: str,
    plural: str,
    namespace: str | None = None,
    name: str | None = None,
    subresource: str | None = None,
) -> str:
    prefix = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    path = prefix + (f"/namespaces/{namespace}" if namespace else "") + f"/{plural}"
    if name:
        path += f"/{name}"
        if subresource:
            path += f"/{subresource}"
    return path


@dataclass(frozen=True)
class CrdSpec:
    """How a custom kind is presented as a CustomResourceDefinition."""

    short_names: tuple[str, ...]
    columns: tuple[dict[str, Any], ...]
    versions: tuple[str, ...] = (c.STORAGE_VERSION, c.LEGACY_VERSION)
    storage_version: str = c.STORAGE_VERSION
    deprecated_versions: tuple[str, ...] = (c.LEGACY_VERSION,)
    categories: tuple[str, ...] = ("agent-sandbox",)
    scale: dict[str, str] | None = None
    status: bool = True
    # Per-version schema defaults (JSON pointer within spec -> value); see `crdgen.build_crd`.
    version_defaults: dict[str, dict[str, Any]] = field(default_factory=dict)


@dataclass(frozen=True)
class ResourceKind:
    """A Kubernetes resource: its group/version/plural, its kind name and, for our own kinds, the model."""

    group: str
    version: str
    plural: str
    kind: str
    # Identity is (group, version, plural, kind); the model and CRD presentation ride along.
    model: type[BaseModel] | None = field(default=None, compare=False)
    crd: CrdSpec | None = field(default=None, compare=False)

    @classmethod
    def core(cls, plural: str, kind: str) -> ResourceKind:
        """A kind of the core API group (`v1`, served under /api/v1)."""
        return cls("", "v1", plural, kind)

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def name(self) -> str:
        """The CRD name, `<plural>.<group>`."""
        return f"{self.plural}.{self.group}"

    def path(
        self, namespace: str | None = None, name: str | None = None, subresource: str | None = None
    ) -> str:
        """REST path of the collection, or of one object (and one of its subresources)."""
        return resource_path(self.api_version, self.plural, namespace, name, subresource)

    def __str__(self) -> str:
        return self.kind


SANDBOX = ResourceKind(
    c.SANDBOX_GROUP,
    c.STORAGE_VERSION,
    "sandboxes",
    "Sandbox",
    m.Sandbox,
    CrdSpec(
        ("sbx",),
        (
            *READY_COLUMNS,
            {"name": "Service", "type": "string", "jsonPath": ".status.service", "priority": 1},
            {"name": "Node", "type": "string", "jsonPath": ".status.nodeName", "priority": 1},
            AGE_COLUMN,
        ),
    ),
)
SANDBOX_CLAIM = ResourceKind(
    c.EXTENSIONS_GROUP,
    c.STORAGE_VERSION,
    "sandboxclaims",
    "SandboxClaim",
    m.SandboxClaim,
    CrdSpec(
        ("sbc",),
        (
            *READY_COLUMNS,
            {"name": "Sandbox", "type": "string", "jsonPath": ".status.sandbox.name"},
            AGE_COLUMN,
        ),
    ),
)
SANDBOX_TEMPLATE = ResourceKind(
    c.EXTENSIONS_GROUP,
    c.STORAGE_VERSION,
    "sandboxtemplates",
    "SandboxTemplate",
    m.SandboxTemplate,
    CrdSpec(
        ("sbt",),
        ({"name": "Network", "type": "string", "jsonPath": ".spec.networkPolicyManagement"}, AGE_COLUMN),
        status=False,
        # v1alpha1 sandboxes always had a headless Service; a v1alpha1 template that does not say otherwise
        # keeps that (Amicable reaches its runtime at <claim>.<ns>.svc). v1beta1 leaves it unset.
        version_defaults={c.LEGACY_VERSION: {"service": True}},
    ),
)
SANDBOX_WARM_POOL = ResourceKind(
    c.EXTENSIONS_GROUP,
    c.STORAGE_VERSION,
    "sandboxwarmpools",
    "SandboxWarmPool",
    m.SandboxWarmPool,
    CrdSpec(
        ("swp", "sandboxwarmpool"),
        (
            *REPLICA_COLUMNS,
            {"name": "Template", "type": "string", "jsonPath": ".spec.sandboxTemplateRef.name"},
            AGE_COLUMN,
        ),
        scale=REPLICAS_SCALE,
    ),
)

SHADOW_ENVIRONMENT = ResourceKind(
    c.SHADOW_GROUP,
    c.SHADOW_VERSION,
    "shadowenvironments",
    "ShadowEnvironment",
    env.ShadowEnvironment,
    CrdSpec(
        ("shenv", "shadowenv"),
        (
            {
                "name": "Ready",
                "type": "string",
                "jsonPath": '.status.conditions[?(@.type=="Ready")].status',
                "description": "Whether the environment can be used.",
            },
            {"name": "Sources", "type": "string", "jsonPath": ".status.sourcesReady"},
            {"name": "Verdict", "type": "string", "jsonPath": ".status.verdict.result"},
            {
                "name": "Failure",
                "type": "string",
                "jsonPath": ".status.failure.code",
                "description": "Stable code of what stops the environment.",
                "priority": 1,
            },
            {"name": "Score", "type": "integer", "jsonPath": ".status.verdict.score", "priority": 1},
            {
                "name": "Clone",
                "type": "string",
                "jsonPath": ".status.cloneMethod",
                "description": "How a fork was cloned: Snapshot or Copy.",
                "priority": 1,
            },
            AGE_COLUMN,
        ),
        **SHADOW_CRD,
    ),
)

SHADOW_ENVIRONMENT_POOL = ResourceKind(
    c.SHADOW_GROUP,
    c.SHADOW_VERSION,
    "shadowenvironmentpools",
    "ShadowEnvironmentPool",
    pool.ShadowEnvironmentPool,
    CrdSpec(
        ("shpool", "shadowpool"),
        (
            *REPLICA_COLUMNS,
            {"name": "Template", "type": "string", "jsonPath": ".spec.template", "priority": 1},
            AGE_COLUMN,
        ),
        **SHADOW_CRD,
        scale=REPLICAS_SCALE,
    ),
)

POD = ResourceKind.core("pods", "Pod")
SERVICE = ResourceKind.core("services", "Service")
SECRET = ResourceKind.core("secrets", "Secret")
CONFIG_MAP = ResourceKind.core("configmaps", "ConfigMap")
PVC = ResourceKind.core("persistentvolumeclaims", "PersistentVolumeClaim")
EVENT = ResourceKind.core("events", "Event")
NAMESPACE = ResourceKind.core("namespaces", "Namespace")
NETWORK_POLICY = ResourceKind("networking.k8s.io", "v1", "networkpolicies", "NetworkPolicy")
LEASE = ResourceKind("coordination.k8s.io", "v1", "leases", "Lease")
STATEFUL_SET = ResourceKind("apps", "v1", "statefulsets", "StatefulSet")
DEPLOYMENT = ResourceKind("apps", "v1", "deployments", "Deployment")
STORAGE_CLASS = ResourceKind("storage.k8s.io", "v1", "storageclasses", "StorageClass")
RUNTIME_CLASS = ResourceKind("node.k8s.io", "v1", "runtimeclasses", "RuntimeClass")
# CSI snapshots (external-snapshotter's CRDs; absent on clusters without snapshot support).
VOLUME_SNAPSHOT = ResourceKind(c.SNAPSHOT_GROUP, "v1", "volumesnapshots", "VolumeSnapshot")
VOLUME_SNAPSHOT_CLASS = ResourceKind(c.SNAPSHOT_GROUP, "v1", "volumesnapshotclasses", "VolumeSnapshotClass")

CUSTOM_KINDS: tuple[ResourceKind, ...] = (
    SANDBOX,
    SANDBOX_CLAIM,
    SANDBOX_TEMPLATE,
    SANDBOX_WARM_POOL,
    SHADOW_ENVIRONMENT,
    SHADOW_ENVIRONMENT_POOL,
)
ALL_KINDS: tuple[ResourceKind, ...] = (
    *CUSTOM_KINDS,
    POD,
    SERVICE,
    SECRET,
    PVC,
    EVENT,
    NETWORK_POLICY,
    LEASE,
    STATEFUL_SET,
    STORAGE_CLASS,
    RUNTIME_CLASS,
    VOLUME_SNAPSHOT,
    VOLUME_SNAPSHOT_CLASS,
)


def by_kind(kind: str) -> ResourceKind:
    for entry in ALL_KINDS:
        if entry.kind == kind:
            return entry
    raise KeyError(kind)
