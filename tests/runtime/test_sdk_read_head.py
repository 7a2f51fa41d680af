"""`runtime.read_head` (what `shadowctl mcp` reads files with) and `runtime.tree`, against a real sandbox-runtime:
at most the limit, and whether there was more; and, from a runtime that ignores the length it was asked for (a
hostile one, which the real runtime cannot be made into, hence a transport), still no more than the limit kept."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import httpx
import pytest
from shadow_operator.sdk import kube, runtime
from shadow_operator.sdk.runtime import RuntimeEndpoint

from tests.runtime.conftest import Server

pytestmark = pytest.mark.unit


def test_read_head_and_tree_against_a_real_runtime(launch: Callable[..., Server]) -> None:
    server = launch()
    (server.root / "src").mkdir()
    (server.root / "src" / "big.bin").write_bytes(bytes(range(256)) * 8192)  # 2 MiB
    (server.root / "src" / "small.txt").write_text("hi\n")
    ep = RuntimeEndpoint(server.url, {})
    with httpx.Client(timeout=60) as http:
        head, more = kube.run(http, runtime.read_head(ep, "src/big.bin", 1000))
        assert (head, more) == ((bytes(range(256)) * 4)[:1000], True)
        assert kube.run(http, runtime.read_head(ep, "src/small.txt", 3)) == (b"hi\n", False)
        assert kube.run(http, runtime.read_head(ep, "src/small.txt", 2)) == (b"hi", True)
        entries = kube.run(http, runtime.tree(ep, "src"))
        assert sorted(e["path"] for e in entries) == ["src/big.bin", "src/small.txt"]
        assert {e["path"]: e["type"] for e in entries}["src/small.txt"] == "file"


def test_read_head_keeps_the_limit_when_the_runtime_sends_more() -> None:
    sent = 0

    def endless(request: httpx.Request) -> httpx.Response:
        assert request.url.params["length"] == "101"

        def body() -> Iterator[bytes]:
            nonlocal sent
            for _ in range(64):
                sent += 65536
                yield b"x" * 65536

        return httpx.Response(200, content=body())

    with httpx.Client(transport=httpx.MockTransport(endless), base_url="http://runtime") as http:
        head, more = kube.run(http, runtime.read_head(RuntimeEndpoint("", {}), "f", 100))
    assert (head, more) == (b"x" * 100, True)
    assert sent == 64 * 65536  # all of it went by; only the limit stayed
