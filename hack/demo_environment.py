#!/usr/bin/env python3
"""`make demo`, second part: the everyday loop of a ShadowEnvironment, driven with shadowctl as a user would.

    hack/demo_environment.py [--source PATH[:org/name]] [--namespace NS] [--name NAME]

Without --source it makes a small Python package under the cache whose last change is not committed (the
case the environment exists for). Then: `shadowctl create` (upload with the uncommitted change, its own Gitea,
a verdict), `exec` (pip installs the package from its public GitHub URL, which the environment's git rewrites
send to that Gitea), an edit inside the workspace, `diff`, and `promote` back into the local directory.
Every command is printed before it runs. Runs against the current kubeconfig context.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

CACHE = Path(os.environ.get("SHADOW_CACHE") or Path.home() / ".cache" / "shadow-operator")
SHADOWCTL = str(Path(sys.executable).parent / "shadowctl")


def say(text: str) -> None:
    print(f"    {text}", flush=True)


def shadowctl(*args: str, check: bool = True) -> int:
    say("$ shadowctl " + shlex.join(args))
    code = subprocess.run([SHADOWCTL, *args], check=False).returncode
    if check and code != 0:
        sys.exit(f"error: shadowctl {args[0]} failed with exit code {code}")
    return code


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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--source", help="local repository PATH[:org/name] (default: a sample package)")
    parser.add_argument("--namespace", default=os.environ.get("SHADOW_RELEASE_NAMESPACE", "sandbox-platform"))
    parser.add_argument("--name", default="demo-env")
    parser.add_argument("--timeout", type=float, default=300.0)
    args = parser.parse_args()
    if args.source:
        path_text, _, repo = args.source.partition(":")
        path = Path(path_text).expanduser().resolve()
        repo = repo or f"shadowdemo/{path.name}"
    else:
        path, repo = sample_repository(), "shadowdemo/shadowpkg"
    org, name, ns = repo.split("/")[0], args.name, args.namespace
    where = ["-n", ns]

    exists = subprocess.run([SHADOWCTL, "status", name, *where, "-o", "json"], capture_output=True)
    if exists.returncode == 0:  # a fresh start when the demo runs again
        shadowctl("destroy", name, *where)
    create = ["create", name, *where, "--local", f"{path}:{repo}", "--timeout", str(args.timeout)]
    create += ["--rewrite", f"https://github.com/{org}/={org}"]
    if not args.source:
        create += ["--verify", "cd shadowpkg && python3 -c 'import shadowpkg; print(shadowpkg.VERSION)'"]
    shadowctl(*create)

    if not args.source:
        print()
        say(f"pip installs the package from https://github.com/{repo}; the rewrite sends git to the Gitea:")
        install = (
            "python3 -m venv --system-site-packages /tmp/demo && /tmp/demo/bin/pip install -q --no-deps "
            f"--no-build-isolation git+https://github.com/{repo} && cd / && "
            "/tmp/demo/bin/python -c 'import shadowpkg; print(\"VERSION =\", shadowpkg.VERSION)'"
        )
        shadowctl("exec", name, *where, "--", "sh", "-c", install)
        print()
        say("an agent edits the code inside the workspace; the local copy is untouched until promote:")
        edit = "cd shadowpkg && echo 'VERSION = \"edited in the shadow\"' > shadowpkg/__init__.py"
        shadowctl("exec", name, *where, "--", "sh", "-c", edit)
        shadowctl("diff", name, *where)
        shadowctl("promote", name, *where, "--force")
        say(
            f"{path}/shadowpkg/__init__.py now reads: {(path / 'shadowpkg' / '__init__.py').read_text().strip()}"
        )
    print()
    say(f"shadowctl status {name} -n {ns}     # conditions, snapshot commits, verdict")
    say(f"shadowctl shell {name} -n {ns}      # an interactive shell in the workspace")
    say(f"shadowctl destroy {name} -n {ns}    # removes its workspace, Gitea and volumes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
