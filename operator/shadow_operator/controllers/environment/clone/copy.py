"""The copy part of the clone step: where the source's volume cannot be snapshotted (or spec.workspace.from.method
is Copy), the workspace is streamed from the source's runtime into the fork's once the fork's Pod is up, as an
operation off the reconcile workers (engine/operations.py)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Final

from shadow_operator.api import constants as c
from shadow_operator.api.environment import CloneStatus, OperationRun
from shadow_operator.api.kinds import SHADOW_ENVIRONMENT
from shadow_operator.clients.runtime import RuntimeRefused, RuntimeStalled, RuntimeUnavailable
from shadow_operator.controllers.environment.clone.restore import BASELINE_DIR, instance, runtime_url
from shadow_operator.controllers.environment.state import RETRY_SECONDS, Pass, Ports, StepFailed
from shadow_operator.engine import Outcome, Running

CLONE_COPY: Final = "CloneCopy"


class CopyPart:
    def __init__(self, deps: Ports) -> None:
        self.deps = deps

    async def copy(self, state: Pass, clone: CloneStatus, timeout: int) -> int | None:
        """Stream the source's workspace into the fork's as an operation (engine/operations.py), recorded in
        status.operation: the bytes copied once it ended, None while it is under way (its end wakes the pass)."""
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
        key = (env.namespace, env.name)
        run = state.status.operation
        if run is not None and run.kind == CLONE_COPY:
            seen = deps.operations.look(key, CLONE_COPY, run.id)
            if isinstance(seen, Running):
                return None
            state.status.operation = None  # set explicitly: the status patch clears it
            if isinstance(seen, Outcome):
                try:
                    copied: int = seen.result()
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
                        "RuntimeStalled",
                        "RuntimeStalled",
                        f"copying the workspace: {exc}",
                        retry=RETRY_SECONDS,
                    ) from None
                except RuntimeUnavailable as exc:
                    message = f"copying from environment {source_name} (it must be running): {exc}"
                    state.set(c.COND_CLONED, False, "Copying", message)
                    raise StepFailed(None, "Copying", message) from None
                return copied
            # None: started by an operator that is gone; a copy again overwrites the same files.
        origin = deps.runtime_for(env.namespace, instance(source), runtime_url(source))
        target = deps.runtime_for(env.namespace, state.instance, state.status.runtime_url)

        async def work() -> int:
            async with origin, target:
                copied = await origin.copy_tree_to(target, "", timeout=remaining)
                if await origin.has_baseline():
                    # The diff baseline comes along, so the fork diffs (and promotes) against the sources as
                    # they were copied in, like a snapshot's clone.
                    copied += await origin.copy_tree_to(target, BASELINE_DIR, timeout=remaining)
            return copied

        now = state.now()
        state.status.operation = OperationRun(
            kind=CLONE_COPY,
            id=deps.operations.start(key, CLONE_COPY, work, timeout=remaining),
            started_at=now.replace(microsecond=0),
            deadline=(now + timedelta(seconds=remaining)).replace(microsecond=0),
        )
        return None
