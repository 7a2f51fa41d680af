"""Workspace baseline and diff.

A baseline is a manifest (path -> type, size, mtime_ns, mode) plus a pack file holding the content of
every file up to SNAPSHOT_LIMIT (one sequential file instead of thousands of copies, so capture is cheap)
and a SHA-256 for larger ones. The diff walks the tree once; files whose size and mtime match the manifest
are taken as unchanged without reading them (git's stat-cache rule), so the cost on a big tree is one
lstat per file.
"""

from __future__ import annotations

import difflib
import fnmatch
import hashlib
import json
import os
import shutil
import stat as st
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

SNAPSHOT_LIMIT = 1 << 20
SNAPSHOT_TOTAL = 2 << 30
PATCH_LIMIT = 8 << 20
DEFAULT_EXCLUDE = ["node_modules/", ".git/"]


class Excluder:
    """gitignore-flavoured: `name/` prunes directories with that name (or that path), others fnmatch."""

    def __init__(self, patterns: list[str]) -> None:
        self.dirs = [p.rstrip("/") for p in patterns if p.endswith("/")]
        self.globs = [p for p in patterns if not p.endswith("/")]

    def _match(self, pats: list[str], rel: str) -> bool:
        if not pats:  # the common case (only directory excludes) costs nothing per file
            return False
        name = rel.rsplit("/", 1)[-1]
        return any(fnmatch.fnmatchcase(rel, p) or fnmatch.fnmatchcase(name, p) for p in pats)

    def skip_dir(self, rel: str) -> bool:
        return self._match(self.dirs, rel) or self._match(self.globs, rel)

    def skip_file(self, rel: str) -> bool:
        return self._match(self.globs, rel)


def scan(top: str, excluder: Excluder, prefix: str = "") -> Iterator[tuple[str, os.DirEntry[str]]]:
    """Yield (relative path, entry) for every non-directory under top, never following symlinks."""
    stack = [(top, prefix)]
    while stack:
        d, rel_d = stack.pop()
        try:
            it = os.scandir(d)
        except OSError:
            continue
        with it:
            for e in it:
                rel = f"{rel_d}{e.name}"
                try:
                    is_dir = e.is_dir(follow_symlinks=False)
                except OSError:
                    continue
                if is_dir:
                    if not excluder.skip_dir(rel):
                        stack.append((e.path, rel + "/"))
                elif not excluder.skip_file(rel):
                    yield rel, e


@dataclass
class Manifest:
    created_at: float
    exclude: list[str]
    # rel -> [kind ("f"|"l"|"o"), size, mtime_ns, mode, pack offset (-1 if none), pack length, sha256 or ""]
    files: dict[str, list[Any]] = field(default_factory=dict)
    snapshot_bytes: int = 0


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


class Baselines:
    def __init__(self, root: str, state_dir: str) -> None:
        self.root = root
        self.dir = os.path.join(state_dir, "baseline")
        self._cache: tuple[float, Manifest] | None = None
        state_rel = os.path.relpath(state_dir, root)
        self.always_exclude = [state_rel.rstrip("/") + "/"] if not state_rel.startswith("..") else []

    def capture(self, exclude: list[str] | None) -> Manifest:
        patterns = list(DEFAULT_EXCLUDE if exclude is None else exclude)
        excluder = Excluder(patterns + self.always_exclude)
        tmp = self.dir + ".new"
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(tmp)
        man = Manifest(created_at=time.time(), exclude=patterns)
        with open(os.path.join(tmp, "pack"), "wb") as pack:
            for rel, e in scan(self.root, excluder):
                try:
                    s = e.stat(follow_symlinks=False)
                    row = self._snapshot(e.path, s, pack, man)
                except OSError:
                    continue  # vanished or unreadable while we walked; the diff will report it as added
                man.files[rel] = row
        with open(os.path.join(tmp, "manifest.json"), "w", encoding="utf-8") as fh:
            json.dump(
                {
                    "created_at": man.created_at,
                    "exclude": man.exclude,
                    "files": man.files,
                    "snapshot_bytes": man.snapshot_bytes,
                },
                fh,
                separators=(",", ":"),
            )
        old = self.dir + ".old"
        shutil.rmtree(old, ignore_errors=True)
        if os.path.exists(self.dir):
            os.rename(self.dir, old)
        os.rename(tmp, self.dir)
        shutil.rmtree(old, ignore_errors=True)
        # Keep the fresh manifest: the first diff then skips re-reading a JSON file of every path.
        self._cache = (os.stat(os.path.join(self.dir, "manifest.json")).st_mtime, man)
        return man

    def _snapshot(self, path: str, s: os.stat_result, pack: Any, man: Manifest) -> list[Any]:
        mode = st.S_IMODE(s.st_mode)
        if st.S_ISLNK(s.st_mode):
            data = os.fsencode(os.readlink(path))
            off = pack.tell()
            pack.write(data)
            man.snapshot_bytes += len(data)
            return ["l", len(data), s.st_mtime_ns, mode, off, len(data), ""]
        if not st.S_ISREG(s.st_mode):
            return ["o", 0, s.st_mtime_ns, mode, -1, 0, ""]
        if s.st_size <= SNAPSHOT_LIMIT and man.snapshot_bytes + s.st_size <= SNAPSHOT_TOTAL:
            with open(path, "rb") as fh:
                data = fh.read()
            off = pack.tell()
            pack.write(data)
            man.snapshot_bytes += len(data)
            return ["f", len(data), s.st_mtime_ns, mode, off, len(data), ""]
        return ["f", s.st_size, s.st_mtime_ns, mode, -1, 0, _sha256(path)]

    def load(self) -> Manifest | None:
        path = os.path.join(self.dir, "manifest.json")
        try:
            mtime = os.stat(path).st_mtime
        except FileNotFoundError:
            return None
        if self._cache and self._cache[0] == mtime:
            return self._cache[1]
        with open(path, encoding="utf-8") as fh:
            raw = json.load(fh)
        man = Manifest(raw["created_at"], raw["exclude"], raw["files"], raw.get("snapshot_bytes", 0))
        self._cache = (mtime, man)
        return man

    def diff(self, man: Manifest, *, patch: bool, paths_only: bool = False) -> dict[str, Any]:
        excluder = Excluder(man.exclude + self.always_exclude)
        seen: set[str] = set()
        added: list[str] = []
        modified: list[str] = []
        with open(os.path.join(self.dir, "pack"), "rb") as pack:
            pfd = pack.fileno()
            for rel, e in scan(self.root, excluder):
                seen.add(rel)
                row = man.files.get(rel)
                if row is None:
                    added.append(rel)
                    continue
                try:
                    s = e.stat(follow_symlinks=False)
                except OSError:
                    seen.discard(rel)
                    continue
                kind = "l" if st.S_ISLNK(s.st_mode) else ("f" if st.S_ISREG(s.st_mode) else "o")
                same_stat = (
                    kind == row[0] and s.st_mtime_ns == row[2] and (kind != "f" or s.st_size == row[1])
                )
                if same_stat and st.S_IMODE(s.st_mode) == row[3]:
                    continue
                if self._content_changed(e.path, kind, s, row, pfd) or st.S_IMODE(s.st_mode) != row[3]:
                    modified.append(rel)
            deleted = sorted(set(man.files) - seen)
            added.sort()
            modified.sort()
            out_files = []
            patches: list[str] = []
            budget = [PATCH_LIMIT]
            for status, names in (("added", added), ("modified", modified), ("deleted", deleted)):
                for rel in names:
                    binary, size = False, None
                    if not paths_only:
                        old = self._old(man.files.get(rel), pfd) if status != "added" else b""
                        new = self._new(rel) if status != "deleted" else b""
                        size = None if new is None else len(new)
                        binary = _is_binary(old) or _is_binary(new)
                        if patch:
                            patches.append(_patch(rel, status, old, new, binary, budget))
                    out_files.append({"path": rel, "status": status, "binary": binary, "size": size})
        result: dict[str, Any] = {
            "baseline_created_at": man.created_at,
            "added": added,
            "modified": modified,
            "deleted": deleted,
            "files": out_files,
        }
        if patch:
            result["patch"] = "".join(patches)
        return result

    def _content_changed(self, path: str, kind: str, s: os.stat_result, row: list[Any], pfd: int) -> bool:
        if kind != row[0]:
            return True
        try:
            if kind == "l":
                return os.fsencode(os.readlink(path)) != os.pread(pfd, row[5], row[4])
            if kind != "f" or s.st_size != row[1]:
                return kind != "o"
            if row[4] >= 0:
                with open(path, "rb") as fh:
                    return fh.read() != os.pread(pfd, row[5], row[4])
            return bool(_sha256(path) != row[6])
        except OSError:
            return True

    @staticmethod
    def _old(row: list[Any] | None, pfd: int) -> bytes | None:
        if row is None or row[4] < 0:
            return None
        return os.pread(pfd, row[5], row[4])

    def _new(self, rel: str) -> bytes | None:
        path = os.path.join(self.root, rel)
        try:
            if os.path.islink(path):
                return os.fsencode(os.readlink(path))
            if os.path.getsize(path) > SNAPSHOT_LIMIT:
                return None
            with open(path, "rb") as fh:
                return fh.read()
        except OSError:
            return None


def _is_binary(data: bytes | None) -> bool:
    if data is None:
        return False
    if b"\x00" in data[:8192]:
        return True
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return True
    return False


def _patch(
    rel: str, status: str, old: bytes | None, new: bytes | None, binary: bool, budget: list[int]
) -> str:
    a = "/dev/null" if status == "added" else f"a/{rel}"
    b = "/dev/null" if status == "deleted" else f"b/{rel}"
    if binary:
        return f"diff --git a/{rel} b/{rel}\nBinary files {a} and {b} differ\n"
    if old is None or new is None or budget[0] <= 0:
        return f"diff --git a/{rel} b/{rel}\n# {rel}: too large for a text patch\n"
    lines = difflib.unified_diff(
        old.decode().splitlines(keepends=True),
        new.decode().splitlines(keepends=True),
        fromfile=a,
        tofile=b,
    )
    body = "".join(
        line if line.endswith("\n") else line + "\n\\ No newline at end of file\n" for line in lines
    )
    budget[0] -= len(body)
    # git needs the mode line to accept /dev/null sides (`git apply` then creates or removes the file).
    extra = {"added": "new file mode 100644\n", "deleted": "deleted file mode 100644\n"}.get(status, "")
    return f"diff --git a/{rel} b/{rel}\n{extra}{body}"
