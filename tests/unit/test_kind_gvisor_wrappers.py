"""images/kind-base/files/usr/local/bin/{runsc,containerd-shim-runsc-v1}: gVisor fitted to the kind node.

Each wrapper is run with its `real=` line pointed at a recorder script (what the real binary would receive,
and what it would print), as the node runs it: /bin/sh with jq.
"""

from __future__ import annotations

import json
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

pytestmark = [
    pytest.mark.unit,
    pytest.mark.skipif(shutil.which("jq") is None, reason="the wrappers use jq (in the node image)"),
]

BIN = Path(__file__).resolve().parents[2] / "images" / "kind-base" / "files" / "usr" / "local" / "bin"
POD_SLICE = "kubelet-kubepods-burstable-pod4114b345_c4a2_4d5e_858f_6830d65739a4.slice"


def wrapper(tmp_path: Path, name: str, real_script: str) -> Path:
    """A copy of the wrapper whose real binary is `real_script`."""
    real = tmp_path / f"real-{name}"
    real.write_text("#!/bin/sh\n" + real_script)
    real.chmod(real.stat().st_mode | stat.S_IEXEC)
    text = (BIN / name).read_text()
    lines = [f"real={real}" if line.startswith("real=") else line for line in text.splitlines()]
    assert lines != text.splitlines(), f"{name} names its real binary on a line starting with real="
    copy = tmp_path / name
    copy.write_text("\n".join(lines) + "\n")
    copy.chmod(copy.stat().st_mode | stat.S_IEXEC)
    return copy


def bundle(tmp_path: Path, cgroups_path: str) -> Path:
    path = tmp_path / "bundle"
    path.mkdir()
    (path / "config.json").write_text(
        json.dumps({"ociVersion": "1.2.1", "linux": {"cgroupsPath": cgroups_path}})
    )
    return path


def cgroups_path(path: Path) -> str:
    return str(json.loads((path / "config.json").read_text())["linux"]["cgroupsPath"])


def test_runsc_create_gets_the_systemd_units_directory_inside_the_pods_cgroup(tmp_path: Path) -> None:
    runsc = wrapper(tmp_path, "runsc", 'printf "%s\\n" "$@"\n')
    path = bundle(tmp_path, f"{POD_SLICE}:cri-containerd:86a6fd")
    args = ["--root=/run/containerd/runsc/k8s.io", "create", "--bundle", str(path), "86a6fd"]
    out = subprocess.run([str(runsc), *args], capture_output=True, text=True, timeout=30, check=True)
    assert out.stdout.splitlines() == args  # passed on unchanged
    assert cgroups_path(path) == (
        "/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-burstable.slice/"
        f"{POD_SLICE}/cri-containerd-86a6fd.scope"
    )


@pytest.mark.parametrize(
    ("verb", "path"),
    [
        ("create", "/kubelet/kubepods/pod1/abc"),  # cgroupfs paths are runsc's own form already
        ("start", f"{POD_SLICE}:cri-containerd:86a6fd"),  # only create reads the bundle's cgroup
    ],
)
def test_runsc_leaves_other_calls_and_paths_alone(tmp_path: Path, verb: str, path: str) -> None:
    runsc = wrapper(tmp_path, "runsc", "exit 0\n")
    spec = bundle(tmp_path, path)
    subprocess.run([str(runsc), verb, f"--bundle={spec}", "id"], timeout=30, check=True)
    assert cgroups_path(spec) == path


def test_shim_start_answers_containerd_1_6_with_a_bare_address(tmp_path: Path) -> None:
    shim = wrapper(
        tmp_path,
        "containerd-shim-runsc-v1",
        'echo "$@" > "$(dirname "$0")/args"\n'
        'printf \'{"version":2,"address":"unix:///run/containerd/s/abc","protocol":"ttrpc"}\'\n',
    )
    args = ["-namespace", "k8s.io", "-address", "/run/containerd/containerd.sock", "-id", "86a6fd", "start"]
    try:
        out = subprocess.run([str(shim), *args], capture_output=True, text=True, timeout=30, check=True)
    except subprocess.CalledProcessError as exc:
        if "unshare" in exc.stderr:
            pytest.skip(f"no mount namespace for this test process: {exc.stderr.strip()}")
        raise
    assert out.stdout.strip() == "unix:///run/containerd/s/abc"
    assert (tmp_path / "args").read_text().split() == args


def test_shim_passes_other_calls_through(tmp_path: Path) -> None:
    shim = wrapper(tmp_path, "containerd-shim-runsc-v1", 'printf "%s\\n" "$@"\nprintf "raw answer"\n')
    args = ["-namespace", "k8s.io", "-id", "86a6fd", "delete"]
    out = subprocess.run([str(shim), *args], capture_output=True, text=True, timeout=30, check=True)
    assert out.stdout == "\n".join(args) + "\nraw answer"
