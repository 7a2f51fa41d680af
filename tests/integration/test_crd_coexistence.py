"""Coexistence on a real API server: installing the chart where another controller's agent-sandbox CRD exists
fails before anything is applied, with a message naming the CRD, its owner and what to do; our own CRDs (an
upgrade) and an explicit crds.adoptExisting=true pass. `helm template --dry-run=server` runs the chart's
`lookup` against the cluster exactly as `helm install` does.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator

import pytest
from kubernetes import client

from tests.support.router import CHART, helm_binary
from tests.support.sandbox_operator import install_crds

pytestmark = pytest.mark.integration

CRD = "sandboxes.agents.x-k8s.io"


def dry_run_install(kubeconfig: str, *values: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [helm_binary(), "template", "shadow", str(CHART), "--namespace", "shadow-system", "--dry-run=server",
         "--kubeconfig", kubeconfig, *values],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


@pytest.fixture
def foreign_crd(k8s_api: client.ApiClient) -> Iterator[None]:
    """Our Sandbox CRD made to look like kubernetes-sigs/agent-sandbox's Helm install; ours again after."""
    install_crds(k8s_api)
    ext = client.ApiextensionsV1Api(k8s_api)
    ext.patch_custom_resource_definition(
        CRD,
        {
            "metadata": {
                "labels": {
                    "app.kubernetes.io/part-of": None,
                    "app.kubernetes.io/name": "agent-sandbox",
                    "app.kubernetes.io/managed-by": "Helm",
                },
                "annotations": {
                    "meta.helm.sh/release-name": "agent-sandbox",
                    "meta.helm.sh/release-namespace": "agent-sandbox-system",
                    "controller-gen.kubebuilder.io/version": "v0.18.0",
                },
            }
        },
    )
    try:
        yield
    finally:
        install_crds(k8s_api)


def test_our_own_crds_pass(k8s_api: client.ApiClient, kubeconfig: str) -> None:
    install_crds(k8s_api)
    result = dry_run_install(kubeconfig)
    assert result.returncode == 0, result.stderr
    assert "kind: Deployment" in result.stdout


def test_another_controllers_crd_stops_the_install_with_what_to_do(
    kubeconfig: str, foreign_crd: None
) -> None:
    result = dry_run_install(kubeconfig)
    assert result.returncode != 0
    message = " ".join(result.stderr.split())
    assert f"The CustomResourceDefinition {CRD} already exists and is not shadow-operator's" in message
    assert "Helm release agent-sandbox-system/agent-sandbox" in message
    assert "app agent-sandbox" in message
    assert "made by controller-gen v0.18.0" in message
    assert "--set crds.adoptExisting=true" in message
    assert "kubectl apply --server-side --force-conflicts -f <chart>/crds/" in message


def test_adopting_on_purpose_passes(kubeconfig: str, foreign_crd: None) -> None:
    result = dry_run_install(kubeconfig, "--set=crds.adoptExisting=true")
    assert result.returncode == 0, result.stderr
