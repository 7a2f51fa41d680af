"""Sleep when idle, wake on the first request, on kind, as a person meets it (issue 30).

A sandbox whose template runs a dev server beside the runtime (a page whose script opens a WebSocket, as a dev
server's hot reload does) and whose claim asks for idle suspension after 10 s. Once the operator suspended it
(its Pod gone, Suspended=True reason Idle), each wake path is taken in turn: headless Chromium (Debian's
package) opens the preview URL through the router and gets the app, whose WebSocket connects; the SDK path
through the router (X-Sandbox-* headers); the SDK and shadowctl through the API server's pod proxy; and
requests that keep arriving while the operator takes the Pod down all get the app, none a 502.

Needs, besides `make e2e`'s cluster, `chromium` on PATH (apt-get install chromium; .ci/run installs it).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import os
import shutil
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import pytest
from shadow_operator.sdk import SandboxClient

from tests.e2e.cluster import (
    DEFAULT_TEMPLATE,
    FULLNAME,
    KUBECONFIG,
    OPERATOR_NAMESPACE,
    Cluster,
    condition,
    eventually,
)
from tests.e2e.devserver import WS_SERVER
from tests.support.controlplane import wait_for
from tests.support.shadowctl import run

# Alone: a held request must be served within the router's hold, a time another test's load would stretch.
pytestmark = [pytest.mark.e2e, pytest.mark.e2e_alone]

PREVIEW_DOMAIN = "preview.localhost"  # Chromium resolves every *.localhost to loopback: the port-forward
ROUTER_SERVICE = f"{FULLNAME}-preview-router"
SDK_SERVICE = "sandbox-router-svc"
IDLE_SECONDS = 10  # the shortest threshold the API allows
HOLD_SECONDS = 15  # previewRouter.holdSeconds, the chart's default
IDLE_GRACE_SECONDS = 3  # operator.idleSuspend.gracePeriodSeconds, the chart's default
SLEEP_TIMEOUT = 120.0


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def asleep(cluster: Cluster, sandbox: str) -> bool:
    found = condition(cluster.get(OPERATOR_NAMESPACE, "sandboxes", sandbox), "Suspended")
    return bool(found and found.get("status") == "True" and found.get("reason") == "Idle")


def wait_asleep(cluster: Cluster, sandbox: str) -> None:
    eventually(
        lambda: asleep(cluster, sandbox) or None, f"{sandbox} to be suspended for idleness", SLEEP_TIMEOUT
    )

    def pod_gone() -> bool | None:
        pods = cluster.core.list_namespaced_pod(OPERATOR_NAMESPACE, field_selector=f"metadata.name={sandbox}")
        return not pods.items or None

    eventually(pod_gone, f"{sandbox}'s Pod to be gone", 60)


@pytest.fixture(scope="module")
def app(cluster: Cluster) -> Iterator[tuple[str, str, str]]:
    """(claim, sandbox, marker): a sandbox with the dev server in its Pod, suspended after 10 idle seconds."""
    marker = f"app {uuid.uuid4().hex}"
    with sleepy_app(cluster, ["python3", "-c", WS_SERVER, marker, "page"]) as (claim, sandbox):
        yield claim, sandbox, marker


@contextlib.contextmanager
def sleepy_app(cluster: Cluster, command: list[str]) -> Iterator[tuple[str, str]]:
    """(claim, sandbox) of a copy of the default template with `command` as a dev server on port 3000 beside
    the runtime, claimed with a 10 s idle threshold; deleted afterwards."""
    template = cluster.get(OPERATOR_NAMESPACE, "sandboxtemplates", DEFAULT_TEMPLATE)
    assert template is not None
    name = unique("wake")
    spec = copy.deepcopy(template["spec"])
    pod = spec["podTemplate"]["spec"]
    runtime = pod["containers"][0]
    pod["containers"].append(
        {
            "name": "dev",
            "image": runtime["image"],
            "imagePullPolicy": runtime.get("imagePullPolicy", "IfNotPresent"),
            "command": command,
            "ports": [{"name": "preview", "containerPort": 3000, "protocol": "TCP"}],
            **({"securityContext": runtime["securityContext"]} if runtime.get("securityContext") else {}),
            "resources": {"requests": {"cpu": "10m", "memory": "32Mi"}, "limits": {"memory": "64Mi"}},
        }
    )
    cluster.create(
        OPERATOR_NAMESPACE,
        "sandboxtemplates",
        {"kind": "SandboxTemplate", "metadata": {"name": name}, "spec": spec},
    )
    claim_spec = {
        "sandboxTemplateRef": {"name": name},
        "autoSuspendPolicy": {"suspendThresholdSeconds": IDLE_SECONDS},
    }
    try:
        cluster.claim(OPERATOR_NAMESPACE, name, claim_spec)
        sandbox = cluster.sandbox_of(cluster.wait_claim_ready(OPERATOR_NAMESPACE, name))
        yield name, sandbox
    finally:
        cluster.delete(OPERATOR_NAMESPACE, "sandboxclaims", name)
        cluster.delete(OPERATOR_NAMESPACE, "sandboxtemplates", name)


@pytest.fixture(scope="module")
def router(cluster: Cluster) -> Iterator[str]:
    with cluster.port_forward(OPERATOR_NAMESPACE, f"svc/{ROUTER_SERVICE}", 80) as url:
        yield url


class Chromium:
    """Headless Chromium driven over its DevTools protocol: open a page, read what its script wrote."""

    def __init__(self, binary: str, profile: Path) -> None:
        self.process = subprocess.Popen(
            [
                binary,
                "--headless=new",
                "--no-sandbox",  # the tests may run as root
                "--disable-gpu",
                "--no-first-run",
                f"--user-data-dir={profile}",
                "--remote-debugging-port=0",
                "about:blank",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert self.process.stderr is not None
        for line in self.process.stderr:
            if "DevTools listening on " in line:
                self.browser = line.split("DevTools listening on ", 1)[1].strip()
                break
        else:
            raise RuntimeError("chromium did not start its DevTools endpoint")
        threading.Thread(target=self.process.stderr.read, daemon=True).start()  # keep the pipe drained
        self.base = "http://" + self.browser.split("//", 1)[1].split("/", 1)[0]

    def open(self, url: str) -> tuple[float, str, str]:
        """Navigate a new tab to `url`; (seconds until the page loaded, #marker's text, #ws's text once the
        WebSocket answered)."""
        target = httpx.put(f"{self.base}/json/new?about:blank", timeout=10).json()

        async def drive() -> tuple[float, str, str]:
            async with (
                aiohttp.ClientSession() as session,
                session.ws_connect(target["webSocketDebuggerUrl"]) as ws,
            ):
                ids = iter(range(1, 10_000))

                async def call(method: str, **params: Any) -> dict[str, Any]:
                    number = next(ids)
                    await ws.send_json({"id": number, "method": method, "params": params})
                    while True:
                        message = json.loads((await ws.receive(timeout=60)).data)
                        if message.get("id") == number:
                            return dict(message.get("result") or {})
                        if message.get("method") == "Page.loadEventFired":
                            loaded.set()

                async def text(element: str) -> str:
                    found = await call(
                        "Runtime.evaluate",
                        expression=f"(document.getElementById({element!r}) || {{}}).textContent || ''",
                    )
                    return str(found.get("result", {}).get("value", ""))

                loaded = asyncio.Event()
                await call("Page.enable")
                started = time.monotonic()
                await call("Page.navigate", url=url)
                deadline = started + 60
                while not loaded.is_set() and time.monotonic() < deadline:
                    message = json.loads((await ws.receive(timeout=60)).data)
                    if message.get("method") == "Page.loadEventFired":
                        loaded.set()
                took = time.monotonic() - started
                echo = ""
                while time.monotonic() < deadline and not echo.startswith("echo:"):
                    echo = await text("ws")
                    if not echo.startswith("echo:"):
                        await asyncio.sleep(0.2)
                return took, await text("marker"), echo

        return asyncio.run(drive())

    def close(self) -> None:
        self.process.terminate()
        self.process.wait(10)


@pytest.fixture(scope="module")
def chromium() -> Iterator[Chromium]:
    binary = shutil.which("chromium") or shutil.which("chromium-browser")
    if binary is None:
        pytest.fail("chromium is not installed: apt-get install chromium (.ci/run installs it)")
    with tempfile.TemporaryDirectory(prefix="shadow-chromium-") as profile:
        browser = Chromium(binary, Path(profile))
        try:
            yield browser
        finally:
            browser.close()


def test_chromium_opens_a_sleeping_preview_and_its_websocket_connects(
    cluster: Cluster, app: tuple[str, str, str], router: str, chromium: Chromium
) -> None:
    _, sandbox, marker = app
    wait_asleep(cluster, sandbox)
    port = router.rsplit(":", 1)[1]
    took, shown, echo = chromium.open(f"http://{sandbox}.{PREVIEW_DOMAIN}:{port}/")
    assert shown == marker, (shown, took)
    assert echo == "echo:hmr"
    print(f"chromium: page of a sleeping sandbox loaded in {took:.2f}s")


def test_sdk_path_through_the_router_wakes_it(cluster: Cluster, app: tuple[str, str, str]) -> None:
    _, sandbox, _ = app
    wait_asleep(cluster, sandbox)
    headers = {"X-Sandbox-ID": sandbox, "X-Sandbox-Namespace": OPERATOR_NAMESPACE, "X-Sandbox-Port": "8888"}
    with cluster.port_forward(OPERATOR_NAMESPACE, f"svc/{SDK_SERVICE}", 8080) as sdk:
        response = httpx.post(f"{sdk}/execute", headers=headers, json={"command": "echo woken"}, timeout=60)
    assert response.status_code == 200, response.text
    assert response.json()["stdout"].strip() == "woken"


def test_sdk_and_shadowctl_through_the_pod_proxy_wake_it(cluster: Cluster, app: tuple[str, str, str]) -> None:
    claim, sandbox, _ = app
    wait_asleep(cluster, sandbox)
    os.environ["KUBECONFIG"] = KUBECONFIG
    told: list[str] = []
    with SandboxClient(namespace=OPERATOR_NAMESPACE, on_wake=told.append) as sdk:
        result = sdk.get_sandbox(claim).commands.run("echo from the sdk")
    assert result.exit_code == 0 and result.stdout == "from the sdk\n"
    assert told == [f"waking sandbox {OPERATOR_NAMESPACE}/{sandbox}…"]
    wait_asleep(cluster, sandbox)
    done = run(KUBECONFIG, "sandbox", "exec", claim, "-n", OPERATOR_NAMESPACE, "--", "echo", "from shadowctl")
    assert done.returncode == 0, done.stderr
    assert done.stdout == "from shadowctl\n" and "waking sandbox" in done.stderr


def test_requests_while_it_goes_to_sleep_are_all_served(
    cluster: Cluster, app: tuple[str, str, str], router: str
) -> None:
    """Requests one after another from before the operator suspends the sandbox until after the router woke it:
    each one gets the app (the ones that meet the Pod going down or gone are held while it wakes), none a 502
    or 503. The sandbox is woken so soon that a look at its status between two requests may never see it
    asleep: the router's resume request (a new shadow.dev/resume-requested) is the sign it slept."""
    _, sandbox, marker = app
    host = {"Host": f"{sandbox}.{PREVIEW_DOMAIN}"}
    eventually(lambda: httpx.get(router, headers=host, timeout=30).status_code == 200 or None, "the app", 60)

    def resume_request() -> str | None:
        body = cluster.get(OPERATOR_NAMESPACE, "sandboxes", sandbox) or {}
        return (body["metadata"].get("annotations") or {}).get("shadow.dev/resume-requested")

    def ready() -> bool:
        found = condition(cluster.get(OPERATOR_NAMESPACE, "sandboxes", sandbox), "Ready")
        return bool(found and found.get("status") == "True")

    before = resume_request()
    answers: list[tuple[float, float, int, bool]] = []
    woken_at: int | None = None
    with httpx.Client(base_url=router, headers=host, timeout=30) as http:
        # The router wrote the activity at the first request and not again for 30 s, and the runtime sees
        # none: the operator suspends the sandbox about IDLE_SECONDS later, while these requests keep coming.
        deadline = time.monotonic() + SLEEP_TIMEOUT
        while time.monotonic() < deadline:
            sent = time.monotonic()
            response = http.get("/")
            answers.append((sent, time.monotonic() - sent, response.status_code, marker in response.text))
            if woken_at is None and resume_request() != before:
                woken_at = len(answers)
            if woken_at is not None and len(answers) > woken_at + 10 and ready():
                break
            time.sleep(0.1)
    assert woken_at is not None, "the sandbox was never suspended while the requests came"
    bad = [(round(t - answers[0][0], 1), code) for t, _, code, ok in answers if code != 200 or not ok]
    assert not bad, f"{len(bad)} of {len(answers)} requests not served: {bad[:10]}"
    held = max(took for _, took, _, _ in answers)
    assert held > 0.5, "no request was held: the sandbox never slept under them"
    print(f"race: {len(answers)} requests, all served; the longest (held while it woke) took {held:.2f}s")


def test_a_request_while_an_app_that_ignores_sigterm_goes_down_is_served_within_the_hold(
    cluster: Cluster, router: str
) -> None:
    """A dev server as PID 1 of its container, with no handler for SIGTERM, ignores it: its Pod lives until
    its grace period ends. An idle suspension deletes it with a short one (the chart's 3 s, not the Pod's
    30 s), so a request that meets the Pod going down is served after the resume, within the router's hold:
    with the Pod's own 30 s it waited the whole hold and got a 504."""
    with sleepy_app(cluster, ["python3", "-m", "http.server", "3000", "--directory", "/tmp"]) as (_, sandbox):
        # The request goes the moment the Pod starts going down (waiting for Suspended came too late: with the
        # short grace period the Pod was gone by then).
        def going_down() -> list[Any] | None:
            pods = cluster.core.list_namespaced_pod(
                OPERATOR_NAMESPACE, field_selector=f"metadata.name={sandbox}"
            )
            return [p.metadata for p in pods.items if p.metadata.deletion_timestamp] or None

        going = wait_for(
            going_down,
            timeout=SLEEP_TIMEOUT,
            what=f"{sandbox}'s Pod to go down for idleness",
            interval=0.1,
            max_interval=0.2,
        )
        sent = time.monotonic()
        response = httpx.get(router, headers={"Host": f"{sandbox}.{PREVIEW_DOMAIN}"}, timeout=60)
        took = time.monotonic() - sent
    assert going[0].deletion_grace_period_seconds == IDLE_GRACE_SECONDS
    assert response.status_code == 200 and "Directory listing" in response.text, (response.status_code, took)
    assert took < HOLD_SECONDS, took
    print(f"stubborn app: the request that met its Pod going down was served after {took:.2f}s")
