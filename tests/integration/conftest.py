"""Fixtures shared by the Sandbox API integration modules: the operator running in-process, object access."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from tests.runtime.conftest import Server, start_server
from tests.support.sandbox_operator import Objects, in_process_operator, install_crds


@pytest.fixture(scope="module")
def operator(k8s_api: client.ApiClient) -> Iterator[Any]:
    """The operator with default settings for one test module (modules may override it with settings)."""
    install_crds(k8s_api)
    with in_process_operator() as runner:
        yield runner


@pytest.fixture
def objs(k8s_api: client.ApiClient, namespace: str, operator: Any) -> Objects:
    return Objects(k8s_api, namespace)


@pytest.fixture(scope="module")
def runtime(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A real workspace runtime on loopback for one test module: the environments' workspace, which the
    operator reaches through SHADOW_RUNTIME_API_URL."""
    srv = start_server(tmp_path_factory.mktemp("workspace"))
    try:
        yield srv
    finally:
        srv.stop()
