"""Pydantic model of ShadowEnvironmentPool (shadow.dev/v1alpha1): environments started ahead of time.

A pool keeps `replicas` instances Ready: each a workspace Sandbox (Pod Ready, volume bound) and, unless
`gitea.enabled: false`, a Gitea (Pod Ready, empty). A ShadowEnvironment naming the pool in `spec.pool` takes
one at creation and owns it from then on (its sources are copied in, its Gitea set up); the pool starts a new
one in the background. The fields here are the ShadowEnvironment fields that shape those Pods; an environment
takes an instance only when its own are equal, so an adopted environment is exactly what a cold one would be.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from shadow_operator.api.environment import MAX_REWRITES, GiteaSpec, GitRewrite, PreviewSpec, WorkspaceVolume
from shadow_operator.api.models import (
    CONDITIONS_FIELD,
    MAX_ENV,
    PRESERVE,
    ApiModel,
    ClaimEnvVar,
    Condition,
    Resource,
)

MAX_POOL_REPLICAS = 100
# The ShadowEnvironment fields that shape an instance's Pods (the pool has fields of the same names), and of
# spec.workspace the volume's (`from` makes a fork, which never takes an instance).
SHAPING_FIELDS = ("template", "workspace", "gitea", "gitRewrites", "env", "resources", "preview", "journal")
WORKSPACE_FIELDS = ("mountPath", "size", "storageClassName")


def pool_fields(pool_spec: dict[str, Any]) -> dict[str, Any]:
    """The pool's values of the shaping fields, as an environment's spec would give them (set ones only):
    what `shadowctl create --pool` starts an environment's spec from, so the environment matches its pool."""
    fields = {k: v for k, v in pool_spec.items() if k in SHAPING_FIELDS and v is not None}
    if "workspace" in fields:
        fields["workspace"] = {k: v for k, v in fields["workspace"].items() if k in WORKSPACE_FIELDS}
    return fields


class ShadowEnvironmentPoolSpec(ApiModel):
    """Desired state of a ShadowEnvironmentPool: how many instances, and the environment fields they match."""

    replicas: int = Field(
        default=1,
        ge=0,
        le=MAX_POOL_REPLICAS,
        description="Instances to keep started and unclaimed (`kubectl scale shadowenvironmentpool/NAME "
        "--replicas=N`).",
    )
    template: str | None = Field(
        default=None,
        max_length=253,
        description="SandboxTemplate (same namespace) of the workspaces; default: the operator's default "
        "template. Instances of an older version of the template are replaced.",
    )
    workspace: WorkspaceVolume = Field(
        default_factory=WorkspaceVolume, description="The workspace volume, as in a ShadowEnvironment."
    )
    gitea: GiteaSpec = Field(
        default_factory=GiteaSpec, description="The Gitea of each instance, as in a ShadowEnvironment."
    )
    git_rewrites: list[GitRewrite] | None = Field(
        default=None,
        max_length=MAX_REWRITES,
        description="The git rewrites of the workspaces (they are in the Pod's environment), as in a "
        "ShadowEnvironment.",
        json_schema_extra={"x-kubernetes-list-type": "atomic"},
    )
    env: list[ClaimEnvVar] | None = Field(
        default=None,
        max_length=MAX_ENV,
        description="Environment variables of the workspaces.",
        json_schema_extra={"x-kubernetes-list-type": "atomic"},
    )
    resources: dict[str, Any] | None = Field(
        default=None,
        description="core/v1 ResourceRequirements of the workspace container (replaces the template's).",
        json_schema_extra={"type": "object", **PRESERVE},
    )
    preview: PreviewSpec | None = Field(default=None, description="The preview dev server.")
    journal: bool = Field(
        default=True, description="Record the command journal and keep HANDOFF.md in the workspace."
    )


class ShadowEnvironmentPoolStatus(ApiModel):
    """Observed state of a ShadowEnvironmentPool."""

    conditions: list[Condition] | None = CONDITIONS_FIELD
    replicas: int | None = Field(default=None, description="Unclaimed instances, started or starting.")
    ready_replicas: int | None = Field(
        default=None, description="Unclaimed instances whose workspace and Gitea are Ready."
    )
    selector: str | None = Field(
        default=None, description="Label selector of the instances' Sandboxes (for the scale subresource)."
    )
    observed_generation: int | None = Field(default=None, description="Generation last acted upon.")


class ShadowEnvironmentPool(Resource):
    """Started workspaces and Gitea instances, for ShadowEnvironments (spec.pool) to take at creation."""

    spec: ShadowEnvironmentPoolSpec
    status: ShadowEnvironmentPoolStatus | None = None
