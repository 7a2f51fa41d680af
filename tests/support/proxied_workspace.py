"""A ShadowEnvironment whose workspace the client reaches as it does in a cluster: through the API server's pod
proxy, to a real sandbox-runtime.

The control plane has no kubelet and the operator is not needed: the test writes what the operator would (the
environment's status: WorkspaceReady, its Sandbox's name, runtime port and token Secret), a Pod whose IP is a
non-loopback address of this machine (the API server refuses to proxy to loopback), and the token Secret. The
runtime listens on that address, with its token and HANDOFF.md kept, so every client verb that talks to a
workspace (exec, cp, diff, journal, decide, handoff, sync, git) runs end to end against a real runtime.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from kubernetes import client
from shadow_operator.api import naming

from tests.runtime.conftest import Server, start_server
from tests.support.router import outside_address, sandbox_pod, token_secret

V = "v1alpha1"


@contextmanager
def proxied_environment(
    api: client.ApiClient, namespace: str, name: str, root: Path, *, spec: dict[str, Any] | None = None
) -> Iterator[Server]:
    """The environment `name` in `namespace`, Ready, its workspace a real runtime at `root`."""
    token = secrets.token_hex(16)
    server = start_server(
        root,
        "--handoff",
        env={"SANDBOX_RUNTIME_TOKEN": token},
        token=token,
        host=outside_address(),
        log=root.parent / f"{name}-runtime.log",
    )
    try:
        core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
        body = {
            "apiVersion": f"shadow.dev/{V}",
            "kind": "ShadowEnvironment",
            "metadata": {"name": name},
            "spec": spec or {"sources": [{"name": "app", "repo": "shadow/app", "upload": {}}]},
        }
        custom.create_namespaced_custom_object("shadow.dev", V, namespace, "shadowenvironments", body)
        ip = server.url.split("//", 1)[1].rsplit(":", 1)[0]
        port = int(server.url.rsplit(":", 1)[1])
        sandbox_pod(core, namespace, name, ip, None, {"app": name})
        token_secret(core, namespace, name, token)
        condition = {"status": "True", "lastTransitionTime": "2026-01-01T00:00:00Z", "message": "the test's"}
        status = {
            "conditions": [
                {"type": t, "reason": t, **condition} for t in ("WorkspaceReady", "SourcesReady", "Ready")
            ],
            "sandbox": name,
            "runtimeURL": f"http://{name}.{namespace}.svc:{port}",
            "runtimeTokenSecret": naming.token_secret_name(name),
        }
        custom.patch_namespaced_custom_object_status(
            "shadow.dev", V, namespace, "shadowenvironments", name, {"status": status}
        )
        yield server
    finally:
        server.stop()
