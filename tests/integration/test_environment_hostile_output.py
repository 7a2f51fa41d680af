"""A workspace whose verify command floods its output cannot grow the shared operator (issue 18, M4).

The operator runs in this process against the local control plane; one real sandbox-runtime on loopback
answers for the workspace (SHADOW_RUNTIME_API_URL). The verify command prints 10 MiB of control characters
(60 MiB of JSON escapes, were the answer read whole): the environment still gets its verdict, with the tail of
the output marked truncated, and this process's peak RSS grows by far less than that.

In front of the runtime sits what a tenant could put there (its code runs beside the runtime and can take its
port): a real HTTP server passing every request through, except that it answers one verify command, and the
check that the workspace has the source's snapshot commit, with an endless stream. Those checks fail with the
operator's limit as their evidence; the others still count.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import httpx
import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from shadow_operator.api import constants as c

from tests.runtime.conftest import Server
from tests.support.sandbox_operator import (
    ENVIRONMENT,
    TEMPLATE,
    Objects,
    in_process_operator,
    install_crds,
    template_body,
)
from tests.support.volumes import bind_volumes

pytestmark = pytest.mark.integration
V = "v1alpha1"
MiB = 1 << 20
STORAGE_CLASS = "hostile-output"
FLOOD = "head -c 10485760 /dev/zero | tr '\\000' '\\001'; echo; echo flood done"
ENDLESS = "echo the runtime in front answers this one without end"


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith(field + ":"))


def reset_peak_rss() -> int:
    """Reset this process's peak RSS (VmHWM) to its current RSS; returns that, in bytes."""
    with open("/proc/self/clear_refs", "w") as fh:
        fh.write("5")
    return _status_kib("VmRSS") * 1024


def peak_rss() -> int:
    return _status_kib("VmHWM") * 1024


class InFront(BaseHTTPRequestHandler):
    """Passes requests through to the runtime; answers the output of the ENDLESS command and of the source's
    check (background processes of the runtime: their logs) with an endless stream of output events."""

    protocol_version = "HTTP/1.1"
    upstream: httpx.Client
    endless: ClassVar[dict[str, bytes]] = {}  # the ids of the processes answered without end: what they run

    def _forward(self) -> None:
        body = self.rfile.read(int(self.headers.get("content-length") or 0))
        if self.command == "GET" and any(self.path == f"/v1/processes/{i}/logs" for i in self.endless):
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("transfer-encoding", "chunked")
            self.end_headers()
            chunk = b'{"type": "stdout", "offset": 0, "data": "' + b"\\u0001" * 10_000 + b'"}\n'
            try:
                while True:
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            except (BrokenPipeError, ConnectionResetError):
                return
        headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "content-length")}
        answer = self.upstream.request(self.command, self.path, content=body, headers=headers)
        if self.command == "POST" and self.path == "/v1/processes":
            for what in (ENDLESS.encode(), b"git cat-file"):
                if what in body:
                    self.endless[answer.json()["id"]] = what
        self.send_response(answer.status_code)
        for key, value in answer.headers.items():
            if key.lower() not in ("content-length", "transfer-encoding", "connection", "content-encoding"):
                self.send_header(key, value)
        self.send_header("content-length", str(len(answer.content)))
        self.end_headers()
        self.wfile.write(answer.content)

    do_GET = do_POST = do_PUT = do_DELETE = _forward

    def log_message(self, *_: Any) -> None:
        return


@pytest.fixture(scope="module")
def in_front(runtime: Server) -> Iterator[str]:
    with httpx.Client(base_url=runtime.url, timeout=600) as upstream:
        handler = type("Handler", (InFront,), {"upstream": upstream})
        httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        httpd.daemon_threads = True
        threading.Thread(target=httpd.serve_forever, daemon=True).start()
        try:
            yield f"http://127.0.0.1:{httpd.server_address[1]}"
        finally:
            httpd.shutdown()
            httpd.server_close()


@pytest.fixture(scope="module")
def operator(k8s_api: client.ApiClient, in_front: str) -> Iterator[Any]:
    install_crds(k8s_api)
    try:
        client.StorageV1Api(k8s_api).create_storage_class(
            {
                "metadata": {"name": STORAGE_CLASS},
                "provisioner": "example.com/none",
                "volumeBindingMode": "Immediate",
            }
        )
    except ApiException as exc:
        if exc.status != 409:
            raise
    with in_process_operator(
        SHADOW_RUNTIME_API_URL=in_front, SHADOW_RUNTIME_MAX_ANSWER_BYTES=str(MiB)
    ) as runner:
        yield runner


def test_a_flood_of_control_characters_gets_a_verdict_not_the_operator_oom(
    objs: Objects, runtime: Server, operator: Any, tmp_path: Path
) -> None:
    objs.create(TEMPLATE, template_body("workspace"))
    bind_volumes(objs, ["workspace-flood"], tmp_path, storage_class=STORAGE_CLASS)
    objs.create(
        ENVIRONMENT,
        {
            "metadata": {"name": "flood"},
            "spec": {
                "gitea": {"enabled": False},
                "workspace": {"size": "1Gi", "storageClassName": STORAGE_CLASS},
                "sources": [{"name": "core", "repo": "shadow/core", "upload": {}}],
                "verify": {
                    "install": False,
                    "commands": [
                        {"name": "flood", "command": FLOOD},
                        {"name": "fine", "command": "echo fine"},
                        {"name": "endless", "command": ENDLESS},
                    ],
                },
            },
        },
        version=V,
    )
    objs.wait_condition(
        ENVIRONMENT, "flood", "False", "WaitingForUpload", type_="SourcesReady", timeout=60, version=V
    )
    core = runtime.root / "core"
    core.mkdir(exist_ok=True)
    (core / "main.py").write_text("print('hello')\n")
    baseline = reset_peak_rss()
    objs.custom.patch_namespaced_custom_object(
        "shadow.dev", V, objs.namespace, "shadowenvironments", "flood",
        {"metadata": {"annotations": {c.ANNOTATION_UPLOAD_PREFIX + "core": "sha256:test"}}},
    )  # fmt: skip
    env = objs.wait(
        ENVIRONMENT,
        "flood",
        lambda o: bool((o.get("status") or {}).get("verdict")),
        timeout=120,
        what="a verdict",
        version=V,
    )
    growth = peak_rss() - baseline
    verdict = env["status"]["verdict"]
    checks = {check["name"]: check for check in verdict["evidence"]["codeExecution"]["checks"]}
    assert checks["flood"]["passed"] and checks["fine"]["passed"], verdict
    detail = checks["flood"]["detail"]
    assert detail.startswith("exit code 0: (output truncated) ") and len(detail) < 500
    ids = {what: process for process, what in InFront.endless.items()}
    (source,) = verdict["evidence"]["sourceVerification"]["checks"]
    for check, what in ((checks["endless"], ENDLESS.encode()), (source, b"git cat-file")):
        assert not check["passed"]
        assert check["detail"] == (
            f"the runtime's answer to GET /v1/processes/{ids[what]}/logs is larger than 8388608 bytes, the most "
            "the operator reads (operator setting SHADOW_RUNTIME_MAX_ANSWER_BYTES, chart value "
            "operator.runtimeMaxAnswerBytes)"
        )
    # Before the cap the whole answer (60 MiB of JSON) and its parse were held: +154 MiB for one call.
    assert growth < 50 * MiB, f"operator process peak RSS grew {growth / MiB:.0f} MiB"
