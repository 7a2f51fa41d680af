"""Proof 2: archive-import fuzz on both interpreters the runtime meets, Debian's python3 (the workspace
image's 3.11.2, no tarfile extraction filters) and this venv's: 10,000 seeded sequences of 1-6 members each,
extracted in-process by the runtime's own code (archive_fuzz.py, one subprocess per interpreter, run side
by side). Zero escapes, zero exclude violations, zero partial writes, nothing left staged."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from .conftest import DEBIAN_PYTHON, RUNTIME_SRC, debian_python_version

pytestmark = pytest.mark.unit

SEQUENCES = 10_000
DRIVER = Path(__file__).with_name("archive_fuzz.py")


def test_archive_import_fuzz_on_debian_python_and_the_venv(tmp_path: Path) -> None:
    assert os.path.exists(DEBIAN_PYTHON), (
        f"{DEBIAN_PYTHON} (Debian's python3 package) is needed: .ci/run installs it"
    )
    # tmpfs when there is one: the fuzz is filesystem-bound (a tree built and compared per sequence).
    work = Path(tempfile.mkdtemp(dir="/dev/shm")) if os.access("/dev/shm", os.W_OK) else tmp_path
    env = {**os.environ, "PYTHONPATH": str(RUNTIME_SRC)}
    runs = {}
    try:
        for seed, python in enumerate([DEBIAN_PYTHON, sys.executable], start=1):
            (work / str(seed)).mkdir()
            runs[python] = subprocess.Popen(
                [
                    python,
                    str(DRIVER),
                    "--seed",
                    str(seed),
                    "--count",
                    str(SEQUENCES),
                    "--workdir",
                    str(work / str(seed)),
                ],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        results = {}
        for python, proc in runs.items():
            out, err = proc.communicate(timeout=600)
            assert proc.returncode == 0, err[-2000:]
            results[python] = json.loads(out)
    finally:
        if work != tmp_path:
            shutil.rmtree(work, ignore_errors=True)
    for python, r in results.items():
        print(f"{python}: {json.dumps({k: v for k, v in r.items() if not isinstance(v, list)})}")
        assert r["sequences"] == SEQUENCES
        for finding in ("escapes", "exclude_violations", "partial_writes", "leftovers", "crashes"):
            assert r[finding] == [], (python, finding, r[finding][:10])
        # The grammar is not degenerate: both verdicts, and accepted archives with links, in numbers.
        assert r["accepted"] > SEQUENCES // 10 and r["accepted_with_links"] > SEQUENCES // 20
        assert sum(r["refused"].values()) > SEQUENCES // 10
    debian = results[DEBIAN_PYTHON]
    assert debian["python"] == ".".join(map(str, debian_python_version()))
