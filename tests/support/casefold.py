"""A case-folding filesystem for tests: where `.GIT` *is* `.git`, as on the default macOS and Windows disks.

Tried in order, each checked by creating `Probe` and finding it as `pROBE`:
1. ext4 with the `casefold` feature, loop-mounted, a `chattr +F` directory (needs root, loop devices, and a
   kernel built with CONFIG_UNICODE; loop device nodes are made with mknod when /dev lacks them, as
   hack/kind/snapshots.sh does for the XFS image).
2. NTFS (the Windows filesystem) through ntfs-3g's `lowntfs-3g -o ignore_case` (FUSE, no kernel caching of names): case-insensitive
   lookups with NTFS's own upcase table, symbolic links supported (needs /dev/fuse and the ntfs-3g package).
`Unavailable` says why neither worked.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

SIZE = 512 << 20


class Unavailable(Exception):
    pass


def _run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, check=False, timeout=120)


def _folds(directory: Path) -> bool:
    probe = directory / "Probe"
    probe.write_text("x")
    try:
        return (directory / "pROBE").exists()
    finally:
        probe.unlink()


def _loop_devices() -> None:
    if not os.path.exists("/dev/loop-control"):
        os.mknod("/dev/loop-control", 0o660 | 0o020000, os.makedev(10, 237))
    for i in range(8):
        if not os.path.exists(f"/dev/loop{i}"):
            os.mknod(f"/dev/loop{i}", 0o660 | 0o060000, os.makedev(7, i))


@contextlib.contextmanager
def _ext4(work: Path) -> Iterator[Path]:
    if os.geteuid() != 0 or not shutil.which("mkfs.ext4") or not shutil.which("chattr"):
        raise Unavailable("ext4 casefold: needs root, mkfs.ext4 and chattr (e2fsprogs)")
    image, mnt = work / "casefold.ext4", work / "ext4"
    mnt.mkdir()
    with open(image, "wb") as fh:
        fh.truncate(SIZE)
    made = _run("mkfs.ext4", "-q", "-F", "-O", "casefold", "-E", "encoding=utf8", str(image))
    if made.returncode != 0:
        raise Unavailable(f"mkfs.ext4 -O casefold: {made.stderr.strip()}")
    with contextlib.suppress(OSError):
        _loop_devices()
    mounted = _run("mount", "-o", "loop", str(image), str(mnt))
    if mounted.returncode != 0:
        raise Unavailable(
            f"ext4 casefold: mount refused ({mounted.stderr.strip().splitlines()[0] if mounted.stderr else ''}; "
            "a kernel without CONFIG_UNICODE cannot mount it)"
        )
    try:
        folded = mnt / "folded"
        folded.mkdir()
        flag = _run("chattr", "+F", str(folded))
        if flag.returncode != 0 or not _folds(folded):
            raise Unavailable(f"ext4 casefold: chattr +F did not fold ({flag.stderr.strip()})")
        yield folded
    finally:
        _run("umount", str(mnt))


@contextlib.contextmanager
def _ntfs(work: Path) -> Iterator[Path]:
    if not shutil.which("mkntfs") or not shutil.which("lowntfs-3g") or not os.path.exists("/dev/fuse"):
        raise Unavailable("NTFS: needs mkntfs and lowntfs-3g (Debian package ntfs-3g) and /dev/fuse")
    image, mnt = work / "casefold.ntfs", work / "ntfs"
    mnt.mkdir()
    with open(image, "wb") as fh:
        fh.truncate(SIZE)
    made = _run("mkntfs", "-F", "-f", "-q", str(image))
    if made.returncode != 0:
        raise Unavailable(f"mkntfs: {made.stderr.strip()}")
    # The kernel's dentry cache compares names exactly: cached entries would let `link` outlive an unlink of
    # `LINK`. Zero timeouts make every lookup ask the filesystem, which folds.
    options = "ignore_case,permissions,entry_timeout=0,negative_timeout=0,attr_timeout=0"
    mounted = _run("lowntfs-3g", "-o", options, str(image), str(mnt))
    if mounted.returncode != 0:
        raise Unavailable(f"lowntfs-3g -o ignore_case: {mounted.stderr.strip()}")
    try:
        if not _folds(mnt):
            raise Unavailable("lowntfs-3g -o ignore_case did not fold case")
        yield mnt
    finally:
        _run("fusermount3", "-u", str(mnt)) if shutil.which("fusermount3") else _run("umount", str(mnt))


@contextlib.contextmanager
def mounted(work: Path) -> Iterator[tuple[Path, str]]:
    """(a case-folding directory, which filesystem it is); Unavailable with every reason otherwise."""
    reasons = []
    for name, mount in (("ext4 casefold (loop)", _ext4), ("NTFS ignore_case (lowntfs-3g)", _ntfs)):
        try:
            with mount(work) as directory:
                yield directory, name
                return
        except Unavailable as exc:
            reasons.append(str(exc))
    raise Unavailable("; ".join(reasons))
