"""Child objects of a Sandbox: Pod, headless Service, PVCs, runtime token Secret; and its status conditions.

Pure functions: the Sandbox body goes in, manifests and conditions come out.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from shadow_operator.api import constants as c
from shadow_operator.api import naming
from shadow_operator.resources.conditions import Condition, make_condition
from shadow_operator.resources.metadata import drop_reserved, owner_reference

Body = Mapping[str, Any]
Manifest = dict[str, Any]


# Sandbox labels copied onto its Pod so pods can be selected by claim, pool or template.
PROPAGATED_LABELS = (c.LABEL_CLAIM_UID, c.LABEL_WARM_POOL, c.LABEL_TEMPLATE_REF_HASH)


def is_suspended(spec: Body) -> bool:
    return spec.get("operatingMode") == "Suspended" or spec.get("replicas") == 0


def _containers(pod_spec: Body) -> list[Mapping[str, Any]]:
    return list(pod_spec.get("containers") or [])


def runtime_container_index(pod_spec: Body) -> int:
    """The container that serves the runtime API: the one with a port named `runtime`, else the first."""
    for index, container in enumerate(_containers(pod_spec)):
        if any(port.get("name") == c.RUNTIME_PORT_NAME for port in container.get("ports") or ()):
            return index
    return 0


def named_port(pod_spec: Body, name: str) -> int | None:
    for container in _containers(pod_spec):
        for port in container.get("ports") or ():
            if port.get("name") == name:
                return int(port["containerPort"])
    return None


def service_ports(pod_spec: Body) -> list[dict[str, Any]]:
    """One Service port per distinct (port, protocol) of the containers; explicit names kept, others generated."""
    names: dict[tuple[int, str], str] = {}
    taken: set[str] = set()
    sidecars = [ic for ic in pod_spec.get("initContainers") or () if ic.get("restartPolicy") == "Always"]
    for container in [*_containers(pod_spec), *sidecars]:
        for port in container.get("ports") or ():
            key = (int(port["containerPort"]), str(port.get("protocol") or "TCP"))
            name = port.get("name") or ""
            if key not in names:
                names[key] = ""
            if name and not names[key] and name not in taken:
                names[key] = name
                taken.add(name)
    ports = []
    for (number, protocol), name in sorted(names.items()):
        if not name:
            base = f"p-{number}-{protocol.lower()}"
            name, suffix = base, 2
            while name in taken:
                name, suffix = f"{base}-{suffix}", suffix + 1
            taken.add(name)
        ports.append({"name": name, "port": number, "protocol": protocol, "targetPort": number})
    return ports


def apply_secure_defaults(pod_spec: dict[str, Any]) -> None:
    """Harden the pod where the template is silent; an explicit template value always wins."""
    pod_spec.setdefault("automountServiceAccountToken", False)
    security = pod_spec.setdefault("securityContext", {})
    security.setdefault("runAsNonRoot", True)
    security.setdefault("seccompProfile", {"type": "RuntimeDefault"})
    for key in ("containers", "initContainers", "ephemeralContainers"):
        for container in pod_spec.get(key) or ():
            ctx = container.setdefault("securityContext", {})
            ctx.setdefault("allowPrivilegeEscalation", False)
            ctx.setdefault("capabilities", {"drop": ["ALL"]})


def inject_runtime_token(pod_spec: dict[str, Any], secret_name: str) -> None:
    volumes = [v for v in pod_spec.get("volumes") or () if v.get("name") != c.RUNTIME_TOKEN_VOLUME]
    volumes.append({"name": c.RUNTIME_TOKEN_VOLUME, "secret": {"secretName": secret_name}})
    pod_spec["volumes"] = volumes
    container = pod_spec["containers"][runtime_container_index(pod_spec)]
    mounts = [m for m in container.get("volumeMounts") or () if m.get("name") != c.RUNTIME_TOKEN_VOLUME]
    mounts.append({"name": c.RUNTIME_TOKEN_VOLUME, "mountPath": c.RUNTIME_TOKEN_DIR, "readOnly": True})
    container["volumeMounts"] = mounts
    env = [e for e in container.get("env") or () if e.get("name") != c.RUNTIME_TOKEN_ENV]
    env.append({"name": c.RUNTIME_TOKEN_ENV, "value": c.RUNTIME_TOKEN_PATH})
    container["env"] = env


def attach_claim_volumes(
    pod_spec: dict[str, Any], sandbox_name: str, templates: list[Mapping[str, Any]]
) -> None:
    """PVC-backed volumes replace template volumes of the same name (StatefulSet semantics)."""
    pvc_volumes = [
        {
            "name": t["metadata"]["name"],
            "persistentVolumeClaim": {"claimName": naming.pvc_name(t["metadata"]["name"], sandbox_name)},
        }
        for t in templates
    ]
    if not pvc_volumes:
        return
    replaced = {v["name"] for v in pvc_volumes}
    pod_spec["volumes"] = [
        v for v in pod_spec.get("volumes") or () if v.get("name") not in replaced
    ] + pvc_volumes


def build_pod_labels_and_annotations(sandbox: Body) -> tuple[dict[str, str], dict[str, str]]:
    """The Pod's labels (template's, our name hash, the propagated Sandbox labels) and annotations."""
    meta = sandbox["metadata"]
    template_meta = sandbox["spec"]["podTemplate"].get("metadata") or {}
    labels = drop_reserved(template_meta.get("labels"))
    labels[c.LABEL_SANDBOX_NAME_HASH] = naming.name_hash(meta["name"])
    for key in PROPAGATED_LABELS:
        if meta.get("labels", {}).get(key):
            labels[key] = meta["labels"][key]
    environment = environment_of(sandbox)
    if environment is not None:
        labels[c.LABEL_ENVIRONMENT] = environment
    return labels, drop_reserved(template_meta.get("annotations"))


def environment_of(sandbox: Body) -> str | None:
    """The environment instance whose workspace this Sandbox is: the Sandbox's own name, when a
    ShadowEnvironment or a ShadowEnvironmentPool controls it. Only then does the Pod carry
    `shadow.dev/environment`, set to that name; its Gitea's NetworkPolicies select it by that label and the
    name's hash, and no other Sandbox of the namespace has that name, so no other Pod can claim the label."""
    meta = sandbox["metadata"]
    for ref in meta.get("ownerReferences") or ():
        if (
            ref.get("controller")
            and ref.get("kind") in ("ShadowEnvironment", "ShadowEnvironmentPool")
            and ref.get("apiVersion", "").startswith(f"{c.SHADOW_GROUP}/")
        ):
            return str(meta["name"])
    return None


def build_pod(sandbox: Body, *, token_secret: str | None) -> Manifest:
    """The sandbox's Pod; its runtime reads the token from `token_secret` (None: no token, see runtime_auth)."""
    meta = sandbox["metadata"]
    spec = copy.deepcopy(dict(sandbox["spec"]["podTemplate"]["spec"]))
    apply_secure_defaults(spec)
    attach_claim_volumes(spec, meta["name"], list(sandbox["spec"].get("volumeClaimTemplates") or ()))
    if token_secret is not None:
        inject_runtime_token(spec, token_secret)
    labels, annotations = build_pod_labels_and_annotations(sandbox)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": meta["name"],
            "namespace": meta["namespace"],
            "labels": labels,
            "annotations": annotations,
            "ownerReferences": [owner_reference(sandbox)],
        },
        "spec": spec,
    }


def build_service(sandbox: Body) -> Manifest:
    meta = sandbox["metadata"]
    selector = {c.LABEL_SANDBOX_NAME_HASH: naming.name_hash(meta["name"])}
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": meta["name"],
            "namespace": meta["namespace"],
            "labels": {**selector, c.LABEL_MANAGED_BY: c.MANAGED_BY_VALUE},
            "ownerReferences": [owner_reference(sandbox)],
        },
        "spec": {
            "clusterIP": "None",
            "selector": selector,
            "ports": service_ports(sandbox["spec"]["podTemplate"]["spec"]),
        },
    }


def build_pvcs(sandbox: Body) -> list[Manifest]:
    meta = sandbox["metadata"]
    pvcs = []
    for template in sandbox["spec"].get("volumeClaimTemplates") or ():
        tmeta = template.get("metadata") or {}
        labels = drop_reserved(tmeta.get("labels"))
        labels[c.LABEL_SANDBOX_NAME_HASH] = naming.name_hash(meta["name"])
        pvcs.append(
            {
                "apiVersion": "v1",
                "kind": "PersistentVolumeClaim",
                "metadata": {
                    "name": naming.pvc_name(tmeta["name"], meta["name"]),
                    "namespace": meta["namespace"],
                    "labels": labels,
                    "annotations": drop_reserved(tmeta.get("annotations")),
                    "ownerReferences": [owner_reference(sandbox)],
                },
                "spec": copy.deepcopy(dict(template["spec"])),
            }
        )
    return pvcs


def build_token_secret(sandbox: Body, token: str) -> Manifest:
    meta = sandbox["metadata"]
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": {
            "name": naming.token_secret_name(meta["name"]),
            "namespace": meta["namespace"],
            "labels": {
                c.LABEL_SANDBOX_NAME_HASH: naming.name_hash(meta["name"]),
                c.LABEL_MANAGED_BY: c.MANAGED_BY_VALUE,
            },
            "ownerReferences": [owner_reference(sandbox)],
        },
        "stringData": {c.RUNTIME_TOKEN_KEY: token},
    }


# ------------------------------------------------------------------------------------------------ status
@dataclass(frozen=True)
class Observed:
    """What the controller saw of the sandbox's children in one pass."""

    pod: Body | None = None
    pod_owned: bool = True
    service: Body | None = None
    error: str | None = None
    # The Pod was not created: its spec asks for more than the chart allows (what and which value allows it).
    refused: str | None = None
    multiple_pods: int = 0
    expired: bool = False
    # Suspended for idleness (spec.autoSuspendPolicy): why, as the conditions say it.
    idle: str | None = None


def _pod_condition(pod: Body, type_: str) -> Mapping[str, Any] | None:
    return next(
        (cond for cond in pod.get("status", {}).get("conditions") or () if cond.get("type") == type_), None
    )


def pod_ips(pod: Body | None) -> list[str]:
    if pod is None:
        return []
    status = pod.get("status") or {}
    ips = [entry["ip"] for entry in status.get("podIPs") or () if entry.get("ip")]
    return ips or ([status["podIP"]] if status.get("podIP") else [])


def node_name(pod: Body | None) -> str | None:
    return ((pod or {}).get("spec") or {}).get("nodeName") or None


def service_required(spec: Body, service: Body | None) -> bool:
    if spec.get("service") is not None:
        return bool(spec["service"])
    return service is not None


def compute_conditions(sandbox: Body, seen: Observed) -> tuple[list[Condition], list[str]]:
    """(conditions to set, condition types to remove) for the Sandbox status."""
    spec = sandbox["spec"]
    generation = sandbox["metadata"].get("generation")
    suspended_mode = is_suspended(spec) or seen.idle is not None
    pod = seen.pod if seen.pod_owned else None
    remove: list[str] = []

    if not suspended_mode:
        suspended = make_condition(
            c.COND_SUSPENDED, False, c.REASON_NOT_SUSPENDED, "Sandbox is not suspended", generation
        )
    elif seen.pod is not None and not seen.pod_owned:
        # A Pod of the Sandbox's name that it does not own is left alone: suspension cannot complete.
        suspended = make_condition(
            c.COND_SUSPENDED,
            False,
            c.REASON_POD_NOT_OWNED,
            "Refused to delete pod because it is not owned by this sandbox",
            generation,
        )
    elif pod is None and seen.idle is not None:
        suspended = make_condition(c.COND_SUSPENDED, True, c.REASON_IDLE, seen.idle, generation)
    elif pod is None:
        suspended = make_condition(
            c.COND_SUSPENDED,
            True,
            c.REASON_POD_TERMINATED,
            "Pod has been terminated. Sandbox is suspended",
            generation,
        )
    else:
        suspended = make_condition(
            c.COND_SUSPENDED,
            False,
            c.REASON_POD_TERMINATING,
            "Pod is terminating. Sandbox is suspending",
            generation,
        )
    conditions = [suspended]

    phase = (pod or {}).get("status", {}).get("phase")
    if phase in ("Succeeded", "Failed"):
        reason = c.REASON_POD_SUCCEEDED if phase == "Succeeded" else c.REASON_POD_FAILED
        message = "Pod completed successfully" if phase == "Succeeded" else "Pod failed"
        conditions.append(make_condition(c.COND_FINISHED, True, reason, message, generation))
    elif not seen.expired:
        # Expiry removes the Pod but not the fact that it finished: Finished stays (as upstream keeps it).
        remove.append(c.COND_FINISHED)

    if pod is not None:
        scheduled = _pod_condition(pod, "PodScheduled")
        if scheduled is None:
            conditions.append(
                make_condition(
                    c.COND_POD_SCHEDULED,
                    "Unknown",
                    c.REASON_POD_SCHEDULING_UNKNOWN,
                    "Pod has not reported a PodScheduled condition yet",
                    generation,
                )
            )
        else:
            status = str(scheduled.get("status"))
            reason = scheduled.get("reason") or (
                c.REASON_POD_SCHEDULED if status == "True" else c.REASON_POD_SCHEDULING_UNKNOWN
            )
            conditions.append(
                make_condition(
                    c.COND_POD_SCHEDULED, status, reason, scheduled.get("message") or "", generation
                )
            )
    else:
        remove.append(c.COND_POD_SCHEDULED)

    conditions.append(_ready_condition(sandbox, seen, pod, suspended_mode, generation))
    return conditions, remove


def _ready_condition(
    sandbox: Body, seen: Observed, pod: Body | None, suspended_mode: bool, generation: int | None
) -> Condition:
    def not_ready(reason: str, message: str) -> Condition:
        return make_condition(c.COND_READY, False, reason, message, generation)

    if seen.expired:
        return not_ready(c.REASON_SANDBOX_EXPIRED, "Sandbox has expired")
    if seen.multiple_pods > 1:
        return not_ready(
            c.REASON_MULTIPLE_PODS,
            f"multiple Pods ({seen.multiple_pods}) are controlled by this Sandbox; refusing to choose or create a Pod",
        )
    if seen.refused:
        return not_ready(c.REASON_POD_SECURITY_REFUSED, seen.refused)
    if seen.error:
        return not_ready(c.REASON_RECONCILER_ERROR, "Error seen: " + seen.error)
    if seen.idle is not None:
        return not_ready(c.REASON_SUSPENDED, "Sandbox is suspending: idle" if seen.pod else seen.idle)
    if suspended_mode:
        return not_ready(
            c.REASON_SANDBOX_SUSPENDED, "Sandbox is suspending" if seen.pod else "Sandbox is suspended"
        )
    phase = (pod or {}).get("status", {}).get("phase")
    if phase == "Succeeded":
        return not_ready(c.REASON_POD_SUCCEEDED, "Pod completed successfully")
    if phase == "Failed":
        return not_ready(c.REASON_POD_FAILED, "Pod failed")

    pod_ready = False
    if pod is None:
        message = "Pod does not exist" if seen.pod_owned else "Pod with the Sandbox's name is not owned by it"
    elif phase != "Running":
        message = f"Pod exists with phase: {phase or 'Pending'}"
    else:
        ready = _pod_condition(pod, "Ready")
        if ready is None or ready.get("status") != "True":
            message = "Pod is Running but not Ready"
        elif not pod_ips(pod):
            message = "Pod is Ready but has no podIPs yet"
        else:
            message, pod_ready = "Pod is Ready", True
    svc_ready = True
    if service_required(sandbox["spec"], seen.service):
        svc_ready = seen.service is not None
        message += "; Service Exists" if svc_ready else "; Service does not exist"
    if pod_ready and svc_ready:
        return make_condition(c.COND_READY, True, c.REASON_DEPENDENCIES_READY, message, generation)
    return not_ready(c.REASON_DEPENDENCIES_NOT_READY, message)


def runtime_url(sandbox: Body, seen: Observed, cluster_domain: str) -> str | None:
    port = named_port(sandbox["spec"]["podTemplate"]["spec"], c.RUNTIME_PORT_NAME) or c.RUNTIME_DEFAULT_PORT
    meta = sandbox["metadata"]
    if seen.service is not None:
        return f"http://{meta['name']}.{meta['namespace']}.svc.{cluster_domain}:{port}"
    ips = pod_ips(seen.pod) if seen.pod_owned else []
    if ips:
        host = f"[{ips[0]}]" if ":" in ips[0] else ips[0]
        return f"http://{host}:{port}"
    return None


def preview_url(sandbox: Body, domain: str | None, scheme: str) -> str | None:
    if not domain or named_port(sandbox["spec"]["podTemplate"]["spec"], c.PREVIEW_PORT_NAME) is None:
        return None
    return f"{scheme}://{sandbox['metadata']['name']}.{domain}/"
