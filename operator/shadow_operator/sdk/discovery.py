"""Where the operator is, for any release name and namespace, with leader election on or off.

The chart writes a ConfigMap `shadow-operator-discovery` into the release namespace, the default template's
and every tenant namespace (where tenants may read ConfigMaps): the release, its namespace, the operator's
Lease and Deployment, the preview keys Secret. A client reads it in the namespace it works in; failing that,
it lists such ConfigMaps cluster-wide (administrators may); failing that, it assumes the chart's defaults (a
release `shadow-operator` in `shadow-system`) and says so.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

from shadow_operator.api import constants as c
from shadow_operator.api.kinds import CONFIG_MAP, DEPLOYMENT, LEASE
from shadow_operator.sdk import kube
from shadow_operator.sdk.errors import Forbidden, NotFound
from shadow_operator.sdk.kube import Body, Call, Op


@dataclass(frozen=True)
class OperatorLocation:
    release: str
    namespace: str
    deployment: str
    leader_election: bool
    lease: str
    keys_secret: str
    keys_namespace: str
    # Where this came from: "ConfigMap NS/NAME", or "" when nothing was found and the defaults are assumed.
    source: str = ""

    @classmethod
    def from_config_map(cls, body: Body) -> OperatorLocation:
        data: dict[str, Any] = body.get("data") or {}
        meta = body.get("metadata") or {}
        release = str(data.get("release") or "shadow-operator")
        namespace = str(data.get("namespace") or meta.get("namespace") or "shadow-system")
        deployment = str(data.get("deployment") or release)
        return cls(
            release=release,
            namespace=namespace,
            deployment=deployment,
            leader_election=str(data.get("leaderElection", "true")).lower() == "true",
            lease=str(data.get("lease") or deployment),
            keys_secret=str(data.get("previewKeysSecret") or f"{deployment}-preview-keys"),
            keys_namespace=str(data.get("previewKeysNamespace") or namespace),
            source=f"ConfigMap {meta.get('namespace')}/{meta.get('name')}",
        )


# The chart's names for a release `shadow-operator` in `shadow-system`: what a client assumes when it finds no
# discovery ConfigMap it may read.
DEFAULT = OperatorLocation(
    release="shadow-operator",
    namespace="shadow-system",
    deployment="shadow-operator",
    leader_election=True,
    lease=c.LEADER_LEASE_NAME,
    keys_secret="shadow-operator-preview-keys",
    keys_namespace="shadow-system",
)


def locate(namespace: str | None) -> Op[OperatorLocation]:
    """The operator serving `namespace`: its discovery ConfigMap there, else any in the cluster, else DEFAULT."""
    if namespace:
        try:
            body = yield from kube.get(
                CONFIG_MAP.path(namespace, c.DISCOVERY_CONFIGMAP),
                f"read ConfigMap {namespace}/{c.DISCOVERY_CONFIGMAP}",
            )
            return OperatorLocation.from_config_map(body)
        except (NotFound, Forbidden):
            pass
    try:
        listed = yield from kube.send(
            Call(
                "GET",
                CONFIG_MAP.path(),
                "list shadow-operator discovery ConfigMaps",
                params={"labelSelector": c.DISCOVERY_SELECTOR},
            )
        )
    except (Forbidden, NotFound):
        return DEFAULT
    # The release namespace's own ConfigMap first (the others are copies of it for tenants).
    items = sorted(
        listed.get("items") or (),
        key=lambda cm: (cm["metadata"].get("namespace") != (cm.get("data") or {}).get("namespace"),),
    )
    return OperatorLocation.from_config_map(items[0]) if items else DEFAULT


@dataclass(frozen=True)
class OperatorState:
    """Whether the operator runs: True, False, or None (the caller may not read what would tell)."""

    alive: bool | None
    location: OperatorLocation
    detail: str


def _fresh(lease: Body, now: dt.datetime) -> bool:
    spec = lease.get("spec") or {}
    renewed = spec.get("renewTime")
    if not renewed:
        return False
    age = (now - dt.datetime.fromisoformat(str(renewed).replace("Z", "+00:00"))).total_seconds()
    return age <= 3 * int(spec.get("leaseDurationSeconds") or 15)


def _read(where: OperatorLocation, path: str, what: str, absent: str) -> Op[Body | OperatorState]:
    """The object at `path`, or what its absence (not running: `absent`) or a refusal (unknown) says."""
    try:
        return (yield from kube.get(path, f"read {what}"))
    except NotFound:
        return OperatorState(False, where, f"not running: {absent}")
    except Forbidden:
        return OperatorState(None, where, f"unknown: you may not read {what}")


def operator_state(namespace: str | None) -> Op[OperatorState]:
    """Is the operator serving `namespace` running: its leader Lease renewed lately, or, with leader election
    off, its Deployment available."""
    where = yield from locate(namespace)
    now = dt.datetime.now(dt.UTC)
    release = f"release {where.release} in {where.namespace}"
    if not where.source:
        # No discovery ConfigMap readable: the Lease by its default name, in whichever namespace it is.
        try:
            listed = yield from kube.send(
                Call(
                    "GET",
                    LEASE.path(),
                    "list Leases",
                    params={"fieldSelector": f"metadata.name={where.lease}"},
                )
            )
        except Forbidden:
            return OperatorState(None, where, "unknown: no shadow-operator-discovery ConfigMap you may read")
        alive = any(_fresh(lease, now) for lease in listed.get("items") or ())
        detail = (
            "running (a fresh shadow-operator Lease)"
            if alive
            else "not running: no fresh shadow-operator Lease"
        )
        return OperatorState(alive, where, detail)
    if where.leader_election:
        what = f"Lease {where.namespace}/{where.lease}"
        path = LEASE.path(where.namespace, where.lease)
        lease = yield from _read(where, path, what, f"{release} holds no {what}")
        if isinstance(lease, OperatorState):
            return lease
        if _fresh(lease, now):
            return OperatorState(True, where, f"running ({release}, its {what} is fresh)")
        return OperatorState(False, where, f"not running: the {what} of {release} is stale")
    what = f"Deployment {where.namespace}/{where.deployment}"
    path = DEPLOYMENT.path(where.namespace, where.deployment)
    deployment = yield from _read(where, path, what, f"{release} has no {what}")
    if isinstance(deployment, OperatorState):
        return deployment
    available = int((deployment.get("status") or {}).get("availableReplicas") or 0)
    if available:
        return OperatorState(True, where, f"running ({release}, leader election off, {what} available)")
    return OperatorState(False, where, f"not running: {what} of {release} has no available replica")
