"""tar.gz export and import that stream: a worker thread runs tarfile against a bounded queue, so
neither direction ever holds more than a few MiB of the archive in memory."""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import os
import queue
import tarfile
from collections.abc import AsyncIterator, Callable

from .baseline import Excluder, scan
from .errors import ApiError, bad_request
from .paths import Root

CHUNK = 1 << 20
_EOF = b""


class _AsyncSink:
    """File-like object for the worker thread; hands 1 MiB chunks to the event loop with backpressure."""

    def __init__(self, loop: asyncio.AbstractEventLoop, q: asyncio.Queue[bytes | BaseException]) -> None:
        self.loop, self.q = loop, q
        self.buf = bytearray()

    def write(self, data: bytes) -> int:
        self.buf += data
        if len(self.buf) >= CHUNK:
            self._put(bytes(self.buf))
            self.buf.clear()
        return len(data)

    def _put(self, item: bytes | BaseException) -> None:
        asyncio.run_coroutine_threadsafe(self.q.put(item), self.loop).result()

    def flush(self) -> None:
        pass

    def close(self) -> None:
        if self.buf:
            self._put(bytes(self.buf))
            self.buf.clear()


def export_stream(
    root: Root,
    base_rel: str,
    exclude: list[str],
    level: int,
    on_bytes: Callable[[int], None] | None,
    always_exclude: list[str],
) -> AsyncIterator[bytes]:
    loop = asyncio.get_running_loop()
    q: asyncio.Queue[bytes | BaseException] = asyncio.Queue(maxsize=4)
    base = os.path.join(root.real, base_rel) if base_rel else root.real
    excluder = Excluder(exclude + always_exclude)
    cancelled = [False]

    def work() -> None:
        sink = _AsyncSink(loop, q)
        try:
            with (
                gzip.GzipFile(fileobj=sink, mode="wb", compresslevel=level, mtime=0) as gz,
                tarfile.open(fileobj=gz, mode="w|", format=tarfile.PAX_FORMAT) as tar,
            ):
                for rel, _e in _walk_all(base, excluder):
                    if cancelled[0]:
                        return
                    with contextlib.suppress(FileNotFoundError, PermissionError):
                        tar.add(os.path.join(base, rel), arcname=rel, recursive=False)
            sink.close()
            sink._put(_EOF)
        except BaseException as err:  # delivered to the response so the stream ends instead of hanging
            with contextlib.suppress(BaseException):
                sink._put(err)

    async def gen() -> AsyncIterator[bytes]:
        fut = loop.run_in_executor(None, work)
        try:
            while True:
                item = await q.get()
                if isinstance(item, BaseException):
                    raise item
                if item == _EOF:
                    break
                if on_bytes is not None:
                    on_bytes(len(item))
                yield item
        finally:
            cancelled[0] = True
            while not fut.done():  # let a blocked producer finish its put and notice the cancel
                with contextlib.suppress(asyncio.QueueEmpty):
                    q.get_nowait()
                await asyncio.sleep(0.01)

    return gen()


def _walk_all(base: str, excluder: Excluder) -> list[tuple[str, os.DirEntry[str]]]:
    """Directories first (so modes and empty dirs survive), then files, in a stable order."""
    dirs: list[tuple[str, os.DirEntry[str]]] = []
    stack = [(base, "")]
    while stack:
        d, rel_d = stack.pop()
        try:
            with os.scandir(d) as it:
                entries = sorted(it, key=lambda e: e.name)
        except OSError:
            continue
        for e in entries:
            rel = rel_d + e.name
            if e.is_dir(follow_symlinks=False) and not excluder.skip_dir(rel):
                dirs.append((rel, e))
                stack.append((e.path, rel + "/"))
    out = sorted(dirs, key=lambda t: t[0])
    out.extend(sorted(scan(base, excluder), key=lambda t: t[0]))
    return out


# Python's extraction filters (PEP 706) arrived in 3.11.4; Debian bookworm's Python, which the workspace
# image runs, is 3.11.2. Without them, `check_member` applies the same rules as the "data" filter.
HAS_TAR_FILTERS = hasattr(tarfile, "data_filter")


def refused(member: tarfile.TarInfo, why: str) -> ApiError:
    return ApiError(400, "INVALID_ARGUMENT", f"refused archive member {member.name!r}: {why}")


def _inside(dest: str, path: str) -> bool:
    path = os.path.normpath(path)
    return path == dest or path.startswith(dest.rstrip(os.sep) + os.sep)


def check_member(member: tarfile.TarInfo, dest: str) -> tarfile.TarInfo:
    """The "data" filter's rules: regular files, directories and links that stay inside `dest` only; no
    set-user/group-id bits, no write bits for others; owners are not restored."""
    dest = os.path.realpath(dest)
    target = os.path.join(dest, member.name)
    if not _inside(dest, target):
        raise refused(member, "it would land outside the destination")
    if member.issym():
        if os.path.isabs(member.linkname):
            raise refused(member, f"absolute symlink target {member.linkname!r}")
        if not _inside(dest, os.path.join(os.path.dirname(target), member.linkname)):
            raise refused(member, f"symlink to {member.linkname!r} points outside the destination")
    elif member.islnk():
        if os.path.isabs(member.linkname) or not _inside(dest, os.path.join(dest, member.linkname)):
            raise refused(member, f"hard link to {member.linkname!r} points outside the destination")
    elif not (member.isfile() or member.isdir()):
        raise refused(member, "only files, directories and links are accepted (no devices or FIFOs)")
    if member.isfile() or member.isdir():
        member.mode = (member.mode & 0o755) | (0o700 if member.isdir() else 0o600)
    # Owners are not restored: the runtime never runs as root, so tarfile does not chown.
    return member


def extract_safely(tar: tarfile.TarFile, member: tarfile.TarInfo, dest: str) -> None:
    if HAS_TAR_FILTERS:
        try:
            tar.extract(member, dest, filter="data")
        except tarfile.FilterError as err:
            raise refused(member, str(err)) from None
    else:
        tar.extract(check_member(member, dest), dest)


class _QueueSource:
    """File-like reader for the worker thread, fed with request chunks by the event loop."""

    def __init__(self) -> None:
        self.q: queue.Queue[bytes] = queue.Queue(maxsize=8)
        self.buf = b""
        self.eof = False

    def read(self, n: int = -1) -> bytes:
        while not self.eof and (n < 0 or len(self.buf) < n):
            item = self.q.get()
            if item == _EOF:
                self.eof = True
            else:
                self.buf += item
        if n < 0:
            out, self.buf = self.buf, b""
        else:
            out, self.buf = self.buf[:n], self.buf[n:]
        return out


async def import_stream(
    root: Root,
    base_rel: str,
    chunks: AsyncIterator[bytes],
    exclude: list[str],
    on_bytes: Callable[[int], None] | None,
) -> tuple[int, int]:
    """Extract a tar (optionally gzip'd) from a byte stream under base_rel; returns (files, bytes)."""
    loop = asyncio.get_running_loop()
    src = _QueueSource()
    excluder = Excluder(exclude)
    dest = os.path.join(root.real, base_rel) if base_rel else root.real
    os.makedirs(dest, exist_ok=True)

    def work() -> tuple[int, int]:
        count = total = 0
        try:
            with tarfile.open(fileobj=src, mode="r|*") as tar:  # type: ignore[call-overload]
                for m in tar:
                    name = m.name.lstrip("./") if m.name.startswith("./") else m.name
                    rel = root.normalise(name)  # refuses absolute, `..`, NUL with a clear message
                    if not rel or (m.isdir() and excluder.skip_dir(rel)) or excluder.skip_file(rel):
                        continue
                    if any(excluder.skip_dir(p) for p in _parents(rel)):
                        continue
                    full = os.path.join(base_rel, rel) if base_rel else rel
                    root.resolve(full)  # an existing symlink on the way must not lead outside
                    extract_safely(tar, m, dest)
                    if m.isfile():
                        count += 1
                        total += m.size
        except tarfile.ReadError as err:
            raise bad_request(f"not a tar archive: {err}") from None
        finally:
            # Drain so the feeding side never blocks on a full queue after we stop reading.
            src.eof = True
            with contextlib.suppress(queue.Empty):
                while True:
                    src.q.get_nowait()
        return count, total

    fut = loop.run_in_executor(None, work)
    try:
        async for chunk in chunks:
            if fut.done():
                break
            if on_bytes is not None:
                on_bytes(len(chunk))
            while not fut.done():
                try:
                    src.q.put_nowait(chunk)
                    break
                except queue.Full:
                    await asyncio.sleep(0.001)
    finally:
        while not fut.done():
            try:
                src.q.put_nowait(_EOF)
                break
            except queue.Full:
                await asyncio.sleep(0.001)
    return await fut


def _parents(rel: str) -> list[str]:
    parts = rel.split("/")
    return ["/".join(parts[:i]) for i in range(1, len(parts))]
