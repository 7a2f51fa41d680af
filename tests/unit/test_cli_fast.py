"""A shadowctl call answers at once: `--version` imports nothing heavy, `list` neither the models nor the
`kubernetes` package, and a kubeconfig is read (merged, relative paths, bad YAML in one line) by
sdk/kubeconfig.py. CPU figures: hack/bench/cli_cpu_bench.py and BENCHMARKS.md."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from shadow_operator.sdk import kubeconfig
from shadow_operator.sdk.errors import NoCredentials

pytestmark = pytest.mark.unit

SHADOWCTL = str(Path(sys.executable).parent / "shadowctl")


def loaded_after(script: str, kubeconfig_path: str = "/nonexistent") -> set[str]:
    """The modules a fresh interpreter holds after `script`."""
    code = f"import json, sys\n{script}\nprint(json.dumps(sorted(sys.modules)))"
    env = {**os.environ, "KUBECONFIG": kubeconfig_path}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True, env=env
    )
    return set(json.loads(done.stdout.splitlines()[-1]))


def write_config(path: Path, **fields: object) -> Path:
    path.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "Config", **fields}))
    return path


def token_config(path: Path) -> Path:
    return write_config(
        path,
        clusters=[{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
        users=[{"name": "u", "user": {"token": "t"}}],
        contexts=[{"name": "x", "context": {"cluster": "c", "user": "u", "namespace": "team-a"}}],
        **{"current-context": "x"},
    )


def test_version_loads_neither_typer_nor_httpx() -> None:
    modules = loaded_after("from shadow_operator.cli import main\nmain(['--version'])")
    assert not modules & {"typer", "httpx", "pydantic", "rich", "yaml", "shadow_operator.sdk"}
    done = subprocess.run([SHADOWCTL, "--version"], capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout.startswith("shadowctl ")


def test_list_loads_no_models_and_no_kubernetes_package(tmp_path: Path) -> None:
    config = token_config(tmp_path / "config")
    modules = loaded_after(
        "from shadow_operator.cli import app\napp.register('list')\n"
        "from shadow_operator.sdk import kube\nkube.connect().close()",
        str(config),
    )
    assert "shadow_operator.cli.environments" in modules
    assert not {m for m in modules if m.split(".")[0] == "kubernetes"}
    assert "shadow_operator.api.models" not in modules
    assert "shadow_operator.cli.sandboxes" not in modules  # another verb's module


def test_a_malformed_kubeconfig_is_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "config"
    bad.write_text('apiVersion: v1\nclusters:\n- name: x\n  cluster: {server: "https://127.0.0.1:1"\n')
    done = subprocess.run(
        [SHADOWCTL, "list"],
        env={**os.environ, "KUBECONFIG": str(bad)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert done.stderr.splitlines() == [
        f"error: the kubeconfig {bad} is not valid YAML at line 5, column 1: did not find expected ',' or '}}'",
        "hint: check the file with: kubectl config view",
    ]


def test_kubeconfig_lists_merge_as_kubectl_merges_them(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "token").write_text("from-file\n")
    first = write_config(
        tmp_path / "a" / "config",
        users=[{"name": "u", "user": {"tokenFile": "token"}}],  # relative to its file
        contexts=[{"name": "x", "context": {"cluster": "c", "user": "u"}}],
        **{"current-context": "x"},
    )
    second = write_config(
        tmp_path / "b",
        clusters=[{"name": "c", "cluster": {"server": "https://example.test:6443/"}}],
        users=[{"name": "u", "user": {"token": "shadowed"}}],  # the first file's u wins
        contexts=[{"name": "x", "context": {"cluster": "other", "user": "u", "namespace": "ns"}}],
        **{"current-context": "y"},
    )
    paths = f"{first}{os.pathsep}{tmp_path / 'missing'}{os.pathsep}{second}"
    found = kubeconfig.credentials(kubeconfig=paths)
    assert found.server == "https://example.test:6443"
    assert found.headers == {"Authorization": "Bearer from-file"}
    assert found.namespace == "default"  # the first file's context x names none
    (tmp_path / "a" / "token").write_text("rotated\n")
    assert found.refresh() == {"Authorization": "Bearer rotated"}
    with pytest.raises(NoCredentials, match="no context named 'nope'"):
        kubeconfig.credentials("nope", paths)


def test_exec_plugins_go_to_the_full_loader(tmp_path: Path) -> None:
    config = write_config(
        tmp_path / "config",
        clusters=[{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
        users=[
            {"name": "u", "user": {"exec": {"apiVersion": "client.authentication.k8s.io/v1", "command": "x"}}}
        ],
        contexts=[{"name": "x", "context": {"cluster": "c", "user": "u"}}],
        **{"current-context": "x"},
    )
    assert kubeconfig.needs_full_loader(kubeconfig=str(config))
    assert not kubeconfig.needs_full_loader(kubeconfig=str(token_config(tmp_path / "plain")))
