"""What a fork's workspace volume is made from, and what the environment being forked is (shared by the clone
step's snapshot and copy parts)."""

from __future__ import annotations

from dataclasses import dataclass

from shadow_operator.api.environment import ShadowEnvironment
from shadow_operator.engine.cache import Body

# The runtime's diff baseline, in its state directory on the volume (a copy-fork takes it along).
BASELINE_DIR = ".sandbox-runtime/baseline"


@dataclass(frozen=True)
class Restore:
    """What a fork's workspace volume is made from."""

    data_source: dict[str, str] | None  # a VolumeSnapshot, or None (an empty volume the copy fills)
    storage_class: str | None
    min_size: str | None
    # Seconds after which the step wants another pass (a snapshot still being cut); None: none of its own.
    poll: float | None = None


def runtime_url(source: Body | None) -> str | None:
    """The runtime URL of the environment being forked (its status, validated into the model)."""
    status = ShadowEnvironment.from_body(source).status if source else None
    return status.runtime_url if status else None


def size_or_none(size: str | None) -> str | None:
    """A restore size to ask for; "0" records a snapshot that reported none."""
    return size if size and size != "0" else None


def instance(source: Body) -> str:
    """What the workspace of the environment being forked is named after (its status.sandbox: a pool
    instance it took, or its own name)."""
    status = ShadowEnvironment.from_body(source).status
    return (status.sandbox if status else None) or source["metadata"]["name"]
