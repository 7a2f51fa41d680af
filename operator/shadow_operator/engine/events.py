"""An event recorder: Kubernetes Events about our objects, posted in the background.

A reconcile never waits on an Event, and a failure to post one is logged and dropped: events inform, they do
not steer. (kopf's own `kopf.info()` needs kopf's per-handler context, which the work-queue tasks lack.)
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

from shadow_operator.api.kinds import EVENT
from shadow_operator.clients.kube import Kube
from shadow_operator.resources.events import build_event

_log = logging.getLogger("shadow_operator.events")


class EventRecorder:
    def __init__(self, kube: Kube) -> None:
        self._kube = kube
        self._pending: set[asyncio.Task[None]] = set()

    def info(self, obj: Mapping[str, Any], reason: str, message: str) -> None:
        self._post(obj, "Normal", reason, message)

    def warn(self, obj: Mapping[str, Any], reason: str, message: str) -> None:
        self._post(obj, "Warning", reason, message)

    def _post(self, obj: Mapping[str, Any], type_: str, reason: str, message: str) -> None:
        event = build_event(obj, type_, reason, message)
        task = asyncio.get_running_loop().create_task(self._send(event))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def _send(self, event: dict[str, Any]) -> None:
        try:
            await self._kube.create(EVENT.path(event["metadata"]["namespace"]), event)
        except Exception as exc:
            _log.info("could not post event %s: %s", event["reason"], exc)

    async def drain(self) -> None:
        """Wait for events still being posted (at shutdown)."""
        if self._pending:
            await asyncio.gather(*self._pending, return_exceptions=True)
