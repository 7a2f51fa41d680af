"""tar.gz export and import that stream: a worker thread runs tarfile against a bounded queue, so
neither direction ever holds more than a few MiB of the archive in memory.

Import never uses tarfile's own extraction (nor its filters, which Debian bookworm's Python 3.11.2, the
workspace image's, does not have): every member is checked and written here, the same on every Python,
into a staging directory; only a wholly accepted archive is moved into the destination.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import os
import queue
import shutil
import stat
import tarfile
import tempfile
import zlib
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from typing import IO

from .baseline import Excluder, scan
from .errors import ApiError, bad_request, conflict
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


STAGING_PREFIX = ".sandbox-runtime-import-"
# GNU long names and pax headers are read whole by tarfile: keep a hostile one from filling memory.
HEADER_LIMIT = 1 << 20
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_LONG_HEADERS = (
    tarfile.GNUTYPE_LONGNAME,
    tarfile.GNUTYPE_LONGLINK,
    tarfile.XHDTYPE,
    tarfile.XGLTYPE,
    tarfile.SOLARIS_XHDTYPE,
)


@dataclass(frozen=True)
class ImportLimits:
    """Bounds of one import: request body bytes (`--max-upload`), members, and bytes once decompressed."""

    max_body: int | None = None
    max_members: int = 1_000_000
    max_expanded: int = 64 << 30


def refused(name: str, why: str) -> ApiError:
    return ApiError(400, "INVALID_ARGUMENT", f"refused archive member {name!r}: {why}")


def too_large(what: str, flag: str) -> ApiError:
    return ApiError(413, "RESOURCE_EXHAUSTED", f"archive refused: {what} (raise the limit with {flag})")


class _BoundedTarInfo(tarfile.TarInfo):
    # tarfile's documented hook for subclasses, called for every header before its payload is read.
    def _proc_member(self, tf: tarfile.TarFile) -> tarfile.TarInfo:
        if self.type in _LONG_HEADERS and self.size > HEADER_LIMIT:
            raise bad_request(f"archive header of {self.size} bytes (long name or pax data) is too large")
        return super()._proc_member(tf)  # type: ignore[misc,no-any-return]


class _Expanded:
    """The tar stream as tarfile reads it: the body, gunzipped when it starts like gzip, counted. Reading
    stops with 413 as soon as more than `limit` bytes came out, so a gzip bomb is never inflated past it."""

    def __init__(self, raw: IO[bytes] | _QueueSource, limit: int) -> None:
        self.raw, self.limit = raw, limit
        self.count = 0
        self.pending = raw.read(2)
        self.gz = zlib.decompressobj(wbits=31) if self.pending == b"\x1f\x8b" else None
        self.done = False

    def read(self, n: int = -1) -> bytes:
        out = bytearray()
        while (n < 0 or len(out) < n) and not self.done:
            want = CHUNK if n < 0 else n - len(out)
            if self.gz is None:
                data = self.pending or self.raw.read(want)
                self.pending = b""
                self.done = not data
            elif self.gz.eof:  # a second gzip member, if any, is ignored (as tarfile does)
                self.done, data = True, b""
            else:
                src = self.gz.unconsumed_tail or self.pending or self.raw.read(CHUNK)
                self.pending = b""
                if not src:
                    raise bad_request("the gzip stream ends early")
                try:
                    data = self.gz.decompress(src, want)
                except zlib.error as err:
                    raise bad_request(f"not a valid gzip stream: {err}") from None
            self.count += len(data)
            if self.count > self.limit:
                raise too_large(f"it expands to more than {self.limit} bytes", "--max-archive-bytes")
            out += data
        return bytes(out)


def member_path(name: str) -> str:
    """The member's path relative to the destination, in one spelling: no `.` or empty segments, so
    `./.git//x` is `.git/x`. Absolute paths, `..` segments and control characters are refused."""
    if any(ord(c) < 0x20 for c in name):
        raise refused(name, "control characters in the name")
    if name.startswith("/"):
        raise refused(name, "absolute path")
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise refused(name, "`..` in the path")
    return "/".join(parts)


def _parents(rel: str) -> list[str]:
    parts = rel.split("/")
    return ["/".join(parts[:i]) for i in range(1, len(parts))]


def excluded(excluder: Excluder, rel: str, is_dir: bool) -> bool:
    """A directory pattern (`.git/`) excludes that path whatever it is (a `.git` file or symlink can point
    git elsewhere) and everything under it; other patterns match the path or its basename."""
    if any(excluder.skip_dir(p) for p in _parents(rel)) or excluder.skip_dir(rel):
        return True
    return not is_dir and excluder.skip_file(rel)


def _safe_mode(mode: int, is_dir: bool) -> int:
    # No set-user/group-id or sticky bits, no write for group/others; the owner can always read and write.
    return (mode & 0o755) | (0o700 if is_dir else 0o600)


class _Staging:
    """A fresh directory the accepted members are written into, never through a symlink: every path is
    opened component by component with O_NOFOLLOW, relative to the staging directory's descriptor."""

    def __init__(self, parent: str) -> None:
        self.path = tempfile.mkdtemp(prefix=STAGING_PREFIX, dir=parent)
        self.fd = os.open(self.path, _DIR_FLAGS)

    def close(self) -> None:
        os.close(self.fd)
        shutil.rmtree(self.path, ignore_errors=True)

    @contextlib.contextmanager
    def dir(self, rel_dir: str, member: str, *, create: bool) -> Iterator[int]:
        """A descriptor of the staged directory `rel_dir` (created if asked); refused when a part of it
        is a file or a symlink of the archive, or (not creating) missing."""
        fd = os.dup(self.fd)
        try:
            for part in rel_dir.split("/") if rel_dir else []:
                if create:
                    with contextlib.suppress(FileExistsError):
                        os.mkdir(part, 0o700, dir_fd=fd)
                try:
                    nxt = os.open(part, _DIR_FLAGS, dir_fd=fd)
                except OSError:
                    raise refused(member, f"{part!r} on its path is not a directory in the archive") from None
                os.close(fd)
                fd = nxt
            yield fd
        finally:
            os.close(fd)


def _lstat(name: str, dir_fd: int | None = None) -> os.stat_result | None:
    try:
        return os.lstat(name, dir_fd=dir_fd)
    except (FileNotFoundError, NotADirectoryError):  # (a file on the way: nothing there either)
        return None


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


class _Extraction:
    """One archive: members checked and staged (`add`), then verified and moved into `dest` (`commit`)."""

    def __init__(self, dest: str, excluder: Excluder, limits: ImportLimits, staging_parent: str) -> None:
        self.dest = dest
        self.excluder = excluder
        self.limits = limits
        self.staging = _Staging(staging_parent)
        self.symlinks: list[str] = []
        self.files = self.bytes = self.members = self.expanded = 0

    def add(self, tar: tarfile.TarFile, m: tarfile.TarInfo) -> None:
        self.members += 1
        if self.members > self.limits.max_members:
            raise too_large(f"more than {self.limits.max_members} members", "--max-archive-members")
        rel = member_path(m.name)
        if not rel:
            return  # `.` itself: an archive does not change the destination directory's own mode
        if not (m.isreg() or m.isdir() or m.issym() or m.islnk()) or m.issparse():
            raise refused(
                m.name, "only files, directories and links are accepted (no devices, FIFOs, sparse files)"
            )
        if excluded(self.excluder, rel, m.isdir()):
            return
        if m.isreg():
            self.expanded += m.size
            if self.expanded > self.limits.max_expanded:  # before a byte of it is read
                raise too_large(
                    f"its files add up to more than {self.limits.max_expanded} bytes", "--max-archive-bytes"
                )
        parent, _, name = rel.rpartition("/")
        with self.staging.dir(parent, m.name, create=True) as pfd:
            existing = _lstat(name, pfd)
            if existing is not None:
                if stat.S_ISDIR(existing.st_mode) and m.isdir():
                    os.chmod(name, _safe_mode(m.mode, True), dir_fd=pfd)
                    return
                if stat.S_ISDIR(existing.st_mode) or m.isdir():
                    raise refused(m.name, "it appears twice in the archive, once as a directory")
                os.unlink(name, dir_fd=pfd)  # a later member replaces an earlier one, as with tar
            if m.isdir():
                os.mkdir(name, 0o700, dir_fd=pfd)
                os.chmod(name, _safe_mode(m.mode, True), dir_fd=pfd)
            elif m.issym():
                self._symlink(m, rel, name, pfd)
            elif m.islnk():
                self._hardlink(m, name, pfd)
            else:
                self._file(tar, m, name, pfd)

    def _file(self, tar: tarfile.TarFile, m: tarfile.TarInfo, name: str, pfd: int) -> None:
        src = tar.extractfile(m)
        assert src is not None
        fd = os.open(name, _FILE_FLAGS, 0o600, dir_fd=pfd)
        try:
            while chunk := src.read(CHUNK):
                _write_all(fd, chunk)
            os.fchmod(fd, _safe_mode(m.mode, False))
            os.utime(fd, (m.mtime, m.mtime))
        finally:
            os.close(fd)
        self.files += 1
        self.bytes += m.size

    def _symlink(self, m: tarfile.TarInfo, rel: str, name: str, pfd: int) -> None:
        target = m.linkname
        if not target or target.startswith("/") or any(ord(c) < 0x20 for c in target):
            raise refused(m.name, f"symlink to {target!r}: only relative targets inside the destination")
        os.symlink(target, name, dir_fd=pfd)
        self.symlinks.append(rel)  # where it leads is checked once the whole archive is in

    def _hardlink(self, m: tarfile.TarInfo, name: str, pfd: int) -> None:
        """Hard links only to a regular file this archive wrote: never to anything already on disk."""
        try:
            target = member_path(m.linkname)
        except ApiError:
            raise refused(m.name, f"hard link to {m.linkname!r} outside the destination") from None
        if target and excluded(self.excluder, target, False):
            return  # the content was excluded, and so is this second name for it
        tparent, _, tname = target.rpartition("/")
        with self.staging.dir(tparent, m.name, create=False) as tfd:
            st = _lstat(tname, tfd) if tname else None
            if st is None or not stat.S_ISREG(st.st_mode):
                raise refused(m.name, f"hard link to {m.linkname!r}, not a file earlier in the archive")
            os.link(tname, name, src_dir_fd=tfd, dst_dir_fd=pfd, follow_symlinks=False)

    # ---- once every member is staged ----------------------------------------------------------------
    def commit(self) -> None:
        """Refuse the archive if it would clash with the destination or any of its symlinks would lead
        out of it (alone or through a chain, with what is already there); else move it in."""
        self._check_clashes(self.staging.path, self.dest, "")
        for rel in self.symlinks:
            mode, target = self._lookup(rel.split("/"))
            if stat.S_ISLNK(mode) and not self._stays_inside(rel, target):  # (unless replaced since)
                raise refused(rel, f"symlink to {target!r} leads outside the destination")
        os.makedirs(self.dest, exist_ok=True)
        self._move(self.staging.path, self.dest)

    def _check_clashes(self, staged: str, dest: str, rel: str) -> None:
        with os.scandir(staged) as it:
            for e in it:
                there = _lstat(os.path.join(dest, e.name))
                if there is None:
                    continue
                path = rel + e.name
                if e.is_dir(follow_symlinks=False):
                    if not stat.S_ISDIR(there.st_mode):
                        raise conflict(f"archive directory {path!r} would replace a file or symlink")
                    self._check_clashes(e.path, os.path.join(dest, e.name), path + "/")
                elif stat.S_ISDIR(there.st_mode):
                    raise conflict(f"archive entry {path!r} would replace a directory")

    def _lookup(self, parts: list[str]) -> tuple[int, str]:
        """(mode, symlink target) of a path of the merged view: staged entries over the destination's.
        Every prefix of `parts` is a directory or missing, so no symlink is followed here."""
        rel = "/".join(parts)
        for base in (self.staging.path, self.dest):
            st = _lstat(os.path.join(base, rel))
            if st is not None:
                return st.st_mode, os.readlink(os.path.join(base, rel)) if stat.S_ISLNK(st.st_mode) else ""
        return 0, ""

    def _stays_inside(self, rel: str, target: str) -> bool:
        """Follow the link as the kernel will once the archive is in place; False if it leaves `dest`."""
        parts = rel.split("/")[:-1]
        todo = list(reversed(target.split("/")))
        hops = 0
        while todo:
            part = todo.pop()
            if part in ("", "."):
                continue
            if part == "..":
                if not parts:
                    return False
                parts.pop()
                continue
            parts.append(part)
            mode, link = self._lookup(parts)
            if stat.S_ISLNK(mode):
                hops += 1
                if hops > 40 or link.startswith("/"):  # a loop never resolves; absolute is outside
                    return hops > 40
                parts.pop()
                todo.extend(reversed(link.split("/")))
        return True

    def _move(self, staged: str, dest: str) -> None:
        """Directories merge into existing ones; everything else replaces its namesake (one rename)."""
        with os.scandir(staged) as it:
            for e in it:
                there = os.path.join(dest, e.name)
                if e.is_dir(follow_symlinks=False) and os.path.isdir(there) and not os.path.islink(there):
                    self._move(e.path, there)
                else:
                    os.rename(e.path, there)


def extract_archive(
    body: IO[bytes] | _QueueSource,
    dest: str,
    *,
    exclude: list[str],
    limits: ImportLimits,
    staging_parent: str | None = None,
) -> tuple[int, int]:
    """Extract a tar or tar.gz read from `body` into the directory `dest` (an absolute, resolved path);
    returns (files, bytes). All or nothing: a refused archive leaves `dest` exactly as it was."""
    parent = staging_parent or _existing_ancestor(dest)
    job = _Extraction(dest, Excluder(exclude), limits, parent)
    try:
        stream = _Expanded(body, limits.max_expanded)
        try:
            with tarfile.open(fileobj=stream, mode="r|", tarinfo=_BoundedTarInfo) as tar:  # type: ignore[call-overload]
                while (m := tar.next()) is not None:
                    tar.members.clear()  # stream mode would keep every header for the whole import
                    job.add(tar, m)
        except tarfile.TarError as err:
            raise bad_request(f"not a tar archive: {err}") from None
        job.commit()
    finally:
        job.staging.close()
    return job.files, job.bytes


def remove_stale_staging(state_dir: str) -> None:
    """Staging directories an interrupted import (a killed runtime) left in the state directory."""
    with contextlib.suppress(OSError), os.scandir(state_dir) as it:
        for e in it:
            if e.name.startswith(STAGING_PREFIX) and e.is_dir(follow_symlinks=False):
                shutil.rmtree(e.path, ignore_errors=True)


def _existing_ancestor(path: str) -> str:
    while not os.path.isdir(path):
        path = os.path.dirname(path)
    return path


class _QueueSource:
    """File-like reader for the worker thread, fed with request chunks by the event loop."""

    def __init__(self) -> None:
        self.q: queue.Queue[bytes | None] = queue.Queue(maxsize=8)
        self.buf = b""
        self.eof = False

    def read(self, n: int = -1) -> bytes:
        while not self.eof and (n < 0 or len(self.buf) < n):
            item = self.q.get()
            if item is None:
                raise _Aborted
            if item == _EOF:
                self.eof = True
            else:
                self.buf += item
        if n < 0:
            out, self.buf = self.buf, b""
        else:
            out, self.buf = self.buf[:n], self.buf[n:]
        return out


class _Aborted(Exception):
    """The request body did not arrive whole (client gone, body limit): nothing is committed."""


async def import_stream(
    root: Root,
    base_rel: str,
    chunks: AsyncIterator[bytes],
    exclude: list[str],
    on_bytes: Callable[[int], None] | None,
    *,
    limits: ImportLimits,
    state_dir: str | None = None,
) -> tuple[int, int]:
    """Extract a tar (optionally gzip'd) from a byte stream under base_rel; returns (files, bytes).

    Staging happens in `state_dir` when it is on the destination's filesystem (hidden from listings,
    exports and diffs), else beside the destination."""
    loop = asyncio.get_running_loop()
    src = _QueueSource()
    dest = os.path.join(root.real, base_rel) if base_rel else root.real
    anchor = _existing_ancestor(dest)
    staging = state_dir if state_dir and _same_filesystem(state_dir, anchor) else anchor

    def work() -> tuple[int, int]:
        try:
            return extract_archive(src, dest, exclude=exclude, limits=limits, staging_parent=staging)
        finally:
            # Drain so the feeding side never blocks on a full queue after we stop reading.
            src.eof = True
            with contextlib.suppress(queue.Empty):
                while True:
                    src.q.get_nowait()

    async def put(item: bytes | None) -> None:
        while not fut.done():
            try:
                src.q.put_nowait(item)
                return
            except queue.Full:
                await asyncio.sleep(0.001)

    fut = loop.run_in_executor(None, work)
    received = 0
    end: bytes | None = None  # None aborts the worker unless the whole body arrived
    try:
        async for chunk in chunks:
            if fut.done():
                break
            received += len(chunk)
            if limits.max_body is not None and received > limits.max_body:
                raise too_large(f"the upload is larger than {limits.max_body} bytes", "--max-upload")
            if on_bytes is not None:
                on_bytes(len(chunk))
            await put(chunk)
        end = _EOF
    finally:
        await put(end)
        if end is None:
            with contextlib.suppress(BaseException):
                await fut
    return await fut


def _same_filesystem(a: str, b: str) -> bool:
    try:
        return os.stat(a).st_dev == os.stat(b).st_dev
    except OSError:
        return False
