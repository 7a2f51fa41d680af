"""Every kind in `api/kinds.py` has what the chart owes it: the RBAC the operator needs for it (derived from the
reconcilers' declarations, and for the kinds the operator reaches directly from `DIRECT` below), printer
columns in its CRD, and an ArgoCD health check where its status carries conditions.

A kind added to `api/kinds.py` without these fails here, named; the checklist is operator/README.md's
"Adding a kind".
"""

from __future__ import annotations

import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel
from shadow_operator.api import kinds as k
from shadow_operator.api.kinds import ALL_KINDS, CUSTOM_KINDS, ResourceKind
from shadow_operator.controllers import RECONCILERS

from tests.support.rbac import render_rbac, rendered

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "shadow-operator"
RELEASE, HOME = "shadow", "shadow-system"
SERVED = ("team-a", "team-b")

READ = frozenset({"get", "list", "watch"})
# A reconciler's own kind: read it, write its metadata (kopf's annotations) and its status; children's owner
# references block its deletion, which needs update on its finalizers where OwnerReferencesPermissionEnforcement
# is on.
PRIMARY = READ | {"patch"}
STATUS = frozenset({"get", "update", "patch"})
# What it owns: created (apply() POSTs a missing child), patched (server-side apply, label syncs), deleted.
OWNED = READ | {"create", "patch", "delete"}

# Kinds the operator reaches with its client directly, not through a reconciler's declarations: verbs, and
# where the grant must be (namespaced: in each served namespace; cluster: cluster-wide; home: the release's
# namespace, only with leader election).
DIRECT: dict[ResourceKind, tuple[frozenset[str], str]] = {
    k.EVENT: (frozenset({"create", "patch"}), "namespaced"),
    k.LEASE: (frozenset({"get", "create", "update"}), "home"),
    k.STORAGE_CLASS: (frozenset({"get", "list"}), "cluster"),
    k.RUNTIME_CLASS: (frozenset({"get"}), "cluster"),
    k.VOLUME_SNAPSHOT: (frozenset({"get", "list", "create", "patch", "delete"}), "namespaced"),
    k.VOLUME_SNAPSHOT_CLASS: (frozenset({"get", "list"}), "cluster"),
}

Need = tuple[str, str, str]  # (apiGroup, resource, verb)


def needs(kind: ResourceKind) -> dict[Need, str]:
    """What the operator does with `kind`: each (group, resource, verb) and where it must be granted."""
    verbs: dict[str, set[str]] = {}

    def add(resource: str, granted: frozenset[str]) -> None:
        verbs.setdefault(resource, set()).update(granted)

    for rec in RECONCILERS:
        if rec.kind == kind:
            add(kind.plural, PRIMARY)
            if kind.crd is None or kind.crd.status:
                add(f"{kind.plural}/status", STATUS)
            if rec.owns:
                add(f"{kind.plural}/finalizers", frozenset({"update"}))
        if kind in rec.owns:
            add(kind.plural, OWNED)
        declared = [
            *(w.kind for w in rec.watches),
            *(i.kind for i in rec.indexes),
            *(c.kind for c in rec.cached),
        ]
        if kind in declared:
            add(kind.plural, READ)
    where = "namespaced"
    if kind in DIRECT:
        direct, where = DIRECT[kind]
        add(kind.plural, direct)
    return {(kind.group, resource, verb): where for resource, vs in verbs.items() for verb in vs}


def allowed(rules: list[dict[str, Any]]) -> set[Need]:
    """What the rules allow on every object of a resource (a rule narrowed by resourceNames allows less)."""
    return {
        (group, resource, verb)
        for rule in rules
        if not rule.get("resourceNames")
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


def grants(docs: list[dict[str, Any]]) -> dict[str, set[Need]]:
    """Where the account's roles grant what: "cluster" (ClusterRoles bound cluster-wide) and each namespace
    (Roles bound there, and ClusterRoles, which hold there too)."""
    (account,) = [d["metadata"]["name"] for d in docs if d["kind"] == "ServiceAccount"]
    subject = {"kind": "ServiceAccount", "name": account, "namespace": HOME}
    roles = {(d["kind"], d["metadata"].get("namespace"), d["metadata"]["name"]): d for d in docs}
    out: dict[str, set[Need]] = {"cluster": set()}
    for binding in docs:
        if binding["kind"] not in ("ClusterRoleBinding", "RoleBinding") or subject not in binding["subjects"]:
            continue
        ref = binding["roleRef"]
        namespace = binding["metadata"].get("namespace")
        role = roles[(ref["kind"], None if ref["kind"] == "ClusterRole" else namespace, ref["name"])]
        out.setdefault(namespace or "cluster", set()).update(allowed(role["rules"]))
    return out


def missing(kind: ResourceKind, granted: dict[str, set[Need]], served: tuple[str, ...]) -> list[str]:
    """The kind's needs the grants lack, as 'verb group/resource in where' lines."""
    cluster = granted["cluster"]
    lacking = []
    for need, where in sorted(needs(kind).items()):
        places = {"cluster": [None], "home": [HOME], "namespaced": list(served) or [None]}[where]
        for namespace in places:
            have = cluster | (granted.get(namespace, set()) if namespace else set())
            if need not in have:
                group, resource, verb = need
                lacking.append(f"{verb} {group or 'core'}/{resource} in {namespace or 'the cluster'}")
    return lacking


ELECTED = ("operator.leaderElection.enabled=true", "operator.replicas=2")


@pytest.fixture(scope="module")
def served_grants() -> dict[str, set[Need]]:
    return grants(render_rbac(RELEASE, HOME, ",".join(SERVED), *ELECTED))


@pytest.fixture(scope="module")
def cluster_grants() -> dict[str, set[Need]]:
    templates = ("templates/rbac.yaml", "templates/serviceaccount.yaml")
    return grants(rendered(RELEASE, HOME, [f"--set={v}" for v in ELECTED], *templates))


def kind_id(kind: ResourceKind) -> str:
    return kind.kind


def test_every_kind_says_what_the_operator_does_with_it() -> None:
    unknown = [kind.kind for kind in ALL_KINDS if not needs(kind)]
    assert not unknown, (
        f"{unknown}: in api/kinds.py but neither named by a reconciler (kind, owns, watches, indexes, cached) "
        "nor listed in DIRECT of this test; say what the operator does with it"
    )
    reconciled = [rec.kind for rec in RECONCILERS]
    orphans = [kind.kind for kind in CUSTOM_KINDS if reconciled.count(kind) != 1]
    assert not orphans, f"{orphans}: a custom kind needs exactly one reconciler in controllers.RECONCILERS"


@pytest.mark.parametrize("kind", ALL_KINDS, ids=kind_id)
def test_chart_rbac_grants_what_the_operator_needs(
    kind: ResourceKind, served_grants: dict[str, set[Need]], cluster_grants: dict[str, set[Need]]
) -> None:
    lacking = missing(kind, served_grants, SERVED)
    assert not lacking, f"{kind}: templates/rbac.yaml lacks, with operator.watchNamespaces: {lacking}"
    lacking = missing(kind, cluster_grants, ())
    assert not lacking, f"{kind}: templates/rbac.yaml lacks, serving the whole cluster: {lacking}"


def chart_crd(kind: ResourceKind) -> dict[str, Any]:
    path = CHART / "crds" / f"{kind.name}.yaml"
    assert path.is_file(), f"{kind}: no {path.relative_to(REPO)}; run `make crds`"
    crd: dict[str, Any] = yaml.safe_load(path.read_text())
    return crd


@pytest.mark.parametrize("kind", CUSTOM_KINDS, ids=kind_id)
def test_every_custom_kind_has_printer_columns(kind: ResourceKind) -> None:
    assert kind.crd is not None, f"{kind}: a custom kind needs a CrdSpec in api/kinds.py"
    for version in chart_crd(kind)["spec"]["versions"]:
        columns = version.get("additionalPrinterColumns") or []
        paths = [column["jsonPath"] for column in columns]
        assert ".metadata.creationTimestamp" in paths, f"{kind} {version['name']}: no Age column"
        others = [p for p in paths if p != ".metadata.creationTimestamp"]
        if kind.crd.status:
            assert any(p.startswith(".status.") for p in others), (
                f"{kind} {version['name']}: no printer column shows its status (CrdSpec.columns in api/kinds.py)"
            )
        else:
            assert others, f"{kind} {version['name']}: no printer column but Age (CrdSpec.columns)"


def status_models(model: type[BaseModel] | None) -> Iterator[type[BaseModel]]:
    field = (model.model_fields if model else {}).get("status")
    for arg in typing.get_args(field.annotation) if field else ():
        if isinstance(arg, type) and issubclass(arg, BaseModel):
            yield arg


def has_conditions(kind: ResourceKind) -> bool:
    return any("conditions" in status.model_fields for status in status_models(kind.model))


def test_condition_kinds_are_known() -> None:
    # The rule below reads the models; this keeps it from passing vacuously if the status types move.
    assert {kind.kind for kind in CUSTOM_KINDS if has_conditions(kind)} >= {
        "Sandbox",
        "SandboxClaim",
        "ShadowEnvironment",
    }


@pytest.mark.parametrize("kind", [kind for kind in CUSTOM_KINDS if has_conditions(kind)], ids=kind_id)
def test_kinds_with_conditions_have_an_argocd_health_check(kind: ResourceKind) -> None:
    """ArgoCD reads no custom kind's health by itself: a kind whose status says through conditions whether it
    works needs a Lua check, installed under its key (the chart's README) and in `make e2e-argocd`."""
    script = CHART / "argocd" / f"{kind.kind.lower()}-health.lua"
    assert script.is_file(), f"{kind}: no {script.relative_to(REPO)}"
    key = f"resource.customizations.health.{kind.group}_{kind.kind}"
    for where in (CHART / "README.md", REPO / "hack" / "kind" / "argocd.sh"):
        text = where.read_text()
        assert key in text and script.name in text, (
            f"{kind}: {where.relative_to(REPO)} does not install {script.name} as {key}"
        )
