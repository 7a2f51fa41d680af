"""The light client: the SDK and the CLI import, read a kubeconfig and make a client without the operator's
dependencies (kopf, aiohttp, prometheus-client, uvicorn), so `pip install shadow-operator` (no `operator`
extra) is enough to run them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib.resources import files
from pathlib import Path

import pytest
import shadow_operator
import yaml

OPERATOR_ONLY = ("kopf", "aiohttp", "prometheus_client", "uvicorn")


@pytest.mark.unit
def test_the_client_runs_without_the_operators_dependencies(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "config"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    script = (
        "import json, sys\n"
        "import shadow_operator.cli, shadow_operator.sdk\n"
        "from shadow_operator.sdk import kube\n"
        "kube.connect().close()\n"
        f"print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in {OPERATOR_ONLY!r})))"
    )
    env = {**os.environ, "KUBECONFIG": str(kubeconfig)}
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True, env=env
    )
    assert json.loads(done.stdout) == []


@pytest.mark.unit
def test_the_package_is_typed() -> None:
    assert files(shadow_operator).joinpath("py.typed").is_file()


@pytest.mark.unit
@pytest.mark.parametrize("command", [["run"], ["router-auth", "-n", "ns", "--domain", "preview.example"]])
def test_the_operator_without_its_extra_says_what_to_install(command: list[str]) -> None:
    """As after `pip install shadow-operator` (no extra): kopf and aiohttp cannot be imported."""
    script = (
        "import sys\n"
        "sys.modules.update(kopf=None, aiohttp=None)\n"
        "from shadow_operator.__main__ import main\n"
        f"sys.exit(main({command!r}))"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert "pip install 'shadow-operator[operator]'" in done.stderr and "Traceback" not in done.stderr
