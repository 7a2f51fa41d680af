#!/usr/bin/env python3
"""`make demo`, second part: a ShadowEnvironment from a local repository, its verdict and its diff.

    hack/demo_environment.py [--source PATH[:org/name]] [--namespace NS] [--name NAME]

Without --source it makes a small Python package under the cache whose last change is not committed (the
case the environment exists for). The repository is uploaded into the environment's workspace with the SDK,
mirrored into the environment's own Gitea, installed in the workspace from its public GitHub URL (which the
environment's git rewrites send to that Gitea), verified, changed inside the workspace as an agent would,
and the change shown as a diff against what was copied in. Runs against the current kubeconfig context.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
from shadow_operator.api.environment import ShadowEnvironment
from shadow_operator.api.kinds import SHADOW_ENVIRONMENT
from shadow_operator.sdk import kube, runtime_endpoint, upload_source

CACHE = Path(os.environ.get("SHADOW_CACHE") or Path.home() / ".cache" / "shadow-operator")


def say(text: str) -> None:
    print(f"    {text}", flush=True)


def git(cwd: Path, *args: str) -> None:
    env = {**os.environ, "GIT_AUTHOR_NAME": "demo", "GIT_AUTHOR_EMAIL": "demo@shadow.dev"}
    env.update(GIT_COMMITTER_NAME="demo", GIT_COMMITTER_EMAIL="demo@shadow.dev")
    subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True)


def sample_repository() -> Path:
    """A package whose working tree says VERSION = "uncommitted" while its last commit says "committed"."""
    root = CACHE / "demo" / "shadowpkg"
    shutil.rmtree(root, ignore_errors=True)
    (root / "shadowpkg").mkdir(parents=True)
    (root / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools"]\nbuild-backend = "setuptools.build_meta"\n\n'
        '[project]\nname = "shadowpkg"\nversion = "0.1.0"\n\n[tool.setuptools]\npackages = ["shadowpkg"]\n'
    )
    (root / "shadowpkg" / "__init__.py").write_text('VERSION = "committed"\n')
    git(root, "init", "-q", "-b", "main")
    git(root, "add", ".")
    git(root, "commit", "-q", "-m", "initial")
    (root / "shadowpkg" / "__init__.py").write_text('VERSION = "uncommitted"\n')
    return root


def environment(name: str, repo: str) -> dict[str, Any]:
    org = repo.split("/")[0]
    return {
        "apiVersion": SHADOW_ENVIRONMENT.api_version,
        "kind": "ShadowEnvironment",
        "metadata": {"name": name},
        "spec": {
            "sources": [{"name": "src", "repo": repo, "upload": {}}],
            "workspace": {"size": "1Gi"},
            "gitRewrites": [{"from": f"https://github.com/{org}/", "to": org}],
            "verify": {
                "commands": [
                    {
                        "name": "import",
                        "command": "cd src && python3 -c 'import shadowpkg; print(shadowpkg.VERSION)'",
                    }
                ]
            },
        },
    }


def recreate(http: httpx.Client, namespace: str, body: dict[str, Any]) -> None:
    name = body["metadata"]["name"]
    path = SHADOW_ENVIRONMENT.path(namespace, name)
    if http.get(path).status_code == 200:
        say(f"replacing the earlier ShadowEnvironment {namespace}/{name}")
        http.delete(path)
        deadline = time.monotonic() + 120
        while http.get(path).status_code == 200:
            if time.monotonic() > deadline:
                sys.exit(f"error: {namespace}/{name} was not deleted in 120s")
            time.sleep(0.5)
    kube.request(http, "POST", SHADOW_ENVIRONMENT.path(namespace), body=body)


def wait_verdict(http: httpx.Client, namespace: str, name: str, timeout: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        env = kube.request(http, "GET", SHADOW_ENVIRONMENT.path(namespace, name))
        status = env.get("status") or {}
        if status.get("failure"):
            failure = status["failure"]
            sys.exit(f"error: the environment failed with {failure['code']}: {failure['message']}")
        if status.get("verdict"):
            return env
        time.sleep(0.5)
    sys.exit(
        f"error: no verdict after {timeout:.0f}s: kubectl -n {namespace} describe shadowenvironment {name}"
    )


def runtime_call(http: httpx.Client, env: dict[str, Any], method: str, path: str, **kw: Any) -> Any:
    """A call to the workspace's runtime through the API server's pod proxy (no port-forward needed)."""
    proxy, headers = runtime_endpoint(http, ShadowEnvironment.from_body(env))
    response = http.request(method, proxy + path, headers=headers, timeout=600, **kw)
    response.raise_for_status()
    return response.json()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--source", help="local repository PATH[:org/name] (default: a sample package)")
    parser.add_argument("--namespace", default=os.environ.get("SHADOW_NAMESPACE", "shadow-system"))
    parser.add_argument("--name", default="demo-env")
    parser.add_argument("--timeout", type=float, default=300.0)
    args = parser.parse_args()
    if args.source:
        path_text, _, repo = args.source.partition(":")
        path = Path(path_text).expanduser().resolve()
        repo = repo or f"shadowdemo/{path.name}"
    else:
        path, repo = sample_repository(), "shadowdemo/shadowpkg"
    ns, name = args.namespace, args.name

    with kube.connect() as http:
        started = time.monotonic()
        recreate(http, ns, environment(name, repo))
        say(f"created ShadowEnvironment {ns}/{name} (source {path} as {repo})")
        last = [0.0]

        def progress(done: int, total: int) -> None:
            if time.monotonic() - last[0] > 0.5 or done == total:
                last[0] = time.monotonic()
                say(f"uploading {done / 1e3:.0f} / {total / 1e3:.0f} kB")

        result = upload_source(name, "src", path, namespace=ns, timeout=args.timeout, progress=progress)
        say(
            f"uploaded {result['files']} files ({result['bytes']} bytes) after {time.monotonic() - started:.1f}s"
        )
        env = wait_verdict(http, ns, name, args.timeout)
        status = env["status"]
        say(
            f"Ready after {time.monotonic() - started:.1f}s; snapshot commit {status['sources'][0]['commit'][:12]}"
        )
        verdict = status["verdict"]
        print()
        say(
            f"verdict: {verdict['result']}  score {verdict['score']}/{verdict['maxScore']} (pass at {verdict['passThreshold']})"
        )
        for category, evidence in verdict["evidence"].items():
            for check in evidence["checks"]:
                mark = "PASS" if check["passed"] else "FAIL"
                say(
                    f"  {mark}  {category}: {check['name']}"
                    + (f" -- {check['detail'][:100]}" if check["detail"] else "")
                )

        if not args.source:
            command = (
                "python3 -m venv --system-site-packages /tmp/demo && /tmp/demo/bin/pip install -q --no-deps "
                f"--no-build-isolation git+https://github.com/{repo} && cd / && "
                "/tmp/demo/bin/python -c 'import shadowpkg; print(shadowpkg.VERSION)'"
            )
            install = runtime_call(http, env, "POST", "/v1/exec", json={"command": command})
            print()
            say(
                f"in the workspace: pip install git+https://github.com/{repo} -> VERSION = {install['stdout'].strip()!r}"
            )

        # An agent's change inside the workspace, then the diff against what was copied in.
        runtime_call(
            http,
            env,
            "POST",
            "/v1/exec",
            json={"command": "cd src && printf '\\n# edited inside the shadow environment\\n' >> README.md"},
        )
        diff = runtime_call(http, env, "GET", "/v1/diff")
        print()
        say("diff inside the workspace since the copy-in (GET /v1/diff):")
        for line in (diff.get("patch") or "").splitlines()[:40]:
            say(f"  {line}")
    print()
    say(f"kubectl -n {ns} get shadowenvironments      # READY, SOURCES, VERDICT")
    say(f"kubectl -n {ns} delete shadowenvironment {name}   # removes its workspace, Gitea and volumes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
