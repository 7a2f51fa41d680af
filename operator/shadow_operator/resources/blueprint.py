"""Sandbox manifests built from a SandboxTemplate, for claims (cold start) and warm pools."""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Mapping
from typing import Any

from shadow_operator.api import constants as c
from shadow_operator.api import naming
from shadow_operator.resources import idle
from shadow_operator.resources.metadata import drop_reserved, owner_reference

Body = Mapping[str, Any]
Manifest = dict[str, Any]


class ClaimBlocked(Exception):
    """The claim cannot progress until something changes; `reason` (an upstream condition reason) and the
    message go into its Ready condition."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class ClaimRejected(ClaimBlocked):
    """The claim asks for something its template forbids (also told as a Warning event)."""


def template_hash(template: Body) -> str:
    """Hash of what shapes a sandbox (pod template, volumes, service): warm sandboxes carry it as a label."""
    spec = template["spec"]
    shape = {k: spec.get(k) for k in ("podTemplate", "volumeClaimTemplates", "service")}
    shape["name"] = template["metadata"]["name"]
    return hashlib.sha256(json.dumps(shape, sort_keys=True).encode()).hexdigest()[:10]


def is_stale(sandbox: Body, template: Body) -> bool:
    """Whether a warm sandbox no longer matches its template: it was made from another template, or the hash it
    carries differs and so does what shapes a sandbox (the pod spec, each volume claim template's name and spec, the service). A change of the pod
    template's labels or annotations alone changes the hash but leaves the sandbox in place, as upstream does."""
    labels = sandbox["metadata"].get("labels") or {}
    if labels.get(c.LABEL_TEMPLATE_REF_HASH) != naming.name_hash(template["metadata"]["name"]):
        return True  # made from another template (the pool's templateRef changed)
    if labels.get(c.LABEL_TEMPLATE_HASH) == template_hash(template):
        return False
    want, have = sandbox_spec_from_template(template), sandbox.get("spec") or {}

    def claim_templates(spec: Mapping[str, Any]) -> list[tuple[Any, Any]]:
        return [
            ((t.get("metadata") or {}).get("name"), t.get("spec"))
            for t in spec.get("volumeClaimTemplates") or ()
        ]

    return (
        want["podTemplate"]["spec"] != (have.get("podTemplate") or {}).get("spec")
        or claim_templates(want) != claim_templates(have)
        or want.get("service") != have.get("service")
    )


def sandbox_spec_from_template(template: Body) -> dict[str, Any]:
    spec = template["spec"]
    pod_template = copy.deepcopy(dict(spec["podTemplate"]))
    pod_template.setdefault("metadata", {})
    # Templates are secure by default: a sandbox gets no API credentials unless the template asks for them.
    pod_template["spec"].setdefault("automountServiceAccountToken", False)
    out: dict[str, Any] = {"podTemplate": pod_template}
    if spec.get("volumeClaimTemplates"):
        out["volumeClaimTemplates"] = copy.deepcopy(list(spec["volumeClaimTemplates"]))
    if spec.get("service") is not None:
        out["service"] = spec["service"]
    return out


def _base_labels(template: Body) -> dict[str, str]:
    return {
        c.LABEL_TEMPLATE_REF_HASH: naming.name_hash(template["metadata"]["name"]),
        c.LABEL_MANAGED_BY: c.MANAGED_BY_VALUE,
    }


def build_warm_sandbox(pool: Body, template: Body) -> Manifest:
    pool_name = pool["metadata"]["name"]
    labels = _base_labels(template)
    labels[c.LABEL_WARM_POOL] = naming.name_hash(pool_name)
    labels[c.LABEL_TEMPLATE_HASH] = template_hash(template)
    labels[c.LABEL_LAUNCH_TYPE] = c.LAUNCH_WARM
    return {
        "apiVersion": c.SANDBOX_API_VERSION,
        "kind": "Sandbox",
        "metadata": {
            "generateName": f"{naming.bounded(pool_name, 57)}-",
            "namespace": pool["metadata"]["namespace"],
            "labels": labels,
            "annotations": {c.ANNOTATION_TEMPLATE_REF: template["metadata"]["name"]},
            "ownerReferences": [owner_reference(pool)],
        },
        "spec": sandbox_spec_from_template(template),
    }


def check_metadata(claim: Body) -> None:
    """Refuse additionalPodMetadata keys in restricted domains (upstream reason InvalidMetadata)."""
    extra = claim["spec"].get("additionalPodMetadata") or {}
    for kind in ("labels", "annotations"):
        for key in extra.get(kind) or {}:
            prefix = key.split("/", 1)[0] if "/" in key else ""
            if any(prefix == d or prefix.endswith("." + d) for d in c.RESTRICTED_METADATA_DOMAINS):
                raise ClaimRejected(
                    c.REASON_INVALID_METADATA,
                    f"invalid additionalPodMetadata: {kind[:-1]} key {key!r} uses a restricted domain",
                )


def merge_env(pod_spec: dict[str, Any], claim_env: list[Mapping[str, Any]], policy: str) -> None:
    if not claim_env:
        return
    if policy == "Disallowed":
        raise ClaimRejected(
            c.REASON_ENV_INJECTION_REJECTED,
            "environment variable injection rejected: the template's envVarsInjectionPolicy is Disallowed",
        )
    containers = pod_spec["containers"]
    by_name = {container["name"]: container for container in containers}
    for var in claim_env:
        target = by_name.get(var.get("containerName") or containers[0]["name"])
        if target is None:
            raise ClaimRejected(
                c.REASON_ENV_INJECTION_REJECTED,
                f"environment variable injection rejected: no container named {var.get('containerName')!r}",
            )
        env = target.setdefault("env", [])
        existing = next((e for e in env if e.get("name") == var["name"]), None)
        if existing is not None and policy != "Overrides":
            raise ClaimRejected(
                c.REASON_ENV_INJECTION_REJECTED,
                f"environment variable injection rejected: {var['name']!r} is set by the template and "
                "envVarsInjectionPolicy is Allowed (not Overrides)",
            )
        if existing is not None:
            env.remove(existing)
        env.append({"name": var["name"], "value": var["value"]})


def merge_volume_claim_templates(spec: dict[str, Any], extra: list[Mapping[str, Any]], policy: str) -> None:
    if not extra:
        return
    names: set[str] = set()
    for index, template in enumerate(extra):
        name = (template.get("metadata") or {}).get("name")
        if not name:
            raise ClaimRejected(
                c.REASON_VOLUME_CLAIM_TEMPLATES_ERROR,
                f"invalid volume claim templates: claim: name at index {index} is empty",
            )
        if name in names:
            raise ClaimRejected(
                c.REASON_VOLUME_CLAIM_TEMPLATES_ERROR,
                f"invalid volume claim templates: claim: duplicate name {name!r}",
            )
        names.add(name)
    if policy == "Disallowed":
        raise ClaimRejected(
            c.REASON_VOLUME_CLAIM_TEMPLATES_ERROR, "volume claim templates are disallowed by the template"
        )
    current = {t["metadata"]["name"]: t for t in spec.get("volumeClaimTemplates") or ()}
    for template in extra:
        name = template["metadata"]["name"]
        if name in current and policy != "Overrides":
            raise ClaimRejected(
                c.REASON_VOLUME_CLAIM_TEMPLATES_ERROR,
                f"overriding volume claim template {name!r} is forbidden by the template",
            )
        current[name] = copy.deepcopy(dict(template))
    spec["volumeClaimTemplates"] = list(current.values())


def add_missing(target: dict[str, str], extra: Mapping[str, str] | None) -> dict[str, str]:
    """Add keys from `extra` that `target` lacks: claim metadata never overrides the template's."""
    for key, value in drop_reserved(extra).items():
        target.setdefault(key, value)
    return target


def build_claimed_sandbox(claim: Body, template: Body) -> Manifest:
    """The Sandbox a claim cold-starts: named like the claim, owned by it."""
    cmeta = claim["metadata"]
    spec = sandbox_spec_from_template(template)
    tspec = template["spec"]
    check_metadata(claim)
    merge_env(
        spec["podTemplate"]["spec"],
        list(claim["spec"].get("env") or ()),
        tspec.get("envVarsInjectionPolicy", "Disallowed"),
    )
    merge_volume_claim_templates(
        spec,
        list(claim["spec"].get("volumeClaimTemplates") or ()),
        tspec.get("volumeClaimTemplatesPolicy", "Disallowed"),
    )
    apply_claim_metadata(spec["podTemplate"], claim)
    policy = claim_policy(claim, template)
    if policy is not None:
        spec["autoSuspendPolicy"] = policy
    labels = _base_labels(template)
    labels[c.LABEL_CLAIM_UID] = cmeta["uid"]
    labels[c.LABEL_LAUNCH_TYPE] = c.LAUNCH_COLD
    if (cmeta.get("labels") or {}).get(c.LABEL_CREATED_BY):
        labels[c.LABEL_CREATED_BY] = cmeta["labels"][c.LABEL_CREATED_BY]
    return {
        "apiVersion": c.SANDBOX_API_VERSION,
        "kind": "Sandbox",
        "metadata": {
            "name": cmeta["name"],
            "namespace": cmeta["namespace"],
            "labels": labels,
            "annotations": {
                c.ANNOTATION_TEMPLATE_REF: template["metadata"]["name"],
                c.ANNOTATION_POD_NAME: cmeta["name"],
                **preview_access(claim),
            },
            "ownerReferences": [owner_reference(claim)],
        },
        "spec": spec,
    }


def claim_policy(claim: Body, template: Body) -> dict[str, Any] | None:
    """The claim's Sandbox's autoSuspendPolicy: the claim's within the template's (resources/idle.py)."""
    try:
        return idle.effective_policy(
            template["spec"], idle.policy_of(claim["spec"]), f"SandboxClaim {claim['metadata']['name']!r}"
        )
    except idle.PolicyRefused as refused:
        raise ClaimRejected(c.REASON_AUTO_SUSPEND_POLICY_REFUSED, str(refused)) from None


def preview_access(owner: Body) -> dict[str, str]:
    """The claim's (or environment's) choice of a public or private preview, for its Sandbox."""
    value = (owner["metadata"].get("annotations") or {}).get(c.ANNOTATION_PREVIEW_ACCESS)
    return {c.ANNOTATION_PREVIEW_ACCESS: value} if value else {}


def apply_claim_metadata(pod_template: dict[str, Any], claim: Body) -> None:
    extra = claim["spec"].get("additionalPodMetadata") or {}
    meta = pod_template.setdefault("metadata", {})
    for kind in ("labels", "annotations"):
        if extra.get(kind):
            meta[kind] = add_missing(dict(meta.get(kind) or {}), extra[kind])


def adoption_patch(sandbox: Body, claim: Body, template: Body) -> Manifest:
    """Merge patch moving a warm sandbox to a claim, guarded by the sandbox's resourceVersion.

    Including metadata.resourceVersion makes the API server reject the patch with 409 if anyone changed the
    sandbox since we read it, so two claims can never both win the same sandbox.
    """
    check_metadata(claim)
    pod_template = copy.deepcopy(dict(sandbox["spec"]["podTemplate"]))
    apply_claim_metadata(pod_template, claim)
    labels: dict[str, Any] = {
        c.LABEL_WARM_POOL: None,
        c.LABEL_TEMPLATE_HASH: None,
        c.LABEL_LAUNCH_TYPE: c.LAUNCH_WARM,
        c.LABEL_CLAIM_UID: claim["metadata"]["uid"],
    }
    created_by = (claim["metadata"].get("labels") or {}).get(c.LABEL_CREATED_BY)
    if created_by:
        labels[c.LABEL_CREATED_BY] = created_by
    metadata: dict[str, Any] = {
        "resourceVersion": sandbox["metadata"]["resourceVersion"],
        "ownerReferences": [owner_reference(claim)],
        "labels": labels,
        # Clients that follow the Sandbox to its Pod read the name here once it is Ready (as upstream sets it).
        "annotations": {c.ANNOTATION_POD_NAME: sandbox["metadata"]["name"], **preview_access(claim)},
    }
    # A warm sandbox has no policy while it waits in its pool (nobody uses it; it must not be suspended).
    return {
        "metadata": metadata,
        "spec": {
            "podTemplate": {"metadata": pod_template.get("metadata") or {}},
            "autoSuspendPolicy": claim_policy(claim, template),
        },
    }
