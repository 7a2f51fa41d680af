"""Pydantic models of the Sandbox API: the single source of truth for the CRD schemas.

Field names, defaults and enums follow kubernetes-sigs/agent-sandbox v1beta1. Kubernetes core types that we
pass through untouched (most of a PodSpec, PVC specs, NetworkPolicy rules) are modelled only as far as we
read them; the rest is kept with `x-kubernetes-preserve-unknown-fields` so nothing a user sends is lost.
Descriptions written here become `kubectl explain` text.
"""

from __future__ import annotations

import base64
from datetime import datetime
from typing import Annotated, Any, Literal, Self

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, JsonValue, PrivateAttr
from pydantic.alias_generators import to_camel

PRESERVE: dict[str, Any] = {"x-kubernetes-preserve-unknown-fields": True}
# CEL cost estimation needs bounds on lists and maps that rules iterate over.
MAX_METADATA_ENTRIES = 64
MAX_VOLUME_CLAIM_TEMPLATES = 16
MAX_ENV = 128


def cel(rule: str, message: str, **extra: str) -> dict[str, JsonValue]:
    return {"rule": rule, "message": message, **extra}


def validations(*rules: dict[str, JsonValue]) -> dict[str, JsonValue]:
    """The CEL rules of a schema, for a model's or a field's `json_schema_extra`."""
    return {"x-kubernetes-validations": list(rules)}


class ApiModel(BaseModel):
    """Base: camelCase on the wire, unknown fields ignored when reading objects back."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")


class OpenModel(ApiModel):
    """A Kubernetes core type of which we model a few fields; every other field is preserved."""

    model_config = ConfigDict(extra="allow", json_schema_extra=PRESERVE)


def labels_field(what: str) -> Any:
    return Field(
        default=None,
        description=f"{what} Keys under agents.x-k8s.io/, extensions.agents.x-k8s.io/ and shadow.dev/ are "
        "reserved for the operator and dropped.",
        json_schema_extra={"maxProperties": MAX_METADATA_ENTRIES},
    )


# ----------------------------------------------------------------------------------------------- shared
class PodMetadata(ApiModel):
    """Labels and annotations for the sandbox Pod."""

    labels: dict[str, str] | None = labels_field("Labels added to the Pod.")
    annotations: dict[str, str] | None = labels_field("Annotations added to the Pod.")


class EmbeddedObjectMetadata(ApiModel):
    """Metadata of an object the operator creates on the sandbox's behalf."""

    name: str | None = Field(
        default=None,
        description="Name of the volume claim template; the PVC is named <name>-<sandbox>.",
        max_length=63,
        pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$",
    )
    labels: dict[str, str] | None = labels_field("Labels added to the object.")
    annotations: dict[str, str] | None = labels_field("Annotations added to the object.")


class ContainerPort(OpenModel):
    """A port the container listens on (core/v1 ContainerPort)."""

    name: str | None = Field(default=None, description="Port name; `runtime` marks the runtime API port.")
    container_port: int = Field(ge=1, le=65535, description="Port number on the Pod's IP.")
    protocol: Literal["TCP", "UDP", "SCTP"] | None = Field(default=None, description="Defaults to TCP.")


class Container(OpenModel):
    """A container of the sandbox Pod (core/v1 Container; fields not listed are passed through)."""

    name: str = Field(min_length=1, description="Container name, unique within the Pod.")
    image: str | None = Field(default=None, description="Container image.")
    ports: list[ContainerPort] | None = Field(default=None, description="Ports exposed by the container.")


class PodSpec(OpenModel):
    """The sandbox Pod's spec (core/v1 PodSpec; fields not listed are passed through)."""

    containers: list[Container] = Field(
        min_length=1,
        description="Containers of the Pod. The container with a port named `runtime` (else the first one) "
        "receives the runtime bearer token.",
    )
    init_containers: list[Container] | None = Field(default=None, description="Init containers.")
    automount_service_account_token: bool | None = Field(
        default=None, description="Defaults to false for sandboxes: untrusted code gets no API credentials."
    )


class PodTemplate(ApiModel):
    """The Pod the sandbox runs."""

    metadata: PodMetadata | None = Field(default=None, description="Only labels and annotations are used.")
    spec: PodSpec = Field(description="The Pod's spec.")


class PersistentVolumeClaimTemplate(ApiModel):
    """A PVC created for the sandbox and mounted as the volume of the same name."""

    metadata: EmbeddedObjectMetadata = Field(description="The name is required; it is the Pod volume name.")
    spec: dict[str, Any] = Field(
        description="core/v1 PersistentVolumeClaimSpec.", json_schema_extra={"type": "object", **PRESERVE}
    )


VCT_DESCRIPTION = (
    "Claims the sandbox Pod may mount; a PVC named <template-name>-<sandbox> is created for each and kept "
    "while the sandbox is suspended."
)
VCT_NAMED = cel(
    "self.all(t, has(t.metadata.name) && t.metadata.name != '')",
    "every volumeClaimTemplate needs metadata.name",
)
# spec.volumeClaimTemplates of a Sandbox, a template and a claim: the same list, each with its own description.
VolumeClaimTemplates = Annotated[
    list[PersistentVolumeClaimTemplate] | None,
    Field(
        max_length=MAX_VOLUME_CLAIM_TEMPLATES,
        json_schema_extra={"x-kubernetes-list-type": "atomic", **validations(VCT_NAMED)},
    ),
]


class Condition(ApiModel):
    """A metav1.Condition."""

    type: str = Field(description="Condition type, e.g. Ready.")
    status: Literal["True", "False", "Unknown"] = Field(description="True, False or Unknown.")
    reason: str = Field(description="CamelCase reason, stable for programs to match on.")
    message: str = Field(default="", description="Human-readable detail.")
    last_transition_time: datetime | None = Field(default=None, description="When the status last changed.")
    observed_generation: int | None = Field(default=None, description="The .metadata.generation it reflects.")


class OwnerReference(ApiModel):
    """metav1.OwnerReference."""

    api_version: str
    kind: str
    name: str
    uid: str
    controller: bool | None = None
    block_owner_deletion: bool | None = None


class ObjectMeta(ApiModel):
    """The part of metav1.ObjectMeta the operator reads (never part of a CRD schema)."""

    name: str = ""
    namespace: str = ""
    uid: str = ""
    resource_version: str = ""
    generation: int | None = None
    creation_timestamp: datetime | None = None
    deletion_timestamp: datetime | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)
    owner_references: list[OwnerReference] = Field(default_factory=list)

    @property
    def controller(self) -> OwnerReference | None:
        """The controller owner reference, if any."""
        return next((ref for ref in self.owner_references if ref.controller), None)


class Resource(ApiModel):
    """Base of every top-level kind: validated once at the boundary, with the raw body kept beside it.

    Reconcilers read the typed fields; the pure manifest builders of `resources/` take `body` (dict in,
    dict out). `metadata`, `apiVersion` and `kind` are not part of the generated CRD schema.
    """

    api_version: str = ""
    kind: str = ""
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    _body: dict[str, Any] = PrivateAttr(default_factory=dict)

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> Self:
        obj = cls.model_validate(body)
        obj._body = body
        return obj

    @property
    def body(self) -> dict[str, Any]:
        """The object as the API server sent it (read-only by convention)."""
        return self._body

    @property
    def namespace(self) -> str:
        return self.metadata.namespace

    @property
    def name(self) -> str:
        return self.metadata.name

    @property
    def deleting(self) -> bool:
        return self.metadata.deletion_timestamp is not None


class StatefulSetStatus(ApiModel):
    """The part of apps/v1 StatefulSetStatus the operator reads."""

    ready_replicas: int = 0


class StatefulSet(Resource):
    """An apps/v1 StatefulSet as the operator reads it (Gitea's): its metadata and ready replicas."""

    status: StatefulSetStatus = Field(default_factory=StatefulSetStatus)


class ServicePort(ApiModel):
    """The part of a core/v1 ServicePort a Sandbox's Service sets (resources/sandbox.py service_ports)."""

    name: str | None = None
    port: int
    protocol: str | None = None
    target_port: int | str | None = None


class ServiceSpec(ApiModel):
    """The part of core/v1 ServiceSpec the operator keeps as it wants it."""

    selector: dict[str, str] | None = None
    ports: list[ServicePort] = Field(default_factory=list)


class Service(Resource):
    """A core/v1 Service as the operator reads it (a Sandbox's): its selector and ports."""

    spec: ServiceSpec = Field(default_factory=ServiceSpec)


class Secret(Resource):
    """A core/v1 Secret as the operator reads it: `data` (base64) and `stringData` (as written, before the API
    server folds it into data)."""

    data: dict[str, str] | None = None
    string_data: dict[str, str] | None = None

    def values(self) -> dict[str, str]:
        """Every key's value as text, stringData winning over data as the API server would have it."""
        decoded = {key: base64.b64decode(value).decode() for key, value in (self.data or {}).items()}
        return {**decoded, **(self.string_data or {})}


# Quantities ("10Gi") as text; an API server sends them as strings, a hand-written body may hold a number.
Quantity = Annotated[str, BeforeValidator(str)]


class ResourceRequests(ApiModel):
    """The part of core/v1 VolumeResourceRequirements the operator reads."""

    requests: dict[str, Quantity] = Field(default_factory=dict)


class PersistentVolumeClaimSpec(ApiModel):
    """The part of core/v1 PersistentVolumeClaimSpec the operator reads."""

    storage_class_name: str | None = None
    resources: ResourceRequests = Field(default_factory=ResourceRequests)


class PersistentVolumeClaimStatus(ApiModel):
    """The part of core/v1 PersistentVolumeClaimStatus the operator reads."""

    phase: str | None = None
    capacity: dict[str, Quantity] = Field(default_factory=dict)


class PersistentVolumeClaim(Resource):
    """A core/v1 PersistentVolumeClaim as the operator reads it: its class, requested size, phase, capacity."""

    spec: PersistentVolumeClaimSpec = Field(default_factory=PersistentVolumeClaimSpec)
    status: PersistentVolumeClaimStatus = Field(default_factory=PersistentVolumeClaimStatus)

    @property
    def requested_storage(self) -> str | None:
        return self.spec.resources.requests.get("storage")

    @property
    def capacity_storage(self) -> str | None:
        return self.status.capacity.get("storage")


class VolumeSnapshotSource(ApiModel):
    """The part of snapshot.storage.k8s.io/v1 VolumeSnapshotSource the operator reads."""

    persistent_volume_claim_name: str | None = None


class VolumeSnapshotSpec(ApiModel):
    """The part of snapshot.storage.k8s.io/v1 VolumeSnapshotSpec the operator reads."""

    source: VolumeSnapshotSource = Field(default_factory=VolumeSnapshotSource)
    volume_snapshot_class_name: str | None = None


class VolumeSnapshotStatus(ApiModel):
    """The part of snapshot.storage.k8s.io/v1 VolumeSnapshotStatus the operator reads."""

    restore_size: Quantity | None = None


class VolumeSnapshot(Resource):
    """A VolumeSnapshot as the operator reads it: the claim it was cut from, its class and restore size."""

    spec: VolumeSnapshotSpec = Field(default_factory=VolumeSnapshotSpec)
    status: VolumeSnapshotStatus = Field(default_factory=VolumeSnapshotStatus)


class VolumeSnapshotClass(Resource):
    """A VolumeSnapshotClass as the operator reads it: its CSI driver."""

    driver: str = ""


class StorageClass(Resource):
    """A storage.k8s.io/v1 StorageClass as the operator reads it: its provisioner."""

    provisioner: str = ""

    @property
    def is_default(self) -> bool:
        return self.metadata.annotations.get("storageclass.kubernetes.io/is-default-class") == "true"


# --------------------------------------------------------------------------------------- idle suspension
MIN_SUSPEND_THRESHOLD_SECONDS = 10
MAX_SUSPEND_THRESHOLD_SECONDS = 30 * 86400


class AutoSuspendPolicy(ApiModel):
    """Suspend the sandbox when nobody has used it for a while, and keep it suspended until a new value of the
    annotation shadow.dev/resume-requested (or operatingMode/replicas) brings it back. The shape of
    agent-sandbox's proposed AutoSuspendPolicy (KEP-0968) with its one timer strategy; unlike that proposal
    the operator never writes spec.operatingMode: the suspension shows in status (status.idle, the Suspended
    condition with reason Idle)."""

    model_config = ConfigDict(
        json_schema_extra=validations(
            cel(
                f"!has(self.suspendThresholdSeconds) || self.suspendThresholdSeconds >= "
                f"{MIN_SUSPEND_THRESHOLD_SECONDS}",
                f"autoSuspendPolicy.suspendThresholdSeconds must be at least {MIN_SUSPEND_THRESHOLD_SECONDS} "
                "seconds (a sandbox suspended sooner would go down between two calls of one client); leave "
                "autoSuspendPolicy out to never suspend",
                fieldPath=".suspendThresholdSeconds",
            ),
            cel(
                f"!has(self.suspendThresholdSeconds) || self.suspendThresholdSeconds <= "
                f"{MAX_SUSPEND_THRESHOLD_SECONDS}",
                f"autoSuspendPolicy.suspendThresholdSeconds must be at most {MAX_SUSPEND_THRESHOLD_SECONDS} "
                "seconds (30 days); leave autoSuspendPolicy out to never suspend",
                fieldPath=".suspendThresholdSeconds",
            ),
        )
    )

    suspend_threshold_seconds: int = Field(
        default=900,
        description="Seconds without activity after which the sandbox is suspended (its Pod deleted, its "
        "volumes kept). Activity: a runtime API call, an open terminal, a process started through the runtime "
        "still running, or a preview/SDK request through the router (the annotation shadow.dev/last-activity).",
    )


AUTO_SUSPEND_POLICY_DESCRIPTION = (
    "Suspend the sandbox after suspendThresholdSeconds without activity; a new value of the annotation "
    "shadow.dev/resume-requested resumes it."
)


class SandboxIdleStatus(ApiModel):
    """Idle suspension of a Sandbox (spec.autoSuspendPolicy)."""

    suspended_at: datetime | None = Field(
        default=None, description="When the idle sandbox was suspended (unset while it is not)."
    )
    last_activity_time: datetime | None = Field(
        default=None,
        description="The newest activity the operator saw when it last looked (the runtime's idle clock, the "
        "annotation shadow.dev/last-activity, the Pod's start).",
    )
    resume_request: str | None = Field(
        default=None,
        description="The last value of the annotation shadow.dev/resume-requested the operator acted on; only "
        "a different value resumes the sandbox again.",
    )
    resume_requested_at: datetime | None = Field(
        default=None,
        description="When the operator saw the resume request it is acting on (unset once the sandbox is Ready).",
    )


CONDITIONS_FIELD: Any = Field(
    default=None,
    description="Observations of the object's state; `Ready` is the one to wait for.",
    json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
)


# ---------------------------------------------------------------------------------------------- Sandbox
class SandboxSpec(ApiModel):
    """Desired state of a Sandbox."""

    model_config = ConfigDict(
        json_schema_extra=validations(
            cel(
                "has(self.volumeClaimTemplates) == has(oldSelf.volumeClaimTemplates) && "
                "(!has(self.volumeClaimTemplates) || self.volumeClaimTemplates == oldSelf.volumeClaimTemplates)",
                "spec.volumeClaimTemplates is immutable: create a new Sandbox to change volumes",
                fieldPath=".volumeClaimTemplates",
                reason="FieldValueForbidden",
            )
        )
    )

    pod_template: PodTemplate = Field(description="The Pod that runs the sandbox; one Pod per Sandbox, ever.")
    volume_claim_templates: VolumeClaimTemplates = Field(
        default=None, description=VCT_DESCRIPTION + " Immutable."
    )
    service: bool | None = Field(
        default=None,
        description="Create a headless Service named like the Sandbox (true), remove it (false), or keep an "
        "existing one without creating it (unset).",
    )
    shutdown_time: datetime | None = Field(
        default=None, description="Absolute time when the sandbox expires."
    )
    shutdown_policy: Literal["Delete", "Retain"] = Field(
        default="Retain",
        description="On expiry the Pod and Service are always deleted; Delete also deletes the Sandbox, Retain "
        "keeps it with Ready=False/SandboxExpired.",
    )
    operating_mode: Literal["Running", "Suspended"] = Field(
        default="Running",
        description="Suspended deletes the Pod and keeps the PVCs; Running brings the Pod back on them.",
    )
    replicas: int | None = Field(
        default=None,
        ge=0,
        le=1,
        description="Deprecated (v1alpha1 clients): 0 suspends the sandbox like operatingMode: Suspended.",
    )
    auto_suspend_policy: AutoSuspendPolicy | None = Field(
        default=None,
        description=AUTO_SUSPEND_POLICY_DESCRIPTION + " A claim's Sandbox gets the claim's policy, else its "
        "template's.",
    )


class SandboxStatus(ApiModel):
    """Observed state of a Sandbox."""

    service_fqdn: str | None = Field(
        default=None, alias="serviceFQDN", description="DNS name of the headless Service."
    )
    service: str | None = Field(default=None, description="Name of the headless Service.")
    conditions: list[Condition] | None = CONDITIONS_FIELD
    selector: str | None = Field(default=None, description="Label selector of the sandbox Pod.")
    pod_ips: list[str] | None = Field(default=None, alias="podIPs", description="IPs of the sandbox Pod.")
    node_name: str | None = Field(default=None, description="Node the Pod runs on.")
    runtime_url: str | None = Field(
        default=None, alias="runtimeURL", description="In-cluster URL of the sandbox runtime API."
    )
    preview_url: str | None = Field(
        default=None,
        alias="previewURL",
        description="Public preview URL, when a preview domain is configured.",
    )
    runtime_token_secret: str | None = Field(
        default=None, description="Name of the Secret holding the runtime's bearer token (key `token`)."
    )
    idle: SandboxIdleStatus | None = Field(
        default=None, description="Idle suspension (spec.autoSuspendPolicy)."
    )


class Sandbox(Resource):
    """An isolated, disposable workspace: one Pod, optional headless Service and PVCs."""

    spec: SandboxSpec
    status: SandboxStatus | None = None


# ------------------------------------------------------------------------------------- SandboxTemplate
class NetworkPolicySpec(ApiModel):
    """Rules of the NetworkPolicy shared by every sandbox of the template (pod selector and types are managed)."""

    ingress: list[dict[str, Any]] | None = Field(
        default=None,
        description="networking/v1 NetworkPolicyIngressRule list; empty means deny all ingress.",
        json_schema_extra={"items": {"type": "object", **PRESERVE}},
    )
    egress: list[dict[str, Any]] | None = Field(
        default=None,
        description="networking/v1 NetworkPolicyEgressRule list; empty means deny all egress.",
        json_schema_extra={"items": {"type": "object", **PRESERVE}},
    )


class SandboxTemplateSpec(ApiModel):
    """A reusable sandbox blueprint for claims and warm pools."""

    pod_template: PodTemplate = Field(description="The Pod sandboxes of this template run.")
    volume_claim_templates: VolumeClaimTemplates = Field(default=None, description=VCT_DESCRIPTION)
    service: bool | None = Field(
        default=None,
        description="Create a headless Service named like each sandbox. Unset in v1beta1 means no Service; "
        "in v1alpha1 it defaults to true, as v1alpha1 sandboxes always had one.",
    )
    network_policy: NetworkPolicySpec | None = Field(
        default=None,
        description="Custom rules for the managed NetworkPolicy. When omitted the secure default applies: "
        "ingress only from the preview router and the operator, egress to the internet but not to private "
        "ranges, DNS allowed.",
    )
    network_policy_management: Literal["Managed", "Unmanaged"] = Field(
        default="Managed",
        description="Unmanaged: no NetworkPolicy is created (another system owns networking).",
    )
    env_vars_injection_policy: Literal["Allowed", "Overrides", "Disallowed"] = Field(
        default="Disallowed",
        description="Whether claims may add (Allowed) or also override (Overrides) container environment.",
    )
    volume_claim_templates_policy: Literal["Disallowed", "Allowed", "Overrides"] = Field(
        default="Disallowed",
        description="Whether claims may add (Allowed) or also replace (Overrides) volume claim templates.",
    )
    auto_suspend_policy: AutoSuspendPolicy | None = Field(
        default=None,
        description=AUTO_SUSPEND_POLICY_DESCRIPTION + " The default for the Sandboxes of claims and "
        "environments; its threshold is also their ceiling: a claim or environment may only shorten it. Warm "
        "pool sandboxes are never suspended while they wait in the pool. Read when a sandbox is claimed.",
    )


class SandboxTemplate(Resource):
    """A sandbox blueprint referenced by SandboxClaims and SandboxWarmPools."""

    spec: SandboxTemplateSpec


# ---------------------------------------------------------------------------------------- SandboxClaim
class NameRef(ApiModel):
    """A reference by name to an object in the same namespace."""

    name: str = Field(min_length=1, max_length=253, description="Name of the referenced object.")


class ClaimLifecycle(ApiModel):
    """When and how the claim ends."""

    shutdown_time: datetime | None = Field(default=None, description="Absolute time when the claim expires.")
    ttl_seconds_after_finished: int | None = Field(
        default=None,
        ge=0,
        description="The claim expires this long after its sandbox's Pod finished (the Finished condition's "
        "lastTransitionTime), or at shutdownTime if that is earlier; shutdownPolicy says what then goes.",
    )
    shutdown_policy: Literal["Delete", "DeleteForeground", "Retain"] = Field(
        default="Retain",
        description="On expiry: Delete the claim, delete it with foreground cascading (DeleteForeground), or "
        "keep it with Ready=False/ClaimExpired and delete only its Sandbox (Retain).",
    )


class ClaimEnvVar(ApiModel):
    """An environment variable injected into the sandbox (needs the template's envVarsInjectionPolicy)."""

    name: str = Field(min_length=1, description="Variable name.")
    value: str = Field(description="Variable value.")
    container_name: str | None = Field(default=None, description="Target container; default: the first one.")


class SandboxClaimSpec(ApiModel):
    """What sandbox to hand out."""

    model_config = ConfigDict(
        json_schema_extra=validations(
            cel(
                "has(self.warmPoolRef) != has(self.sandboxTemplateRef)",
                "set exactly one of spec.warmPoolRef.name (v1beta1) or spec.sandboxTemplateRef.name (v1alpha1)",
            ),
            cel(
                "!has(self.warmpool) || has(self.sandboxTemplateRef)",
                "spec.warmpool only applies together with spec.sandboxTemplateRef",
                fieldPath=".warmpool",
            ),
        )
    )

    warm_pool_ref: NameRef | None = Field(
        default=None,
        description="Warm pool to take a ready sandbox from; its template is used for a cold start when the "
        "pool is empty.",
    )
    sandbox_template_ref: NameRef | None = Field(
        default=None,
        description="v1alpha1 form: template to create the sandbox from. The Sandbox is named like the claim "
        "unless spec.warmpool selects a pool.",
    )
    warmpool: str | None = Field(
        default=None,
        description="v1alpha1 form: `none` (or unset) cold-starts a Sandbox named like the claim, `default` "
        "adopts from any pool of the template, any other value names the pool.",
    )
    lifecycle: ClaimLifecycle | None = Field(default=None, description="Expiry of the claim.")
    additional_pod_metadata: PodMetadata | None = Field(
        default=None,
        description="Labels and annotations added to the sandbox Pod (never overriding the template's); "
        "kubernetes.io, k8s.io and agents.x-k8s.io domains are refused.",
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "!has(self.labels) || self.labels.all(k, size(self.labels[k]) <= 63)",
                    "additionalPodMetadata label values must be at most 63 characters",
                )
            ]
        },
    )
    env: list[ClaimEnvVar] | None = Field(
        default=None,
        max_length=MAX_ENV,
        description="Environment injected into the sandbox; forces a cold start.",
        json_schema_extra={"x-kubernetes-list-type": "atomic"},
    )
    volume_claim_templates: list[PersistentVolumeClaimTemplate] | None = Field(
        default=None,
        max_length=MAX_VOLUME_CLAIM_TEMPLATES,
        description="Extra volume claim templates (per the template's policy); forces a cold start. Each needs "
        "a unique metadata.name: the claim reports one without (Ready=False, VolumeClaimTemplatesError), as "
        "upstream does, rather than being refused.",
        json_schema_extra={"x-kubernetes-list-type": "atomic"},
    )
    auto_suspend_policy: AutoSuspendPolicy | None = Field(
        default=None,
        description=AUTO_SUSPEND_POLICY_DESCRIPTION + " Overrides the template's, within it: a threshold "
        "longer than the template's is refused (Ready=False, AutoSuspendPolicyRefused). Read when the sandbox "
        "is claimed.",
    )


class ClaimSandboxStatus(ApiModel):
    """The sandbox bound to the claim."""

    name: str | None = Field(default=None, description="Name of the Sandbox.")
    pod_ips: list[str] | None = Field(default=None, alias="podIPs", description="IPs of its Pod.")


class SandboxClaimStatus(ApiModel):
    """Observed state of a claim."""

    conditions: list[Condition] | None = CONDITIONS_FIELD
    sandbox: ClaimSandboxStatus | None = Field(default=None, description="The bound sandbox.")
    preview_url: str | None = Field(
        default=None,
        alias="previewURL",
        description="The bound sandbox's preview URL, when a preview domain is configured (a shadow-operator "
        "addition).",
    )


class SandboxClaim(Resource):
    """A request for a sandbox: adopted from a warm pool when one is ready, else created from the template."""

    spec: SandboxClaimSpec
    status: SandboxClaimStatus | None = None


# ------------------------------------------------------------------------------------- SandboxWarmPool
class UpdateStrategy(ApiModel):
    """How warm sandboxes follow template changes."""

    type: Literal["OnReplenish", "Recreate"] = Field(
        default="OnReplenish",
        description="Recreate replaces stale warm sandboxes at once; OnReplenish only when they are used up.",
    )


class SandboxWarmPoolSpec(ApiModel):
    """A pool of ready sandboxes of one template."""

    replicas: int = Field(
        default=1, ge=0, description="Desired number of warm sandboxes (scale subresource)."
    )
    sandbox_template_ref: NameRef = Field(description="Template the warm sandboxes are created from.")
    update_strategy: UpdateStrategy | None = Field(default=None, description="Reaction to template changes.")


class SandboxWarmPoolStatus(ApiModel):
    """Observed state of a warm pool."""

    replicas: int | None = Field(default=None, description="Warm sandboxes in the pool.")
    ready_replicas: int | None = Field(default=None, description="Warm sandboxes that are Ready.")
    selector: str | None = Field(default=None, description="Label selector of the pool's sandboxes.")
    observed_generation: int | None = Field(default=None, description="Generation last acted upon.")


class SandboxWarmPool(Resource):
    """Keeps `replicas` ready sandboxes of a template for claims to adopt."""

    spec: SandboxWarmPoolSpec
    status: SandboxWarmPoolStatus | None = None
