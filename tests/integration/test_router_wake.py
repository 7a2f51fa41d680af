"""Wake on the first request, through the real router: nginx (the chart's config) and router-auth (a real process
as the chart's ServiceAccount, with the chart's RBAC) against the local API server, real HTTP upstreams.

The operator does not run here: the test plays its part of the contract as the router sees it. A sleeping
sandbox is a Sandbox whose status says Suspended=True (reason Idle), Ready=False, with no Pod; the stand-in
watches for the router's resume request (a new value of shadow.dev/resume-requested), then starts the sandbox's
servers at a new address, creates its Pod there and marks the Sandbox Ready, as the operator's next pass would.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import httpx
import pytest
from kubernetes import client, watch
from shadow_operator.api import constants as c
from shadow_operator.api import naming
from urllib3.exceptions import ProtocolError

from tests.support.controlplane import free_port, wait_for
from tests.support.router import (
    Box,
    Router,
    Upstreams,
    metric,
    raw_get,
    router_account,
    running_router,
    sandbox_object,
    sandbox_pod,
    scrape,
    token_secret,
)
from tests.support.sandbox_operator import install_crds

pytestmark = pytest.mark.integration

DOMAIN = "wake.test"
HOLD_SECONDS = 6
GROUP, VERSION, PLURAL = "agents.x-k8s.io", "v1beta1", "sandboxes"
ADDRESSES = (f"127.0.{a}.{b}" for a in range(1, 250) for b in range(2, 250))


@dataclass
class World:
    router: Router
    namespace: str
    other: str  # a namespace the router does not serve
    core: client.CoreV1Api
    custom: client.CustomObjectsApi
    upstreams: Upstreams
    wakers: list[threading.Thread] = field(default_factory=list)


@pytest.fixture(scope="module")
def world(
    k8s_api: client.ApiClient, kubeconfig: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[World]:
    install_crds(k8s_api)
    core, custom = client.CoreV1Api(k8s_api), client.CustomObjectsApi(k8s_api)
    suffix = uuid.uuid4().hex[:6]
    namespace, other = f"wake-{suffix}", f"wake-other-{suffix}"
    for ns in (namespace, other):
        core.create_namespace({"metadata": {"name": ns}})
    upstreams = Upstreams()
    directory = tmp_path_factory.mktemp("router-wake")
    values = [
        "--set=previewRouter.enabled=true",
        f"--set=previewRouter.domain={DOMAIN}",
        "--set=previewRouter.scheme=http",
        f"--set=previewRouter.sandboxNamespaces={{{namespace}}}",
        # Long enough that a request after a Pod went down still gets the cached answer (the race below).
        "--set=previewRouter.authCacheSeconds=30",
        f"--set=previewRouter.holdSeconds={HOLD_SECONDS}",
    ]
    built = None
    try:
        with (
            router_account(k8s_api, kubeconfig, values, directory) as account,
            running_router(directory, account, values) as router,
        ):
            built = World(router, namespace, other, core, custom, upstreams)
            yield built
    finally:
        for thread in built.wakers if built else ():
            thread.join(30)
        upstreams.close()
        for ns in (namespace, other):
            core.delete_namespace(ns, propagation_policy="Background")


# ------------------------------------------------------------------------------ the operator's side
def _conditions(ready: bool, suspended: bool) -> list[dict[str, str]]:
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    return [
        {
            "type": c.COND_READY,
            "status": "True" if ready else "False",
            "reason": c.REASON_DEPENDENCIES_READY if ready else "Suspended" if suspended else "PodNotReady",
            "message": "set by the test",
            "lastTransitionTime": now,
        },
        {
            "type": c.COND_SUSPENDED,
            "status": "True" if suspended else "False",
            "reason": c.REASON_IDLE if suspended else c.REASON_NOT_SUSPENDED,
            "message": "idle for 600s" if suspended else "",
            "lastTransitionTime": now,
        },
    ]


def _set_status(world: World, name: str, *, ready: bool, suspended: bool, ns: str | None = None) -> None:
    world.custom.patch_namespaced_custom_object_status(
        GROUP,
        VERSION,
        ns or world.namespace,
        PLURAL,
        name,
        {"status": {"conditions": _conditions(ready, suspended)}},
    )


def _get(world: World, name: str, ns: str | None = None) -> dict[str, Any]:
    return dict(
        world.custom.get_namespaced_custom_object(GROUP, VERSION, ns or world.namespace, PLURAL, name)
    )


def _annotation(world: World, name: str, key: str, ns: str | None = None) -> str | None:
    return (_get(world, name, ns)["metadata"].get("annotations") or {}).get(key)


def _sleeping(world: World, name: str, *, ns: str | None = None, private: bool = False) -> Box:
    """A Sandbox suspended for idleness: its template's ports, no Pod, nothing listening yet."""
    ns = ns or world.namespace
    box = Box(name, "", free_port(), free_port(), f"runtime-token-{uuid.uuid4().hex}")
    annotations = {c.ANNOTATION_PREVIEW_ACCESS: "private"} if private else {}
    sandbox_object(world.custom, ns, name, box, annotations)
    _set_status(world, name, ready=False, suspended=True, ns=ns)
    token_secret(world.core, ns, name, box.token)
    return box


def _pod_up(world: World, box: Box, pod: str) -> None:
    """The sandbox's servers at a new address and its Pod there, Ready (what a resume makes)."""
    box.ip = next(ADDRESSES)
    world.upstreams.start(f"{box.name}/preview", box.ip, box.preview_port)
    world.upstreams.start(f"{box.name}/runtime", box.ip, box.runtime_port)
    owner = _get(world, box.name)
    labels = {c.LABEL_SANDBOX_NAME_HASH: naming.name_hash(box.name)}
    sandbox_pod(world.core, world.namespace, pod, box.ip, owner, labels)
    _set_status(world, box.name, ready=True, suspended=False)


def _resume_on_request(world: World, box: Box, before: str | None = None, going: str | None = None) -> None:
    """In the background: once the router asks for a resume (a value other than `before`), let the Pod that was
    going down (`going`) go, and bring the sandbox up on a new Pod."""

    def run() -> None:
        wait_for(
            lambda: _annotation(world, box.name, c.ANNOTATION_RESUME_REQUEST) not in (None, before),
            timeout=HOLD_SECONDS + 10,
            what=f"the router to ask for {box.name}'s resume",
        )
        if going is not None:
            world.core.patch_namespaced_pod(going, world.namespace, {"metadata": {"finalizers": None}})
        _pod_up(world, box, f"{box.name}-{uuid.uuid4().hex[:5]}")

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    world.wakers.append(thread)


@contextlib.contextmanager
def _annotation_values(world: World, name: str, key: str) -> Iterator[list[str]]:
    """Every value `key` takes on the Sandbox while the block runs, in order, from a watch (each patch that
    writes a new value is one MODIFIED event)."""
    version = _get(world, name)["metadata"]["resourceVersion"]
    seen: list[str] = []
    stream = watch.Watch()

    def run() -> None:
        with contextlib.suppress(ProtocolError):  # stream.stop() ends the response under the reader
            read()

    def read() -> None:
        for event in stream.stream(
            world.custom.list_namespaced_custom_object,
            GROUP,
            VERSION,
            world.namespace,
            PLURAL,
            field_selector=f"metadata.name={name}",
            resource_version=version,
            timeout_seconds=120,
        ):
            value = (event["object"]["metadata"].get("annotations") or {}).get(key)
            if value is not None and (not seen or seen[-1] != value):
                seen.append(value)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield seen
    finally:
        stream.stop()


def _marker(world: World, name: str, values: list[str], key: str) -> None:
    """Write `key` once more by hand and wait until the watch saw it: every earlier write has been seen too."""
    mark = f"marker-{uuid.uuid4().hex[:6]}"
    world.custom.patch_namespaced_custom_object(
        GROUP, VERSION, world.namespace, PLURAL, name, {"metadata": {"annotations": {key: mark}}}
    )
    wait_for(lambda: mark in values, timeout=10, what="the watch to see the marker")
    values.remove(mark)


# ------------------------------------------------------------------------------------------ requests
def _preview(world: World, name: str, path: str = "/", headers: list[tuple[str, str]] | None = None) -> Any:
    return raw_get(world.router.preview_port, path, headers or [], host=f"{name}.{DOMAIN}")


def _resumes(router: Router, cause: str) -> float:
    return metric(scrape(router), "shadow_router_resumes_requested_total", cause=cause)


# ---------------------------------------------------------------------------------------------- tests
def test_fifty_requests_on_a_sleeping_sandbox_cause_one_resume_and_are_all_served(world: World) -> None:
    box = _sleeping(world, "sb-fifty")
    before = scrape(world.router)
    with _annotation_values(world, box.name, c.ANNOTATION_RESUME_REQUEST) as values:
        _resume_on_request(world, box)
        started = time.monotonic()
        with concurrent.futures.ThreadPoolExecutor(50) as pool:
            answers = list(pool.map(lambda n: _preview(world, box.name, f"/page/{n}"), range(50)))
        assert [status for status, _, _ in answers] == [200] * 50, answers[0]
        assert {httpx.Response(200, content=b).json()["server"] for _, _, b in answers} == {
            "sb-fifty/preview"
        }
        assert time.monotonic() - started < HOLD_SECONDS
        _marker(world, box.name, values, c.ANNOTATION_RESUME_REQUEST)
        assert len(values) == 1, values  # one resume patch for fifty requests
    after = scrape(world.router)
    assert (
        metric(after, "shadow_router_resumes_requested_total", cause="preview")
        - metric(before, "shadow_router_resumes_requested_total", cause="preview")
        == 1
    )
    held = metric(after, "shadow_router_requests_held_total", route="preview") - metric(
        before, "shadow_router_requests_held_total", route="preview"
    )
    assert 1 <= held <= 50
    assert metric(after, "shadow_router_hold_seconds_count", route="preview") > metric(
        before, "shadow_router_hold_seconds_count", route="preview"
    )


def test_hold_ends_with_a_504_page_after_the_cap(world: World) -> None:
    box = _sleeping(world, "sb-nobody")  # nobody resumes it
    before = scrape(world.router)
    started = time.monotonic()
    status, headers, body = _preview(world, box.name, "/", [("Accept", "text/html,application/xhtml+xml")])
    waited = time.monotonic() - started
    assert status == 504, body
    assert HOLD_SECONDS - 0.5 <= waited < HOLD_SECONDS + 5
    assert headers["content-type"].startswith("text/html") and headers.get("retry-after") == "5"
    assert "waking up" in body and "sb-nobody" in body
    assert _annotation(world, box.name, c.ANNOTATION_RESUME_REQUEST) is not None  # it did ask
    # Not a browser: one line of text.
    status, headers, body = _preview(world, box.name, "/api")
    assert status == 504 and headers["content-type"].startswith("text/plain")
    assert body == "Sandbox sb-nobody was asleep and is waking up: retry in a few seconds.\n"
    after = scrape(world.router)
    timed_out = metric(after, "shadow_router_holds_timed_out_total", route="preview") - metric(
        before, "shadow_router_holds_timed_out_total", route="preview"
    )
    assert timed_out == 2


@pytest.mark.parametrize("method", ["GET", "POST"])
def test_request_while_the_pod_goes_down_is_held_and_served_after_the_resume(
    world: World, method: str
) -> None:
    """The race: nginx still has the allowed answer naming the old Pod (authCacheSeconds), the Pod's server is
    gone (connection refused) and the Pod is Terminating, the Sandbox not yet marked Suspended. Before, this was
    a 502; now nginx asks router-auth again, which holds the request while the sandbox wakes (a POST arrives
    with its whole body)."""
    name = f"sb-race-{method.lower()}"
    box = Box(name, "", free_port(), free_port(), "t")
    sandbox_object(world.custom, world.namespace, name, box, {})
    token_secret(world.core, world.namespace, name, box.token)
    _pod_up(world, box, f"{name}-first")
    first_ip = box.ip
    wait_for(lambda: _preview(world, name)[0] == 200, timeout=15, what="sb-race to be served")  # now cached
    # The operator suspends it: its Pod goes Terminating (held by a finalizer here) and its server stops.
    world.core.patch_namespaced_pod(
        f"{name}-first", world.namespace, {"metadata": {"finalizers": ["test/hold"]}}
    )
    world.core.delete_namespaced_pod(f"{name}-first", world.namespace)
    world.upstreams.stop(f"{name}/preview")
    world.upstreams.stop(f"{name}/runtime")
    with _annotation_values(world, name, c.ANNOTATION_RESUME_REQUEST) as values:
        _resume_on_request(world, box, going=f"{name}-first")
        content = b"x" * 300_000 if method == "POST" else None
        # A request with a body comes back as a 307 to the same address once the sandbox is awake (nginx does
        # not send a body twice); clients that follow it send it again, whole.
        response = httpx.request(
            method,
            f"{world.router.preview}/after",
            headers={"Host": f"{name}.{DOMAIN}"},
            content=content,
            timeout=20,
            follow_redirects=True,
        )
        assert [r.status_code for r in response.history] == ([307] if method == "POST" else [])
        assert response.status_code == 200, response.text
        answer = response.json()
        assert answer["server"] == f"{name}/preview" and answer["path"] == "/after"
        assert answer["method"] == method and answer["body_length"] == len(content or b"")
        assert box.ip != first_ip  # served by the new Pod
        _marker(world, name, values, c.ANNOTATION_RESUME_REQUEST)
        assert len(values) == 1, values
    # The cached answer was replaced: the next request goes straight to the new Pod.
    assert _preview(world, name, "/next")[0] == 200


def test_sdk_call_on_a_sleeping_sandbox_waits_and_goes_through(world: World) -> None:
    box = _sleeping(world, "sb-sdk")
    before = _resumes(world.router, "sdk")
    _resume_on_request(world, box)
    headers = {
        "X-Sandbox-ID": box.name,
        "X-Sandbox-Namespace": world.namespace,
        "X-Sandbox-Port": str(box.runtime_port),
    }
    response = httpx.post(
        f"{world.router.sdk}/execute", headers=headers, json={"command": "true"}, timeout=20
    )
    assert response.status_code == 200, response.text
    assert response.json()["server"] == "sb-sdk/runtime"
    assert response.json()["headers"]["X-Sandbox-Runtime-Token"] == box.token
    assert _resumes(world.router, "sdk") - before == 1


def test_websocket_to_a_sleeping_sandbox_is_held_then_connects(world: World) -> None:
    box = _sleeping(world, "sb-ws")
    _resume_on_request(world, box)

    async def talk() -> str:
        async with (
            aiohttp.ClientSession() as session,
            session.ws_connect(f"{world.router.preview}/ws", headers={"Host": f"sb-ws.{DOMAIN}"}) as ws,
        ):
            await ws.send_str("hmr")
            return str((await ws.receive(timeout=5)).data)

    assert asyncio.run(talk()) == "sb-ws/preview:hmr"


def test_activity_is_written_at_most_once_per_30s_per_sandbox(world: World) -> None:
    name = "sb-busy"
    box = Box(name, "", free_port(), free_port(), "t")
    sandbox_object(world.custom, world.namespace, name, box, {})
    _pod_up(world, box, f"{name}-pod")
    with _annotation_values(world, name, c.ANNOTATION_LAST_ACTIVITY) as values:
        # Each request a different cookie: nginx's cache does not absorb them, router-auth sees every one.
        for n in range(60):
            status, _, body = _preview(world, name, "/", [("Cookie", f"n={n}")])
            assert status == 200, body
        wait_for(lambda: values, timeout=10, what="the router to write the last activity")
        for n in range(60, 80):
            assert _preview(world, name, "/", [("Cookie", f"n={n}")])[0] == 200
        _marker(world, name, values, c.ANNOTATION_LAST_ACTIVITY)
        assert len(values) == 1, values
    written = time.strptime(values[0], "%Y-%m-%dT%H:%M:%SZ")
    assert abs(time.mktime(written) - time.mktime(time.gmtime())) < 120


def test_hostile_requests_wake_nothing(world: World) -> None:
    """A sleeping sandbox in a namespace the router does not serve, a private one without a link, and a flood of
    made-up hosts: no resume asked, no annotation written."""
    outside = _sleeping(world, "sb-outside", ns=world.other)
    private = _sleeping(world, "sb-locked", private=True)
    before = scrape(world.router)
    assert _preview(world, outside.name)[0] == 404
    status, _, body = _preview(world, private.name)
    assert status == 401, body
    sdk = {
        "X-Sandbox-ID": outside.name,
        "X-Sandbox-Namespace": world.other,
        "X-Sandbox-Port": str(outside.runtime_port),
    }
    assert httpx.post(f"{world.router.sdk}/execute", headers=sdk, timeout=10).status_code == 404
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        statuses = set(pool.map(lambda n: _preview(world, f"flood-{n}")[0], range(300)))
    assert statuses == {404}
    after = scrape(world.router)
    for cause in ("preview", "sdk"):
        assert metric(after, "shadow_router_resumes_requested_total", cause=cause) == metric(
            before, "shadow_router_resumes_requested_total", cause=cause
        )
    for name, ns in ((outside.name, world.other), (private.name, world.namespace)):
        annotations = _get(world, name, ns)["metadata"].get("annotations") or {}
        assert (
            c.ANNOTATION_RESUME_REQUEST not in annotations and c.ANNOTATION_LAST_ACTIVITY not in annotations
        )
