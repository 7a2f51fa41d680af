"""A hostile workspace runtime for the client fuzz (tests/runtime/test_client_fuzz.py): a grammar of diffs and
archives built to make promote and cp write where they must not, and a real HTTP server that answers the
runtime's API (`/v1/diff`, `/v1/stat`, `/v1/files`, `/v1/archive`) with them.

Case `n` of seed `s` is the same on both sides (`random.Random(f"{s}:{n}")`): the server builds its answers
from it, the test its expectations. Run the server with `python -m tests.support.hostile --port N`.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import gzip
import io
import json
import random
import socket
import struct
import sys
import tarfile
import threading
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import unquote, urlsplit

PREFIX = "src"
# Budget the fuzz gives the client: small, so that "too large" is reachable in every case.
MAX_BYTES = 1 << 20
MAX_MEMBERS = 8

# Components that are `.git` on some filesystem (case, Unicode ignorables, NFKC, NTFS trailing dots/spaces,
# streams, short names), that leave the directory, or that are symbolic links in the local target.
DOTGIT = [
    ".git",
    ".GIT",
    ".Git",
    ".gIT",
    ".g\u200cit",
    ".git\u200d",
    "\u200b.git",
    ".gi\ufefft",
    ".\u034fgit",
    "\uff0e\uff47\uff49\uff54",  # fullwidth
    ".git.",
    ".git ",
    ".GIT. .",
    ".git::$INDEX_ALLOCATION",
    "GIT~1",
    "git~1",
    ".git\\hooks",
]
ESCAPES = [".", "..", "", "..\u200b", ". .", "\u2024\u2024"]  # the last: ONE DOT LEADER, NFKC "."
LINKS = ["link", "LINK", "Link", "abs", "ABS", "file"]  # symlinks (any case) and a file used as a directory
ORDINARY = ["a", "b", "new", "sub", "Ünï", "x.py", "gitx", ".github", ".gitignore", "git", "hooks", "config"]


@dataclass
class Member:
    """An archive member, or a changed path of a diff (then `kind` is what the stat says)."""

    name: str
    kind: str  # file | dir | symlink | hardlink | fifo
    size: int = 0
    data: bytes = field(default=b"", repr=False)
    mode: int = 0o644
    sparse: int = 0  # a GNU sparse member: its expanded size
    linkname: str = ""
    safe: bool = True  # every component ordinary: the client should write it


@dataclass
class Case:
    n: int
    kind: str  # promote | cp
    members: list[Member] = field(default_factory=list)
    deleted: list[Member] = field(default_factory=list)
    bomb: int = 0  # cp: a member of this many zero bytes (a gzip bomb), declared honestly
    many: int = 0  # cp: this many extra members

    def archive(self) -> bytes:
        return build_archive(self)


def _component(r: random.Random, hostility: float) -> tuple[str, bool]:
    roll = r.random() / max(hostility, 1e-9)
    if roll < 0.55:
        return r.choice(DOTGIT), False
    if roll < 0.75:
        return r.choice(ESCAPES), False
    if roll < 1.0:
        return r.choice(LINKS), False
    return r.choice(ORDINARY), True


def _path(r: random.Random, hostility: float) -> tuple[str, bool]:
    parts = [_component(r, hostility) for _ in range(r.randint(1, 4))]
    name = "/".join(p for p, _ in parts)
    safe = all(ok for _, ok in parts)
    shape = r.random() / max(hostility, 1e-9)
    if shape < 0.1:
        return "/" + name, False
    if shape < 0.2:
        return "./" + name, False
    if shape < 0.25:
        return name + "/.", False
    return name, safe


def _mode(r: random.Random) -> int:
    return r.choice([0o644, 0o755, 0o600, 0o4755, 0o2755, 0o1777, 0o6777, 0o777])


def case(seed: int, n: int) -> Case:
    r = random.Random(f"{seed}:{n}")
    c = Case(n, "promote" if n % 2 == 0 else "cp")
    hostility = r.choice([0.0, 0.0, 0.1, 0.3, 0.6])  # the share of hostile components, paths and sizes
    for _ in range(r.randint(1, 6)):
        name, safe = _path(r, hostility)
        kind = r.choices(["file", "dir", "symlink", "hardlink", "fifo"], [8, 2, 1, 1, 1])[0]
        size = r.choice([0, 1, 100, 4096, 70_000])
        m = Member(name, kind, size, bytes([r.randrange(256)]) * size, _mode(r), safe=safe)
        if kind in ("symlink", "hardlink"):
            m.linkname = r.choice(["/etc/passwd", "../../outside/secret.txt", ".git/config", "a"])
        if r.random() < 0.1 * hostility:
            m.sparse = 4 << 30  # 4 GiB declared, a few bytes stored
        if r.random() < 0.1 * hostility:
            m.size = r.choice([MAX_BYTES + 1, 3 << 30])  # promote: a stat that declares too much
        if c.kind == "promote" and r.random() < 0.1 * hostility:
            m.data = b"L" * (MAX_BYTES + 10)  # a file that sends more than it declared
        c.members.append(m)
    if c.kind == "promote":
        for _ in range(r.randint(0, 3)):
            name, safe = _path(r, hostility)
            c.deleted.append(Member(name, "file", safe=safe))
    else:
        if r.random() < 0.1 * hostility:
            c.bomb = r.choice([MAX_BYTES * 4, 64 << 20])
        if r.random() < 0.1 * hostility:
            c.many = MAX_MEMBERS + 5
    return c


# ------------------------------------------------------------------------------------------ archives
def _gnu_sparse(name: str, realsize: int, mode: int) -> bytes:
    """A GNU old-style sparse member: `realsize` bytes of which only the last 512 are stored."""
    info = tarfile.TarInfo(name)
    info.type = tarfile.GNUTYPE_SPARSE
    info.mode = mode
    info.size = tarfile.BLOCKSIZE
    header = bytearray(info.tobuf(tarfile.GNU_FORMAT))
    # offset 386: four sparse entries (offset, numbytes), then isextended, then realsize (12 octal bytes each)
    entry = tarfile.itn(realsize - tarfile.BLOCKSIZE, 12, tarfile.GNU_FORMAT) + tarfile.itn(
        tarfile.BLOCKSIZE, 12, tarfile.GNU_FORMAT
    )
    header[386 : 386 + 24] = entry
    header[482] = 0
    header[483:495] = tarfile.itn(realsize, 12, tarfile.GNU_FORMAT)
    header[148:156] = b"        "
    checksum = sum(header[:512])
    header[148:156] = b"%06o\0 " % checksum
    return bytes(header) + b"S" * tarfile.BLOCKSIZE


@functools.lru_cache(maxsize=4)
def _zeros(size: int) -> bytes:
    """`size` zero bytes as raw deflate data, flushed to a byte boundary (~1000:1: a gzip bomb)."""
    z = zlib.compressobj(9, zlib.DEFLATED, -zlib.MAX_WBITS)
    block = bytes(1 << 20)
    out = [z.compress(block[: min(size - i, len(block))]) for i in range(0, size, len(block))]
    out.append(z.flush(zlib.Z_FULL_FLUSH))
    return b"".join(out)


def _crc_of_zeros(crc: int, size: int) -> int:
    block = bytes(1 << 20)
    for i in range(0, size, len(block)):
        crc = zlib.crc32(block[: min(size - i, len(block))], crc)
    return crc


def build_archive(c: Case) -> bytes:
    """The case's members as one gzip member (CRC and length correct, so a reader that gets to the end of it
    can check them)."""
    tar = io.BytesIO()
    for m in c.members:
        if m.sparse:
            tar.write(_gnu_sparse(m.name, m.sparse, m.mode))
            continue
        info = tarfile.TarInfo(m.name)
        info.mode = m.mode
        info.type = {
            "file": tarfile.REGTYPE,
            "dir": tarfile.DIRTYPE,
            "symlink": tarfile.SYMTYPE,
            "hardlink": tarfile.LNKTYPE,
            "fifo": tarfile.FIFOTYPE,
        }[m.kind]
        info.linkname = m.linkname
        data = m.data if m.kind == "file" else b""
        info.size = len(data)
        tar.write(info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape"))
        tar.write(data + bytes(-len(data) % tarfile.BLOCKSIZE))
    for i in range(c.many):
        tar.write(tarfile.TarInfo(f"many-{i}").tobuf(tarfile.PAX_FORMAT))
    if c.bomb:
        bomb = tarfile.TarInfo("bomb.bin")
        bomb.size = c.bomb
        tar.write(bomb.tobuf(tarfile.PAX_FORMAT))
    head = tar.getvalue()
    tail = bytes(-c.bomb % tarfile.BLOCKSIZE + 2 * tarfile.BLOCKSIZE)
    z = zlib.compressobj(6, zlib.DEFLATED, -zlib.MAX_WBITS)
    deflated = z.compress(head) + z.flush(zlib.Z_FULL_FLUSH)
    crc = zlib.crc32(head)
    if c.bomb:
        deflated += _zeros(c.bomb)
        crc = _crc_of_zeros(crc, c.bomb)
    end = zlib.compressobj(6, zlib.DEFLATED, -zlib.MAX_WBITS)
    deflated += end.compress(tail) + end.flush()
    crc = zlib.crc32(tail, crc)
    size = len(head) + c.bomb + len(tail)
    header = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff"
    return header + deflated + struct.pack("<II", crc, size & 0xFFFFFFFF)


def sparse_archive(size: int = 4 << 30) -> bytes:
    """One GNU sparse member declaring `size` bytes: what `shadowctl cp` of a hostile 4 GiB file receives."""
    body = _gnu_sparse("huge.bin", size, 0o644) + bytes(2 * tarfile.BLOCKSIZE)
    return gzip.compress(body)


def bomb_archive(size: int) -> bytes:
    """One member of `size` zero bytes, about size/1000 compressed."""
    c = Case(0, "cp", bomb=size)
    return build_archive(c)


# ------------------------------------------------------------------------------------------ the server
class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    seed = 0

    def setup(self) -> None:
        super().setup()
        # Headers and body go out in separate writes: without this, delayed ACKs cost 40 ms per answer.
        self.request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _send(self, status: int, body: bytes, content_type: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        parts = urlsplit(self.path).path.split("/", 4)  # "", "case"|"big", n|kind, "v1", rest
        if len(parts) < 5 or parts[3] != "v1":
            return self._send(404, b'{"detail": "no such path"}')
        api, _, rest = parts[4].partition("/")
        rel = unquote(rest)
        if parts[1] == "big":
            if api == "stat":
                return self._send(200, b'{"type": "directory", "size": 0, "mode": "0755"}')
            if parts[2] == "sparse4g":
                return self._send(200, sparse_archive(), "application/gzip")
            return self._send(200, bomb_archive(int(parts[2])), "application/gzip")
        if parts[1] == "fixed":
            answer = FIXED.get(f"/v1/{api}/{rel}".rstrip("/"))
            if answer is None:
                return self._send(404, b'{"detail": "not found"}')
            return self._send(200, answer, "application/octet-stream")
        c = case(self.seed, int(parts[2]))
        if api == "archive":
            return self._send(200, c.archive(), "application/gzip")
        if api == "diff":
            return self._send(200, json.dumps(_diff(c)).encode())
        found = {f"{PREFIX}/{m.name}": m for m in c.members}.get(rel)
        if found is None:
            return self._send(404, b'{"detail": "not found"}')
        if api == "stat":
            kind = {"dir": "directory", "hardlink": "file", "fifo": "other"}.get(found.kind, found.kind)
            size = found.sparse or found.size
            return self._send(
                200, json.dumps({"type": kind, "size": size, "mode": f"0{found.mode:o}"}).encode()
            )
        return self._send(200, found.data, "application/octet-stream")


def _diff(c: Case) -> dict[str, Any]:
    names = [f"{PREFIX}/{m.name}" for m in c.members]
    if c.n % 3 == 0:
        names.append(f"{PREFIX}x/outside-the-source.txt")  # not under the source: never promoted
    half = len(names) // 2
    return {
        "added": names[:half],
        "modified": names[half:],
        "deleted": [f"{PREFIX}/{m.name}" for m in c.deleted],
    }


# Answers of the `/fixed/0/v1/...` paths, by path (for tests that serve one hostile answer, in a thread).
FIXED: dict[str, bytes] = {}


@contextlib.contextmanager
def serving(answers: dict[str, bytes | dict[str, Any]]) -> Iterator[str]:
    """Serve these answers (JSON for dicts) on loopback in a thread; yields the runtime's base URL."""
    FIXED.clear()
    FIXED.update({k: json.dumps(v).encode() if isinstance(v, dict) else v for k, v in answers.items()})
    server = Server(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/fixed/0"
    finally:
        server.shutdown()
        server.server_close()
        FIXED.clear()


class Server(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that refuses an answer half-way hangs up: that is the point, not an error."""
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    Handler.seed = args.seed
    server = Server(("127.0.0.1", args.port), Handler)
    server.daemon_threads = True
    server.serve_forever()


if __name__ == "__main__":
    main()
