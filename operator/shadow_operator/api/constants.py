"""Names shared by every layer: API groups, labels, annotations, condition types and reasons.

The values match kubernetes-sigs/agent-sandbox so that clients written for it read our objects unchanged.
"""

from __future__ import annotations

from typing import Final

SANDBOX_GROUP: Final = "agents.x-k8s.io"
EXTENSIONS_GROUP: Final = "extensions.agents.x-k8s.io"
STORAGE_VERSION: Final = "v1beta1"
LEGACY_VERSION: Final = "v1alpha1"
SANDBOX_API_VERSION: Final = f"{SANDBOX_GROUP}/{STORAGE_VERSION}"
EXTENSIONS_API_VERSION: Final = f"{EXTENSIONS_GROUP}/{STORAGE_VERSION}"

# ShadowEnvironment's own API group.
SHADOW_GROUP: Final = "shadow.dev"
SHADOW_VERSION: Final = "v1alpha1"
SHADOW_API_VERSION: Final = f"{SHADOW_GROUP}/{SHADOW_VERSION}"

# Our own prefix for operator bookkeeping (kopf progress, finalizers); never shared with upstream keys.
OPERATOR_PREFIX: Final = "shadow.dev"
FINALIZER: Final = f"{OPERATOR_PREFIX}/finalizer"

# Labels.
LABEL_SANDBOX_NAME_HASH: Final = "agents.x-k8s.io/sandbox-name-hash"
LABEL_WARM_POOL: Final = "agents.x-k8s.io/warm-pool-sandbox"
LABEL_TEMPLATE_HASH: Final = "agents.x-k8s.io/sandbox-pod-template-hash"
LABEL_TEMPLATE_REF_HASH: Final = "agents.x-k8s.io/sandbox-template-ref-hash"
LABEL_LAUNCH_TYPE: Final = "agents.x-k8s.io/launch-type"
LABEL_CLAIM_UID: Final = "agents.x-k8s.io/claim-uid"
LABEL_CREATED_BY: Final = "agents.x-k8s.io/created-by"
LABEL_ADOPTABLE: Final = "agents.x-k8s.io/adoptable"
LABEL_MANAGED_BY: Final = "app.kubernetes.io/managed-by"
MANAGED_BY_VALUE: Final = "shadow-operator"
# The cache selector of the kinds whose objects the operator creates for more than one owner kind (Secrets,
# Services, NetworkPolicies): a label of ours, not one of the Sandbox API's.
MANAGED_BY_SELECTOR: Final = f"{LABEL_MANAGED_BY}={MANAGED_BY_VALUE}"
LAUNCH_COLD: Final = "cold"
LAUNCH_WARM: Final = "warm"

# Annotations.
ANNOTATION_ASSIGNED_SANDBOX: Final = "agents.x-k8s.io/sandbox-name"
# The Pod a Sandbox tracks (always the Sandbox's own name here); set before an adopted Sandbox can be Ready.
ANNOTATION_POD_NAME: Final = "agents.x-k8s.io/pod-name"
ANNOTATION_TEMPLATE_REF: Final = "agents.x-k8s.io/sandbox-template-ref"
ANNOTATION_CLIENT_FIRST_REQUESTED: Final = "agents.x-k8s.io/client-first-requested-at"
ANNOTATION_CONTROLLER_FIRST_OBSERVED: Final = "agents.x-k8s.io/controller-first-observed-at"
ANNOTATION_PROPAGATED_LABELS: Final = "agents.x-k8s.io/propagated-labels"
ANNOTATION_PROPAGATED_ANNOTATIONS: Final = "agents.x-k8s.io/propagated-annotations"

# Label and annotation prefixes that users may not set on sandbox pods: they steer selectors and ownership.
RESERVED_PREFIXES: Final = ("agents.x-k8s.io/", "extensions.agents.x-k8s.io/", f"{OPERATOR_PREFIX}/")
# Domains a claim's additionalPodMetadata may not use (upstream rejects them with InvalidMetadata).
RESTRICTED_METADATA_DOMAINS: Final = ("kubernetes.io", "k8s.io", "agents.x-k8s.io", OPERATOR_PREFIX)

# Condition types.
COND_READY: Final = "Ready"
COND_SUSPENDED: Final = "Suspended"
COND_POD_SCHEDULED: Final = "PodScheduled"
COND_FINISHED: Final = "Finished"

# Sandbox reasons.
REASON_DEPENDENCIES_READY: Final = "DependenciesReady"
REASON_DEPENDENCIES_NOT_READY: Final = "DependenciesNotReady"
REASON_SANDBOX_SUSPENDED: Final = "SandboxSuspended"
REASON_SANDBOX_EXPIRED: Final = "SandboxExpired"
REASON_POD_SUCCEEDED: Final = "PodSucceeded"
REASON_POD_FAILED: Final = "PodFailed"
REASON_MULTIPLE_PODS: Final = "MultiplePods"
REASON_RECONCILER_ERROR: Final = "ReconcilerError"
# The pod template asks for what the chart does not allow (privileged, host namespaces, hostPath, an account).
REASON_POD_SECURITY_REFUSED: Final = "PodSecurityRefused"
REASON_NOT_SUSPENDED: Final = "NotSuspended"
REASON_POD_TERMINATED: Final = "PodTerminated"
REASON_POD_TERMINATING: Final = "PodTerminating"
REASON_POD_NOT_OWNED: Final = "PodNotOwned"
REASON_POD_SCHEDULED: Final = "PodScheduled"
REASON_POD_SCHEDULING_UNKNOWN: Final = "PodSchedulingUnknown"

# Claim reasons.
REASON_TEMPLATE_NOT_FOUND: Final = "TemplateNotFound"
REASON_WARM_POOL_NOT_FOUND: Final = "WarmPoolNotFound"
REASON_SANDBOX_CREATE_PENDING: Final = "SandboxCreatePending"
REASON_SANDBOX_NOT_READY: Final = "SandboxNotReady"
REASON_SANDBOX_MISSING: Final = "SandboxMissing"
REASON_INVALID_METADATA: Final = "InvalidMetadata"
REASON_ENV_INJECTION_REJECTED: Final = "EnvVarsInjectionRejected"
REASON_VOLUME_CLAIM_TEMPLATES_ERROR: Final = "VolumeClaimTemplatesError"
REASON_CLAIM_EXPIRED: Final = "ClaimExpired"

# A claim's or environment's spec.egress against its template's: True when every rule narrows it, False when
# some were dropped for widening it (each named in the message) or the template has no spec.egress.
COND_EGRESS_NARROWED: Final = "EgressNarrowed"
REASON_RULES_APPLIED: Final = "RulesApplied"
REASON_RULES_DROPPED: Final = "RulesDropped"
REASON_TEMPLATE_HAS_NO_EGRESS: Final = "TemplateHasNoEgress"

# Runtime contract (see sandbox-runtime): port name, token mount and environment variable.
RUNTIME_PORT_NAME: Final = "runtime"
RUNTIME_DEFAULT_PORT: Final = 8888
PREVIEW_PORT_NAME: Final = "preview"
RUNTIME_TOKEN_DIR: Final = "/var/run/secrets/sandbox-runtime"
RUNTIME_TOKEN_KEY: Final = "token"
RUNTIME_TOKEN_PATH: Final = f"{RUNTIME_TOKEN_DIR}/{RUNTIME_TOKEN_KEY}"
RUNTIME_TOKEN_ENV: Final = "SANDBOX_RUNTIME_TOKEN_FILE"
RUNTIME_TOKEN_VOLUME: Final = "sandbox-runtime-token"
RUNTIME_TOKEN_SECRET_SUFFIX: Final = "-runtime-token"

# ShadowEnvironment: labels, annotations, conditions, reasons.
LABEL_ENVIRONMENT: Final = f"{OPERATOR_PREFIX}/environment"
LABEL_COMPONENT: Final = f"{OPERATOR_PREFIX}/component"
COMPONENT_GITEA: Final = "gitea"
COMPONENT_WORKSPACE: Final = "workspace"
# Set by the client after it uploaded a source: `uploads.shadow.dev/<source>: <sha256 of the archive>`.
ANNOTATION_UPLOAD_PREFIX: Final = f"uploads.{OPERATOR_PREFIX}/"
# What the workspace's diff baseline leaves out, hence what no diff, promote or race carries: git's own
# directories, the runtime's state, Python's bytecode caches (a stale .pyc can stand in for its source).
BASELINE_EXCLUDE: Final = (".git/", ".sandbox-runtime/", "__pycache__/")
# Changing its value asks for a new verification (e.g. `shadowctl verify` writes a timestamp).
ANNOTATION_VERIFY_REQUEST: Final = f"{OPERATOR_PREFIX}/verify-requested"
# Changing its value resumes a Sandbox (or a ShadowEnvironment's workspace) suspended for idleness.
ANNOTATION_RESUME_REQUEST: Final = f"{OPERATOR_PREFIX}/resume-requested"
# On a Sandbox: the claim's last resume-requested value the operator passed to it (tenants may annotate their
# claims, not Sandboxes), so that each new value of the claim's is passed once.
ANNOTATION_CLAIM_RESUME_REQUEST: Final = f"{OPERATOR_PREFIX}/claim-resume-requested"
# The newest request a client made of a Sandbox outside its runtime (RFC 3339, UTC): the preview router writes
# it on preview and SDK-path requests; the idle clock (spec.autoSuspendPolicy) counts it as activity.
ANNOTATION_LAST_ACTIVITY: Final = f"{OPERATOR_PREFIX}/last-activity"
# Idle suspension (spec.autoSuspendPolicy): the Suspended condition's reason, Ready's, and the claim's reason
# when its policy asks for more than its template allows.
REASON_IDLE: Final = "Idle"
REASON_SUSPENDED: Final = "Suspended"
REASON_AUTO_SUSPEND_POLICY_REFUSED: Final = "AutoSuspendPolicyRefused"
# ShadowEnvironmentPool: its instances' Sandboxes carry the pool's name until an environment takes one, and
# a hash of what they were made from (the pool's environment fields and its template), which an environment
# asking for the pool must match.
LABEL_POOL: Final = f"{OPERATOR_PREFIX}/pool"
ANNOTATION_POOL_HASH: Final = f"{OPERATOR_PREFIX}/pool-hash"
COND_WORKSPACE_READY: Final = "WorkspaceReady"
COND_GITEA_READY: Final = "GiteaReady"
COND_SOURCES_READY: Final = "SourcesReady"
COND_VERIFIED: Final = "Verified"
# A fork (spec.workspace.from): True once the cloned workspace is usable; its reason says Snapshot or Copy.
COND_CLONED: Final = "Cloned"
COMPONENT_SNAPSHOT: Final = "snapshot"
# On VolumeSnapshots of a workspace: the environment it was taken of, and that environment's sources (JSON
# [{name, repo, path}]), which an environment restored from it inherits.
LABEL_SNAPSHOT_OF: Final = f"{OPERATOR_PREFIX}/snapshot-of"
ANNOTATION_SNAPSHOT_SOURCES: Final = f"{OPERATOR_PREFIX}/sources"
SNAPSHOT_GROUP: Final = "snapshot.storage.k8s.io"
# On a fork's volume claim, restored from a snapshot that was still being cut when the claim was made: the
# snapshot's name, written once it is ready to use. The update wakes csi-provisioner, which otherwise retries
# the claim only after its exponential backoff (1 s, 2 s, 4 s, ...).
ANNOTATION_SNAPSHOT_READY: Final = f"{OPERATOR_PREFIX}/snapshot-ready"
GITEA_HTTP_PORT: Final = 3000
# The ref a snapshot bundle carries the snapshot commit under (the operator pushes it to the branch it names).
GIT_SNAPSHOT_REF: Final = "refs/shadow/snapshot"
# A push the client asks the operator to make (JSON, api.environment.PushRequest): a promote to a branch or a
# published directory. The operator answers in status.lastPush with the same id.
ANNOTATION_PUSH_REQUEST: Final = f"{OPERATOR_PREFIX}/push-request"
# Labels of the operator's own Pods (the chart's), which Gitea admits.
OPERATOR_POD_COMPONENT: Final = "operator"
GITEA_SECRET_USERNAME: Final = "username"
# The admin user the operator creates in each Gitea (its password is generated per Gitea).
GITEA_ADMIN_USERNAME: Final = "shadow-admin"
GITEA_SECRET_PASSWORD: Final = "password"
GITEA_SECRET_TOKEN: Final = "token"
# Environment variables the workspace gets: the Gitea base URL (seed 000's AMPLIFIER_GIT_HOST) and its org.
ENV_GITEA_URL: Final = "SHADOW_GITEA_URL"
ENV_GITEA_ORG: Final = "SHADOW_GITEA_ORG"
WORKSPACE_VOLUME: Final = "workspace"

# The operator's leader-election Lease (clients read its renewTime to tell whether an operator is running).
LEADER_LEASE_NAME: Final = "shadow-operator"
# The ConfigMap the chart writes into the release, template and tenant namespaces, saying where the operator
# is (release, namespace, Lease, Deployment, preview keys): how clients find any release (sdk/discovery.py).
DISCOVERY_CONFIGMAP: Final = "shadow-operator-discovery"
DISCOVERY_SELECTOR: Final = "app.kubernetes.io/name=shadow-operator,app.kubernetes.io/component=discovery"

# The Secret the operator writes into each namespace the preview router serves: that namespace's preview link
# keys (derived from the router's root keys, common/tokens.py), so tenants there sign links for it alone. Its
# annotation names the namespace the keys sign for.
PREVIEW_LINK_KEYS_SECRET: Final = "shadow-preview-link-keys"
ANNOTATION_PREVIEW_LINK_NAMESPACE: Final = f"{OPERATOR_PREFIX}/preview-link-namespace"

# Whether a Sandbox's preview needs a signed link (public|private); set on a SandboxTemplate, a Sandbox, or
# on a SandboxClaim / ShadowEnvironment, whose sandbox gets it.
ANNOTATION_PREVIEW_ACCESS: Final = f"{OPERATOR_PREFIX}/preview-access"

# A SandboxTemplate annotation: "none" runs the template's sandboxes without the runtime token, for clients that
# reach the runtime by the claim's Service and send none (Amicable's backend). Off by default; honoured only when
# the template's managed NetworkPolicy admits named peers alone (resources/runtime_auth.py), otherwise the token
# stays and a RuntimeTokenKept Warning says why.
ANNOTATION_RUNTIME_AUTH: Final = f"{OPERATOR_PREFIX}/runtime-auth"
RUNTIME_AUTH_NONE: Final = "none"
RUNTIME_AUTH_TOKEN: Final = "token"
REASON_RUNTIME_TOKEN_KEPT: Final = "RuntimeTokenKept"

# The egress gateway (issue 29): the per-cluster proxy that sandboxes of a template with spec.egress go through.
# The gateway's Pods carry this label (the chart sets it whatever the release's name); sandboxes' NetworkPolicy
# admits that label in the operator's namespace only.
EGRESS_GATEWAY_LABELS: Final = {f"{OPERATOR_PREFIX}/egress-gateway": "true"}
EGRESS_PROXY_PORT: Final = 3128
EGRESS_ADMIN_PORT: Final = 9091
# On a Sandbox made from a template with spec.egress: its Pod gets the proxy variables and the egress CA.
ANNOTATION_EGRESS: Final = f"{OPERATOR_PREFIX}/egress"
# The ConfigMap the gateway writes in each namespace it serves: `ca.crt` (the namespace's egress CA) and
# `bundle.crt` (the public roots and that CA), mounted read-only in the workspace.
EGRESS_CA_CONFIGMAP: Final = "shadow-egress-ca"
EGRESS_CA_DIR: Final = "/etc/shadow-egress"
EGRESS_CA_VOLUME: Final = "shadow-egress-ca"
