"""The chart's tenants: each tenant namespace gets the default template and is served (operator, router); the
tenants' ClusterRoles join the built-in roles by aggregation labels. The rights themselves are checked on a
real API server (tests/integration/test_tenant_rbac.py).
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.unit.test_chart import _helm, by_kind, documents, render

pytestmark = pytest.mark.unit

AGGREGATE = "rbac.authorization.k8s.io/aggregate-to-"


@pytest.fixture(scope="module")
def helm() -> str:
    return _helm()


def named(docs: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in by_kind(docs, kind)}


def test_each_tenant_namespace_gets_the_default_template(helm: str) -> None:
    docs = documents(
        render(helm, "--set=tenants.namespaces={team-b,team-a,shadow-system}", include_crds=False)
    )
    templates = by_kind(docs, "SandboxTemplate")
    assert sorted(t["metadata"]["namespace"] for t in templates) == ["shadow-system", "team-a", "team-b"]
    assert all(t["metadata"]["name"] == "workspace" for t in templates)
    assert all(t["spec"] == templates[0]["spec"] for t in templates)


def test_without_tenants_only_the_release_namespace_has_a_template(helm: str) -> None:
    docs = documents(render(helm, include_crds=False))
    assert [t["metadata"]["namespace"] for t in by_kind(docs, "SandboxTemplate")] == ["shadow-system"]


def test_tenant_namespaces_are_served_by_a_namespaced_operator_and_the_router(helm: str) -> None:
    docs = documents(
        render(
            helm,
            "--set=operator.watchNamespaces={ops}",
            "--set=tenants.namespaces={team-a}",
            "--set=previewRouter.enabled=true",
            include_crds=False,
        )
    )
    deployments = named(docs, "Deployment")
    args = deployments["shadow-shadow-operator"]["spec"]["template"]["spec"]["containers"][0]["args"]
    served = [args[i + 1] for i, a in enumerate(args) if a == "--namespace"]
    assert served == ["ops", "team-a"]
    roles = {(r["metadata"]["namespace"], r["metadata"]["name"]) for r in by_kind(docs, "Role")}
    assert {("ops", "shadow-shadow-operator"), ("team-a", "shadow-shadow-operator")} <= roles
    router = next(d for name, d in deployments.items() if name.endswith("preview-router"))
    router_args = [a for c in router["spec"]["template"]["spec"]["containers"] for a in c.get("args", [])]
    routed = [router_args[i + 1] for i, a in enumerate(router_args) if a == "--namespace"]
    assert routed == ["shadow-system", "team-a"]


def test_tenant_roles_join_edit_and_view(helm: str) -> None:
    roles = named(documents(render(helm, include_crds=False)), "ClusterRole")
    edit, view = roles["shadow-shadow-operator-tenant-edit"], roles["shadow-shadow-operator-tenant-view"]
    assert {k for k, v in edit["metadata"]["labels"].items() if k.startswith(AGGREGATE) and v == "true"} == {
        f"{AGGREGATE}edit",
        f"{AGGREGATE}admin",
    }
    assert {k for k, v in view["metadata"]["labels"].items() if k.startswith(AGGREGATE) and v == "true"} == {
        f"{AGGREGATE}view",
        f"{AGGREGATE}edit",
        f"{AGGREGATE}admin",
    }
    # view never runs anything: no write verb, no Secrets, no proxy.
    for rule in view["rules"]:
        assert set(rule["verbs"]) <= {"get", "list", "watch"}
        assert not {"secrets", "pods/proxy"} & set(rule["resources"])


def test_cluster_reads_can_be_left_unbound(helm: str) -> None:
    docs = documents(
        render(helm, "--set=tenants.rbac.clusterReadSubjects=null", "--set=tenants.rbac.aggregate=false")
    )
    assert not [d for d in docs if "tenant" in d["metadata"]["name"]]
