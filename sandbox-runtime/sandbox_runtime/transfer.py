"""Streaming file transfer in bounded memory: downloads in large chunks, uploads straight to disk."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import urllib.parse
from collections.abc import Callable

from python_multipart.multipart import MultipartParser, parse_options_header
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from .errors import ApiError, bad_request
from .files import AtomicWriter
from .paths import Root

# 1 MiB chunks: big enough that per-chunk overhead (one read, one ASGI send) is noise next to the copy,
# small enough that a slow client holds at most a few MiB (uvicorn applies write backpressure).
CHUNK = 1 << 20

_RANGE = re.compile(r"^bytes=(\d*)-(\d*)$")


class FileStream(Response):
    """ASGI response for a regular file, with single-range support (`Range: bytes=a-b`)."""

    def __init__(
        self,
        path: str,
        *,
        range_header: str | None = None,
        filename: str | None = None,
        head: bool = False,
        on_bytes: Callable[[int], None] | None = None,
        offset: int | None = None,
        length: int | None = None,
    ) -> None:
        # Deliberately not calling Response.__init__: we stream from the fd and build headers ourselves;
        # subclassing only tells FastAPI to hand the object straight to the server.
        self.background = None
        try:
            self.fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as err:
            from .paths import map_os_error

            raise map_os_error(err, os.path.basename(path)) from None
        size = os.fstat(self.fd).st_size
        self.status = 200
        start, end = 0, size
        if offset is not None or length is not None:
            start = min(max(offset or 0, 0), size)
            end = size if length is None else min(size, start + max(length, 0))
        elif range_header:
            m = _RANGE.match(range_header.strip())
            if m and (m.group(1) or m.group(2)):
                a, b = m.group(1), m.group(2)
                if a:
                    start = int(a)
                    end = min(size, int(b) + 1) if b else size
                else:
                    start = max(0, size - int(b))
                if (start >= size and size > 0) or start > end:
                    os.close(self.fd)
                    raise ApiError(416, "OUT_OF_RANGE", f"range not satisfiable for size {size}")
                self.status = 206
        self.start, self.end, self.size = start, end, size
        self.head = head
        self.on_bytes = on_bytes
        self.header_list = [
            (b"content-type", b"application/octet-stream"),
            (b"content-length", str(end - start).encode()),
            (b"accept-ranges", b"bytes"),
        ]
        if self.status == 206:
            self.header_list.append(
                (b"content-range", f"bytes {start}-{max(start, end - 1)}/{size}".encode())
            )
        if filename:
            quoted = urllib.parse.quote(os.path.basename(filename))
            self.header_list.append(
                (b"content-disposition", f"attachment; filename*=utf-8''{quoted}".encode())
            )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await send({"type": "http.response.start", "status": self.status, "headers": self.header_list})
            if self.head:
                await send({"type": "http.response.body", "body": b""})
                return
            # Read-ahead on a worker thread: the next block comes off the disk (or page cache) while
            # the current one is written to the socket, and a cold disk read never stalls the loop.
            loop = asyncio.get_running_loop()
            pos = self.start

            def read_at(p: int) -> asyncio.Future[bytes]:
                return loop.run_in_executor(None, os.pread, self.fd, min(CHUNK, self.end - p), p)

            nxt = read_at(pos) if pos < self.end else None
            while nxt is not None:
                data = await nxt
                nxt = None
                if not data:
                    break
                pos += len(data)
                if pos < self.end:
                    nxt = read_at(pos)
                try:
                    await send({"type": "http.response.body", "body": data, "more_body": pos < self.end})
                except BaseException:
                    if nxt is not None:
                        with contextlib.suppress(BaseException):
                            await nxt
                    raise
                if self.on_bytes is not None:
                    self.on_bytes(len(data))
            if pos < self.end or self.start == self.end:
                await send({"type": "http.response.body", "body": b""})
        finally:
            os.close(self.fd)


class _Pipelined:
    """Feeds an AtomicWriter in ~1 MiB batches written (writev, no joining copy) on a worker thread while
    the next batch is received, so disk writes (which the kernel may throttle) overlap with the network.
    At most two batches are in memory per upload."""

    def __init__(self, writer: AtomicWriter, on_bytes: Callable[[int], None] | None) -> None:
        self.writer = writer
        self.on_bytes = on_bytes
        self.pending: list[bytes | memoryview] = []
        self.size = 0
        self.inflight: asyncio.Future[None] | None = None

    def add(self, data: bytes | memoryview) -> None:
        self.pending.append(data)
        self.size += len(data)

    async def flush_if_full(self) -> None:
        if self.size < CHUNK:
            return
        if self.inflight is not None:
            await self.inflight
        batch, size = self.pending, self.size
        self.pending, self.size = [], 0
        self.inflight = asyncio.get_running_loop().run_in_executor(None, self.writer.writev, batch)
        if self.on_bytes is not None:
            self.on_bytes(size)

    async def finish(self, *, commit: bool = True) -> None:
        if self.inflight is not None:
            await self.inflight
            self.inflight = None
        self.writer.writev(self.pending)
        if self.on_bytes is not None:
            self.on_bytes(self.size)
        self.pending, self.size = [], 0
        if commit:
            self.writer.commit()

    async def abort(self) -> None:
        if self.inflight is not None:
            with contextlib.suppress(BaseException):
                await self.inflight
        self.writer.abort()


def check_upload_size(received: int, limit: int | None) -> None:
    if limit is not None and received > limit:
        raise ApiError(
            413, "RESOURCE_EXHAUSTED", f"upload larger than the limit of {limit} bytes (--max-upload)"
        )


async def receive_to_file(
    request: Request, writer: AtomicWriter, limit: int | None, on_bytes: Callable[[int], None] | None
) -> None:
    """Stream a raw request body into an AtomicWriter; nothing replaces the destination unless the whole
    body arrived (a broken or oversized upload leaves the old file as it was)."""
    pipe = _Pipelined(writer, on_bytes)
    received = 0
    try:
        async for chunk in request.stream():
            pipe.add(chunk)
            received += len(chunk)
            check_upload_size(received, limit)
            await pipe.flush_if_full()
        await pipe.finish()
    except BaseException:
        await pipe.abort()
        raise


async def receive_multipart(
    request: Request,
    root: Root,
    *,
    field_names: tuple[str, ...] | None,
    mode: int,
    on_bytes: Callable[[int], None] | None,
    target: str | None = None,
    limit: int | None = None,
) -> list[tuple[str, int]]:
    """Parse multipart/form-data as it arrives, writing each file part to its destination.

    The destination is `target` if given, else the part's filename (a path relative to the root), as the
    legacy runtime does. Returns (relative path, size) per stored file. All or nothing: parts are
    renamed into place only once the whole body arrived, so a broken body or one past `limit` bytes (413)
    changes no file.
    """
    ctype, params = parse_options_header(request.headers.get("content-type", ""))
    if ctype != b"multipart/form-data" or b"boundary" not in params:
        raise bad_request("expected multipart/form-data with a boundary")
    st = _PartState()
    current: list[_Pipelined | None] = [None]
    ended: list[_Pipelined] = []
    written: list[_Pipelined] = []
    errors: list[ApiError] = []

    def on_header_field(data: bytes, start: int, end: int) -> None:
        st.field += data[start:end]

    def on_header_value(data: bytes, start: int, end: int) -> None:
        st.value += data[start:end]

    def on_header_end() -> None:
        st.headers[bytes(st.field).lower()] = bytes(st.value)
        st.field, st.value = bytearray(), bytearray()

    def on_headers_finished() -> None:
        _disp, opts = parse_options_header(st.headers.get(b"content-disposition", b""))
        name = opts.get(b"name", b"").decode("utf-8", "replace")
        fname = opts.get(b"filename")
        st.headers = {}
        if errors or fname is None or (field_names is not None and name not in field_names):
            current[0] = None
            return
        try:
            dest = target if target is not None else fname.decode("utf-8", "replace")
            current[0] = _Pipelined(AtomicWriter(root, dest, mode), on_bytes)
        except ApiError as err:
            errors.append(err)
            current[0] = None

    def on_part_data(data: bytes, start: int, end: int) -> None:
        p = current[0]
        if p is not None:
            p.add(memoryview(data)[start:end])

    def on_part_end() -> None:
        p = current[0]
        if p is not None:
            ended.append(p)
            current[0] = None

    parser = MultipartParser(
        params[b"boundary"],
        {
            "on_header_field": on_header_field,
            "on_header_value": on_header_value,
            "on_header_end": on_header_end,
            "on_headers_finished": on_headers_finished,
            "on_part_data": on_part_data,
            "on_part_end": on_part_end,
        },
    )

    async def settle() -> None:
        while ended:
            p = ended.pop(0)
            written.append(p)
            await p.finish(commit=False)
        if current[0] is not None:
            await current[0].flush_if_full()

    received = 0
    try:
        async for chunk in request.stream():
            received += len(chunk)
            check_upload_size(received, limit)
            parser.write(chunk)
            if errors:
                raise errors[0]
            await settle()
        parser.finalize()
        await settle()
        if errors:
            raise errors[0]
        committed, written[:] = list(written), []
        for p in committed:
            p.writer.commit()
    except ApiError:
        raise
    except Exception as err:
        raise bad_request(f"malformed multipart body: {err}") from None
    finally:
        for p in [*written, *ended, *([current[0]] if current[0] is not None else [])]:
            await p.abort()
    return [(p.writer.res.rel, p.writer.size) for p in committed]


class _PartState:
    def __init__(self) -> None:
        self.headers: dict[bytes, bytes] = {}
        self.field = bytearray()
        self.value = bytearray()
