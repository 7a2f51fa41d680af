"""Running the installed `shadowctl` as a user would, with a kubeconfig of the test's choosing."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

SHADOWCTL = str(Path(sys.executable).parent / "shadowctl")


def run(
    kubeconfig: str | None,
    *args: str,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
) -> subprocess.CompletedProcess[str]:
    """`shadowctl ARGS` with KUBECONFIG=`kubeconfig` (None: the environment's), wide output, and no
    SHADOW_NAMESPACE from the test's environment: the kubeconfig and -n decide the namespace."""
    environ = {**os.environ, "COLUMNS": "200", **(env or {})}
    environ.pop("SHADOW_NAMESPACE", None)
    if kubeconfig is not None:
        environ["KUBECONFIG"] = kubeconfig
    return subprocess.run(
        [SHADOWCTL, *args], env=environ, capture_output=True, text=True, timeout=120, cwd=cwd
    )


def write_kubeconfig(
    path: Path, admin_kubeconfig: str, users: dict[str, dict[str, Any]], contexts: dict[str, tuple[str, str]]
) -> str:
    """A kubeconfig with the admin's cluster, these users and contexts (name -> (user, namespace)); the first
    context is the current one."""
    admin = yaml.safe_load(Path(admin_kubeconfig).read_text())
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": admin["clusters"],
        "users": [{"name": name, "user": user} for name, user in users.items()],
        "contexts": [
            {
                "name": name,
                "context": {"cluster": admin["clusters"][0]["name"], "user": user, "namespace": ns},
            }
            for name, (user, ns) in contexts.items()
        ],
        "current-context": next(iter(contexts)),
    }
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o600)
    return str(path)
