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

from shadow_operator.api.environment import WorkspaceShape, WorkspaceVolume
from shadow_operator.api.models import CONDITIONS_FIELD, ApiModel, Condition, Resource

MAX_POOL_REPLICAS = 100
# The ShadowEnvironment fields that shape an instance's Pods (the pool has fields of the same names), and of
# spec.workspace the volume's (`from` makes a fork, which never takes an instance).
SHAPING_FIELDS = (
    "template",
    "runtimeClassName",
    "workspace",
    "gitea",
    "gitRewrites",
    "env",
    "resources",
    "preview",
    "journal",
)
WORKSPACE_FIELDS = ("mountPath", "size", "storageClassName")


def pool_fields(pool_spec: dict[str, Any]) -> dict[str, Any]:
    """The pool's values of the shaping fields, as an environment's spec would give them (set ones only):
    what `shadowctl create --pool` starts an environment's spec from, so the environment matches its pool."""
    fields = {k: v for k, v in pool_spec.items() if k in SHAPING_FIELDS and v is not None}
    if "workspace" in fields:
        fields["workspace"] = {k: v for k, v in fields["workspace"].items() if k in WORKSPACE_FIELDS}
    return fields


class ShadowEnvironmentPoolSpec(WorkspaceShape):
    """Desired state of a ShadowEnvironmentPool: how many instances, and the environment fields they are made
    from (a ShadowEnvironment's, with the same defaults; an instance's template is replaced when it changes)."""

    replicas: int = Field(
        default=1,
        ge=0,
        le=MAX_POOL_REPLICAS,
        description="Instances to keep started and unclaimed (`kubectl scale shadowenvironmentpool/NAME "
        "--replicas=N`).",
    )
    workspace: WorkspaceVolume = Field(
        default_factory=WorkspaceVolume, description="The workspace volume, as in a ShadowEnvironment."
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
