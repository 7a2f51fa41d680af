"""1 GiB through the runtime in both directions, with the server's peak RSS measured (VmHWM)."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Iterator

import httpx
import pytest

from tests.runtime.conftest import Server

pytestmark = pytest.mark.unit

GIB = 1 << 30
BLOCK = os.urandom(1 << 20)
RSS_LIMIT = 150 << 20


def peak_rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM in /proc status")


def body(total: int, digest: hashlib._Hash) -> Iterator[bytes]:
    sent = 0
    while sent < total:
        chunk = BLOCK[: min(len(BLOCK), total - sent)]
        digest.update(chunk)
        sent += len(chunk)
        yield chunk


def test_one_gib_upload_and_download_in_bounded_memory(launch: Callable[..., Server]) -> None:
    srv = launch()
    c = srv.client(timeout=300)
    before = peak_rss(srv.pid)

    sent = hashlib.sha1()
    r = c.put(
        "/v1/files/big/blob.bin",
        content=body(GIB, sent),
        headers={"content-type": "application/octet-stream"},
    )
    assert r.status_code == 204, r.text
    assert (srv.root / "big/blob.bin").stat().st_size == GIB

    got = hashlib.sha1()
    size = 0
    with c.stream("GET", "/download/big/blob.bin") as resp:
        assert resp.status_code == 200 and int(resp.headers["content-length"]) == GIB
        for chunk in resp.iter_raw(1 << 20):
            got.update(chunk)
            size += len(chunk)
    assert size == GIB and got.hexdigest() == sent.hexdigest()

    # The legacy multipart upload streams too (parsed incrementally, written straight to its destination).
    boundary = "sr-test-boundary"
    mp_digest = hashlib.sha1()

    def multipart() -> Iterator[bytes]:
        yield (
            f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="big/multi.bin"\r\n'
            "Content-Type: application/octet-stream\r\n\r\n"
        ).encode()
        yield from body(256 << 20, mp_digest)
        yield f"\r\n--{boundary}--\r\n".encode()

    r = c.post(
        "/upload", content=multipart(), headers={"content-type": f"multipart/form-data; boundary={boundary}"}
    )
    assert r.status_code == 200, r.text
    with open(srv.root / "big/multi.bin", "rb") as fh:
        on_disk = hashlib.sha1()
        while chunk := fh.read(1 << 20):
            on_disk.update(chunk)
    assert on_disk.hexdigest() == mp_digest.hexdigest()

    peak = peak_rss(srv.pid)
    print(
        f"runtime VmHWM: {before / 2**20:.1f} MiB before, {peak / 2**20:.1f} MiB after 1.25 GiB of transfers"
    )
    assert peak < RSS_LIMIT, f"peak RSS {peak / 2**20:.1f} MiB exceeds {RSS_LIMIT / 2**20:.0f} MiB"
    metrics = c.get("/metrics").text
    sent_line = next(x for x in metrics.splitlines() if x.startswith("sandbox_runtime_bytes_sent_total"))
    assert float(sent_line.split()[-1]) >= GIB


def test_upload_limit_refuses_and_keeps_old_file(launch: Callable[..., Server]) -> None:
    srv = launch("--max-upload", str(1 << 20))
    c = srv.client()
    assert c.put("/v1/files/keep.txt", content=b"original").status_code == 204
    r = c.put("/v1/files/keep.txt", content=b"x" * (2 << 20))
    assert r.status_code == 413 and r.json()["code"] == "RESOURCE_EXHAUSTED"
    assert (srv.root / "keep.txt").read_bytes() == b"original"
    assert not [p for p in srv.root.iterdir() if p.name.startswith(".sr-upload-")]


def test_client_disconnect_mid_upload_leaves_no_partial_file(launch: Callable[..., Server]) -> None:
    srv = launch()

    def broken() -> Iterator[bytes]:
        yield b"a" * (4 << 20)
        raise RuntimeError("client gave up")

    with pytest.raises(Exception), httpx.Client(base_url=srv.url) as c:  # noqa: B017 - any transport error
        c.put("/v1/files/partial.bin", content=broken())
    c = srv.client()

    def settled() -> bool:
        return not [p for p in srv.root.iterdir() if p.name.startswith(".sr-upload-")]

    from tests.runtime.conftest import wait_until

    wait_until(settled, 10, "temp upload file to be removed")
    assert not (srv.root / "partial.bin").exists()
    assert c.get("/healthz").status_code == 200
