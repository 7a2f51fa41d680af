#!/usr/bin/env python3
"""CPU time of a shadowctl call: `shadowctl --version` and `shadowctl list`, beside `kubectl get`.

Each command runs --runs times as a child process (after one warm-up run that also caches its bytecode, as
an installed package has it); its CPU time (user + sys, from the kernel's accounting of
the child: `os.wait4`) is recorded, and the median and the worst are printed. `list` talks to a real API
server: a local control plane (tests/support/controlplane.py: etcd, kube-apiserver, kwok) started for the
run with the CRDs applied and --objects ShadowEnvironments created, or the one of --kubeconfig.

    .venv/bin/python hack/bench/cli_cpu_bench.py --runs 10
    .venv/bin/python hack/bench/cli_cpu_bench.py --kubeconfig ~/.kube/config -n team-a
    .venv/bin/python hack/bench/cli_cpu_bench.py --shadowctl /other/checkout/.venv/bin/shadowctl  # before
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.support.controlplane import DEFAULT_BIN_DIR, ControlPlane  # noqa: E402

SHADOWCTL = str(Path(sys.executable).parent / "shadowctl")
KUBECTL = str(DEFAULT_BIN_DIR / "kubectl")


def cpu_seconds(argv: list[str], env: dict[str, str]) -> float:
    """user + sys CPU seconds of one run of argv (it must succeed)."""
    child = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    assert child.stderr is not None
    errors = child.stderr.read()
    _, status, usage = os.wait4(child.pid, 0)
    child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({child.returncode}): {errors.decode()[:500]}")
    return usage.ru_utime + usage.ru_stime


def prepare(kubeconfig: str, namespace: str, objects: int) -> None:
    env = {**os.environ, "KUBECONFIG": kubeconfig}
    subprocess.run(
        [KUBECTL, "apply", "--server-side", "-f", str(ROOT / "crds")],
        env=env,
        check=True,
        capture_output=True,
    )
    subprocess.run(
        [KUBECTL, "wait", "--for=condition=Established", "crd/shadowenvironments.shadow.dev"],
        env=env,
        check=True,
        capture_output=True,
    )
    manifests = "".join(
        f"""---
apiVersion: shadow.dev/v1alpha1
kind: ShadowEnvironment
metadata: {{name: bench-{i}, namespace: {namespace}}}
spec:
  sources: [{{name: app, repo: shadow/app, upload: {{}}}}]
"""
        for i in range(objects)
    )
    subprocess.run(
        [KUBECTL, "apply", "-f", "-"], input=manifests.encode(), env=env, check=True, capture_output=True
    )


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--objects", type=int, default=5, help="ShadowEnvironments to create for `list`")
    parser.add_argument("--kubeconfig", help="use this cluster instead of starting a local control plane")
    parser.add_argument("-n", "--namespace", default="default")
    parser.add_argument(
        "--shadowctl", default=SHADOWCTL, help="the shadowctl to measure (another checkout's)"
    )
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="cli-bench-") as tmp:
        plane = None
        kubeconfig = args.kubeconfig
        if kubeconfig is None:
            plane = ControlPlane(directory=Path(tmp) / "controlplane", nodes=1, die_with_parent=True)
            plane.start()
            kubeconfig = str(plane.kubeconfig)
            prepare(kubeconfig, args.namespace, args.objects)
        try:
            # As an installed package runs: with its bytecode cached (the warm-up run writes it, outside the
            # checkout), whatever PYTHONDONTWRITEBYTECODE the caller has.
            env = {
                **os.environ,
                "KUBECONFIG": kubeconfig,
                "COLUMNS": "200",
                "PYTHONPYCACHEPREFIX": f"{tmp}/pycache",
            }
            env.pop("PYTHONDONTWRITEBYTECODE", None)
            commands = {
                "shadowctl --version": [args.shadowctl, "--version"],
                "shadowctl list": [args.shadowctl, "list", "-n", args.namespace],
                "shadowctl list -o json": [args.shadowctl, "list", "-n", args.namespace, "-o", "json"],
                "kubectl get shadowenvironments": [
                    KUBECTL,
                    "get",
                    "shadowenvironments",
                    "-n",
                    args.namespace,
                ],
            }
            print(
                f"{'command':<34} {'median CPU s':>12} {'max CPU s':>10}  ({args.runs} runs, {time.strftime('%F %H:%M')})"
            )
            for label, argv in commands.items():
                cpu_seconds(argv, env)  # warm the page cache
                samples = [cpu_seconds(argv, env) for _ in range(args.runs)]
                print(f"{label:<34} {statistics.median(samples):>12.3f} {max(samples):>10.3f}")
        finally:
            if plane is not None:
                plane.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
