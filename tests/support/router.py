"""The preview router for tests: the real nginx binary with the chart's rendered config, router-auth as a real
process against the test's API server, and upstream HTTP / WebSocket / SSE servers on loopback.

What is changed from the chart's render, and why (nothing that routes): the `/tmp/` paths of the nginx config
and of the image's main nginx.conf point into the test's directory (several test runs share the machine's
/tmp), and router-auth's `--keys-dir` points at a directory the test writes. Ports are chosen with `--set`
like any user would; the routing rules are used exactly as rendered.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import fcntl
import ipaddress
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from aiohttp import web
from kubernetes import client
from shadow_operator.api import naming

from tests.support.controlplane import free_port, wait_for
from tests.support.rbac import applied, rendered, token_kubeconfig

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "shadow-operator"
IMAGE_NGINX_CONF = ROOT / "images" / "preview-router" / "nginx.conf"
SSE_EVENTS = 3
SSE_GAP_SECONDS = 0.4


def helm_binary() -> str:
    cache = Path(os.environ.get("SHADOW_CACHE", Path.home() / ".cache" / "shadow-operator"))
    for candidate in (os.environ.get("HELM", ""), str(cache / "bin" / "helm"), shutil.which("helm") or ""):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    raise RuntimeError("helm not found: build it with `hack/build-tools.sh helm` (or set HELM)")


def render_router(values: list[str]) -> tuple[str, list[str]]:
    """(nginx router.conf, router-auth's args) exactly as the chart renders them with these `--set`s."""
    out = subprocess.run(
        [helm_binary(), "template", "shadow", str(CHART), "--namespace", "shadow-system", *values],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    ).stdout
    docs = [d for d in yaml.safe_load_all(out) if d]
    (config,) = [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-router")]
    (deployment,) = [
        d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"].endswith("-router")
    ]
    containers = {c["name"]: c for c in deployment["spec"]["template"]["spec"]["containers"]}
    return config["data"]["router.conf"], list(containers["router-auth"]["args"])


@contextlib.contextmanager
def router_account(
    k8s_api: client.ApiClient, admin_kubeconfig: str, values: list[str], directory: Path
) -> Iterator[str]:
    """A kubeconfig of the router's own ServiceAccount, with the chart's RBAC for it applied in a namespace of
    its own (removed after): router-auth runs with exactly the rights the chart gives it."""
    core = client.CoreV1Api(k8s_api)
    release = f"rt-{uuid.uuid4().hex[:6]}"
    home = f"{release}-home"
    docs = rendered(release, home, values, "templates/preview-router.yaml")
    with applied(k8s_api, docs, home) as account:
        request = {"spec": {"expirationSeconds": 7200}}
        token = core.create_namespaced_service_account_token(account, home, request).status.token
        yield token_kubeconfig(admin_kubeconfig, str(token), directory / "router.kubeconfig")


# ------------------------------------------------------------------------------------------- upstreams
def upstream_app(name: str) -> web.Application:
    """Echoes each request as JSON (who answered, method, path, headers); /ws echoes; /events streams."""

    async def echo(request: web.Request) -> web.StreamResponse:
        if request.path == "/ws":
            ws = web.WebSocketResponse()
            await ws.prepare(request)
            async for message in ws:
                await ws.send_str(f"{name}:{message.data}")
            return ws
        if request.path == "/events":
            response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await response.prepare(request)
            for number in range(SSE_EVENTS):
                await response.write(f"data: {number}\n\n".encode())
                await asyncio.sleep(SSE_GAP_SECONDS)
            await response.write_eof()
            return response
        body = await request.read()
        return web.json_response(
            {
                "server": name,
                "method": request.method,
                "path": request.path_qs,
                "headers": {k: v for k, v in request.headers.items()},
                "body_length": len(body),
            }
        )

    app = web.Application(client_max_size=1024**3)
    app.router.add_route("*", "/{tail:.*}", echo)
    return app


@dataclass
class Upstreams:
    """aiohttp servers in one background event loop; `start(name, host)` returns the port."""

    loop: asyncio.AbstractEventLoop = field(default_factory=asyncio.new_event_loop)
    runners: list[web.AppRunner] = field(default_factory=list)
    by_name: dict[str, web.AppRunner] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def start(self, name: str, host: str, port: int | None = None) -> int:
        async def serve() -> int:
            runner = web.AppRunner(upstream_app(name), access_log=None)
            await runner.setup()
            port_ = port or free_port()
            await web.TCPSite(runner, host, port_).start()
            self.runners.append(runner)
            self.by_name[name] = runner
            return port_

        return asyncio.run_coroutine_threadsafe(serve(), self.loop).result(10)

    def stop(self, name: str) -> None:
        """Stop one server: its port then refuses connections, as a Pod's does once its process exits."""
        runner = self.by_name.pop(name)
        self.runners.remove(runner)
        asyncio.run_coroutine_threadsafe(runner.cleanup(), self.loop).result(10)

    def close(self) -> None:
        async def cleanup() -> None:
            for runner in self.runners:
                await runner.cleanup()

        asyncio.run_coroutine_threadsafe(cleanup(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


# ------------------------------------------------------------------------ sandboxes, as the operator makes them
# The operator does not run: these write a Sandbox, its Pod (never scheduled; its status says Running at a
# loopback IP) and its runtime token Secret the way the operator would.
@dataclass
class Box:
    name: str
    ip: str
    preview_port: int
    runtime_port: int
    token: str


def sandbox_object(
    custom: client.CustomObjectsApi, ns: str, name: str, box: Box, annotations: dict[str, str]
) -> Any:
    body = {
        "apiVersion": "agents.x-k8s.io/v1beta1",
        "kind": "Sandbox",
        "metadata": {"name": name, "annotations": annotations},
        "spec": {
            "podTemplate": {
                "spec": {
                    "containers": [
                        {
                            "name": "runtime",
                            "image": "sandbox-runtime:dev",
                            "ports": [
                                {"name": "runtime", "containerPort": box.runtime_port},
                                {"name": "preview", "containerPort": box.preview_port},
                            ],
                        }
                    ]
                }
            }
        },
    }
    return custom.create_namespaced_custom_object("agents.x-k8s.io", "v1beta1", ns, "sandboxes", body)


def set_ready(custom: client.CustomObjectsApi, ns: str, name: str, ready: bool) -> None:
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    condition = {
        "type": "Ready",
        "status": "True" if ready else "False",
        "reason": "DependenciesReady" if ready else "DependenciesNotReady",
        "message": "set by the test",
        "lastTransitionTime": now,
    }
    custom.patch_namespaced_custom_object_status(
        "agents.x-k8s.io", "v1beta1", ns, "sandboxes", name, {"status": {"conditions": [condition]}}
    )


def sandbox_pod(
    core: client.CoreV1Api, ns: str, name: str, ip: str, owner: dict[str, Any] | None, labels: dict[str, str]
) -> None:
    meta: dict[str, Any] = {"name": name, "labels": labels}
    if owner is not None:
        meta["ownerReferences"] = [
            {
                "apiVersion": owner["apiVersion"],
                "kind": owner["kind"],
                "name": owner["metadata"]["name"],
                "uid": owner["metadata"]["uid"],
                "controller": True,
            }
        ]
    # A scheduler nobody runs: the pod stays where the test puts it, and the test writes its status.
    spec = {"schedulerName": "nobody", "containers": [{"name": "c", "image": "none:dev"}]}
    core.create_namespaced_pod(ns, {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec})
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    status = {
        "phase": "Running",
        "podIP": ip,
        "podIPs": [{"ip": ip}],
        "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": now}],
    }
    core.patch_namespaced_pod_status(name, ns, {"status": status})


def token_secret(core: client.CoreV1Api, ns: str, sandbox: str, token: str) -> None:
    core.create_namespaced_secret(
        ns,
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {
                "name": naming.token_secret_name(sandbox),
                "labels": {
                    "agents.x-k8s.io/sandbox-name-hash": naming.name_hash(sandbox),
                    "app.kubernetes.io/managed-by": "shadow-operator",
                },
            },
            "data": {"token": base64.b64encode(token.encode()).decode()},
        },
    )


def managed_sandbox(
    world_args: tuple[client.CustomObjectsApi, client.CoreV1Api],
    ns: str,
    box: Box,
    *,
    ready: bool = True,
    private: bool = False,
) -> dict[str, Any]:
    """The Sandbox (as created: its metadata.uid is what preview tokens are bound to), Ready or not, with its
    owned Pod and runtime token Secret."""
    custom, core = world_args
    annotations = {"shadow.dev/preview-access": "private"} if private else {}
    sandbox = sandbox_object(custom, ns, box.name, box, annotations)
    set_ready(custom, ns, box.name, ready)
    sandbox_pod(
        core, ns, box.name, box.ip, sandbox, {"agents.x-k8s.io/sandbox-name-hash": naming.name_hash(box.name)}
    )
    token_secret(core, ns, box.name, box.token)
    return dict(sandbox)


# ---------------------------------------------------------------------------------------- processes
@dataclass
class Router:
    directory: Path
    preview_port: int
    sdk_port: int
    auth_port: int
    metrics_port: int
    keys_dir: Path
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def preview(self) -> str:
        return f"http://127.0.0.1:{self.preview_port}"

    @property
    def sdk(self) -> str:
        return f"http://127.0.0.1:{self.sdk_port}"

    @property
    def metrics(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}/metrics"

    def logs(self) -> str:
        return "\n".join(
            f"--- {p.name}\n{p.read_text(errors='replace')[-4000:]}"
            for p in sorted(self.directory.glob("*.log"))
        )


@contextlib.contextmanager
def running_router(directory: Path, kubeconfig: str, values: list[str]) -> Iterator[Router]:
    """nginx (the chart's config) and router-auth (the chart's args), until the context ends."""
    if shutil.which("nginx") is None:
        raise RuntimeError("nginx not found: apt-get install nginx-light (the router image's package)")
    router = Router(
        directory=directory,
        preview_port=free_port(),
        sdk_port=free_port(),
        auth_port=free_port(),
        metrics_port=free_port(),
        keys_dir=directory / "keys",
    )
    router.keys_dir.mkdir()
    conf, args = render_router(
        [
            *values,
            f"--set=previewRouter.ports.preview={router.preview_port}",
            f"--set=previewRouter.ports.sdk={router.sdk_port}",
            f"--set=previewRouter.ports.auth={router.auth_port}",
            f"--set=previewRouter.ports.metrics={router.metrics_port}",
            f"--set=previewRouter.ports.accessLog={free_port()}",
        ]
    )
    # nginx's workers run as an unprivileged user when the tests run as root, and pytest's directories are
    # private to root: the workers' writable paths (cache, temp files) go to a directory of their own.
    scratch = Path(tempfile.mkdtemp(prefix="shadow-router-"))
    scratch.chmod(0o777)
    conf_dir = directory / "conf.d"
    conf_dir.mkdir()
    (conf_dir / "router.conf").write_text(conf.replace("/tmp/", f"{scratch}/"))
    main = IMAGE_NGINX_CONF.read_text().replace("/tmp/", f"{scratch}/")
    main = main.replace("/etc/nginx/conf.d/", f"{conf_dir}/")
    (directory / "nginx.conf").write_text(main)

    args[args.index("--keys-dir") + 1] = str(router.keys_dir)
    env = {**os.environ, "KUBECONFIG": kubeconfig}
    with (
        (directory / "router-auth.log").open("wb") as auth_log,
        (directory / "nginx.log").open("wb") as ng_log,
    ):
        auth = subprocess.Popen(
            [sys.executable, "-m", "shadow_operator", *args],
            stdout=auth_log,
            stderr=subprocess.STDOUT,
            env=env,
        )
        router.processes.append(auth)
        nginx = subprocess.Popen(
            ["nginx", "-p", str(directory), "-c", str(directory / "nginx.conf"), "-g", "daemon off;"],
            stdout=ng_log,
            stderr=subprocess.STDOUT,
        )
        router.processes.append(nginx)
        try:
            wait_for(lambda: _ready(router), timeout=60, what=f"the router to be ready:\n{router.logs()}")
            yield router
        finally:
            for process in router.processes:
                if process.poll() is None:
                    process.send_signal(signal.SIGTERM)
            for process in router.processes:
                try:
                    process.wait(10)
                except subprocess.TimeoutExpired:
                    process.kill()
            shutil.rmtree(scratch, ignore_errors=True)


def _ready(router: Router) -> bool:
    import http.client

    for process in router.processes:
        if process.poll() is not None:
            raise RuntimeError(f"a router process exited:\n{router.logs()}")
    try:
        connection = http.client.HTTPConnection("127.0.0.1", router.preview_port, timeout=2)
        connection.request("GET", "/healthz")
        return connection.getresponse().status == 200
    except OSError:
        return False


SIOCGIFADDR = 0x8915


def outside_address() -> str:
    """A non-loopback IPv4 address of this machine. nginx listens on every address, so a connection from this
    address to this address reaches it with a peer (`$remote_addr`) that is not loopback: the router sees what
    a call from another pod shows it, while a connection to 127.0.0.1 looks like a kubectl port-forward."""
    for _, name in socket.if_nameindex():
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            try:
                answer = fcntl.ioctl(probe.fileno(), SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
            except OSError:
                continue  # no IPv4 address on this interface
        address = socket.inet_ntoa(answer[20:24])
        if not ipaddress.ip_address(address).is_loopback:
            return address
    raise RuntimeError("this machine has no non-loopback IPv4 address: the router's network tests need one")


def raw_get(
    port: int,
    path: str,
    headers: list[tuple[str, str]],
    *,
    host: str | None,
    address: str = "127.0.0.1",
) -> tuple[int, dict[str, str], str]:
    """A GET with exactly these headers and this Host (None: no Host line at all), parsed loosely; from and to
    `address` (127.0.0.1: a port-forward as the router sees it; `outside_address()`: a pod elsewhere)."""
    import http.client

    connection = http.client.HTTPConnection(address, port, timeout=10, source_address=(address, 0))
    connection.putrequest("GET", path, skip_host=True, skip_accept_encoding=True)
    if host is not None:
        connection.putheader("Host", host)
    for key, value in headers:
        connection.putheader(key, value)
    connection.endheaders()
    response = connection.getresponse()
    body = response.read().decode(errors="replace")
    result = response.status, {k.lower(): v for k, v in response.getheaders()}, body
    connection.close()
    return result


# ------------------------------------------------------------------------------------------- metrics
Series = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(router: Router) -> Series:
    """router-auth's /metrics: every sample by (name, sorted labels)."""
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(router.metrics, timeout=10).text
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def metric(series: Series, name: str, **labels: str) -> float:
    return series.get((name, tuple(sorted(labels.items()))), 0.0)
