#!/usr/bin/env python3
"""Race overhead on the kind cluster of `make e2e`: a race of 5 against its slowest candidate's own work.

Issue 21's target: a race of 5 adds at most 10 s beyond its slowest candidate's own command and verification.
One source environment (StorageClass `shadow-snapshots`, so the five forks restore one shared snapshot; no
Gitea, so what is measured is the race, not Gitea's start) with one verification command is raced with
`ShadowGateway.race(COMMAND, count=5)`: five forks, the command in each, a diff, a verification each. For each
round this prints, per candidate, when its fork was Ready, its command's own run time and its verification's
(request to verdict); then the race's time to the ranking, the slowest candidate's command + verification, and
the difference (the overhead: forking, waits, exec and diff calls, ranking), and the time the losers took to be
destroyed.

    .venv/bin/python hack/bench/race_bench.py --runs 3 --count 5 --command 'sleep 2'
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import uuid
from pathlib import Path

from kubernetes import client

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "operator"))
from shadow_operator.sdk import ShadowGateway, upload_source  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from environment_bench import KIND_KUBECONFIG, ensure_namespace, kind_api  # noqa: E402
from fork_bench import GROUP, PLURAL, REQUESTS, STORAGE_CLASS, VERSION, delete_envs, wait_envs  # noqa: E402

CHECK = "cd pkg && python3 -B -c 'import pkg'"


def make_source(api: client.ApiClient, ns: str, work: Path) -> str:
    custom = client.CustomObjectsApi(api)
    name = f"race-src-{uuid.uuid4().hex[:4]}"
    repo = work / name
    (repo / "pkg").mkdir(parents=True)
    (repo / "pkg" / "__init__.py").write_text('VERSION = "1"\n')
    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "ShadowEnvironment",
        "metadata": {"name": name},
        "spec": {
            "sources": [{"name": "pkg", "repo": "bench/pkg", "upload": {}}],
            "workspace": {"storageClassName": STORAGE_CLASS},
            "gitea": {"enabled": False},
            "verify": {
                "enabled": False,
                "install": False,
                "commands": [{"name": "import", "command": CHECK}],
            },
            "resources": {"requests": REQUESTS},
        },
    }
    custom.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, body)
    upload_source(name, "pkg", repo, namespace=ns, timeout=300)
    wait_envs(custom, ns, [name], "Ready", 300)
    return name


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--count", type=int, default=5, help="candidates per race")
    parser.add_argument("--command", default="sleep 2 && echo done > pkg/result.txt")
    parser.add_argument("--namespace", default="bench-race")
    parser.add_argument("--kubeconfig", default=KIND_KUBECONFIG)
    args = parser.parse_args()
    api = kind_api(args.kubeconfig)
    custom = client.CustomObjectsApi(api)
    ensure_namespace(api, args.namespace)
    overheads, ranked_times = [], []
    with tempfile.TemporaryDirectory() as work:
        source = make_source(api, args.namespace, Path(work))
        try:
            for run in range(1, args.runs + 1):
                with ShadowGateway(source, namespace=args.namespace) as gw:
                    result = gw.race(args.command, count=args.count, prefix=f"{source}-r{run}")
                print(f"round {run}: fork request {result.fork_seconds:.2f}s", flush=True)
                for c in sorted(result.candidates, key=lambda c: c.name):
                    print(
                        f"  {c.name}: ready at {c.ready_seconds or 0:.2f}s, command {c.duration_seconds or 0:.2f}s, "
                        f"verify {c.verify_seconds or 0:.2f}s, {c.verdict} {c.score}/{c.max_score}"
                        + (f", error {c.error}" if c.error else "")
                    )
                slowest = max((c.duration_seconds or 0) + (c.verify_seconds or 0) for c in result.candidates)
                overhead = result.ranked_seconds - slowest
                overheads.append(overhead)
                ranked_times.append(result.ranked_seconds)
                print(
                    f"  ranked after {result.ranked_seconds:.2f}s; slowest command + verification {slowest:.2f}s; "
                    f"overhead {overhead:.2f}s (target <= 10 s); cleanup done at {result.total_seconds:.2f}s",
                    flush=True,
                )
                delete_envs(custom, args.namespace, result.kept)
        finally:
            delete_envs(custom, args.namespace, [source])
    print("\n| race of | rounds | ranked p50 s | overhead p50 s | overhead max s | target |")
    print("|---:|---:|---:|---:|---:|---|")
    print(
        f"| {args.count} | {len(overheads)} | {statistics.median(ranked_times):.2f} | "
        f"{statistics.median(overheads):.2f} | {max(overheads):.2f} | <= 10 s |"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
