"""kopf settings and the operator's own start-up (login, metrics server), in one place."""

from __future__ import annotations

import logging
from typing import Any

import kopf
from prometheus_client import start_http_server

from shadow_operator.api import constants as c
from shadow_operator.api.kinds import NAMESPACE
from shadow_operator.clients.kube import ApiError
from shadow_operator.controllers.config import Config
from shadow_operator.engine import Client, Concurrency, Reconciler
from shadow_operator.resources.podsecurity import namespace_labels

log = logging.getLogger(__name__)

_metrics_started: set[int] = set()


class NoDiffBase(kopf.DiffBaseStorage):
    """A diff-base storage for an operator without change-detecting handlers (on.create/update/resume).

    kopf builds the "essence" of every object on every watch event (a deep copy of the body) to detect
    changes for such handlers; ours are index and event handlers only, which never look at it. Profiling the
    claim benchmark showed that copy as 7% of the operator's CPU: this storage builds nothing and stores nothing.
    """

    def build(self, *, body: kopf.Body, extra_fields: Any = None) -> kopf.BodyEssence:
        return kopf.BodyEssence()

    def fetch(self, *, body: kopf.Body) -> kopf.BodyEssence | None:
        return None

    def store(self, *, body: kopf.Body, patch: kopf.Patch, essence: kopf.BodyEssence) -> None:
        return None


def login(logger: kopf.Logger, **kwargs: Any) -> kopf.ConnectionInfo | None:
    """In-cluster service account first, else the kubeconfig: no extra client library needed for kopf."""
    return kopf.login_with_service_account(logger=logger, **kwargs) or kopf.login_with_kubeconfig(
        logger=logger, **kwargs
    )


def configure(settings: kopf.OperatorSettings, config: Config) -> None:
    if config.json_logs:
        kopf.configure(log_format=kopf.LogFormat.JSON)
    # Our bookkeeping lives under our own prefix so it never collides with another operator's.
    settings.persistence.finalizer = c.FINALIZER
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=c.OPERATOR_PREFIX)
    settings.persistence.diffbase_storage = NoDiffBase()
    settings.peering.name = "shadow-operator"
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    settings.watching.connect_timeout = 10
    settings.networking.request_timeout = 60
    # kopf logs every handler run at INFO; posting those as Events would double the API traffic. Our own
    # Events go through the engine's recorder.
    settings.posting.level = logging.WARNING
    # One "Handler succeeded" line per watch event is noise at our event rates; failures still show.
    logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    # The liveness endpoint is probed every few seconds; its access lines would drown the log.
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    start_metrics(config)


def start_metrics(config: Config) -> None:
    """Serve Prometheus metrics (once per process; a standby replica serves them while it waits, too)."""
    if config.metrics_port and config.metrics_port not in _metrics_started:
        start_http_server(config.metrics_port)
        _metrics_started.add(config.metrics_port)


def concurrency(config: Config, reconciler: type[Reconciler[Any]]) -> Concurrency:
    """A kind's workers (chart value operator.workers, per kind) and namespace share (operator.namespaceShare):
    the reconciler's defaults unless set; its operations' slots (operator.operations)."""
    return Concurrency(
        workers=config.workers.get(reconciler.name(), reconciler.workers),
        namespace_share=config.namespace_share or reconciler.namespace_share,
        operations=config.operations,
        operations_per_namespace=config.operations_per_namespace,
    )


async def prepare(client: Client, config: Config) -> None:
    """Before any reconciler runs: label the tenant namespaces to enforce the chart's Pod Security level.

    Server-side apply without force: the labels are ours to keep in step with the chart, but one that somebody
    else set to another value (a platform team's deliberate choice) is left as it is, and said. A namespace we
    may not patch or that is gone is said too; neither stops the operator (`shadowctl doctor` shows the rest).
    """
    for name in config.pod_security_namespaces:
        fields = namespace_labels(
            name, config.pod_security.level, config.pod_security_warn, config.pod_security_audit
        )
        try:
            await client.apply_fields(NAMESPACE, fields)
        except ApiError as exc:
            if exc.status not in (403, 404, 409):
                raise
            log.warning(
                "namespace %s: Pod Security labels %s not applied: %s",
                name,
                fields["metadata"]["labels"],
                exc.message,
            )
        else:
            log.info("namespace %s: Pod Security labels %s", name, fields["metadata"]["labels"])
