"""The SDK reads the namespace as kubectl does: the named (or current) context's, else "default"."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
import yaml
from shadow_operator.sdk import ShadowGateway, kube

pytestmark = pytest.mark.unit


def kubeconfig(tmp_path: Path) -> str:
    path = tmp_path / "config"
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [
                    {"name": "a", "context": {"cluster": "c", "user": "u", "namespace": "team-a"}},
                    {"name": "plain", "context": {"cluster": "c", "user": "u"}},
                ],
                "current-context": "a",
            }
        )
    )
    return str(path)


def test_context_namespace(tmp_path: Path) -> None:
    config = kubeconfig(tmp_path)
    assert kube.context_namespace(kubeconfig=config) == "team-a"
    assert kube.context_namespace("plain", kubeconfig=config) == "default"
    assert kube.context_namespace("a", kubeconfig=config) == "team-a"
    assert kube.context_namespace(kubeconfig=str(tmp_path / "missing")) == "default"


def test_login_reads_server_token_and_namespace(tmp_path: Path) -> None:
    identity = kube.login(kubeconfig=kubeconfig(tmp_path))
    assert identity.server == "https://127.0.0.1:1"
    assert identity.headers == {"Authorization": "Bearer t"}
    assert identity.namespace == "team-a"


def test_the_gateway_defaults_to_the_contexts_namespace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KUBECONFIG", kubeconfig(tmp_path))
    with httpx.Client(base_url="https://127.0.0.1:1") as http:
        assert ShadowGateway("x", client=http).namespace == "team-a"
        assert ShadowGateway("x", namespace="other", client=http).namespace == "other"
