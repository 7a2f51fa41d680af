"""The installation-health script the verification runs in a workspace (resources/copyin.py INSTALL_PYTHON),
run by bash with Debian's python3 (the workspace image's) on a real git repository: the package installs from
its git URL, into a venv that borrows the system's pip instead of installing its own (about 2 s of every
verdict), and a package that does not build fails the check."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from shadow_operator.resources import copyin

from tests.support.hostile_repo import git

pytestmark = pytest.mark.unit
PYTHON = "/usr/bin/python3"


def package(root: Path, backend: str) -> Path:
    root.mkdir()
    (root / "pyproject.toml").write_text(
        f'[build-system]\nrequires = ["setuptools"]\nbuild-backend = "{backend}"\n\n'
        '[project]\nname = "checkedpkg"\nversion = "0.1.0"\n\n[tool.setuptools]\npackages = ["checkedpkg"]\n'
    )
    (root / "checkedpkg").mkdir()
    (root / "checkedpkg" / "__init__.py").write_text("OK = True\n")
    git(root, "init", "-q", "-b", "main")
    git(root, "add", ".")
    git(root, "commit", "-q", "-m", "initial")
    return root


def run_check(repo: Path, tmp: Path) -> subprocess.CompletedProcess[str]:
    bin_dir = tmp / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "python3").unlink(missing_ok=True)
    (bin_dir / "python3").symlink_to(PYTHON)
    env = {
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "HOME": str(tmp),
        "TMPDIR": str(tmp),
        "SHADOW_URL": f"file://{repo}",
        "SHADOW_BRANCH": "main",
    }
    return subprocess.run(
        ["bash", "-c", copyin.INSTALL_PYTHON], env=env, capture_output=True, text=True, timeout=240
    )


@pytest.fixture
def debian_python() -> None:
    probe = subprocess.run([PYTHON, "-c", "import setuptools, pip, venv"], capture_output=True)
    if not os.path.exists(PYTHON) or probe.returncode != 0 or shutil.which("git") is None:
        pytest.fail(f"{PYTHON} with pip, setuptools and venv (python3-pip, python3-venv) and git are needed")


def test_a_package_installs_from_its_git_url_with_the_systems_pip(
    tmp_path: Path, debian_python: None
) -> None:
    result = run_check(package(tmp_path / "good", "setuptools.build_meta"), tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().endswith("SHADOW_RESULT installed")
    [site] = list(tmp_path.glob("*/venv/lib/python3*/site-packages"))
    assert (site / "checkedpkg" / "__init__.py").read_text() == "OK = True\n"
    assert not list(site.glob("pip*")), "pip was installed into the venv (ensurepip): the slow path"


def test_a_package_that_does_not_build_fails_the_check(tmp_path: Path, debian_python: None) -> None:
    result = run_check(package(tmp_path / "bad", "no_such_backend.build"), tmp_path)
    assert result.returncode != 0 and "SHADOW_RESULT installed" not in result.stdout
