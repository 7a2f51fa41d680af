"""Child objects of a ShadowEnvironment: its Gitea (Secret, Service, StatefulSet) and its workspace Sandbox.

Pure functions, dict in and dict out. The workspace Sandbox starts from the environment's SandboxTemplate and
gains a PVC at `spec.workspace.mountPath`, the environment's variables, and git configuration through
`GIT_CONFIG_COUNT`/`GIT_CONFIG_KEY_n`/`GIT_CONFIG_VALUE_n` (git >= 2.31 reads these from the environment): the
`insteadOf` rules apply to every git process in the Pod (pip, uv and npm run git too) without a file in the
workspace that a diff or a promote would pick up.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from shadow_operator.api import constants as c
from shadow_operator.api import naming
from shadow_operator.api.models import StatefulSet
from shadow_operator.common.sources import SourcePlan
from shadow_operator.resources.blueprint import preview_access, sandbox_spec_from_template
from shadow_operator.resources.conditions import parse_time
from shadow_operator.resources.sandbox import runtime_container_index

Body = Mapping[str, Any]
Manifest = dict[str, Any]

GITEA_DATA_VOLUME = "data"
GITEA_DATA_PATH = "/data"
# Git identity of the snapshot commits the operator makes of uncommitted work.
SNAPSHOT_AUTHOR = ("shadow-operator", "shadow-operator@shadow.dev")


# ------------------------------------------------------------------------------------------------ names
def template_runtime_class(template: Body) -> str | None:
    """The RuntimeClass a SandboxTemplate's Pods run with, if it names one."""
    pod_spec = ((template.get("spec") or {}).get("podTemplate") or {}).get("spec") or {}
    value = pod_spec.get("runtimeClassName")
    return str(value) if value else None


def gitea_ready(sts: Body | None) -> bool:
    """Whether a Gitea StatefulSet (as cached) has its Pod Ready."""
    return sts is not None and StatefulSet.model_validate(sts).status.ready_replicas >= 1


def gitea_name(env: str) -> str:
    """StatefulSet and Service of the environment's Gitea (52 characters leave room for the Pod's suffix
    and the StatefulSet's revision label)."""
    return naming.bounded(f"{env}-gitea", 52)


def gitea_secret_name(env: str) -> str:
    return naming.bounded(f"{env}-gitea-admin")


def gitea_url(env: Body, cluster_domain: str) -> str:
    meta = env["metadata"]
    return f"http://{gitea_name(meta['name'])}.{meta['namespace']}.svc.{cluster_domain}:{c.GITEA_HTTP_PORT}"


def environment_labels(env: Body, component: str) -> dict[str, str]:
    return {
        c.LABEL_ENVIRONMENT: env["metadata"]["name"],
        c.LABEL_COMPONENT: component,
        c.LABEL_MANAGED_BY: c.MANAGED_BY_VALUE,
    }


_QUANTITY_UNITS = {
    **{s: 1024**i for i, s in enumerate(("", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"))},
    **{s: 1000**i for i, s in enumerate(("", "k", "M", "G", "T", "P", "E")) if s},
}


def parse_quantity(value: str) -> float:
    """Bytes of a storage quantity such as 10Gi, 1.5G or 500M (the forms spec.workspace.size admits)."""
    number = value.rstrip("KMGTPEik")
    return float(number) * float(_QUANTITY_UNITS[value[len(number) :]])


# -------------------------------------------------------------------------------------------- sources
def public_url(plan: SourcePlan, rewrites: Sequence[Mapping[str, str]]) -> str | None:
    """The URL people (and lockfiles) use for the repository, when a rewrite sends it to this Gitea."""
    for rule in rewrites:
        if rule["to"] == plan.org:
            return f"{rule['from']}{plan.repo}"
    return None


def git_config_env(rewrites: Sequence[Mapping[str, str]], base_url: str) -> list[dict[str, str]]:
    """`url.<gitea>/<org>/.insteadOf <from>` for each rewrite, as git's environment configuration."""
    pairs = [(f"url.{base_url}/{rule['to']}/.insteadOf", rule["from"]) for rule in rewrites]
    env = [{"name": "GIT_CONFIG_COUNT", "value": str(len(pairs))}]
    for i, (key, value) in enumerate(pairs):
        env.append({"name": f"GIT_CONFIG_KEY_{i}", "value": key})
        env.append({"name": f"GIT_CONFIG_VALUE_{i}", "value": value})
    return env


# ------------------------------------------------------------------------------------------------ Gitea
def build_gitea_secret(env: Body, username: str, password: str) -> Manifest:
    meta = env["metadata"]
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": {
            "name": gitea_secret_name(meta["name"]),
            "namespace": meta["namespace"],
            "labels": environment_labels(env, c.COMPONENT_GITEA),
        },
        "stringData": {c.GITEA_SECRET_USERNAME: username, c.GITEA_SECRET_PASSWORD: password},
    }


def gitea_selector(env: Body) -> dict[str, str]:
    return {c.LABEL_ENVIRONMENT: env["metadata"]["name"], c.LABEL_COMPONENT: c.COMPONENT_GITEA}


def build_gitea_service(env: Body) -> Manifest:
    meta = env["metadata"]
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": gitea_name(meta["name"]),
            "namespace": meta["namespace"],
            "labels": environment_labels(env, c.COMPONENT_GITEA),
        },
        "spec": {
            "selector": gitea_selector(env),
            "ports": [{"name": "http", "port": c.GITEA_HTTP_PORT, "targetPort": "http", "protocol": "TCP"}],
        },
    }


# What each environment's Gitea container asks for unless the operator is configured otherwise (the chart's
# gitea.resources).
GITEA_RESOURCES: Manifest = {"requests": {"cpu": "50m", "memory": "128Mi"}, "limits": {"memory": "1Gi"}}


def gitea_on_volume(env: Body, current: Body | None) -> bool:
    """Whether Gitea's data goes on a volume claim: spec.gitea.persistence.enabled (or retain, which needs one),
    unless its StatefulSet already exists. A StatefulSet's volumeClaimTemplates cannot change, so one keeps
    the storage it was created with (an environment from before emptyDir was the default keeps its volume)."""
    if current is not None:
        templates = (current.get("spec") or {}).get("volumeClaimTemplates") or ()
        return any(t["metadata"]["name"] == GITEA_DATA_VOLUME for t in templates)
    persistence = (env["spec"].get("gitea") or {}).get("persistence") or {}
    return bool(persistence.get("enabled") or persistence.get("retain"))


def build_gitea_statefulset(
    env: Body,
    *,
    image: str,
    cluster_domain: str,
    pull_policy: str = "IfNotPresent",
    resources: Manifest | None = None,
    on_volume: bool = False,
) -> Manifest:
    """Gitea's StatefulSet; its data on a volume claim of its own when `on_volume` (see gitea_on_volume), else
    on an emptyDir limited to spec.gitea.persistence.size, so the Pod waits for no provisioner."""
    meta, spec = env["metadata"], env["spec"]
    name = gitea_name(meta["name"])
    gitea = spec.get("gitea") or {}
    persistence = gitea.get("persistence") or {}
    size = persistence.get("size", "1Gi")
    secret = gitea_secret_name(meta["name"])

    def from_secret(key: str) -> dict[str, Any]:
        return {"secretKeyRef": {"name": secret, "key": key}}

    storage: dict[str, Any]
    volumes: list[dict[str, Any]] = []
    if on_volume:
        pvc_spec: dict[str, Any] = {
            "accessModes": ["ReadWriteOnce"],
            "resources": {"requests": {"storage": size}},
        }
        storage_class = (spec.get("workspace") or {}).get("storageClassName")
        if storage_class:
            pvc_spec["storageClassName"] = storage_class
        storage = {
            # The data volume goes with the StatefulSet (and so with the environment) unless retained.
            "persistentVolumeClaimRetentionPolicy": {
                "whenDeleted": "Retain" if persistence.get("retain") else "Delete",
                "whenScaled": "Retain",
            },
            "volumeClaimTemplates": [{"metadata": {"name": GITEA_DATA_VOLUME}, "spec": pvc_spec}],
        }
    else:
        storage = {}
        volumes = [{"name": GITEA_DATA_VOLUME, "emptyDir": {"sizeLimit": size}}]

    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {
            "name": name,
            "namespace": meta["namespace"],
            "labels": environment_labels(env, c.COMPONENT_GITEA),
        },
        "spec": {
            "serviceName": name,
            "replicas": 1,
            "selector": {"matchLabels": gitea_selector(env)},
            **storage,
            "template": {
                "metadata": {
                    "labels": {
                        **environment_labels(env, c.COMPONENT_GITEA),
                        "app.kubernetes.io/name": "gitea",
                    }
                },
                "spec": {
                    "automountServiceAccountToken": False,
                    "enableServiceLinks": False,
                    "securityContext": {
                        "runAsNonRoot": True,
                        "runAsUser": 1000,
                        "runAsGroup": 1000,
                        "fsGroup": 1000,
                        "seccompProfile": {"type": "RuntimeDefault"},
                    },
                    "containers": [
                        {
                            "name": "gitea",
                            "image": image,
                            "imagePullPolicy": pull_policy,
                            "env": [
                                {"name": "GITEA_ROOT_URL", "value": gitea_url(env, cluster_domain) + "/"},
                                {
                                    "name": "GITEA_ADMIN_USERNAME",
                                    "valueFrom": from_secret(c.GITEA_SECRET_USERNAME),
                                },
                                {
                                    "name": "GITEA_ADMIN_PASSWORD",
                                    "valueFrom": from_secret(c.GITEA_SECRET_PASSWORD),
                                },
                            ],
                            "ports": [
                                {"name": "http", "containerPort": c.GITEA_HTTP_PORT, "protocol": "TCP"}
                            ],
                            "readinessProbe": {
                                "httpGet": {"path": "/api/healthz", "port": "http"},
                                "periodSeconds": 1,
                                "failureThreshold": 3,
                            },
                            "resources": copy.deepcopy(GITEA_RESOURCES if resources is None else resources),
                            "securityContext": {
                                "allowPrivilegeEscalation": False,
                                "capabilities": {"drop": ["ALL"]},
                            },
                            "volumeMounts": [{"name": GITEA_DATA_VOLUME, "mountPath": GITEA_DATA_PATH}],
                        }
                    ],
                    **({"volumes": volumes} if volumes else {}),
                },
            },
        },
    }


# -------------------------------------------------------------------------------------------- workspace
def _set_env(container: dict[str, Any], extra: Sequence[Mapping[str, Any]]) -> None:
    names = {e["name"] for e in extra}
    container["env"] = [e for e in container.get("env") or () if e.get("name") not in names] + [
        dict(e) for e in extra
    ]


def _set_root_arg(container: dict[str, Any], mount_path: str) -> None:
    args = list(container.get("args") or ())
    for i, arg in enumerate(args):
        if arg == "--root" and i + 1 < len(args):
            args[i + 1] = mount_path
        elif arg.startswith("--root="):
            args[i] = f"--root={mount_path}"
    if args:
        container["args"] = args


def merged_resources(template: Manifest, given: Manifest) -> Manifest:
    """The template's ResourceRequirements with the environment's laid over them, key by key: a CPU request
    given alone keeps the template's memory limit (a workspace must not lose the limit its platform set)."""
    merged = copy.deepcopy(dict(template))
    for key, value in given.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = {**merged[key], **copy.deepcopy(value)}
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def build_workspace_sandbox(
    env: Body,
    template: Body,
    *,
    gitea_base_url: str | None,
    suspended: bool = False,
    auto_suspend_policy: Mapping[str, Any] | None = None,
    data_source: Mapping[str, str] | None = None,
    storage_class: str | None = None,
    min_size: str | None = None,
) -> Manifest:
    """The Sandbox the workspace runs in: the template's Pod with the workspace volume at mountPath.

    A fork's volume is restored from `data_source` (a VolumeSnapshot), in `storage_class` (the source
    volume's when spec.workspace.storageClassName is unset), at least `min_size` (the snapshot's size).
    `suspended`: stopped on request (spec.suspend); idleness is the Sandbox's own (`auto_suspend_policy`).
    """
    meta, spec = env["metadata"], env["spec"]
    workspace = spec.get("workspace") or {}
    mount_path = workspace.get("mountPath", "/workspace")
    sandbox_spec = sandbox_spec_from_template(template)
    pod_spec = sandbox_spec["podTemplate"]["spec"]
    container = pod_spec["containers"][runtime_container_index(pod_spec)]

    # The template's own workspace volume (an emptyDir in the default template) gives way to the PVC.
    mounts = [m for m in container.get("volumeMounts") or () if m.get("name") != c.WORKSPACE_VOLUME]
    mounts = [m for m in mounts if m.get("mountPath") != mount_path]
    container["volumeMounts"] = [*mounts, {"name": c.WORKSPACE_VOLUME, "mountPath": mount_path}]
    pod_spec["volumes"] = [v for v in pod_spec.get("volumes") or () if v.get("name") != c.WORKSPACE_VOLUME]
    container["workingDir"] = mount_path
    _set_root_arg(container, mount_path)

    extra: list[dict[str, Any]] = [{"name": "SANDBOX_RUNTIME_ROOT", "value": mount_path}]
    if spec.get("journal", True):
        extra.append({"name": "SANDBOX_RUNTIME_HANDOFF", "value": "1"})
    if gitea_base_url is not None:
        org = (spec.get("gitea") or {}).get("organization") or "shadow"
        extra += [
            {"name": c.ENV_GITEA_URL, "value": gitea_base_url},
            {"name": c.ENV_GITEA_ORG, "value": org},
        ]
        extra += git_config_env(spec.get("gitRewrites") or (), gitea_base_url)
    extra += [{"name": e["name"], "value": e["value"]} for e in spec.get("env") or ()]
    _set_env(container, extra)
    if spec.get("resources"):
        container["resources"] = merged_resources(container.get("resources") or {}, spec["resources"])
    if spec.get("runtimeClassName"):
        pod_spec["runtimeClassName"] = spec["runtimeClassName"]
    preview_port = (spec.get("preview") or {}).get("port")
    if preview_port:
        ports = [p for p in container.get("ports") or () if p.get("name") != c.PREVIEW_PORT_NAME]
        ports = [p for p in ports if p.get("containerPort") != preview_port]
        container["ports"] = [
            *ports,
            {"name": c.PREVIEW_PORT_NAME, "containerPort": preview_port, "protocol": "TCP"},
        ]
    pod_meta = sandbox_spec["podTemplate"].setdefault("metadata", {})
    pod_meta.setdefault("labels", {})[c.LABEL_ENVIRONMENT] = meta["name"]
    security = pod_spec.setdefault("securityContext", {})
    security.setdefault("fsGroup", 1000)
    # The kubelet re-applies fsGroup to every file of a volume it mounts unless the volume's root already has
    # it: a restored fork would otherwise see every file's mode changed (g+rw), and wait for a walk of its tree.
    security.setdefault("fsGroupChangePolicy", "OnRootMismatch")

    size = workspace.get("size", "10Gi")
    if min_size and parse_quantity(min_size) > parse_quantity(size):
        size = min_size
    pvc_spec: dict[str, Any] = {
        "accessModes": ["ReadWriteOnce"],
        "resources": {"requests": {"storage": size}},
    }
    if workspace.get("storageClassName") or storage_class:
        pvc_spec["storageClassName"] = workspace.get("storageClassName") or storage_class
    if data_source:
        pvc_spec["dataSource"] = dict(data_source)
    vcts = [
        t
        for t in sandbox_spec.get("volumeClaimTemplates") or ()
        if t["metadata"]["name"] != c.WORKSPACE_VOLUME
    ]
    sandbox_spec["volumeClaimTemplates"] = [
        *vcts,
        # Labelled with its environment, so `shadowctl cleanup` can tell a leftover volume from a live one.
        {
            "metadata": {
                "name": c.WORKSPACE_VOLUME,
                "labels": environment_labels(env, c.COMPONENT_WORKSPACE),
            },
            "spec": pvc_spec,
        },
    ]
    # The runtime URL in status is the headless Service's name.
    sandbox_spec["service"] = True
    sandbox_spec["operatingMode"] = "Suspended" if suspended else "Running"
    if auto_suspend_policy is not None:
        sandbox_spec["autoSuspendPolicy"] = dict(auto_suspend_policy)
    if spec.get("shutdownTime"):
        sandbox_spec["shutdownTime"] = spec["shutdownTime"]
    return {
        "apiVersion": c.SANDBOX_API_VERSION,
        "kind": "Sandbox",
        "metadata": {
            "name": meta["name"],
            "namespace": meta["namespace"],
            # The template's label (propagated to the Pod) puts the workspace under the template's managed
            # NetworkPolicy, as claims' sandboxes are: DNS and the internet, never other private ranges.
            # The environment's own policy adds the one exception it needs: its Gitea.
            "labels": {
                **environment_labels(env, c.COMPONENT_WORKSPACE),
                c.LABEL_TEMPLATE_REF_HASH: naming.name_hash(template["metadata"]["name"]),
            },
            **({"annotations": preview_access(env)} if preview_access(env) else {}),
        },
        "spec": sandbox_spec,
    }


# ---------------------------------------------------------------------------------------------- failures
IMAGE_PULL_REASONS = frozenset({"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull"})
# A Pod waits for its volume while the provisioner works (Immediate binding): only a wait this long is a failure.
UNSCHEDULABLE_GRACE_SECONDS = 30.0
# The Sandbox controller creates a Pod and its PVCs at once, so the scheduler's first attempt may not find a
# claim yet; it tries again when the claim appears, but the condition keeps that message (and its time) while
# the volume is provisioned. A claim the operator never created is caught by the startup timeout instead.
STALE_CLAIM_MESSAGE = re.compile(r'persistentvolumeclaim "[^"]+" not found', re.IGNORECASE)


def pod_failure(pod: Body | None, what: str, now: datetime) -> tuple[str, str] | None:
    """A failure code and message for a Pod that will not start on its own, or None."""
    if pod is None:
        return None
    status = pod.get("status") or {}
    for cs in [*(status.get("initContainerStatuses") or ()), *(status.get("containerStatuses") or ())]:
        waiting = (cs.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") in IMAGE_PULL_REASONS:
            image = cs.get("image", "")
            detail = waiting.get("message") or waiting["reason"]
            return (
                "ImagePullFailed",
                f"{what}: image {image} cannot be pulled ({detail}); check the image name and that the "
                "registry is reachable from the nodes",
            )
    for cond in status.get("conditions") or ():
        if (
            cond.get("type") == "PodScheduled"
            and cond.get("status") == "False"
            and cond.get("reason") == "Unschedulable"
        ):
            since = parse_time(cond.get("lastTransitionTime"))
            if since is not None and (now - since).total_seconds() < UNSCHEDULABLE_GRACE_SECONDS:
                continue
            message = cond.get("message", "")
            if STALE_CLAIM_MESSAGE.search(message):
                continue
            if "persistentvolumeclaim" in message.lower() or "volume" in message.lower():
                return (
                    "StorageUnavailable",
                    f"{what}: its volume cannot be provisioned ({message}); check the storage class",
                )
            return ("Unschedulable", f"{what} cannot be scheduled: {message}")
    return None


def pvc_failure(pvc: Body | None, what: str) -> tuple[str, str] | None:
    """A PVC that the provisioner gave up on (Lost) is a storage failure."""
    if pvc is not None and (pvc.get("status") or {}).get("phase") == "Lost":
        return ("StorageUnavailable", f"{what}: volume claim {pvc['metadata']['name']} is Lost")
    return None
