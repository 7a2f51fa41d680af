#!/usr/bin/env python3
"""The egress gateway's cost: added latency and throughput against direct, and its memory with many sandboxes.

One run starts the real gateway (`.venv-egress`, as the tests do: tests/support/egress.py) and one HTTPS
upstream on loopback, then measures, on keep-alive connections, in rounds whose order rotates:
  - a small GET (17 bytes) direct, through a host-only rule (a TLS tunnel the gateway does not open) and
    through a method/path rule (TLS terminated by the gateway and opened again upstream);
  - a 100 MiB download the same three ways (throughput, MiB/s);
then loads policies for N sandboxes (--sandboxes, 100) of --rules rules each and reports the gateway's RSS
before and after (VmRSS from /proc, after a settle).

Usage: .venv/bin/python hack/bench/egress_bench.py [--rounds 500] [--big-rounds 3] [--sandboxes 100]
"""

from __future__ import annotations

import argparse
import os
import ssl
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.support.controlplane import wait_for  # noqa: E402
from tests.support.egress import start_gateway, start_upstream  # noqa: E402
from tests.support.pki import CertificateAuthority  # noqa: E402

TOKEN = "t" * 64
BIG = 100 * 1024 * 1024


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def sandbox(i: int, rules: int, port: int) -> dict[str, Any]:
    rule_list = [
        {"host": "tunnel.test", "ports": [port]},
        {"host": "open.test", "ports": [port], "methods": ["GET"], "paths": ["/"]},
    ]
    rule_list += [
        {"host": f"api{j}.example.com", "methods": ["GET", "POST"], "paths": ["/v1/", "/v2/"]}
        for j in range(rules - 2)
    ]
    return {"namespace": f"team-{i}", "name": f"agent-{i}", "token": TOKEN if i == 0 else f"{i:064d}",
            "addresses": ["127.0.0.1"] if i == 0 else [f"10.0.{i // 250}.{i % 250}"], "template": {"rules": rule_list}}  # fmt: skip


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(p / 100 * len(ordered)) - 1))]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=500)
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--big-rounds", type=int, default=3)
    parser.add_argument("--sandboxes", type=int, default=100)
    parser.add_argument("--rules", type=int, default=10)
    args = parser.parse_args()
    directory = Path(tempfile.mkdtemp(prefix="egress-bench-"))
    ca = CertificateAuthority(directory, "bench-ca")
    upstream = start_upstream(ca, "tunnel.test")
    ca.issue("open-test", "open.test", dns_names=("open.test",), server=True)
    # One server answers for both names: its certificate names tunnel.test, the tunnel's; for open.test the
    # gateway's own upstream check needs a certificate for open.test, so a second server is started.
    opened = start_upstream(ca, "open.test")
    resolve = {"tunnel.test": "127.0.0.1", "open.test": "127.0.0.1"}
    gen = start_gateway(directory, ca.pair.cert, resolve, {"sandboxes": []})
    gateway = next(gen)
    try:
        base = rss_kib(gateway.process.pid)
        one = {"sandboxes": [sandbox(0, args.rules, upstream.port)]}
        one["sandboxes"][0]["template"]["rules"][1]["ports"] = [opened.port]
        gateway.write_policy(one)
        wait_for(
            lambda: httpx.get(f"{gateway.admin}/v1/ca/team-0").status_code == 200, timeout=5, what="policy"
        )
        trust = directory / "trust.pem"
        trust.write_text(gateway.ca_pem("team-0") + ca.pair.cert.read_text())
        context = ssl.create_default_context(cafile=trust)
        clients = {
            "direct": (httpx.Client(verify=context, timeout=60), f"https://127.0.0.1:{upstream.port}"),
            "tunnel (host rule)": (httpx.Client(verify=context, proxy=gateway.proxy(TOKEN), timeout=60), f"https://tunnel.test:{upstream.port}"),
            "terminated (method/path rule)": (httpx.Client(verify=context, proxy=gateway.proxy(TOKEN), timeout=60), f"https://open.test:{opened.port}"),
        }  # fmt: skip
        # The direct client talks to 127.0.0.1 with a certificate for tunnel.test.
        clients["direct"][0].headers["Host"] = "tunnel.test"
        direct = httpx.Client(verify=False, timeout=60)
        clients["direct"] = (direct, f"https://127.0.0.1:{upstream.port}")
        names = list(clients)
        small: dict[str, list[float]] = {name: [] for name in names}
        for i in range(args.warmup + args.rounds):
            for name in names[i % 3 :] + names[: i % 3]:
                client, base_url = clients[name]
                start = time.perf_counter()
                try:
                    answer = client.get(f"{base_url}/small")
                except httpx.HTTPError as error:
                    raise SystemExit(f"{name}: round {i}: {error!r}") from error
                elapsed = time.perf_counter() - start
                assert answer.status_code == 200, (name, answer.status_code, answer.text)
                if i >= args.warmup:
                    small[name].append(elapsed * 1000)
        big: dict[str, list[float]] = {name: [] for name in names}
        for i in range(args.big_rounds):
            for name in names[i % 3 :] + names[: i % 3]:
                client, base_url = clients[name]
                start = time.perf_counter()
                size = 0
                with client.stream("GET", f"{base_url}/big/{BIG}") as answer:
                    for chunk in answer.iter_raw(1 << 20):
                        size += len(chunk)
                assert size == BIG, (name, size)
                big[name].append(BIG / (1 << 20) / (time.perf_counter() - start))
        print(f"Python {sys.version.split()[0]}, load average {os.getloadavg()[0]:.1f}, {args.rounds} rounds")
        print("| Path | small p50 | small p99 | added p50 | 100 MiB MiB/s (median) |")
        print("|---|---|---|---|---|")
        ref = percentile(small["direct"], 50)
        for name in names:
            p50, p99 = percentile(small[name], 50), percentile(small[name], 99)
            added = "" if name == "direct" else f"+{p50 - ref:.3f} ms"
            print(f"| {name} | {p50:.3f} ms | {p99:.3f} ms | {added} | {statistics.median(big[name]):.0f} |")
        after_one = rss_kib(gateway.process.pid)
        many = {"sandboxes": [sandbox(i, args.rules, upstream.port) for i in range(args.sandboxes)]}
        gateway.write_policy(many)
        wait_for(
            lambda: httpx.get(f"{gateway.admin}/v1/ca/team-{args.sandboxes - 1}").status_code == 200,
            timeout=10,
            what="many",
        )
        time.sleep(1)
        loaded = rss_kib(gateway.process.pid)
        print(
            f"RSS: started {base / 1024:.1f} MiB; after the runs above {after_one / 1024:.1f} MiB; with "
            f"{args.sandboxes} sandboxes x {args.rules} rules loaded {loaded / 1024:.1f} MiB "
            f"(+{(loaded - after_one) / 1024:.1f} MiB)"
        )
    finally:
        next(gen, None)


if __name__ == "__main__":
    main()
