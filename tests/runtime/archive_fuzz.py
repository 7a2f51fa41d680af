"""Archive-import fuzz (proof 2), stdlib only so any interpreter runs it: seeded sequences of 1-6 tar
members (files, directories, symlinks, hard links; names in every spelling) extracted in-process by
`sandbox_runtime.archive.extract_archive` into a destination that sits inside a sentinel tree.

    python archive_fuzz.py --seed 1 --count 10000 --workdir DIR   -> one JSON summary line

Checked per sequence: the sentinel tree (everything outside the destination) is unchanged; a refused
archive leaves the destination unchanged; an accepted one writes nothing an exclude matches (whatever the
member's spelling), no symlink that resolves outside the destination, no hard link to an outside file;
no staging directory is left behind. test_archive_fuzz.py runs it on Debian's python3 and the venv's.
"""

from __future__ import annotations

import argparse
import fnmatch
import io
import json
import os
import random
import shutil
import sys
import tarfile
import time
from typing import Any

from sandbox_runtime.archive import STAGING_PREFIX, ImportLimits, extract_archive
from sandbox_runtime.errors import ApiError

SEGMENTS = ["a", "b", "d", "x.txt", ".git", "up", "far", "in", "keep", ".", "..", ""]
TARGETS = ["..", ".", "a", "b", "d", "in", "up", "far", "x.txt", ".git", "keep", "d/f.txt"]
EXCLUDES = [".git/", "a/", "*.txt"]


def build_tree(base: str) -> str:
    """base/{secret.txt, other/s.txt, root/{sibling.txt, dest/{keep, d/f.txt, up->.., far->../.., in->d}}}"""
    os.makedirs(os.path.join(base, "other"))
    os.makedirs(os.path.join(base, "root", "dest", "d"))
    for rel, text in [("secret.txt", "outside"), ("other/s.txt", "s"), ("root/sibling.txt", "sib")]:
        with open(os.path.join(base, rel), "w") as fh:
            fh.write(text)
    dest = os.path.join(base, "root", "dest")
    for rel, text in [("keep", "keep"), ("d/f.txt", "f")]:
        with open(os.path.join(dest, rel), "w") as fh:
            fh.write(text)
    os.symlink("..", os.path.join(dest, "up"))
    os.symlink("../..", os.path.join(dest, "far"))
    os.symlink("d", os.path.join(dest, "in"))
    return dest


def snapshot(top: str, skip: str | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for dirpath, dirnames, filenames in os.walk(top):
        if skip is not None:
            dirnames[:] = [n for n in dirnames if os.path.join(dirpath, n) != skip]
        for name in dirnames + filenames:
            p = os.path.join(dirpath, name)
            st = os.lstat(p)
            rel = os.path.relpath(p, top)
            if os.path.islink(p):
                out[rel] = ("link", os.readlink(p))
            elif os.path.isdir(p):
                out[rel] = ("dir", st.st_mode)
            else:
                with open(p, "rb") as fh:
                    out[rel] = ("file", st.st_mode, st.st_dev, st.st_ino, fh.read())
    return out


def random_path(rng: random.Random, pool: list[str]) -> str:
    # `..` rarer than the other segments, so that about half of the archives are accepted.
    weights = [0.25 if s == ".." else 1.0 for s in pool]
    path = "/".join(rng.choices(pool, weights)[0] for _ in range(rng.randint(1, 3)))
    r = rng.random()
    if r < 0.2:
        path = "./" + path
    elif r < 0.23:
        path = "/" + path
    if rng.random() < 0.1:
        path += "/"
    return path


def random_archive(rng: random.Random, base: str) -> tuple[bytes, list[str], list[str]]:
    buf = io.BytesIO()
    kinds: list[str] = []
    names: list[str] = []
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as t:
        for _ in range(rng.randint(1, 6)):
            kind = rng.choices(["file", "dir", "sym", "hard"], [35, 15, 30, 20])[0]
            info = tarfile.TarInfo(random_path(rng, SEGMENTS))
            info.mode = rng.choice([0o644, 0o755, 0o4755, 0o777])
            data = b""
            if kind == "file":
                data = rng.choice([b"", b"pwned", b"x" * 700])
                info.size = len(data)
            elif kind == "dir":
                info.type = tarfile.DIRTYPE
            elif kind == "sym":
                info.type = tarfile.SYMTYPE
                r = rng.random()
                info.linkname = (
                    os.path.join(base, "secret.txt")
                    if r < 0.05
                    else "/etc"
                    if r < 0.1
                    else random_path(rng, TARGETS)
                ).rstrip("/") or "."
            else:
                info.type = tarfile.LNKTYPE
                r = rng.random()
                if names and r < 0.6:
                    info.linkname = rng.choice(["", "./"]) + rng.choice(names)
                elif r < 0.8:
                    info.linkname = random_path(rng, TARGETS)
                else:
                    info.linkname = rng.choice(
                        ["../secret.txt", "up/sibling.txt", os.path.join(base, "secret.txt")]
                    )
            t.addfile(info, io.BytesIO(data) if data else None)
            kinds.append(kind)
            names.append(info.name)
    excludes = [e for e in EXCLUDES if rng.random() < 0.4]
    return buf.getvalue(), excludes, kinds


def exclude_violations(changed: dict[str, Any], excludes: list[str]) -> list[str]:
    """Checked independently of the runtime's Excluder: by path components and basenames."""
    bad = []
    for rel, entry in changed.items():
        parts = rel.split("/")
        for ex in excludes:
            as_dir = ex.endswith("/") and ex.rstrip("/") in parts
            as_glob = not ex.endswith("/") and entry[0] != "dir" and fnmatch.fnmatchcase(parts[-1], ex)
            if as_dir or as_glob:
                bad.append(f"{rel} matches {ex}")
    return bad


def run(seed: int, count: int, workdir: str) -> dict[str, Any]:
    rng = random.Random(seed)
    stats: dict[str, Any] = {
        "python": sys.version.split()[0],
        "tar_filters": hasattr(tarfile, "data_filter"),
        "seed": seed,
        "sequences": 0,
        "accepted": 0,
        "refused": {},
        "accepted_with_links": 0,
        "escapes": [],
        "exclude_violations": [],
        "partial_writes": [],
        "leftovers": [],
        "crashes": [],
    }
    t0 = time.monotonic()
    for i in range(count):
        base = os.path.join(workdir, f"seq{i}")
        dest_top = build_tree(base)
        dest = dest_top if rng.random() < 0.9 else os.path.join(dest_top, "new", "sub")
        data, excludes, kinds = random_archive(rng, base)
        outside_before = snapshot(base, skip=dest_top)
        dest_before = snapshot(dest_top)
        inodes_outside = {(v[2], v[3]) for v in outside_before.values() if v[0] == "file"}
        case = f"seed={seed} seq={i}"
        try:
            extract_archive(io.BytesIO(data), dest, exclude=excludes, limits=ImportLimits())
            accepted = True
            stats["accepted"] += 1
            stats["accepted_with_links"] += any(k in ("sym", "hard") for k in kinds)
        except ApiError as err:
            accepted = False
            stats["refused"][str(err.status)] = stats["refused"].get(str(err.status), 0) + 1
        except Exception as err:  # any other failure is a finding
            accepted = False
            stats["crashes"].append(f"{case}: {err!r}")
        stats["sequences"] += 1
        if snapshot(base, skip=dest_top) != outside_before:
            stats["escapes"].append(f"{case}: outside tree changed")
        after = snapshot(dest_top)
        if not accepted and after != dest_before:
            stats["partial_writes"].append(case)
        if accepted:
            changed = {k: v for k, v in after.items() if dest_before.get(k) != v}
            stats["exclude_violations"] += [f"{case}: {v}" for v in exclude_violations(changed, excludes)]
            for rel, entry in changed.items():
                p = os.path.join(dest_top, rel)
                real = os.path.realpath(p)
                if entry[0] == "link" and not (real == dest_top or real.startswith(dest_top + os.sep)):
                    stats["escapes"].append(f"{case}: symlink {rel} -> {entry[1]} resolves to {real}")
                if entry[0] == "file" and (entry[2], entry[3]) in inodes_outside:
                    stats["escapes"].append(f"{case}: {rel} is a hard link to an outside file")
        for _dir, dirnames, _files in os.walk(base):
            stats["leftovers"] += [f"{case}: {n}" for n in dirnames if n.startswith(STAGING_PREFIX)]
        shutil.rmtree(base)
    stats["seconds"] = round(time.monotonic() - t0, 1)
    return stats


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--count", type=int, default=10000)
    p.add_argument("--workdir", required=True)
    a = p.parse_args()
    print(json.dumps(run(a.seed, a.count, a.workdir)))


if __name__ == "__main__":
    main()
