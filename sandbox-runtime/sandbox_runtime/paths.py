"""Confinement of client-supplied paths to the workspace root.

Every path a client sends is relative to the root. We refuse rather than normalise: `..` segments,
absolute paths, NUL and other control bytes, and any path whose resolution (following symlinks that
already exist, including ones a command created) lands outside the root.
"""

from __future__ import annotations

import errno
import os
from dataclasses import dataclass

from .errors import ApiError, bad_request, forbidden


@dataclass(frozen=True)
class Resolved:
    rel: str  # normalised relative path, "" for the root itself
    path: str  # absolute path inside the root, symlinks resolved


class Root:
    def __init__(self, root: str) -> None:
        self.real = os.path.realpath(root)
        self._prefix = self.real.rstrip("/") + "/"

    def contains(self, real: str) -> bool:
        return real == self.real or real.startswith(self._prefix)

    def normalise(self, raw: str, *, allow_root: bool = True) -> str:
        if "\x00" in raw:
            raise bad_request("path contains a NUL byte")
        if any(ord(c) < 0x20 for c in raw):
            raise bad_request("path contains control characters")
        if raw.startswith("/"):
            raise forbidden(f"absolute paths are not allowed: {raw!r}; paths are relative to the workspace")
        parts = [p for p in raw.split("/") if p not in ("", ".")]
        if ".." in parts:
            raise forbidden(f"path escapes the workspace: {raw!r}")
        rel = "/".join(parts)
        if not rel and not allow_root:
            raise bad_request("path must name an entry inside the workspace, not the workspace itself")
        return rel

    def resolve(self, raw: str, *, allow_root: bool = True) -> Resolved:
        """Resolve an existing-or-not path, refusing anything that lands outside the root."""
        rel = self.normalise(raw, allow_root=allow_root)
        joined = os.path.join(self.real, rel) if rel else self.real
        real = os.path.realpath(joined)
        if not self.contains(real):
            raise forbidden(f"path escapes the workspace through a symlink: {raw!r}")
        return Resolved(rel, real)

    def resolve_for_write(self, raw: str) -> Resolved:
        """Like resolve, but the last component must not be a symlink (we replace entries, never follow)."""
        res = self.resolve(raw, allow_root=False)
        joined = os.path.join(self.real, res.rel)
        if os.path.islink(joined):
            raise forbidden(f"refusing to write through a symlink: {raw!r}")
        return Resolved(res.rel, joined)

    def resolve_entry(self, raw: str) -> Resolved:
        """The entry itself (a symlink is not followed): its parent must resolve inside the root.

        Used to delete or move a symlink that points outside, which touches only the link.
        """
        rel = self.normalise(raw, allow_root=False)
        parent, _, name = rel.rpartition("/")
        parent_real = os.path.realpath(os.path.join(self.real, parent)) if parent else self.real
        if not self.contains(parent_real):
            raise forbidden(f"path escapes the workspace through a symlink: {raw!r}")
        return Resolved(rel, os.path.join(parent_real, name))

    def relative(self, real: str) -> str:
        if real == self.real:
            return ""
        return real[len(self._prefix) :]

    def check_entry(self, abspath: str) -> bool:
        """True if a directory entry (maybe a symlink) stays inside the root when followed."""
        return self.contains(os.path.realpath(abspath))


# errno → (HTTP status, error code, message suffix); anything else is a 400 with the system's message.
_OS_ERRORS: dict[int, tuple[int, str, str]] = {
    errno.ENOENT: (404, "NOT_FOUND", "no such file or directory"),
    errno.EACCES: (403, "PERMISSION_DENIED", "permission denied"),
    errno.EPERM: (403, "PERMISSION_DENIED", "permission denied"),
    errno.ENOTEMPTY: (409, "CONFLICT", "directory not empty"),
    errno.EISDIR: (409, "CONFLICT", "is a directory"),
    errno.ENOTDIR: (409, "CONFLICT", "not a directory"),
    errno.EEXIST: (409, "CONFLICT", "already exists"),
    errno.ENOSPC: (507, "RESOURCE_EXHAUSTED", "no space left on device"),
    errno.ENAMETOOLONG: (400, "INVALID_ARGUMENT", "name too long"),
}


def map_os_error(err: OSError, what: str) -> ApiError:
    status, code, text = _OS_ERRORS.get(
        err.errno or 0, (400, "FAILED_PRECONDITION", os.strerror(err.errno or 0))
    )
    return ApiError(status, code, f"{what}: {text}")
