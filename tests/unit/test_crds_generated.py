"""The generated CRDs in crds/ and the chart match the pydantic models, and are structurally sound."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from shadow_operator.api import crdgen

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


@pytest.mark.parametrize("kind", crdgen.KINDS, ids=lambda k: k.kind)
def test_schemas_are_structural(kind: crdgen.Kind) -> None:
    crd = crdgen.build_crd(kind)
    for version in crd["spec"]["versions"]:
        schema = version["schema"]["openAPIV3Schema"]
        for path, node in _walk(schema):
            assert "$ref" not in node and "anyOf" not in node and "title" not in node, path
            if "properties" in node and not path.endswith(".properties"):
                assert node.get("type") == "object", f"{path} has properties but no type: object"
            assert node.get("additionalProperties") is not True, path


def test_versions_share_one_schema_and_v1beta1_is_storage() -> None:
    for kind in crdgen.KINDS:
        versions = crdgen.build_crd(kind)["spec"]["versions"]
        assert [v["name"] for v in versions] == ["v1beta1", "v1alpha1"]
        assert [v["storage"] for v in versions] == [True, False]
        assert versions[0]["schema"] == versions[1]["schema"], kind.kind


def test_names_columns_and_subresources() -> None:
    crds = {k.kind: crdgen.build_crd(k) for k in crdgen.KINDS}
    for crd in crds.values():
        assert crd["spec"]["names"]["categories"] == ["agent-sandbox"]
        assert crd["spec"]["conversion"] == {"strategy": "None"}
    sandbox = crds["Sandbox"]["spec"]
    assert sandbox["names"]["shortNames"] == ["sbx"]
    for crd in crds.values():
        names = crd["spec"]["names"]
        # kubectl resolves a category before a resource name: none may equal a singular or short name.
        assert not set(names["categories"]) & {names["singular"], *names.get("shortNames", [])}
    columns = [col["name"] for col in sandbox["versions"][0]["additionalPrinterColumns"]]
    assert columns[:2] == ["Ready", "Reason"] and columns[-1] == "Age"
    pool = crds["SandboxWarmPool"]["spec"]["versions"][0]["subresources"]
    assert pool["scale"] == {
        "specReplicasPath": ".spec.replicas",
        "statusReplicasPath": ".status.replicas",
        "labelSelectorPath": ".status.selector",
    }
    assert "subresources" not in crds["SandboxTemplate"]["spec"]["versions"][0]


def test_claim_schema_keeps_both_reference_forms() -> None:
    crd = next(crdgen.build_crd(k) for k in crdgen.KINDS if k.kind == "SandboxClaim")
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    assert {"warmPoolRef", "sandboxTemplateRef", "warmpool"} <= set(spec["properties"])
    assert "required" not in spec
    messages = [rule["message"] for rule in spec["x-kubernetes-validations"]]
    assert any("exactly one of spec.warmPoolRef.name" in msg for msg in messages)


def test_written_files_parse_as_yaml() -> None:
    for text in crdgen.render_all().values():
        doc = yaml.safe_load(text)
        assert doc["kind"] == "CustomResourceDefinition"
