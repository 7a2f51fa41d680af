"""gRPC's ProcessService goes through the same exec service as HTTP: what `POST /v1/exec` refuses, gRPC's
Execute and Start refuse too, with the matching status and the same message, and a refused command never
keeps one of the `--max-processes` slots."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import grpc
import pytest

from tests.runtime.conftest import Server, free_port, wait_until

pytestmark = pytest.mark.unit

TOKEN = "ptok"
META = [("authorization", f"Bearer {TOKEN}")]
# HTTP status -> gRPC code, as the server maps ApiError.
CODES = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    403: grpc.StatusCode.PERMISSION_DENIED,
    404: grpc.StatusCode.NOT_FOUND,
    429: grpc.StatusCode.RESOURCE_EXHAUSTED,
}


@pytest.fixture(scope="module")
def messages() -> Any:
    from sandbox_runtime.grpc_process import Messages

    return Messages()


@pytest.fixture
def parity_server(launch: Callable[..., Server]) -> tuple[Server, int]:
    port = free_port()
    srv = launch("--grpc-port", str(port), env={"SANDBOX_RUNTIME_TOKEN": TOKEN}, token=TOKEN)
    (srv.root / "a-file").write_text("x")
    return srv, port


@pytest.fixture
def channel(parity_server: tuple[Server, int]) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(f"127.0.0.1:{parity_server[1]}") as ch:
        yield ch


def execute(ch: grpc.Channel, m: Any, argv: list[str], cwd: str | None, env: dict[str, str]) -> Any:
    call = ch.unary_unary(
        "/process.v1.ProcessService/Execute",
        request_serializer=m.ExecuteRequest.SerializeToString,
        response_deserializer=m.ExecuteResponse.FromString,
    )
    req = m.ExecuteRequest()
    req.config.command.extend(argv)
    req.config.env_vars.update(env)
    if cwd is not None:
        req.config.cwd = cwd
    return call(req, timeout=20, metadata=META)


def start(ch: grpc.Channel, m: Any, argv: list[str], env: dict[str, str] | None = None) -> list[Any]:
    call = ch.unary_stream(
        "/process.v1.ProcessService/Start",
        request_serializer=m.StartRequest.SerializeToString,
        response_deserializer=m.StartResponse.FromString,
    )
    req = m.StartRequest()
    req.config.command.extend(argv)
    req.config.env_vars.update(env or {})
    return list(call(req, timeout=20, metadata=META))


REFUSED = {
    "NUL in an argument": (["echo", "a\x00b"], None, {}),
    "NUL in an environment value": (["true"], None, {"X": "a\x00b"}),
    "'=' in an environment name": (["true"], None, {"A=B": "x"}),
    "empty environment name": (["true"], None, {"": "x"}),
    "cwd outside the root": (["true"], "../..", {}),
    "absolute cwd": (["true"], "/etc", {}),
    "cwd that is a file": (["true"], "a-file", {}),
    "cwd that does not exist": (["true"], "missing", {}),
}


@pytest.mark.parametrize("case", REFUSED)
def test_execute_refuses_what_http_refuses(
    case: str, parity_server: tuple[Server, int], channel: grpc.Channel, messages: Any
) -> None:
    argv, cwd, env = REFUSED[case]
    srv, _ = parity_server
    http = srv.client().post("/v1/exec", json={"argv": argv, "cwd": cwd or "", "env": env})
    assert 400 <= http.status_code < 500, http.text
    with pytest.raises(grpc.RpcError) as refused:
        execute(channel, messages, argv, cwd, env)
    assert refused.value.code() == CODES[http.status_code], refused.value.details()
    assert refused.value.details() == http.json()["message"]


def test_start_refuses_what_http_refuses(
    parity_server: tuple[Server, int], channel: grpc.Channel, messages: Any
) -> None:
    srv, _ = parity_server
    http = srv.client().post("/v1/processes", json={"argv": ["true"], "env": {"A=B": "x"}})
    assert http.status_code == 400
    with pytest.raises(grpc.RpcError) as refused:
        start(channel, messages, ["true"], {"A=B": "x"})
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert refused.value.details() == http.json()["message"]


def test_refused_commands_give_their_slot_back(launch: Callable[..., Server], messages: Any) -> None:
    port = free_port()
    srv = launch(
        "--grpc-port", str(port), "--max-processes", "1", env={"SANDBOX_RUNTIME_TOKEN": TOKEN}, token=TOKEN
    )
    client = srv.client()
    with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
        for _ in range(3):
            with pytest.raises(grpc.RpcError) as refused:
                start(ch, messages, ["echo", "a\x00b"])
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        # HTTP: an argument that cannot be encoded (a lone surrogate) fails at spawn time, after the
        # slot was taken. Sent as a JSON escape: the client itself cannot encode the character.
        lone_surrogate = b'{"argv": ["\\ud800"]}'
        for _ in range(3):
            r = client.post(
                "/v1/processes", content=lone_surrogate, headers={"content-type": "application/json"}
            )
            assert r.status_code == 400, r.text
        assert client.post("/v1/exec", json={"argv": ["true"]}).json()["exit_code"] == 0
        assert execute(ch, messages, ["true"], None, {}).exit_code == 0


def test_process_limit_is_shared_with_http(launch: Callable[..., Server], messages: Any) -> None:
    port = free_port()
    srv = launch(
        "--grpc-port", str(port), "--max-processes", "1", env={"SANDBOX_RUNTIME_TOKEN": TOKEN}, token=TOKEN
    )
    client = srv.client()
    busy = client.post("/v1/processes", json={"argv": ["sleep", "30"]}).json()
    with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
        with pytest.raises(grpc.RpcError) as refused:
            execute(ch, messages, ["true"], None, {})
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        client.delete(f"/v1/processes/{busy['id']}")
        assert execute(ch, messages, ["true"], None, {}).exit_code == 0


def test_grpc_calls_count_as_activity(
    parity_server: tuple[Server, int], channel: grpc.Channel, messages: Any
) -> None:
    srv, _ = parity_server
    client = srv.client()

    def idle() -> int:
        return int(client.get("/v1/health").json()["idle_seconds"])

    wait_until(lambda: idle() >= 1, 5, "the runtime to be idle")
    assert execute(channel, messages, ["true"], None, {}).exit_code == 0
    assert idle() == 0


def test_grpc_exec_is_journaled_and_counted(
    parity_server: tuple[Server, int], channel: grpc.Channel, messages: Any
) -> None:
    srv, _ = parity_server
    client = srv.client()
    assert execute(channel, messages, ["echo", "via-grpc"], None, {}).stdout == b"via-grpc\n"
    entries = client.get("/v1/journal").json()["entries"]
    assert any(e.get("argv") == ["echo", "via-grpc"] for e in entries), entries
    metrics = client.get("/metrics").text
    assert 'sandbox_runtime_exec_total{api="grpc",outcome="ok"} 1.0' in metrics
