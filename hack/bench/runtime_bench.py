#!/usr/bin/env python3
"""sandbox-runtime benchmarks, measured side by side in one run on this machine.

  exec:     POST /execute {"command": "true"} round trip vs a raw fork/exec of `true` (subprocess.run)
  transfer: download and upload MB/s (curl over loopback) vs `cat FILE > /dev/null`
  diff:     baseline capture and diff of a 100k-file tree, next to `git status` on the same tree
  hostile:  /healthz latency while four clients send execs with a 1 MiB argument, vs /healthz idle

Usage: .venv/bin/python hack/bench/runtime_bench.py [--size-mib 1024] [--files 100000] [--execs 1000]
Prints a Markdown section for BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start(root: Path) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SANDBOX_RUNTIME_")}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "sandbox_runtime",
            "--root",
            str(root),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
            c.request("GET", "/healthz")
            if c.getresponse().status == 200:
                return proc, port
        except OSError:
            time.sleep(0.05)
    raise SystemExit("runtime did not become healthy")


def peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def p50(xs: list[float]) -> float:
    return statistics.median(xs)


def bench_exec(port: int, n: int) -> dict[str, float]:
    conn = http.client.HTTPConnection("127.0.0.1", port)
    body = json.dumps({"command": "true"}).encode()
    native = json.dumps({"argv": ["true"]}).encode()
    headers = {"content-type": "application/json"}

    def rt(path: str, payload: bytes) -> float:
        t = time.perf_counter()
        conn.request("POST", path, body=payload, headers=headers)
        r = conn.getresponse()
        data = r.read()
        dt = time.perf_counter() - t
        assert r.status == 200 and json.loads(data)["exit_code"] == 0, data
        return dt

    def raw() -> float:
        t = time.perf_counter()
        subprocess.run(["true"], capture_output=True, check=True)
        return time.perf_counter() - t

    for _ in range(50):  # warm-up
        rt("/execute", body)
        raw()
    legacy, v1, fork = [], [], []
    # Interleaved, so background load on the shared machine hits all three alike.
    for _ in range(n):
        legacy.append(rt("/execute", body))
        v1.append(rt("/v1/exec", native))
        fork.append(raw())
    return {
        "execute_p50_ms": p50(legacy) * 1e3,
        "v1_exec_p50_ms": p50(v1) * 1e3,
        "fork_p50_ms": p50(fork) * 1e3,
        "execute_mean_ms": statistics.fmean(legacy) * 1e3,
        "fork_mean_ms": statistics.fmean(fork) * 1e3,
    }


def p99(xs: list[float]) -> float:
    return statistics.quantiles(xs, n=100)[98]


def bench_hostile(port: int, seconds: float) -> dict[str, float]:
    """/healthz polled every 20 ms, idle and then while four clients send 1 MiB-argument execs (legacy
    `/execute` string and native argv alternately; exec refuses such an argument, the runtime must not
    stall on it)."""

    def poll(duration: float) -> list[float]:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        out: list[float] = []
        end = time.monotonic() + duration
        while time.monotonic() < end:
            t = time.perf_counter()
            conn.request("GET", "/healthz")
            conn.getresponse().read()
            out.append(time.perf_counter() - t)
            time.sleep(0.02)
        return out

    idle = poll(min(seconds, 3.0))
    # The clients are processes, so their own work never delays the poller (one GIL per process).
    clients = [
        subprocess.Popen(
            [sys.executable, "-c", _HAMMER, str(port), str(i), str(seconds)], stdout=subprocess.PIPE
        )
        for i in range(4)
    ]
    loaded = poll(seconds)
    sent = sum(int(c.communicate(timeout=120)[0] or 0) for c in clients)
    return {
        "idle_p99_ms": p99(idle) * 1e3,
        "loaded_p50_ms": p50(loaded) * 1e3,
        "loaded_p99_ms": p99(loaded) * 1e3,
        "execs_per_s": sent / seconds,
    }


# One hostile client: `/execute` (string) or `/v1/exec` (argv) with a 1 MiB argument, for a while.
_HAMMER = """
import http.client, json, sys, time
port, i, seconds = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
arg = "x" * (1 << 20)
path, body = ("/execute", {"command": "echo " + arg}) if i % 2 else ("/v1/exec", {"argv": ["echo", arg]})
payload = json.dumps(body).encode()
conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
sent, end = 0, time.monotonic() + seconds
while time.monotonic() < end:
    conn.request("POST", path, body=payload, headers={"content-type": "application/json"})
    conn.getresponse().read()
    sent += 1
print(sent)
"""


def timed(cmd: list[str] | str, shell: bool = False) -> float:
    t = time.perf_counter()
    subprocess.run(cmd, shell=shell, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t


class RawServer:
    """Loopback ceiling without any HTTP framework: a thread doing pread+sendall / recv_into+write on a
    bare socket, one request per connection. Same client (curl), same files, same filesystem."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen()
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self.serve, daemon=True).start()

    def serve(self) -> None:
        buf = bytearray(1 << 20)
        while True:
            conn, _ = self.sock.accept()
            with conn:
                head = b""
                while b"\r\n\r\n" not in head:
                    head += conn.recv(65536)
                header, _, rest = head.partition(b"\r\n\r\n")
                method, path = header.split(b" ")[:2]
                target = self.root / path.decode().lstrip("/")
                if method == b"GET":
                    size = target.stat().st_size
                    conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\nconnection: close\r\n\r\n" % size)
                    fd = os.open(target, os.O_RDONLY)
                    off = 0
                    while off < size:
                        data = os.pread(fd, 1 << 20, off)
                        conn.sendall(data)
                        off += len(data)
                    os.close(fd)
                else:
                    length = int(
                        next(
                            line.split(b":")[1]
                            for line in header.split(b"\r\n")
                            if line.lower().startswith(b"content-length")
                        )
                    )
                    with open(target, "wb") as fh:
                        fh.write(rest)
                        left = length - len(rest)
                        view = memoryview(buf)
                        while left > 0:
                            n = conn.recv_into(view[: min(len(buf), left)])
                            if not n:
                                break
                            fh.write(view[:n])
                            left -= n
                    conn.sendall(b"HTTP/1.1 204 No Content\r\nconnection: close\r\n\r\n")


def bench_transfer(port: int, root: Path, size_mib: int, runs: int) -> dict[str, float]:
    src = root / "bench.bin"
    block = os.urandom(1 << 20)
    with open(src, "wb") as fh:
        for _ in range(size_mib):
            fh.write(block)
    size = size_mib << 20
    outside = Path(tempfile.mkdtemp(prefix="rt-bench-up-", dir=root.parent)) / "upload.bin"
    shutil.copyfile(src, outside)
    base = f"http://127.0.0.1:{port}"
    cat: list[float] = []
    down: list[float] = []
    down_v1: list[float] = []
    up: list[float] = []
    up_mp: list[float] = []
    cp: list[float] = []
    raw_down: list[float] = []
    raw_up: list[float] = []
    raw = RawServer(root)
    # `Expect:` off: curl would otherwise wait for a 100-continue the bare server never sends.
    curl = ["curl", "-sf", "-o", "/dev/null", "-H", "Expect:"]
    timed(f"cat {src} > /dev/null", shell=True)
    for i in range(runs):
        cat.append(timed(f"cat {src} > /dev/null", shell=True))
        down.append(timed([*curl, f"{base}/download/bench.bin"]))
        down_v1.append(timed([*curl, f"{base}/v1/files/bench.bin"]))
        up.append(
            timed(
                [
                    *curl,
                    "-T",
                    str(outside),
                    "-H",
                    "content-type: application/octet-stream",
                    f"{base}/v1/files/up{i}.bin",
                ]
            )
        )
        up_mp.append(timed([*curl, "-F", f"file=@{outside};filename=up-mp{i}.bin", f"{base}/upload"]))
        cp.append(timed(["cp", str(outside), str(root / "cp.bin")]))
        raw_down.append(timed([*curl, f"http://127.0.0.1:{raw.port}/bench.bin"]))
        raw_up.append(timed([*curl, "-T", str(outside), f"http://127.0.0.1:{raw.port}/raw-up.bin"]))
        # Each run writes new files; removing the previous ones (freeing blocks) stays out of the timings.
        for name in ("cp.bin", f"up{i}.bin", f"up-mp{i}.bin", "raw-up.bin"):
            assert (root / name).stat().st_size == size, name
            (root / name).unlink()
    shutil.rmtree(outside.parent)
    (root / "bench.bin").unlink()

    def mbs(ts: list[float]) -> float:
        return size / min(ts) / 1e6

    return {
        "cat": mbs(cat),
        "download": mbs(down),
        "download_v1": mbs(down_v1),
        "upload_put": mbs(up),
        "upload_multipart": mbs(up_mp),
        "cp": mbs(cp),
        "raw_down": mbs(raw_down),
        "raw_up": mbs(raw_up),
    }


def bench_diff(port: int, root: Path, files: int, use_git: bool) -> dict[str, float]:
    tree = root
    per_dir = 100
    for i in range(files):
        d = tree / f"pkg{i // per_dir:04d}"
        if i % per_dir == 0:
            d.mkdir()
        (d / f"mod{i % per_dir:03d}.py").write_text(f"# module {i}\nVALUE = {i}\n")
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)

    def call(method: str, path: str, body: bytes | None = None) -> tuple[float, dict[str, Any]]:
        t = time.perf_counter()
        conn.request(method, path, body=body, headers={"content-type": "application/json"})
        r = conn.getresponse()
        data = json.loads(r.read())
        assert r.status == 200, data
        return time.perf_counter() - t, data

    capture, info = call("POST", "/v1/baseline", b"{}")
    assert info["files"] == files, info
    unchanged, d0 = call("GET", "/v1/diff")
    assert d0["files"] == [], d0
    for i in range(0, 1000, 10):  # 100 modified
        (tree / f"pkg{i // per_dir:04d}" / f"mod{i % per_dir:03d}.py").write_text("# changed\n")
    for i in range(10):
        (tree / f"pkg0000/new{i}.py").write_text("new\n")
        (tree / f"pkg{files // per_dir - 1:04d}/mod{i:03d}.py").unlink()
    changed, d1 = call("GET", "/v1/diff")
    counts = (len(d1["added"]), len(d1["modified"]), len(d1["deleted"]))
    assert counts == (10, 100, 10), counts
    paths_only, _ = call("GET", "/v1/diff?paths_only=true")
    out = {
        "files": files,
        "capture_s": capture,
        "diff_unchanged_s": unchanged,
        "diff_changed_s": changed,
        "diff_paths_only_s": paths_only,
    }
    if use_git and shutil.which("git"):
        # Same tree, same changes, measured as git's own status (index already refreshed).
        gdir = Path(tempfile.mkdtemp(prefix="rt-bench-git-"))
        subprocess.run(["cp", "-a", f"{tree}/.", str(gdir)], check=True)
        shutil.rmtree(gdir / ".sandbox-runtime", ignore_errors=True)
        g = ["git", "-C", str(gdir), "-c", "user.email=b@b", "-c", "user.name=b", "-c", "gc.auto=0"]
        subprocess.run([*g, "init", "-q"], check=True)
        subprocess.run([*g, "add", "-A"], check=True)
        subprocess.run([*g, "commit", "-qm", "base"], check=True)
        for i in range(0, 1000, 10):
            (gdir / f"pkg{i // per_dir:04d}" / f"mod{i % per_dir:03d}.py").write_text("# changed again\n")
        out["git_status_s"] = min(timed([*g, "status", "--porcelain"]) for _ in range(3))
        shutil.rmtree(gdir, ignore_errors=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-mib", type=int, default=1024)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--files", type=int, default=100_000)
    ap.add_argument("--execs", type=int, default=1000)
    ap.add_argument("--no-git", action="store_true")
    ap.add_argument("--hostile-seconds", type=float, default=10.0, help="duration of the 1 MiB-argument load")
    ap.add_argument("--workdir", default=None, help="parent of the temporary workspace (default: $TMPDIR)")
    a = ap.parse_args()
    if a.files < 2000 or a.files % 100:
        ap.error("--files must be a multiple of 100 and at least 2000 (the diff edits 120 of them)")
    if not shutil.which("curl"):
        raise SystemExit("curl is needed as the HTTP client for transfer benchmarks")
    work = Path(tempfile.mkdtemp(prefix="rt-bench-", dir=a.workdir))
    fstype = fs_of(work)
    proc, port = start(work)
    try:
        e = bench_exec(port, a.execs)
        h = bench_hostile(port, a.hostile_seconds)
        t = bench_transfer(port, work, a.size_mib, a.runs)
        rss_transfer = peak_rss_mib(proc.pid)
        d = bench_diff(port, work, a.files, not a.no_git)
        rss_end = peak_rss_mib(proc.pid)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
        shutil.rmtree(work, ignore_errors=True)

    cmd = " ".join(["hack/bench/runtime_bench.py", *sys.argv[1:]])
    fork = e["fork_p50_ms"]
    cat = t["cat"]
    rows = [
        (
            "exec `true`, legacy `POST /execute`, p50",
            f"{e['execute_p50_ms']:.2f} ms",
            f"raw fork/exec {fork:.2f} ms",
            f"{e['execute_p50_ms'] / fork:.2f}x",
            "<= 3x",
        ),
        (
            "exec `true`, native `POST /v1/exec`, p50",
            f"{e['v1_exec_p50_ms']:.2f} ms",
            f"raw fork/exec {fork:.2f} ms",
            f"{e['v1_exec_p50_ms'] / fork:.2f}x",
            "<= 3x",
        ),
    ]
    rows.append(
        (
            f"`/healthz` p99 while 4 clients send 1 MiB-argument execs ({h['execs_per_s']:.0f}/s; p50 "
            f"{h['loaded_p50_ms']:.1f} ms)",
            f"{h['loaded_p99_ms']:.1f} ms",
            f"idle p99 {h['idle_p99_ms']:.1f} ms",
            "",
            "< 200 ms",
        )
    )
    for key, label in (
        ("download", "download, `GET /download/...`"),
        ("download_v1", "download, `GET /v1/files/...`"),
        ("upload_put", "upload, `PUT /v1/files/...`"),
        ("upload_multipart", "upload, multipart `POST /upload`"),
    ):
        rows.append(
            (
                f"{label}, {a.size_mib} MiB (curl)",
                f"{t[key]:.0f} MB/s",
                f"`cat` {cat:.0f} MB/s",
                f"{t[key] / cat:.0%}",
                ">= 25%",
            )
        )
    rows.append(
        (
            "(write reference) `cp` of the file on the same filesystem",
            f"{t['cp']:.0f} MB/s",
            f"`cat` {cat:.0f} MB/s",
            f"{t['cp'] / cat:.0%}",
            "",
        )
    )
    rows.append(
        (
            "(reference) bare-socket server, download: pread + sendall, same client",
            f"{t['raw_down']:.0f} MB/s",
            f"`cat` {cat:.0f} MB/s",
            f"{t['raw_down'] / cat:.0%}",
            "",
        )
    )
    rows.append(
        (
            "(reference) bare-socket server, upload: recv_into + write in one thread",
            f"{t['raw_up']:.0f} MB/s",
            f"`cat` {cat:.0f} MB/s",
            f"{t['raw_up'] / cat:.0%}",
            "",
        )
    )
    rows.append(("runtime peak RSS (VmHWM) after the transfers", f"{rss_transfer:.0f} MiB", "", "", "flat"))
    git = d.get("git_status_s")
    rows += [
        (f"baseline capture, {d['files']:,} files", f"{d['capture_s']:.2f} s", "", "", ""),
        (
            f"diff, {d['files']:,} files, nothing changed",
            f"{d['diff_unchanged_s']:.2f} s",
            f"`git status` {git:.2f} s" if git else "",
            f"{d['diff_unchanged_s'] / git:.1f}x" if git else "",
            "",
        ),
        (
            "diff, 100 modified + 10 added + 10 deleted, with patch",
            f"{d['diff_changed_s']:.2f} s",
            "",
            "",
            "",
        ),
        ("diff, same changes, paths only", f"{d['diff_paths_only_s']:.2f} s", "", "", ""),
        ("runtime peak RSS (VmHWM) at the end", f"{rss_end:.0f} MiB", "", "", ""),
    ]
    print(
        f"Command: `.venv/bin/python {cmd}` ({os.cpu_count()} cores, {time.strftime('%Y-%m-%d %H:%M')} UTC, "
        f"Python {sys.version.split()[0]}, workspace on {fstype}, load average {os.getloadavg()[0]:.1f})"
    )
    print()
    print("| Measure | sandbox-runtime | Reference | Ratio | Target |")
    print("|---|---|---|---|---|")
    for row in rows:
        print("| " + " | ".join(row) + " |")
    print()
    print(
        f"Exec: medians of {a.execs} interleaved rounds after 50 warm-up (client: http.client, keep-alive). "
        f"Transfers: best of {a.runs} (client: curl; upload body streamed with `-T`)."
    )


def fs_of(path: Path) -> str:
    out = subprocess.run(["df", "--output=fstype", str(path)], capture_output=True, text=True).stdout.split()
    return out[-1] if out else "?"


if __name__ == "__main__":
    main()
