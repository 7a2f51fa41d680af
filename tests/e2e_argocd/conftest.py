"""Fixtures for the ArgoCD tests on the kind cluster `make e2e-argocd` sets up (hack/kind/argocd.sh): ArgoCD
in namespace argocd, a Gitea (gitops-git) beside it, no install of the chart yet. The git repositories are
filled here, through a port-forward, and ArgoCD takes everything else from them."""

from __future__ import annotations

import base64
import os
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import config

from tests.e2e.cluster import KUBECONFIG, Cluster
from tests.e2e_argocd.gitops import ARGOCD_NS, GitServer

CHART_RELEASE = os.environ.get("SHADOW_CHART_RELEASE", "")


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    if not Path(KUBECONFIG).exists():
        pytest.fail(f"no kind cluster kubeconfig at {KUBECONFIG}: run `make e2e-argocd`")
    api = config.new_client_from_config(config_file=KUBECONFIG)
    try:
        yield Cluster(api=api, kubeconfig=KUBECONFIG)
    finally:
        api.close()


@pytest.fixture(scope="session")
def chart_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The released chart (images pinned by digest in the local registry) that hack/kind/argocd.sh made."""
    if not CHART_RELEASE or not Path(CHART_RELEASE).is_file():
        pytest.fail(f"no released chart at SHADOW_CHART_RELEASE={CHART_RELEASE!r}: run `make e2e-argocd`")
    out = tmp_path_factory.mktemp("chart")
    with tarfile.open(CHART_RELEASE) as tar:
        tar.extractall(out, filter="data")
    return out / "shadow-operator"


@pytest.fixture(scope="session")
def git_server(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GitServer]:
    secret = cluster.core.read_namespaced_secret("gitops-git-admin", ARGOCD_NS)
    user, password = (base64.b64decode(secret.data[k]).decode() for k in ("username", "password"))
    with cluster.port_forward(ARGOCD_NS, "svc/gitops-git", 3000) as url:
        yield GitServer(url, user, password, tmp_path_factory.mktemp("repos"))
