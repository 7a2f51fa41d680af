"""Where the client writes what a sandbox sends: one place that confines paths, bounds sizes and sanitises modes.

Everything a workspace returns (diff paths, archive members, file modes, sizes) is the tenant's, so promote,
`cp` and downloads write only through `Confined`:

- A path is relative, `/`-separated, without `.`, `..` or empty components, and none of its components is a
  spelling of `.git` on some filesystem (`is_dotgit`): folded the way macOS (HFS+/APFS: case, Unicode
  ignorables) and Windows (NTFS: case, trailing dots and spaces, `:stream`, the `GIT~1` short name) fold names,
  which is what git checks for itself (`is_hfs_dotgit`, `is_ntfs_dotgit` in git's path.c and utf8.c), plus NFKC
  so that fullwidth and compatibility forms count too, plus the simple case mappings that reach an ASCII letter
  which case folding misses (`.git` spelt with a DOTLESS I is `.GIT` on NTFS, which upper-cases it to I; with
  a CAPITAL I WITH DOT ABOVE it is `.git` to a simple lower-casing).
- Every directory is opened relative to its parent with O_NOFOLLOW (`dir_fd` walks), so a symbolic link
  anywhere below the target, existing or raced in, is refused instead of followed; missing parents are created
  the same way. Files are written to a temporary name in their directory and renamed into place.
- `Budget` counts members and bytes (declared sizes before anything is written, then the bytes as they come),
  so nothing is ever held whole in memory and a hostile size ends the copy with one clear line.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import secrets
import stat
import unicodedata
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Self

from shadow_operator.api.constants import BASELINE_EXCLUDE
from shadow_operator.sdk.errors import ShadowError, TooLarge, UnsafePath

DEFAULT_MAX_BYTES = 1 << 30  # 1 GiB: what one cp or promote may write unless the caller asks for more
DEFAULT_MAX_MEMBERS = 100_000
CHUNK = 256 * 1024

# Unicode's Default_Ignorable_Code_Point (DerivedCoreProperties.txt): invisible, and dropped in name lookups by
# HFS+ (git's list, U+200C..U+200F, U+202A..U+202E, U+206A..U+206F, U+FEFF, is a subset).
_IGNORABLE = re.compile(
    "[\u00ad\u034f\u061c\u115f\u1160\u17b4\u17b5\u180b-\u180f\u200b-\u200f\u202a-\u202e\u2060-\u206f"
    "\u3164\ufe00-\ufe0f\ufeff\uffa0\ufff0-\ufff8\U0001bca0-\U0001bca3\U0001d173-\U0001d17a"
    "\U000e0000-\U000e0fff]"
)
# Every non-ASCII code point whose simple upper or lower case is an ASCII letter: the set Python's `re` matches
# for [a-z] under IGNORECASE (tests/unit/test_sdk_confine.py recomputes it over all code points). casefold()
# already maps the long s and the Kelvin sign; it leaves the dotless i alone, and turns the dotted capital I into
# i + COMBINING DOT ABOVE, whereas NTFS's upcase table (simple mappings) and a simple lower-casing do not.
SIMPLE_CASE_TO_ASCII = {"\u0130": "i", "\u0131": "i", "\u017f": "s", "\u212a": "k"}
_SIMPLE_CASE = str.maketrans(SIMPLE_CASE_TO_ASCII)
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)


def fold(name: str) -> str:
    """The name a case-insensitive, Unicode-normalising filesystem would look up: ignorables dropped, NFKC,
    simple case mappings to ASCII, case-folded; then what Windows drops (anything from an NTFS stream's `:`,
    trailing dots and spaces)."""
    folded = _IGNORABLE.sub("", name)
    folded = unicodedata.normalize("NFKC", folded).translate(_SIMPLE_CASE)
    folded = unicodedata.normalize("NFKC", folded.casefold())
    folded = _IGNORABLE.sub("", folded).split(":", 1)[0]
    return folded.rstrip(". ")


def is_dotgit(name: str) -> bool:
    """`.git` as some filesystem would read this name (a backslash separates names on Windows)."""
    return any(fold(piece) in (".git", "git~1") for piece in name.split("\\"))


def check(rel: str) -> tuple[str, ...]:
    """The components of a path that stays inside its directory and out of every `.git`; else UnsafePath."""
    if not rel or "\0" in rel or rel.startswith("/"):
        raise UnsafePath(f"refusing {rel!r}: not a relative path")
    parts = tuple(rel.split("/"))
    for part in parts:
        if part in ("", ".", ".."):
            raise UnsafePath(f"refusing {rel!r}: '.', '..' and empty components are not allowed")
        if fold(part) in ("", ".", ".."):
            raise UnsafePath(f"refusing {rel!r}: {part!r} reads as {fold(part)!r} on some filesystems")
        if is_dotgit(part):
            raise UnsafePath(f"refusing {rel!r}: {part!r} is .git on case-insensitive filesystems")
    return parts


def is_safe(rel: str) -> bool:
    try:
        check(rel)
    except UnsafePath:
        return False
    return True


_UNDIFFED = frozenset(fold(d.rstrip("/")) for d in BASELINE_EXCLUDE)


def undiffed(rel: str) -> bool:
    """Whether a path lies in a directory no workspace baseline covers (`.git`, the runtime's own state,
    `__pycache__`), in any spelling: a workspace's diff lists such a path only if its baseline was tampered
    with, and a bytecode file there could run in place of its source, so nothing carries or promotes it."""
    return any(fold(part) in _UNDIFFED for part in rel.split("/")[:-1])


def safe_mode(mode: int) -> int:
    """The permissions a file from a sandbox gets here: its execute bits kept, never setuid, setgid or sticky,
    never writable by group or others, always readable and writable by its owner."""
    return (mode & 0o755) | 0o600


def number(value: object, base: int) -> int:
    """A size or an octal mode from a runtime's answer; 0 when it is not one (then only the bytes count)."""
    try:
        return max(int(str(value), base), 0)
    except ValueError:
        return 0


@dataclass
class Budget:
    """Members and bytes one copy may write; `TooLarge` (one line, with the option to raise) past either."""

    max_bytes: int = DEFAULT_MAX_BYTES
    max_members: int = DEFAULT_MAX_MEMBERS
    option: str = "--max-bytes"
    members: int = 0
    written: int = 0
    declared: int = field(default=0, repr=False)

    def member(self, name: str, declared_size: int) -> None:
        """Count one member by its declared size, before reading or writing any of it."""
        self.members += 1
        if self.members > self.max_members:
            raise TooLarge(
                f"refusing {name!r}: more than {self.max_members} entries",
                hint="raise the limit with --max-members if you trust the source",
            )
        self.declared += max(declared_size, 0)
        if self.declared > self.max_bytes:
            raise TooLarge(
                f"refusing {name!r}: it declares {declared_size} bytes, over the limit of {self.max_bytes} "
                "bytes in all",
                hint=f"raise the limit with {self.option} if you trust the source",
            )

    def take(self, name: str, n: int) -> None:
        """Count bytes as they arrive (a server may send more than it declared)."""
        self.written += n
        if self.written > self.max_bytes:
            raise TooLarge(
                f"refusing {name!r}: more than {self.max_bytes} bytes arrived",
                hint=f"raise the limit with {self.option} if you trust the source",
            )


class Confined:
    """A local directory that paths from a sandbox are written under, and never outside of.

    The root itself is the caller's choice (it may be reached through symbolic links); everything below it is
    walked with O_NOFOLLOW. Use as a context manager, or call `close()`.
    """

    def __init__(self, root: str | os.PathLike[str], *, create: bool = False) -> None:
        self.root = Path(root).expanduser().resolve()
        for part in self.root.parts:
            if is_dotgit(part):
                raise UnsafePath(f"refusing to write into {self.root}: it is inside a .git directory")
        if create:
            self.root.mkdir(parents=True, exist_ok=True)
        try:
            self.fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0))
        except OSError as exc:
            raise UnsafePath(f"{self.root} is not a directory ({exc.strerror})") from None

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextlib.contextmanager
    def _parent(self, rel: str, *, create: bool) -> Iterator[tuple[int | None, str]]:
        """(fd of the parent directory, last name); fd None when a parent is missing and not created."""
        parts = check(rel)
        fd = os.dup(self.fd)
        try:
            for i, part in enumerate(parts[:-1]):
                try:
                    nxt = os.open(part, _DIR_FLAGS, dir_fd=fd)
                except FileNotFoundError:
                    if not create:
                        os.close(fd)
                        fd = -1
                        yield None, parts[-1]
                        return
                    with contextlib.suppress(FileExistsError):
                        os.mkdir(part, 0o755, dir_fd=fd)
                    nxt = self._open_dir(fd, part, parts[: i + 1])
                except OSError as exc:
                    raise self._refused(rel, parts[: i + 1], exc) from None
                os.close(fd)
                fd = nxt
            yield fd, parts[-1]
        finally:
            if fd >= 0:
                os.close(fd)

    def _open_dir(self, fd: int, part: str, prefix: tuple[str, ...]) -> int:
        try:
            return os.open(part, _DIR_FLAGS, dir_fd=fd)
        except OSError as exc:
            raise self._refused("/".join(prefix), prefix, exc) from None

    def _refused(self, rel: str, prefix: tuple[str, ...], exc: OSError) -> UnsafePath:
        where = "/".join(prefix)
        if exc.errno in (errno.ELOOP, errno.ENOTDIR, errno.EMLINK):
            return UnsafePath(f"refusing {rel!r}: {self.root / where} is not a directory (a symbolic link?)")
        return UnsafePath(f"refusing {rel!r}: {self.root / where}: {exc.strerror}")

    @contextlib.contextmanager
    def _local(self, rel: str) -> Iterator[None]:
        """A local error (no space, a name this filesystem refuses) ends the copy with one line too."""
        try:
            yield
        except OSError as exc:
            raise ShadowError(
                f"cannot write {rel!r} under {self.root}: {exc.strerror or exc}", code="LocalWriteFailed"
            ) from None

    def mkdir(self, rel: str) -> None:
        with self._local(rel), self._parent(rel, create=True) as (fd, name):
            assert fd is not None
            with contextlib.suppress(FileExistsError):
                os.mkdir(name, 0o755, dir_fd=fd)
            os.close(self._open_dir(fd, name, check(rel)))  # a directory, not a link to one

    @contextlib.contextmanager
    def writer(self, rel: str, mode: int, budget: Budget) -> Iterator[_Writer]:
        """A file written under a temporary name and renamed over `rel` when the block ends without error."""
        with self._local(rel), self._parent(rel, create=True) as (fd, name):
            assert fd is not None
            with contextlib.suppress(FileNotFoundError):
                existing = os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode
                if not stat.S_ISREG(existing):
                    raise UnsafePath(
                        f"refusing {rel!r}: {self.root / rel} exists and is not a regular file",
                        hint="move it away and try again",
                    )
            tmp = f".{name[:64]}.{secrets.token_hex(4)}.partial"
            out = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600, dir_fd=fd)
            try:
                try:
                    yield _Writer(out, rel, budget)
                    os.fchmod(out, safe_mode(mode))
                finally:
                    os.close(out)
                os.replace(tmp, name, src_dir_fd=fd, dst_dir_fd=fd)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp, dir_fd=fd)
                raise

    def delete(self, rel: str) -> bool:
        """Remove a file or symbolic link (never followed), or an empty directory; False when nothing was."""
        with self._local(rel), self._parent(rel, create=False) as (fd, name):
            if fd is None:
                return False
            try:
                mode = os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode
                if stat.S_ISDIR(mode):
                    os.rmdir(name, dir_fd=fd)
                else:
                    os.unlink(name, dir_fd=fd)
            except (FileNotFoundError, OSError) as exc:
                if exc.errno in (errno.ENOENT, errno.ENOTEMPTY, errno.EEXIST):
                    return False  # gone, or a directory with local work in it: kept
                raise
            return True


class _Writer:
    """Where the bytes of one file go, counted against the copy's budget as they arrive."""

    def __init__(self, fd: int, rel: str, budget: Budget) -> None:
        self._fd = fd
        self._rel = rel
        self._budget = budget

    def write(self, data: bytes) -> None:
        self._budget.take(self._rel, len(data))
        view = memoryview(data)
        while view:
            view = view[os.write(self._fd, view) :]
