"""Filesystem operations on confined paths: listing, stat, atomic writes, moves, deletes."""

from __future__ import annotations

import contextlib
import fnmatch
import os
import shutil
import stat as st
import tempfile
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

from .errors import ApiError, conflict, not_found
from .paths import Resolved, Root, map_os_error


def iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat().replace("+00:00", "Z")


def kind(mode: int) -> str:
    if st.S_ISDIR(mode):
        return "directory"
    if st.S_ISREG(mode):
        return "file"
    if st.S_ISLNK(mode):
        return "symlink"
    return "other"


def entry_stat(root: Root, abspath: str) -> os.stat_result:
    """Stat an entry, following a symlink only when its target stays inside the root."""
    lst = os.lstat(abspath)
    if st.S_ISLNK(lst.st_mode) and root.check_entry(abspath):
        with contextlib.suppress(OSError):
            return os.stat(abspath)
    return lst


def describe(root: Root, abspath: str, name: str, s: os.stat_result | None = None) -> dict[str, Any]:
    s = s or entry_stat(root, abspath)
    return {
        "name": name,
        "path": root.relative(abspath) if not os.path.islink(abspath) else _rel_join(root, abspath),
        "type": kind(s.st_mode),
        "size": s.st_size,
        "mode": f"0{st.S_IMODE(s.st_mode):03o}",
        "modified_at": iso(s.st_mtime),
        "mtime": s.st_mtime,
    }


def _rel_join(root: Root, abspath: str) -> str:
    parent = os.path.realpath(os.path.dirname(abspath))
    return os.path.join(root.relative(parent), os.path.basename(abspath)).lstrip("/")


def stat_path(root: Root, res: Resolved) -> os.stat_result:
    try:
        return os.stat(res.path)
    except OSError as err:
        raise map_os_error(err, res.rel or ".") from None


def list_dir(root: Root, res: Resolved) -> list[dict[str, Any]]:
    try:
        with os.scandir(res.path) as it:
            entries = sorted(it, key=lambda e: e.name)
    except NotADirectoryError:
        raise conflict(f"not a directory: {res.rel}") from None
    except OSError as err:
        raise map_os_error(err, res.rel or ".") from None
    out = []
    for e in entries:
        with contextlib.suppress(FileNotFoundError):
            out.append(describe(root, e.path, e.name))
    return out


def walk(
    root: Root,
    base: str,
    *,
    depth: int | None = None,
    hidden: bool = True,
    prune: frozenset[str] = frozenset(),
) -> Iterator[tuple[os.DirEntry[str], int]]:
    """Depth-first walk that never follows symlinked directories (so it cannot leave the root)."""
    stack: list[tuple[str, int]] = [(base, 1)]
    while stack:
        d, level = stack.pop()
        try:
            with os.scandir(d) as it:
                items = sorted(it, key=lambda e: e.name, reverse=True)
        except OSError:
            continue
        subdirs = []
        for e in reversed(items):
            if not hidden and e.name.startswith("."):
                continue
            yield e, level
            if e.is_dir(follow_symlinks=False) and e.name not in prune and (depth is None or level < depth):
                subdirs.append((e.path, level + 1))
        stack.extend(reversed(subdirs))


def list_files(root: Root, base: str, prune: frozenset[str]) -> list[str]:
    """Every file under `base` (and symlink to one inside the root), relative to the root and sorted;
    directories named in `prune` are not entered."""
    out = []
    for e, _ in walk(root, base, prune=prune):
        if e.name in prune and e.is_dir(follow_symlinks=False):
            continue
        if e.is_file(follow_symlinks=False) or (e.is_symlink() and root.check_entry(e.path)):
            if os.path.isdir(e.path):
                continue
            out.append(root.relative(e.path))
    out.sort()
    return out


def list_tree(
    root: Root, res: Resolved, *, depth: int, glob: str | None, hidden: bool, files_only: bool = False
) -> list[dict[str, Any]]:
    if not os.path.isdir(res.path):
        if os.path.exists(res.path):
            raise conflict(f"not a directory: {res.rel}")
        raise not_found(f"no such directory: {res.rel or '.'}")
    out = []
    for e, _level in walk(root, res.path, depth=depth if depth > 0 else None, hidden=hidden):
        rel = root.relative(e.path)
        if glob and not (fnmatch.fnmatch(rel, glob) or fnmatch.fnmatch(e.name, glob)):
            continue
        try:
            info = describe(root, e.path, e.name)
        except FileNotFoundError:
            continue
        if files_only and info["type"] == "directory":
            continue
        info["path"] = rel
        out.append(info)
    return out


def parse_mode(mode: str | None, default: int = 0o644) -> int:
    if mode is None or mode == "":
        return default
    if not (len(mode) in (3, 4) and all(c in "01234567" for c in mode)):
        raise ApiError(400, "INVALID_ARGUMENT", f"mode must be octal like 0644, got {mode!r}")
    return int(mode, 8)


class AtomicWriter:
    """Writes into a temp file beside the destination and renames it into place on commit."""

    def __init__(self, root: Root, raw: str, mode: int = 0o644) -> None:
        self.res = root.resolve_for_write(raw)
        self.mode = mode
        parent = os.path.dirname(self.res.path)
        try:
            os.makedirs(parent, exist_ok=True)
        except FileExistsError:
            raise conflict(f"a parent of {self.res.rel!r} is not a directory") from None
        except OSError as err:
            raise map_os_error(err, self.res.rel) from None
        # The parent may have been created through a symlink that appeared meanwhile; re-check.
        if not root.contains(os.path.realpath(parent)):
            raise ApiError(403, "PERMISSION_DENIED", f"path escapes the workspace: {raw!r}")
        if os.path.isdir(self.res.path):
            raise conflict(f"is a directory: {self.res.rel}")
        try:
            self.fd, self.tmp = tempfile.mkstemp(prefix=".sr-upload-", dir=parent)
        except OSError as err:
            raise map_os_error(err, self.res.rel) from None
        self.size = 0
        self.closed = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        view = memoryview(data)
        while view:
            n = os.write(self.fd, view)
            view = view[n:]
            self.size += n

    def writev(self, parts: list[bytes | memoryview]) -> None:
        """Write buffers with as few syscalls as possible and no joining copy."""
        views = [memoryview(p) for p in parts if len(p)]
        while views:
            n = os.writev(self.fd, views[:1024])  # IOV_MAX
            self.size += n
            while n and views:
                if n >= len(views[0]):
                    n -= len(views[0])
                    views.pop(0)
                else:
                    views[0] = views[0][n:]
                    n = 0

    def commit(self) -> None:
        os.fchmod(self.fd, self.mode)
        os.close(self.fd)
        self.closed = True
        try:
            os.rename(self.tmp, self.res.path)
        except OSError as err:
            self.abort()
            raise map_os_error(err, self.res.rel) from None

    def abort(self) -> None:
        if not self.closed:
            os.close(self.fd)
            self.closed = True
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.tmp)


def delete(res: Resolved, recursive: bool) -> None:
    path = res.path
    try:
        lst = os.lstat(path)
        if st.S_ISDIR(lst.st_mode):
            if recursive:
                shutil.rmtree(path)
            else:
                os.rmdir(path)
        else:
            os.unlink(path)
    except OSError as err:
        raise map_os_error(err, res.rel) from None


def move(root: Root, src: str, dst: str, overwrite: bool) -> tuple[str, str]:
    s = root.resolve_entry(src)  # move the entry itself, never a symlink's target
    d = root.resolve_for_write(dst)
    if not os.path.lexists(s.path):
        raise not_found(f"no such file or directory: {s.rel}")
    src_path = s.path
    if os.path.lexists(d.path) and not overwrite:
        raise conflict(f"destination exists: {d.rel} (set overwrite=true)")
    if d.path == src_path or d.path.startswith(src_path.rstrip("/") + "/"):
        raise ApiError(400, "INVALID_ARGUMENT", "cannot move a directory into itself")
    try:
        os.makedirs(os.path.dirname(d.path), exist_ok=True)
        os.replace(src_path, d.path)
    except OSError as err:
        raise map_os_error(err, f"{s.rel} -> {d.rel}") from None
    return s.rel, d.rel


def mkdir(root: Root, raw: str, parents: bool, mode: int) -> str:
    res = root.resolve_for_write(raw)
    try:
        if parents:
            os.makedirs(res.path, mode=mode, exist_ok=True)
        else:
            os.mkdir(res.path, mode)
    except OSError as err:
        raise map_os_error(err, res.rel) from None
    if not root.contains(os.path.realpath(res.path)):
        raise ApiError(403, "PERMISSION_DENIED", f"path escapes the workspace: {raw!r}")
    return res.rel
