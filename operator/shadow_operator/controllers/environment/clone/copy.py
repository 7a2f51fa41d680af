"""The copy part of the clone step: where the source's volume cannot be snapshotted (or spec.workspace.from.method
is Copy), the workspace is streamed from the source's runtime into the fork's once the fork's Pod is up."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

from shadow_operator.api import constants as c
from shadow_operator.api.environment import CloneStatus
from shadow_operator.api.kinds import SHADOW_ENVIRONMENT
from shadow_operator.clients.runtime import RuntimeRefused, RuntimeStalled, RuntimeUnavailable
from shadow_operator.controllers.environment.clone.restore import BASELINE_DIR, instance, runtime_url
from shadow_operator.controllers.environment.state import RETRY_SECONDS, Pass, Ports, StepFailed


class CopyPart:
    def __init__(self, deps: Ports) -> None:
        self.deps = deps

    async def copy(self, state: Pass, clone: CloneStatus, timeout: int) -> int:
        env, deps = state.env, self.deps
        source_name = clone.source.partition("/")[2]
        source = deps.cache.store(SHADOW_ENVIRONMENT).get(env.namespace, source_name)
        if source is None:
            raise StepFailed(
                "CloneSourceNotFound",
                "CloneSourceNotFound",
                f"environment {source_name!r} was deleted before its workspace was copied",
                retry=None,
            )
        started = clone.started_at or datetime.now(UTC)
        remaining = timeout - (state.now() - started).total_seconds()
        if remaining <= 0:
            raise StepFailed(
                "CopyFailed",
                "CopyFailed",
                f"environment {source_name}'s workspace was not copied within {timeout}s; is it running "
                "(not suspended)? Raise spec.workspace.from.timeoutSeconds for large workspaces",
                retry=None,
            )
        url = runtime_url(source)
        try:
            async with (
                deps.runtime_for(env.namespace, instance(source), url) as origin,
                deps.runtime_for(env.namespace, state.instance, state.status.runtime_url) as target,
            ):
                async with asyncio.timeout(remaining):
                    copied = await origin.copy_tree_to(target, "", timeout=remaining)
                    if await origin.has_baseline():
                        # The diff baseline comes along, so the fork diffs (and promotes) against the sources
                        # as they were copied in, like a snapshot's clone.
                        copied += await origin.copy_tree_to(target, BASELINE_DIR, timeout=remaining)
        except TimeoutError:
            raise StepFailed(
                "CopyFailed",
                "CopyFailed",
                f"copying environment {source_name}'s workspace took longer than {timeout}s; raise "
                "spec.workspace.from.timeoutSeconds for large workspaces",
                retry=None,
            ) from None
        except RuntimeRefused as exc:
            raise StepFailed(
                "CopyFailed", "CopyFailed", f"copying the workspace: {exc}", retry=RETRY_SECONDS
            ) from None
        except RuntimeStalled as exc:
            raise StepFailed(
                "RuntimeStalled", "RuntimeStalled", f"copying the workspace: {exc}", retry=RETRY_SECONDS
            ) from None
        except RuntimeUnavailable as exc:
            message = f"copying from environment {source_name} (it must be running): {exc}"
            state.set(c.COND_CLONED, False, "Copying", message)
            raise StepFailed(None, "Copying", message) from None
        return copied
