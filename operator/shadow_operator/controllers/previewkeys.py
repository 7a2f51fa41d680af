"""Each served namespace's preview link keys, published by the operator (issue 28 L3).

The router holds the root keys (its keys Secret, which no tenant reads) and verifies a link to a sandbox of
namespace N with N's keys only: HMAC(root key, N) under each root key's id (`KeyRing.for_namespace`). This
loop writes N's keys into the Secret `shadow-preview-link-keys` in every namespace the router serves, so
whoever may read Secrets in N (the `edit` role) signs links for N's sandboxes and for no other namespace's.
It reads the root Secret again every `every` seconds: a key added to it (rotation) reaches every namespace
within that time, a key removed is removed there too. A tenant's edit of its Secret is undone on the next
pass; it could only ever spoil its own namespace's links.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass

import aiohttp
import kopf

from shadow_operator.api.kinds import SECRET
from shadow_operator.api.models import ObjectMeta, Secret
from shadow_operator.clients.kube import ApiError, Kube
from shadow_operator.common.tokens import KeyRing
from shadow_operator.controllers.config import Config
from shadow_operator.resources.previewkeys import differs, link_keys_secret

log = logging.getLogger(__name__)
EVERY_SECONDS = 30.0


@dataclass
class LinkKeysPublisher:
    kube: Kube
    root_namespace: str
    root_name: str
    namespaces: Sequence[str]
    every: float = EVERY_SECONDS

    async def root(self) -> KeyRing | None:
        """The router's keys; None when there are none to derive from (nothing is then written)."""
        body = await self.kube.get(SECRET.path(self.root_namespace, self.root_name))
        if body is None:
            log.info(
                "no preview keys Secret %s/%s: no link keys published", self.root_namespace, self.root_name
            )
            return None
        try:
            return KeyRing.from_secret_data(Secret.model_validate(body).data) or None
        except ValueError as exc:
            log.error("preview keys Secret %s/%s: %s", self.root_namespace, self.root_name, exc)
            return None

    async def publish(self) -> list[str]:
        """One pass: write each namespace's keys where they are missing or differ; the namespaces written."""
        root = await self.root()
        if root is None:
            return []
        written = []
        for namespace in self.namespaces:
            wanted = link_keys_secret(namespace, root)
            path = SECRET.path(namespace, wanted["metadata"]["name"])
            try:
                current = await self.kube.get(path)
                if not differs(current, wanted):
                    continue
                if current is None:
                    await self.kube.create(SECRET.path(namespace), wanted)
                else:
                    meta = ObjectMeta.model_validate(current["metadata"])
                    wanted["metadata"] = {
                        **current["metadata"],
                        "labels": {**meta.labels, **wanted["metadata"]["labels"]},
                        "annotations": {**meta.annotations, **wanted["metadata"]["annotations"]},
                    }
                    await self.kube.replace(path, wanted)  # carries resourceVersion: a race is a 409, retried
                written.append(namespace)
            except ApiError as exc:
                log.warning("preview link keys of %s not written: %s", namespace, exc)
        if written:
            log.info("preview link keys written in %s", ", ".join(written))
        return written

    async def run(self) -> None:
        while True:
            try:
                await self.publish()
            except (ApiError, aiohttp.ClientError, TimeoutError) as exc:
                log.warning("preview link keys: %s", exc)
            await asyncio.sleep(self.every)


_running: dict[str, tuple[Kube, asyncio.Task[None]]] = {}


async def start(config: Config) -> None:
    """Start publishing when the chart named the router's keys Secret and the namespaces it serves."""
    if not config.preview_keys_secret or not config.preview_namespaces:
        return
    namespace, _, name = config.preview_keys_secret.partition("/")
    kube = await Kube.connect()
    publisher = LinkKeysPublisher(kube, namespace, name, config.preview_namespaces)
    _running["publisher"] = (kube, asyncio.create_task(publisher.run()))


async def stop() -> None:
    running = _running.pop("publisher", None)
    if running is not None:
        kube, task = running
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await kube.close()


def register(registry: kopf.OperatorRegistry | None = None) -> None:
    async def on_startup(**_: object) -> None:
        await start(Config.from_env())

    async def on_cleanup(**_: object) -> None:
        await stop()

    kopf.on.startup(id="preview-link-keys/startup", registry=registry)(on_startup)
    kopf.on.cleanup(id="preview-link-keys/cleanup", registry=registry)(on_cleanup)
