"""sandboxd's gRPC ProcessService (package `process.v1`), so agent-sandbox's SDK can run commands in
sandboxd mode against this runtime. Optional: needs the `grpc` extra (grpcio, protobuf).

The message types are built at runtime from a descriptor that restates the service's wire contract
(names and field numbers); no generated code is checked in. They live in a private descriptor pool so
they cannot clash with a client's generated stubs loaded in the same process.
"""

from __future__ import annotations

import contextlib
import hmac
import os
import signal
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import Any, TypeAlias

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool, empty_pb2, message_factory

from .errors import ApiError
from .execution import ExecSpec, killpg
from .runtime import Runtime

_F = descriptor_pb2.FieldDescriptorProto
SERVICE = "process.v1.ProcessService"
Context: TypeAlias = grpc.aio.ServicerContext[Any, Any]


def _descriptor() -> descriptor_pb2.FileDescriptorProto:
    fd = descriptor_pb2.FileDescriptorProto(
        name="shadow/sandbox_runtime/process.proto",
        package="process.v1",
        syntax="proto3",
        dependency=["google/protobuf/empty.proto"],
    )
    sig = fd.enum_type.add(name="Signal")
    for name, num in (
        ("SIGNAL_UNSPECIFIED", 0),
        ("SIGNAL_SIGINT", 2),
        ("SIGNAL_SIGKILL", 9),
        ("SIGNAL_SIGTERM", 15),
    ):
        sig.value.add(name=name, number=num)

    def message(name: str, *fields: tuple[str, int, int, str | None, int]) -> descriptor_pb2.DescriptorProto:
        m = fd.message_type.add(name=name)
        for fname, number, ftype, type_name, label in fields:
            f = m.field.add(name=fname, number=number, type=ftype, label=label)
            if type_name:
                f.type_name = type_name
        return m

    opt, rep = _F.LABEL_OPTIONAL, _F.LABEL_REPEATED
    message("PTY", ("cols", 1, _F.TYPE_UINT32, None, opt), ("rows", 2, _F.TYPE_UINT32, None, opt))
    cfg = message(
        "ProcessConfig",
        ("command", 1, _F.TYPE_STRING, None, rep),
        ("env_vars", 2, _F.TYPE_MESSAGE, ".process.v1.ProcessConfig.EnvVarsEntry", rep),
        ("cwd", 3, _F.TYPE_STRING, None, opt),
    )
    entry = cfg.nested_type.add(name="EnvVarsEntry")
    entry.field.add(name="key", number=1, type=_F.TYPE_STRING, label=opt)
    entry.field.add(name="value", number=2, type=_F.TYPE_STRING, label=opt)
    entry.options.map_entry = True
    _proto3_optional(cfg, "cwd")
    start = message(
        "StartRequest",
        ("config", 1, _F.TYPE_MESSAGE, ".process.v1.ProcessConfig", opt),
        ("pty", 2, _F.TYPE_MESSAGE, ".process.v1.PTY", opt),
    )
    _proto3_optional(start, "pty")
    message("InitEvent", ("process_id", 1, _F.TYPE_INT32, None, opt))
    message("ExitEvent", ("exit_code", 1, _F.TYPE_INT32, None, opt))
    resp = message(
        "StartResponse",
        ("init", 1, _F.TYPE_MESSAGE, ".process.v1.InitEvent", opt),
        ("stdout", 2, _F.TYPE_BYTES, None, opt),
        ("stderr", 3, _F.TYPE_BYTES, None, opt),
        ("exit", 4, _F.TYPE_MESSAGE, ".process.v1.ExitEvent", opt),
    )
    resp.oneof_decl.add(name="event")
    for f in resp.field:
        f.oneof_index = 0
    message("ExecuteRequest", ("config", 1, _F.TYPE_MESSAGE, ".process.v1.ProcessConfig", opt))
    message(
        "ExecuteResponse",
        ("exit_code", 1, _F.TYPE_INT32, None, opt),
        ("stdout", 2, _F.TYPE_BYTES, None, opt),
        ("stderr", 3, _F.TYPE_BYTES, None, opt),
    )
    stdin = message(
        "WriteStdinRequest",
        ("process_id", 1, _F.TYPE_INT32, None, opt),
        ("input", 2, _F.TYPE_BYTES, None, opt),
        ("eof", 3, _F.TYPE_MESSAGE, ".google.protobuf.Empty", opt),
    )
    stdin.oneof_decl.add(name="payload")
    stdin.field[1].oneof_index = 0
    stdin.field[2].oneof_index = 0
    message("WriteStdinResponse")
    message(
        "SendSignalRequest",
        ("process_id", 1, _F.TYPE_INT32, None, opt),
        ("signal", 2, _F.TYPE_ENUM, ".process.v1.Signal", opt),
    )
    message("SendSignalResponse")
    message(
        "ResizeTTYRequest",
        ("process_id", 1, _F.TYPE_INT32, None, opt),
        ("cols", 2, _F.TYPE_UINT32, None, opt),
        ("rows", 3, _F.TYPE_UINT32, None, opt),
    )
    message("ResizeTTYResponse")
    return fd


def _proto3_optional(m: descriptor_pb2.DescriptorProto, field: str) -> None:
    # proto3 `optional` is a synthetic one-field oneof named `_<field>`.
    m.oneof_decl.add(name=f"_{field}")
    for f in m.field:
        if f.name == field:
            f.oneof_index = len(m.oneof_decl) - 1
            f.proto3_optional = True


class Messages:
    def __init__(self) -> None:
        pool = descriptor_pool.DescriptorPool()
        pool.AddSerializedFile(empty_pb2.DESCRIPTOR.serialized_pb)
        pool.Add(_descriptor())
        self.cls: dict[str, Any] = {}
        for name in (
            "ExecuteRequest",
            "ExecuteResponse",
            "StartRequest",
            "StartResponse",
            "InitEvent",
            "ExitEvent",
            "WriteStdinRequest",
            "WriteStdinResponse",
            "SendSignalRequest",
            "SendSignalResponse",
            "ResizeTTYRequest",
            "ResizeTTYResponse",
        ):
            self.cls[name] = message_factory.GetMessageClass(pool.FindMessageTypeByName(f"process.v1.{name}"))

    def __getattr__(self, name: str) -> Any:
        try:
            return self.cls[name]
        except KeyError:
            raise AttributeError(name) from None


_STATUS = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    403: grpc.StatusCode.PERMISSION_DENIED,
    404: grpc.StatusCode.NOT_FOUND,
    409: grpc.StatusCode.FAILED_PRECONDITION,
    429: grpc.StatusCode.RESOURCE_EXHAUSTED,
}


class ProcessService:
    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self.m = Messages()
        self.expected = f"Bearer {rt.settings.token}".encode() if rt.settings.token else None

    async def _check(self, context: Context) -> None:
        if self.expected is None:
            return
        got = b""
        for key, value in context.invocation_metadata() or ():
            if key == "authorization":
                got = value.encode() if isinstance(value, str) else value
        if not hmac.compare_digest(got, self.expected):
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or invalid bearer token")

    def _spec(self, config: Any, timeout: float | None) -> ExecSpec:
        """The same checks as HTTP's exec (cwd confined, no NUL bytes, valid env names): one ExecService."""
        if not config.command:
            raise ApiError(400, "INVALID_ARGUMENT", "config.command is empty")
        return self.rt.exec.spec(
            list(config.command),
            cwd=config.cwd if config.HasField("cwd") else "",
            env=dict(config.env_vars),
            timeout=timeout,
        )

    async def _abort(self, context: Context, err: ApiError) -> None:
        await context.abort(_STATUS.get(err.status, grpc.StatusCode.UNKNOWN), err.message)

    async def execute(self, request: Any, context: Context) -> Any:
        await self._check(context)
        remaining = context.time_remaining()
        timeout = (
            min(remaining, self.rt.settings.exec_timeout) if remaining else self.rt.settings.exec_timeout
        )
        try:
            res = await self.rt.exec.run(self._spec(request.config, timeout), "grpc")
        except ApiError as err:
            await self._abort(context, err)
            raise
        return self.m.ExecuteResponse(exit_code=res.exit_code, stdout=res.stdout, stderr=res.stderr)

    async def start(self, request: Any, context: Context) -> AsyncGenerator[Any, None]:
        await self._check(context)
        if request.HasField("pty"):
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, "PTY over gRPC is not supported; use /v1/pty")
        # Like /v1/processes: no default timeout; the process lives as long as the caller's stream.
        try:
            p = await self.rt.exec.start(self._spec(request.config, None), keep_stdin=True)
        except ApiError as err:
            await self._abort(context, err)
            raise
        try:
            yield self.m.StartResponse(init=self.m.InitEvent(process_id=p.pid))
            async for chunk in p.follow_raw():
                if chunk is None:
                    yield self.m.StartResponse(exit=self.m.ExitEvent(exit_code=p.exit_code or 0))
                    return
                stream, data = chunk
                yield self.m.StartResponse(**{stream: data})
        finally:
            if p.running:  # the caller cancelled the stream
                killpg(p.pid)

    async def _process(self, request: Any, context: Context) -> Any:
        """The authorised request's process, or an aborted call (NOT_FOUND) when there is none."""
        await self._check(context)
        try:
            return self._by_pid(request.process_id)
        except ApiError as err:
            await self._abort(context, err)
            raise

    def _by_pid(self, pid: int) -> Any:
        for p in self.rt.exec.processes.procs.values():
            if p.pid == pid:
                return p
        raise ApiError(404, "NOT_FOUND", f"no process with id {pid}")

    async def write_stdin(self, request: Any, context: Context) -> Any:
        p = await self._process(request, context)
        stdin = p.proc.stdin
        if stdin is not None and not stdin.is_closing():
            with contextlib.suppress(BrokenPipeError, ConnectionResetError, RuntimeError):
                if request.WhichOneof("payload") == "input":
                    stdin.write(request.input)
                    await stdin.drain()
                else:
                    stdin.close()
        return self.m.WriteStdinResponse()

    async def send_signal(self, request: Any, context: Context) -> Any:
        p = await self._process(request, context)
        sig = request.signal or signal.SIGTERM
        if p.running:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(p.pid, sig)
        return self.m.SendSignalResponse()

    async def resize_tty(self, request: Any, context: Context) -> Any:
        await self._check(context)
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "PTY over gRPC is not supported; use /v1/pty")

    def _unary(self, method: Callable[[Any, Context], Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
        async def call(request: Any, context: Context) -> Any:
            with self.rt.activity.busy():  # a gRPC client is as much a user as an HTTP one
                return await method(request, context)

        return call

    def _stream(
        self, method: Callable[[Any, Context], AsyncGenerator[Any, None]]
    ) -> Callable[..., AsyncIterator[Any]]:
        async def call(request: Any, context: Context) -> AsyncIterator[Any]:
            with self.rt.activity.busy():
                async with contextlib.aclosing(method(request, context)) as events:
                    async for event in events:
                        yield event

        return call

    def handler(self) -> grpc.GenericRpcHandler:
        m = self.m
        return grpc.method_handlers_generic_handler(
            SERVICE,
            {
                "Execute": grpc.unary_unary_rpc_method_handler(
                    self._unary(self.execute),
                    m.ExecuteRequest.FromString,
                    m.ExecuteResponse.SerializeToString,
                ),
                "Start": grpc.unary_stream_rpc_method_handler(
                    self._stream(self.start), m.StartRequest.FromString, m.StartResponse.SerializeToString
                ),
                "WriteStdin": grpc.unary_unary_rpc_method_handler(
                    self._unary(self.write_stdin),
                    m.WriteStdinRequest.FromString,
                    m.WriteStdinResponse.SerializeToString,
                ),
                "SendSignal": grpc.unary_unary_rpc_method_handler(
                    self._unary(self.send_signal),
                    m.SendSignalRequest.FromString,
                    m.SendSignalResponse.SerializeToString,
                ),
                "ResizeTTY": grpc.unary_unary_rpc_method_handler(
                    self._unary(self.resize_tty),
                    m.ResizeTTYRequest.FromString,
                    m.ResizeTTYResponse.SerializeToString,
                ),
            },
        )


async def serve(rt: Runtime, host: str, port: int) -> grpc.aio.Server:
    server = grpc.aio.server()
    server.add_generic_rpc_handlers([ProcessService(rt).handler()])
    server.add_insecure_port(f"{host}:{port}")
    await server.start()
    return server
