"""The cluster as the gateway's policy source: templates, claims, environments, sandbox Pods and credential
Secrets, each listed then watched, and the table rebuilt whenever one changes (well within 2 s).

A sandbox Pod is under a policy when its template (the Pod's template-ref-hash label, in its namespace) has
spec.egress; its claim (claim-uid label) or environment (environment label) may narrow it. Its addresses are
the Pod's IPs as the API server reports them, its proxy credential is derived from the gateway's key and the
Pod's namespace and name (the Pod is named like its Sandbox). Credentials come only from Secrets labelled
`shadow.dev/egress-credential: "true"`: the gateway never holds any other Secret.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import certifi
from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException

from shadow_operator.api import constants as c
from shadow_operator.api import kinds, naming
from shadow_operator.api.environment import ShadowEnvironment
from shadow_operator.api.models import SandboxClaim, SandboxTemplate, Secret
from shadow_operator.common import egress
from shadow_operator.common.egress import proxy_token
from shadow_operator.egress.table import PolicyTable, SandboxEntry

log = logging.getLogger(__name__)
CREDENTIAL_LABEL = f"{c.OPERATOR_PREFIX}/egress-credential"
CA_SECRET_PREFIX = "shadow-egress-ca-"
CA_NAMESPACE_LABEL = f"{c.OPERATOR_PREFIX}/egress-ca-for"
# Coalesces a burst of watch events into one rebuild.
REBUILD_DELAY_SECONDS = 0.05
WATCH_TIMEOUT_SECONDS = 300

Key = tuple[str, str]


@dataclass(frozen=True)
class Feed:
    name: str
    lister: Callable[..., Any]
    args: tuple[Any, ...] = ()
    selector: str | None = None


class KubeSource:
    def __init__(
        self,
        api: client.ApiClient,
        table: PolicyTable,
        key: bytes,
        ca_pem: Callable[[str], bytes],
        on_rebuild: Callable[[], None] = lambda: None,
    ) -> None:
        self.api, self.table, self.key, self.ca_pem, self.on_rebuild = api, table, key, ca_pem, on_rebuild
        self.published: dict[str, bytes] = {}
        self.objects: dict[str, dict[Key, dict[str, Any]]] = {}
        self.changed = threading.Event()
        custom, core = client.CustomObjectsApi(api), client.CoreV1Api(api)

        def crd(kind: kinds.ResourceKind) -> Feed:
            return Feed(
                kind.plural, custom.list_cluster_custom_object, (kind.group, kind.version, kind.plural)
            )

        self.feeds = [
            crd(kinds.SANDBOX_TEMPLATE),
            crd(kinds.SANDBOX_CLAIM),
            crd(kinds.SHADOW_ENVIRONMENT),
            Feed("pods", core.list_pod_for_all_namespaces, selector=c.LABEL_TEMPLATE_REF_HASH),
            Feed("secrets", core.list_secret_for_all_namespaces, selector=f"{CREDENTIAL_LABEL}=true"),
        ]

    def start(self) -> None:
        for feed in self.feeds:
            self.objects[feed.name] = {}
            threading.Thread(
                target=self._follow, args=(feed,), name=f"watch-{feed.name}", daemon=True
            ).start()
        threading.Thread(target=self._rebuild_loop, name="rebuild", daemon=True).start()

    # ------------------------------------------------------------------------------------------ watching
    def _events(self, feed: Feed) -> Iterator[tuple[str, dict[str, Any]]]:
        kwargs: dict[str, Any] = {"label_selector": feed.selector} if feed.selector else {}
        listed = self.api.sanitize_for_serialization(feed.lister(*feed.args, **kwargs))
        yield "SYNC", listed
        stream = watch.Watch().stream(
            feed.lister,
            *feed.args,
            resource_version=listed["metadata"]["resourceVersion"],
            timeout_seconds=WATCH_TIMEOUT_SECONDS,
            **kwargs,
        )
        for event in stream:
            yield event["type"], self.api.sanitize_for_serialization(event["object"])

    def _follow(self, feed: Feed) -> None:
        while True:
            try:
                for kind, obj in self._events(feed):
                    store = self.objects[feed.name]
                    if kind == "SYNC":
                        self.objects[feed.name] = {_key(item): item for item in obj.get("items") or ()}
                    elif kind == "DELETED":
                        store.pop(_key(obj), None)
                    elif kind in ("ADDED", "MODIFIED"):
                        store[_key(obj)] = obj
                    self.changed.set()
            except (
                Exception
            ) as error:  # whatever it was (API, TLS, network), list again: never stop following
                log.warning("watch of %s: %s; listing again", feed.name, error)
                time.sleep(1)

    def _rebuild_loop(self) -> None:
        while True:
            self.changed.wait()
            time.sleep(REBUILD_DELAY_SECONDS)
            self.changed.clear()
            try:
                self.rebuild()
            except Exception:  # a bad object must not stop the gateway from following the others
                log.exception("rebuilding the egress table")

    # ------------------------------------------------------------------------------------------ building
    def rebuild(self) -> None:
        templates: dict[Key, SandboxTemplate] = {}
        for (namespace, name), body in self.objects.get("sandboxtemplates", {}).items():
            parsed = SandboxTemplate.model_validate(body)
            if parsed.spec.egress is not None:
                templates[(namespace, naming.name_hash(name))] = parsed
        claims = {
            (ns, body["metadata"]["uid"]): SandboxClaim.model_validate(body)
            for (ns, _), body in self.objects.get("sandboxclaims", {}).items()
        }
        environments = {
            key: ShadowEnvironment.model_validate(body)
            for key, body in self.objects.get("shadowenvironments", {}).items()
        }
        entries = []
        for (namespace, name), pod in self.objects.get("pods", {}).items():
            labels = pod["metadata"].get("labels") or {}
            template = templates.get((namespace, labels.get(c.LABEL_TEMPLATE_REF_HASH, "")))
            if template is None:
                continue
            narrowing = None
            if (claim := claims.get((namespace, labels.get(c.LABEL_CLAIM_UID, "")))) is not None:
                narrowing = claim.spec.egress
            elif (env := environments.get((namespace, labels.get(c.LABEL_ENVIRONMENT, "")))) is not None:
                narrowing = env.spec.egress
            result = egress.effective(template.spec.egress, narrowing)
            status = pod.get("status") or {}
            addresses = {item["ip"] for item in status.get("podIPs") or () if item.get("ip")}
            entries.append(
                SandboxEntry(
                    namespace=namespace,
                    name=name,
                    token=proxy_token(self.key, namespace, name),
                    addresses=frozenset(addresses),
                    rules=result.rules or (),
                    dropped=result.dropped,
                    uid=sandbox_uid(pod),
                )
            )
        secrets = {
            key: Secret.model_validate(body).values() for key, body in self.objects.get("secrets", {}).items()
        }
        # Each namespace's CA first (read or made through the API server, here in this thread), so that the
        # proxy finds it loaded when the namespace's first sandbox connects.
        for namespace in sorted({entry.namespace for entry in entries}):
            self.publish_ca(namespace)
        self.table.replace(entries, secrets)
        self.on_rebuild()
        log.info("egress table: %d sandboxes, %d credential secrets", len(entries), len(secrets))

    async def runtime_token(self, entry: SandboxEntry) -> str | None:
        """The sandbox's runtime token (its Secret, read by name when asked): what opens its decision log."""

        def read() -> str | None:
            try:
                body = client.CoreV1Api(self.api).read_namespaced_secret(
                    naming.token_secret_name(entry.name), entry.namespace
                )
            except ApiException:
                return None
            return (
                Secret.model_validate(self.api.sanitize_for_serialization(body))
                .values()
                .get(c.RUNTIME_TOKEN_KEY)
            )

        return await asyncio.to_thread(read)

    def publish_ca(self, namespace: str) -> None:
        """The namespace's CA certificate (never its key) as the ConfigMap its workspaces mount: `ca.crt` alone
        and `bundle.crt`, the public roots with it, for tools that read one bundle (SSL_CERT_FILE)."""
        try:
            pem = self.ca_pem(namespace)
        except Exception as error:  # one namespace's CA must not hold back every other policy change
            log.warning("egress CA of namespace %s not loaded: %s", namespace, error)
            return
        if self.published.get(namespace) == pem:
            return
        body = {
            "metadata": {
                "name": c.EGRESS_CA_CONFIGMAP,
                "namespace": namespace,
                "labels": {c.LABEL_MANAGED_BY: c.MANAGED_BY_VALUE},
            },
            "data": {"ca.crt": pem.decode(), "bundle.crt": Path(certifi.where()).read_text() + pem.decode()},
        }
        core = client.CoreV1Api(self.api)
        try:
            core.create_namespaced_config_map(namespace, body)
        except ApiException as error:
            if error.status != 409:
                log.warning("egress CA of namespace %s not published: %s", namespace, error.reason)
                return
            core.replace_namespaced_config_map(c.EGRESS_CA_CONFIGMAP, namespace, body)
        self.published[namespace] = pem


def create_or_read_secret(
    api: client.ApiClient, namespace: str, name: str, make: Callable[[], dict[str, Any]]
) -> dict[str, str]:
    """The values of a Secret the gateway keeps in its own namespace, made from make() (a body's other fields
    than its name and namespace) when there is none. Gateways racing to make it (replicas, a restart) end with
    one: the API server creates it once and the others read what it holds."""
    core = client.CoreV1Api(api)

    def read() -> dict[str, str]:
        body = core.read_namespaced_secret(name, namespace)
        return Secret.model_validate(api.sanitize_for_serialization(body)).values()

    try:
        return read()
    except ApiException as error:
        if error.status != 404:
            raise
    body = make()
    body["metadata"] = {
        **body.get("metadata", {}),
        "name": name,
        "namespace": namespace,
        "labels": {c.LABEL_MANAGED_BY: c.MANAGED_BY_VALUE, **body.get("metadata", {}).get("labels", {})},
    }
    try:
        core.create_namespaced_secret(namespace, body)
    except ApiException as error:
        if error.status != 409:
            raise
    return read()


def ensure_key(api: client.ApiClient, namespace: str, name: str) -> bytes:
    """The proxy credentials' key from its Secret, made (random) by the first gateway that finds none; the
    operator mounts the same Secret. Kept in the cluster, not in the chart, so that a render is the same every
    time (GitOps tools compare renders) and the key survives upgrades."""
    values = create_or_read_secret(
        api, namespace, name, lambda: {"stringData": {"key": secrets.token_urlsafe(48)}}
    )
    return values["key"].encode()


def ca_secret_name(namespace: str) -> str:
    """The Secret, in the gateway's own namespace, with the CA key of sandbox namespace `namespace`."""
    return f"{CA_SECRET_PREFIX}{namespace}"


def ca_keeper(
    api: client.ApiClient, home: str
) -> Callable[[str, Callable[[], tuple[bytes, bytes]]], tuple[bytes, bytes]]:
    """Each namespace's CA (key and certificate) in a Secret in `home`, the gateway's own namespace, never in
    the tenant's: what a tenant creates in its namespace can neither become the CA nor read it. The Secret is
    looked up by a name derived from the namespace, in `home` only."""

    def keep(namespace: str, make: Callable[[], tuple[bytes, bytes]]) -> tuple[bytes, bytes]:
        def body() -> dict[str, Any]:
            key, cert = make()
            return {
                "metadata": {"labels": {CA_NAMESPACE_LABEL: namespace}},
                "type": "kubernetes.io/tls",
                "stringData": {"tls.key": key.decode(), "tls.crt": cert.decode()},
            }

        values = create_or_read_secret(api, home, ca_secret_name(namespace), body)
        return values["tls.key"].encode(), values["tls.crt"].encode()

    return keep


def sandbox_uid(pod: dict[str, Any]) -> str:
    """The uid of the Sandbox that owns the Pod ("" when none does)."""
    owners = pod["metadata"].get("ownerReferences") or ()
    return next((str(o.get("uid") or "") for o in owners if o.get("kind") == kinds.SANDBOX.kind), "")


class EventWriter:
    """The Kubernetes side of the decision log (egress.events): create and patch Events, nothing else."""

    def __init__(self, api: client.ApiClient) -> None:
        self.events = client.EventsV1Api(api)

    def create(self, namespace: str, body: dict[str, Any]) -> None:
        self.events.create_namespaced_event(namespace, body)

    def patch(self, namespace: str, name: str, body: dict[str, Any]) -> bool:
        try:
            self.events.patch_namespaced_event(name, namespace, body)
        except ApiException as error:
            if error.status == 404:  # expired (the API server's event TTL): write it anew
                return False
            raise
        return True


def _key(obj: dict[str, Any]) -> Key:
    return obj["metadata"].get("namespace", ""), obj["metadata"]["name"]
