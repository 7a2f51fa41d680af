"""The generated CRDs in crds/ and the chart match the pydantic models, and are structurally sound."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from shadow_operator.api import crdgen
from shadow_operator.api.kinds import (
    CUSTOM_KINDS,
    SHADOW_ENVIRONMENT,
    SHADOW_ENVIRONMENT_POOL,
    ResourceKind,
)

# The agent-sandbox kinds (v1beta1 storage, v1alpha1 served); the shadow.dev kinds are our own v1alpha1 API.
SANDBOX_KINDS = [k for k in CUSTOM_KINDS if k.group != SHADOW_ENVIRONMENT.group]

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
OUTPUTS = [ROOT / "crds", ROOT / "charts" / "shadow-operator" / "crds"]


@pytest.mark.parametrize("out", OUTPUTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_generated_crds_are_current(out: Path) -> None:
    stale = crdgen.stale_files(out)
    assert not stale, f"{out.relative_to(ROOT)} is stale: {stale}; run `make crds`"


def test_check_mode_reports_a_stale_file(tmp_path: Path) -> None:
    assert crdgen.main(["--out", str(tmp_path)]) == 0
    assert crdgen.main(["--check", "--out", str(tmp_path)]) == 0
    victim = tmp_path / "sandboxes.agents.x-k8s.io.yaml"
    victim.write_text(victim.read_text().replace("Suspended", "Paused"))
    assert crdgen.main(["--check", "--out", str(tmp_path)]) == 1
    assert crdgen.stale_files(tmp_path) == [victim.name]


def test_generation_is_idempotent(tmp_path: Path) -> None:
    crdgen.main(["--out", str(tmp_path)])
    first = {p.name: p.read_text() for p in tmp_path.iterdir()}
    crdgen.main(["--out", str(tmp_path)])
    assert {p.name: p.read_text() for p in tmp_path.iterdir()} == first


def _walk(node: Any, path: str = "") -> list[tuple[str, dict[str, Any]]]:
    found: list[tuple[str, dict[str, Any]]] = []
    if isinstance(node, dict):
        found.append((path, node))
        for key, value in node.items():
            found.extend(_walk(value, f"{path}.{key}"))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            found.extend(_walk(value, f"{path}[{i}]"))
    return found


@pytest.mark.parametrize("kind", CUSTOM_KINDS, ids=lambda k: k.kind)
def test_schemas_are_structural(kind: ResourceKind) -> None:
    crd = crdgen.build_crd(kind)
    for version in crd["spec"]["versions"]:
        schema = version["schema"]["openAPIV3Schema"]
        for path, node in _walk(schema):
            assert "$ref" not in node and "anyOf" not in node and "title" not in node, path
            if "properties" in node and not path.endswith(".properties"):
                assert node.get("type") == "object", f"{path} has properties but no type: object"
            assert node.get("additionalProperties") is not True, path


@pytest.mark.parametrize("kind", CUSTOM_KINDS, ids=lambda k: k.kind)
def test_schemas_are_what_the_api_server_stores(kind: ResourceKind) -> None:
    """The API server drops an empty `properties: {}`: a CRD that has one never matches its live copy, and
    ArgoCD shows it OutOfSync forever (seen with ShadowEnvironment's `upload: {}` on a real ArgoCD)."""
    crd = crdgen.build_crd(kind)
    for version in crd["spec"]["versions"]:
        for path, node in _walk(version["schema"]["openAPIV3Schema"]):
            if not path.endswith(".properties"):
                assert node.get("properties") != {}, f"{path} has an empty properties"


def test_an_empty_object_stays_closed() -> None:
    """`upload: {}` takes no field: without properties it must not become preserve-unknown-fields."""
    crd = crdgen.build_crd(SHADOW_ENVIRONMENT)
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    upload = schema["properties"]["spec"]["properties"]["sources"]["items"]["properties"]["upload"]
    assert upload["type"] == "object" and "x-kubernetes-preserve-unknown-fields" not in upload, upload


def _without_defaults(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: _without_defaults(v) for k, v in node.items() if k != "default"}
    if isinstance(node, list):
        return [_without_defaults(v) for v in node]
    return node


def test_versions_share_one_schema_and_v1beta1_is_storage() -> None:
    """One schema for all versions (no conversion webhook needed); only defaults may differ per version."""
    for kind in SANDBOX_KINDS:
        versions = crdgen.build_crd(kind)["spec"]["versions"]
        assert [v["name"] for v in versions] == ["v1beta1", "v1alpha1"]
        assert [v["storage"] for v in versions] == [True, False]
        assert _without_defaults(versions[0]["schema"]) == _without_defaults(versions[1]["schema"]), kind.kind


def test_shadow_environment_is_v1alpha1_only_and_not_deprecated() -> None:
    crd = crdgen.build_crd(next(k for k in CUSTOM_KINDS if k.kind == "ShadowEnvironment"))
    (version,) = crd["spec"]["versions"]
    assert crd["spec"]["group"] == "shadow.dev"
    assert version["name"] == "v1alpha1" and version["storage"] is True
    assert "deprecated" not in version
    assert crd["spec"]["names"]["categories"] == ["shadow"]
    columns = [col["name"] for col in version["additionalPrinterColumns"] if not col.get("priority")]
    assert columns == ["Ready", "Sources", "Verdict", "Age"]


def test_v1alpha1_templates_default_to_a_headless_service_and_v1beta1_ones_do_not() -> None:
    crd = crdgen.build_crd(next(k for k in CUSTOM_KINDS if k.kind == "SandboxTemplate"))
    service = {
        v["name"]: v["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["service"]
        for v in crd["spec"]["versions"]
    }
    assert service["v1alpha1"].get("default") is True
    assert "default" not in service["v1beta1"]


def test_names_columns_and_subresources() -> None:
    crds = {k.kind: crdgen.build_crd(k) for k in CUSTOM_KINDS}
    for kind in SANDBOX_KINDS:
        assert crds[kind.kind]["spec"]["names"]["categories"] == ["agent-sandbox"]
    for crd in crds.values():
        assert crd["spec"]["conversion"] == {"strategy": "None"}
    sandbox = crds["Sandbox"]["spec"]
    assert sandbox["names"]["shortNames"] == ["sbx"]
    for crd in crds.values():
        names = crd["spec"]["names"]
        # kubectl resolves a category before a resource name: none may equal a singular or short name.
        assert not set(names["categories"]) & {names["singular"], *names.get("shortNames", [])}
    columns = [col["name"] for col in sandbox["versions"][0]["additionalPrinterColumns"]]
    assert columns[:2] == ["Ready", "Reason"] and columns[-1] == "Age"
    for pool_kind in ("SandboxWarmPool", SHADOW_ENVIRONMENT_POOL.kind):
        pool = crds[pool_kind]["spec"]["versions"][0]["subresources"]
        assert pool["scale"] == {
            "specReplicasPath": ".spec.replicas",
            "statusReplicasPath": ".status.replicas",
            "labelSelectorPath": ".status.selector",
        }, pool_kind
    assert "subresources" not in crds["SandboxTemplate"]["spec"]["versions"][0]


def test_claim_schema_keeps_both_reference_forms() -> None:
    crd = next(crdgen.build_crd(k) for k in CUSTOM_KINDS if k.kind == "SandboxClaim")
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    assert {"warmPoolRef", "sandboxTemplateRef", "warmpool"} <= set(spec["properties"])
    assert "required" not in spec
    messages = [rule["message"] for rule in spec["x-kubernetes-validations"]]
    assert any("exactly one of spec.warmPoolRef.name" in msg for msg in messages)


def test_written_files_parse_as_yaml() -> None:
    for text in crdgen.render_all().values():
        doc = yaml.safe_load(text)
        assert doc["kind"] == "CustomResourceDefinition"


def _undescribed(schema: dict[str, Any], path: str) -> list[str]:
    found = []
    for key, sub in (schema.get("properties") or {}).items():
        if not sub.get("description"):
            found.append(f"{path}.{key}")
        found += _undescribed(sub, f"{path}.{key}")
    for nested, suffix in ((schema.get("items"), "[]"), (schema.get("additionalProperties"), "{}")):
        if isinstance(nested, dict):
            found += _undescribed(nested, path + suffix)
    return found


def test_every_field_is_described_for_kubectl_explain() -> None:
    """`kubectl explain` prints these descriptions; they come from the models' Field(description=...)."""
    for kind in CUSTOM_KINDS:
        for version in crdgen.build_crd(kind)["spec"]["versions"]:
            root = version["schema"]["openAPIV3Schema"]
            missing = [p for p in _undescribed(root, kind.kind) if p != f"{kind.kind}.metadata"]
            assert not missing, f"{version['name']}: fields without a description: {missing}"
