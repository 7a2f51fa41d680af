"""Kubernetes Events about our objects, posted in the background so a reconcile never waits on them.

kopf's own `kopf.info()` needs kopf's per-task context, which our work-queue tasks do not have, so events
go through our client. Failures to post are logged and dropped: events are informational.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

from shadow_operator.clients.kube import resource_path
from shadow_operator.controllers import runtime
from shadow_operator.resources.events import build_event

_log = logging.getLogger("shadow_operator.events")
_pending: set[asyncio.Task[None]] = set()


def info(obj: Mapping[str, Any], reason: str, message: str) -> None:
    _post(obj, "Normal", reason, message)


def warn(obj: Mapping[str, Any], reason: str, message: str) -> None:
    _post(obj, "Warning", reason, message)


def _post(obj: Mapping[str, Any], type_: str, reason: str, message: str) -> None:
    event = build_event(obj, type_, reason, message)
    task = asyncio.get_running_loop().create_task(_send(event))
    _pending.add(task)
    task.add_done_callback(_pending.discard)


async def _send(event: dict[str, Any]) -> None:
    try:
        await runtime.current().kube.create(
            resource_path("v1", "events", event["metadata"]["namespace"]), event
        )
    except Exception as exc:
        _log.info("could not post event %s: %s", event["reason"], exc)
