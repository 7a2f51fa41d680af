"""Operator start-up and shut-down: kopf settings, the API client, work queues and the metrics server."""

from __future__ import annotations

import logging
from typing import Any

import kopf
from prometheus_client import start_http_server

from shadow_operator.api import constants as c
from shadow_operator.clients.kube import Kube
from shadow_operator.controllers import claim, runtime, sandbox, template, warmpool
from shadow_operator.controllers.queue import WorkQueue

_metrics_started: set[int] = set()


@kopf.on.login()
def login(logger: kopf.Logger, **kwargs: Any) -> kopf.ConnectionInfo | None:
    """In-cluster service account first, else the kubeconfig: no extra client library needed for kopf."""
    return kopf.login_with_service_account(logger=logger, **kwargs) or kopf.login_with_kubeconfig(
        logger=logger, **kwargs
    )


@kopf.on.startup()
async def configure(settings: kopf.OperatorSettings, logger: kopf.Logger, **_: Any) -> None:
    config = runtime.Config.from_env()
    if config.json_logs:
        kopf.configure(log_format=kopf.LogFormat.JSON)
    # Our bookkeeping lives under our own prefix so it never collides with another operator's.
    settings.persistence.finalizer = c.FINALIZER
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=c.OPERATOR_PREFIX)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=c.OPERATOR_PREFIX, key="last-handled-configuration"
    )
    settings.peering.name = "shadow-operator"
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    settings.watching.connect_timeout = 10
    settings.networking.request_timeout = 60
    # Watch only our pods and services (server-side), not every pod of the cluster.
    settings.watching.label_selectors["v1", "pods"] = c.LABEL_SANDBOX_NAME_HASH
    settings.watching.label_selectors["v1", "services"] = c.LABEL_SANDBOX_NAME_HASH
    # kopf logs every handler run at INFO; posting those as Events would double the API traffic. Our own
    # Events go through controllers/events.py.
    settings.posting.level = logging.WARNING
    # One "Handler succeeded" line per watch event is noise at our event rates; failures still show.
    logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    # The liveness endpoint is probed every few seconds; its access lines would drown the log.
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    settings.execution.max_workers = 4

    kube = await Kube.connect()
    rt = runtime.Runtime(config=config, kube=kube)
    for kind, reconcile in (
        ("Sandbox", sandbox.reconcile),
        ("SandboxClaim", claim.reconcile),
        ("SandboxWarmPool", warmpool.reconcile),
        ("SandboxTemplate", template.reconcile),
    ):
        rt.queues[kind] = WorkQueue(kind, reconcile, workers=config.workers)
        rt.queues[kind].start()
    runtime.install(rt)
    if config.metrics_port and config.metrics_port not in _metrics_started:
        start_http_server(config.metrics_port)
        _metrics_started.add(config.metrics_port)
    logger.info("shadow-operator started (metrics port %s)", config.metrics_port or "off")


@kopf.on.cleanup()
async def shutdown(**_: Any) -> None:
    rt = runtime.current()
    for queue in rt.queues.values():
        await queue.stop()
    await rt.kube.close()
    runtime.install(None)
