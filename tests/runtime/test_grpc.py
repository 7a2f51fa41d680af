"""sandboxd's gRPC ProcessService, checked at the wire level with hand-encoded protobuf bytes (so the test
does not share the server's descriptor) plus a streamed Start with the server's own message types."""

from __future__ import annotations

from collections.abc import Callable

import grpc
import pytest

from tests.runtime.conftest import Server, free_port

pytestmark = pytest.mark.unit


def varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def field(number: int, payload: bytes) -> bytes:
    return varint(number << 3 | 2) + varint(len(payload)) + payload


def parse(data: bytes) -> dict[int, list[bytes | int]]:
    out: dict[int, list[bytes | int]] = {}
    i = 0
    while i < len(data):
        key, i = _varint(data, i)
        num, wire = key >> 3, key & 7
        if wire == 0:
            val, i = _varint(data, i)
            out.setdefault(num, []).append(val)
        else:
            size, i = _varint(data, i)
            out.setdefault(num, []).append(data[i : i + size])
            i += size
    return out


def _varint(data: bytes, i: int) -> tuple[int, int]:
    shift = result = 0
    while True:
        b = data[i]
        i += 1
        result |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return result, i


def identity(b: bytes) -> bytes:
    return b


@pytest.fixture
def grpc_server(launch: Callable[..., Server]) -> tuple[Server, int]:
    port = free_port()
    srv = launch("--grpc-port", str(port), env={"SANDBOX_RUNTIME_TOKEN": "gtok"}, token="gtok")
    return srv, port


def test_execute_wire_format(grpc_server: tuple[Server, int]) -> None:
    srv, port = grpc_server
    (srv.root / "sub").mkdir()
    # ExecuteRequest{config: ProcessConfig{command: [sh, -c, ...], env_vars: {X: y}, cwd: "sub"}}
    config = (
        field(1, b"/bin/sh")
        + field(1, b"-c")
        + field(1, b'echo "$X $(basename $PWD)"; echo e >&2; exit 3')
        + field(2, field(1, b"X") + field(2, b"y"))
        + field(3, b"sub")
    )
    with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
        call = ch.unary_unary(
            "/process.v1.ProcessService/Execute", request_serializer=identity, response_deserializer=identity
        )
        with pytest.raises(grpc.RpcError) as denied:
            call(field(1, config), timeout=10)
        assert denied.value.code() == grpc.StatusCode.UNAUTHENTICATED
        raw = call(field(1, config), timeout=10, metadata=[("authorization", "Bearer gtok")])
    resp = parse(raw)
    assert resp == {1: [3], 2: [b"y sub\n"], 3: [b"e\n"]}


def test_start_streams_events_and_takes_stdin(grpc_server: tuple[Server, int]) -> None:
    from sandbox_runtime.grpc_process import Messages

    _srv, port = grpc_server
    m = Messages()
    meta = [("authorization", "Bearer gtok")]
    with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
        start = ch.unary_stream(
            "/process.v1.ProcessService/Start",
            request_serializer=m.StartRequest.SerializeToString,
            response_deserializer=m.StartResponse.FromString,
        )
        write = ch.unary_unary(
            "/process.v1.ProcessService/WriteStdin",
            request_serializer=m.WriteStdinRequest.SerializeToString,
            response_deserializer=m.WriteStdinResponse.FromString,
        )
        req = m.StartRequest()
        req.config.command.extend(["sh", "-c", "read line; echo got-$line; exit 5"])
        stream = start(req, timeout=20, metadata=meta)
        events = iter(stream)
        first = next(events)
        assert first.WhichOneof("event") == "init" and first.init.process_id > 0
        w = m.WriteStdinRequest(process_id=first.init.process_id, input=b"hello\n")
        write(w, timeout=10, metadata=meta)
        rest = list(events)
    out = b"".join(e.stdout for e in rest if e.WhichOneof("event") == "stdout")
    assert out == b"got-hello\n"
    assert rest[-1].WhichOneof("event") == "exit" and rest[-1].exit.exit_code == 5
