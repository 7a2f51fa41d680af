"""The operator's runtime and Gitea clients share one TLS context: opening a client loads no CA bundle.

The operator opens a client for every pass that talks to a workspace or a Gitea; each used to build its own
context (the CA bundle read and parsed), which at a few hundred environments was most of the operator's CPU
(hack/bench/tenants_bench.py, BENCHMARKS.md "Many tenants")."""

from __future__ import annotations

import ssl
from typing import Any

import pytest
from shadow_operator.clients.gitea import Gitea
from shadow_operator.clients.runtime import Runtime

pytestmark = pytest.mark.unit


def test_clients_share_one_verifying_tls_context(monkeypatch: pytest.MonkeyPatch) -> None:
    built: list[ssl.SSLContext] = []
    create = ssl.create_default_context

    def counted(*args: Any, **kwargs: Any) -> ssl.SSLContext:
        context = create(*args, **kwargs)
        built.append(context)
        return context

    monkeypatch.setattr(ssl, "create_default_context", counted)
    clients = [Runtime("https://runtime.example:8888", "t") for _ in range(5)]
    clients += [Gitea("https://gitea.example:3000", username="a", token="t") for _ in range(5)]
    # At most the first client of the process builds it; none of the others does.
    assert len(built) <= 1, f"{len(built)} TLS contexts built for 10 clients"
    contexts = {id(client._http._transport._pool._ssl_context) for client in clients}
    assert len(contexts) == 1
    shared = clients[0]._http._transport._pool._ssl_context
    # Still the verifying default: certificates required and host names checked.
    assert shared.verify_mode == ssl.CERT_REQUIRED and shared.check_hostname
