"""Downloads from a workspace or sandbox (`shadowctl cp NAME:PATH ...`): streamed, bounded, confined.

A directory arrives as a tar.gz stream from the runtime (`GET /v1/archive/...`); it is read as a stream
(`tarfile` in `r|` mode over a gzip reader over the HTTP body), one member at a time, so memory stays near one
piece however large the archive. Every member is counted by its declared size before it is written (sparse
members by their expanded size), headers are bounded too, and only regular files and directories are written,
through `confine.Confined`: no `.git` in any spelling, no symbolic links followed, no setuid bits.
"""

from __future__ import annotations

import gzip
import io
import tarfile
import zlib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import httpx

from shadow_operator.sdk import confine, kube, runtime
from shadow_operator.sdk.errors import TooLarge, UnsafePath

# What tarfile may read between two members beyond the data it skips: headers, PAX records, long names.
HEADER_BYTES = 1 << 20
_SLACK = 4 * tarfile.RECORDSIZE  # tarfile reads its input a record at a time


class _Chunks(io.RawIOBase):
    """A readable file over an iterator of byte strings (an HTTP body as it arrives)."""

    def __init__(self, chunks: Iterable[bytes]) -> None:
        self._chunks = iter(chunks)
        self._left = memoryview(b"")

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while not self._left:
            piece = next(self._chunks, None)
            if piece is None:
                return 0
            self._left = memoryview(piece)
        n = min(len(buffer), len(self._left))
        buffer[:n] = self._left[:n]
        self._left = self._left[n:]
        return n


class _Metered(io.RawIOBase):
    """The decompressed tar stream, with a ceiling on what may be read before the next check: a gzip bomb or
    a header that declares gigabytes ends with TooLarge instead of filling memory or the disk."""

    def __init__(self, source: io.BufferedIOBase) -> None:
        self._source = source
        self.count = 0
        self.ceiling = HEADER_BYTES

    def readable(self) -> bool:
        return True

    def allow(self, n: int) -> None:
        self.ceiling = self.count + n + _SLACK

    def readinto(self, buffer: Any) -> int:
        room = self.ceiling - self.count
        if room <= 0:
            raise TooLarge("refusing the archive: a header or member is larger than it declares")
        data = self._source.read(min(len(buffer), room))
        buffer[: len(data)] = data
        self.count += len(data)
        return len(data)


def extract(chunks: Iterable[bytes], target: str | Path, budget: confine.Budget | None = None) -> int:
    """Write the regular files and directories of a tar.gz stream under `target` (created if missing);
    returns the number of files. Symbolic links, hard links and devices are skipped (they could point
    anywhere); the first unsafe path or the first size past the budget stops it (UnsafePath, TooLarge), and
    what was written before stays (inside `target`)."""
    budget = budget or confine.Budget()
    metered = _Metered(gzip.GzipFile(fileobj=io.BufferedReader(_Chunks(chunks), confine.CHUNK), mode="rb"))
    with confine.Confined(target, create=True) as dest:
        try:
            with tarfile.open(fileobj=io.BufferedReader(metered, tarfile.RECORDSIZE), mode="r|") as tar:
                return _members(tar, metered, dest, budget)
        except (tarfile.TarError, gzip.BadGzipFile, EOFError, zlib.error) as exc:
            raise UnsafePath(f"refusing the archive: it is not a whole tar.gz ({exc})") from None


def _members(tar: tarfile.TarFile, metered: _Metered, dest: confine.Confined, budget: confine.Budget) -> int:
    files = 0
    skip = 0  # what tarfile will read past before the next header: data not read here, padding
    while True:
        metered.allow(skip + HEADER_BYTES)
        member = tar.next()
        if member is None:
            return files
        budget.member(member.name, member.size)
        name = member.name.rstrip("/")
        skip = member.size + tarfile.BLOCKSIZE
        if name in ("", "."):
            continue  # the directory itself
        if member.isdir():
            dest.mkdir(name)
        elif member.isreg():
            metered.allow(member.size + tarfile.BLOCKSIZE)
            reader = tar.extractfile(member)
            assert reader is not None
            with dest.writer(name, member.mode, budget) as out:
                while data := reader.read(confine.CHUNK):
                    out.write(data)
            files += 1
            skip = tarfile.BLOCKSIZE
        else:
            confine.check(name)  # links and devices are skipped, but a hostile name still ends the copy


def download_dir(
    http: httpx.Client,
    ep: runtime.RuntimeEndpoint,
    remote: str,
    local: str | Path,
    budget: confine.Budget | None = None,
) -> int:
    """Stream the workspace directory `remote` into `local`; returns the number of files written."""
    call = runtime.archive_call(ep, remote)
    with http.stream("GET", call.path, headers=dict(call.headers), timeout=300.0) as response:
        if not response.is_success:
            response.read()
            raise kube.error_of(response, call)
        return extract(response.iter_bytes(), local, budget)


def download_file(
    http: httpx.Client,
    ep: runtime.RuntimeEndpoint,
    remote: str,
    local: str | Path,
    mode: int,
    budget: confine.Budget | None = None,
) -> Path:
    """Stream one workspace file to the local path `local` (its directory must exist), under the budget."""
    budget = budget or confine.Budget()
    target = Path(local).expanduser()
    budget.member(remote, 0)
    with confine.Confined(target.parent) as dest, dest.writer(target.name, mode, budget) as out:
        kube.run(http, runtime.read_into(ep, remote, out.write))
    return target
