"""Proof 1 of issue 18: the client trusts nothing from a sandbox.

Promote, cp and upload run against a grammar of hostile answers (tests/support/hostile.py: every spelling of
`.git`, symbolic links in the local target, `.`/`..`/absolute forms, setuid modes, sparse 4 GiB members, gzip
bombs, sizes that lie) served by a real HTTP server on loopback, into a target on a case-folding filesystem
(tests/support/casefold.py), where `.GIT` *is* `.git`. After every case the sentinel trees (beside the target,
and the target's own `.git`) must be byte-for-byte as before, and nothing under the target may fold to `.git`,
be a new link, or carry setuid/setgid/sticky or group/other write bits; what is safe must have been written.

Without a case-folding filesystem the test skips, except under `make test` (SHADOW_REQUIRE_INTEGRATION=1),
where it fails: the proof is not made on such a host and CI must not say it was. The client's memory on a
4 GiB (sparse) archive and a 256 MiB gzip bomb: tests/runtime/test_client_hostile.py.
"""

from __future__ import annotations

import gzip
import io
import os
import random
import shutil
import stat
import subprocess
import sys
import tarfile
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from shadow_operator.sdk import confine, download, kube, promote, runtime
from shadow_operator.sdk.errors import ShadowError
from shadow_operator.sdk.runtime import RuntimeEndpoint
from shadow_operator.sdk.upload import stream_worktree, worktree_files

from tests.runtime.conftest import free_port, wait_until
from tests.support import casefold, hostile
from tests.support.hostile import Case

pytestmark = pytest.mark.unit

SEED = int(os.environ.get("SHADOW_FUZZ_SEED", "18"))
CASES = int(os.environ.get("SHADOW_FUZZ_CASES", "9000"))  # promote and cp, half each
UPLOADS = int(os.environ.get("SHADOW_FUZZ_UPLOADS", "1000"))
CANARY = "s3cr3t-canary"


@pytest.fixture(scope="module")
def folding(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    try:
        with casefold.mounted(tmp_path_factory.mktemp("casefold")) as (directory, name):
            print(f"\ncase-folding filesystem: {name}")
            yield directory
    except casefold.Unavailable as exc:
        if os.environ.get("SHADOW_REQUIRE_INTEGRATION") == "1":
            pytest.fail(f"no case-folding filesystem, the client fuzz cannot prove anything here: {exc}")
        pytest.skip(f"no case-folding filesystem: {exc}")


@pytest.fixture(scope="module")
def hostile_url() -> Iterator[str]:
    port = free_port()
    repo = Path(__file__).resolve().parents[2]
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.support.hostile", "--port", str(port), "--seed", str(SEED)], cwd=repo
    )
    url = f"http://127.0.0.1:{port}"

    def up() -> bool:
        try:
            return httpx.get(f"{url}/healthz", timeout=1).status_code == 404
        except httpx.TransportError:
            return False

    try:
        wait_until(up, 20, "the hostile runtime")
        yield url
    finally:
        proc.terminate()
        proc.wait(10)


# ------------------------------------------------------------------------------------------ the layout
FIXTURE_FILES = {"file": b"a local file\n", "sub/keep.txt": b"local work\n"}
GIT_FILES = {"HEAD": b"ref: refs/heads/main\n", "config": b"[core]\n\tbare = false\n", "hooks/README": b"x"}
OUTSIDE_FILES = {"secret.txt": b"outside\n", "dir/x": b"outside too\n"}


class Layout:
    """root/outside (a sentinel tree) and the target root/t<N>: .git, link -> ../outside, abs -> root/outside,
    file, sub/keep.txt. The target is rebuilt under a new name when a case changed its fixture, and every 100
    cases: ntfs-3g's case folding loses track of a name deleted and created again in the same directory (a
    symlink `abs` re-created after a promote deleted it is no longer found as `ABS`), so names are never
    re-created in place, and every rebuild checks that the new target folds."""

    REBUILD_EVERY = 100

    def __init__(self, root: Path) -> None:
        self.root = root
        self.outside = root / "outside"
        for rel, data in OUTSIDE_FILES.items():
            (self.outside / rel).parent.mkdir(parents=True, exist_ok=True)
            (self.outside / rel).write_bytes(data)
        self.generation = 0
        self.cases = 0
        self.target = root / "t0"
        self.fixture: dict[str, tuple[int, int, int]] = {}
        self.sentinel: dict[str, tuple[object, ...]] = {}
        self.rebuild()

    def rebuild(self) -> None:
        old, self.generation = self.target, self.generation + 1
        t = self.target = self.root / f"t{self.generation}"
        for rel, data in {**{f".git/{k}": v for k, v in GIT_FILES.items()}, **FIXTURE_FILES}.items():
            (t / rel).parent.mkdir(parents=True, exist_ok=True)
            (t / rel).write_bytes(data)
        os.symlink("../outside", t / "link")
        os.symlink(str(self.outside), t / "abs")
        self.fixture = {rel: _identity(t / rel) for rel in FIXTURE_FILES}
        _remove(old)
        for spelling in (".GIT", ".Git", "LINK", "Abs", "FILE", "SUB/KEEP.TXT"):
            assert os.path.lexists(t / spelling), f"the filesystem does not fold {spelling} in {t}"
        self.sentinel = self.snapshot()

    def reset(self) -> None:
        """Back to the fixture for the next case (the target's .git never changes: violations() checks)."""
        t = self.target
        self.cases += 1
        intact = self.cases % self.REBUILD_EVERY != 0 and all(
            os.path.lexists(t / rel) and _identity(t / rel) == ident for rel, ident in self.fixture.items()
        )
        intact = intact and all(os.path.islink(t / name) for name in ("link", "abs"))
        if not intact:
            self.rebuild()
            return
        for entry in os.scandir(t):
            if entry.name not in (".git", "link", "abs", "file", "sub"):
                _remove(Path(entry.path))
        for entry in os.scandir(t / "sub"):
            if entry.name != "keep.txt":
                _remove(Path(entry.path))

    def snapshot(self) -> dict[str, tuple[object, ...]]:
        """Everything outside the target, the target's .git, its links and its fixture files."""
        seen: dict[str, tuple[object, ...]] = {}
        for top in (self.outside, self.target / ".git"):
            for path in [top, *_walk(top)]:
                seen[str(path.relative_to(self.root))] = _describe(path)
        seen["(root)"] = tuple(sorted(os.listdir(self.root)))
        for name in ("link", "abs"):  # promote may delete a link of the target (the link, not its target)
            if os.path.islink(self.target / name):
                seen[name] = (os.readlink(self.target / name),)
        return seen

    def violations(self) -> list[str]:
        now = self.snapshot()
        keys = self.sentinel.keys() | now.keys()
        problems = [
            f"changed: {k}"
            for k in keys
            if self.sentinel.get(k) != now.get(k) and not (k in ("link", "abs") and k not in now)
        ]
        for path in _walk(self.target, skip=".git"):
            rel = path.relative_to(self.target)
            if any(confine.is_dotgit(part) for part in rel.parts):
                problems.append(f"a .git spelling: {rel}")
            mode = path.lstat().st_mode
            if stat.S_ISLNK(mode) and str(rel) not in ("link", "abs"):
                problems.append(f"a new link: {rel}")
            elif not (stat.S_ISREG(mode) or stat.S_ISDIR(mode) or stat.S_ISLNK(mode)):
                problems.append(f"not a file or directory: {rel}")
            if mode & 0o7022 and not stat.S_ISLNK(mode):
                problems.append(f"mode {stat.filemode(mode)}: {rel}")
        return problems


def _walk(top: Path, skip: str = "") -> Iterator[Path]:
    """Every entry below top, links not followed (os.scandir: pathlib's rglob costs more on FUSE)."""
    stack = [str(top)]
    while stack:
        with os.scandir(stack.pop()) as entries:
            for entry in entries:
                if entry.name == skip and entry.path == os.path.join(top, skip):
                    continue
                yield Path(entry.path)
                if entry.is_dir(follow_symlinks=False):
                    stack.append(entry.path)


def _identity(path: Path) -> tuple[int, int, int]:
    st = path.lstat()
    return (st.st_ino, st.st_size, st.st_mtime_ns)


def _describe(path: Path) -> tuple[object, ...]:
    """What any write changes: a rename over the file changes its inode, a write its size or mtime."""
    st = path.lstat()
    return (stat.S_IFMT(st.st_mode), stat.S_IMODE(st.st_mode), st.st_size, st.st_mtime_ns, st.st_ino)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif os.path.lexists(path):
        path.unlink()


# ----------------------------------------------------------------------------------------- the cases
def run_case(http: httpx.Client, url: str, c: Case, target: Path) -> str:
    ep = RuntimeEndpoint(f"{url}/case/{c.n}", {})
    budget = confine.Budget(hostile.MAX_BYTES, hostile.MAX_MEMBERS)
    try:
        if c.kind == "promote":
            diff = kube.run(http, runtime.diff(ep, paths_only=True))
            plan = promote.plan_promote(diff, "core", hostile.PREFIX, target)
            kube.run(http, promote.apply(ep, plan, budget))
        else:
            download.download_dir(http, ep, hostile.PREFIX, target, budget)
    except ShadowError as exc:
        assert "\n" not in exc.message, exc.message  # one line, for a person (and a script) to read
        return exc.code
    return "ok"


def written_as_expected(c: Case, target: Path) -> list[str]:
    """After a case that succeeded: every safe regular file is there with its bytes (the last one of a name)."""
    last = {m.name.rstrip("/"): m for m in c.members}
    deleted = {m.name for m in c.deleted}  # promote deletes after it writes
    problems = []
    for name, m in last.items():
        if m.safe and m.kind == "file" and not m.sparse and name not in deleted:
            path = target / name
            if not path.is_file() or path.read_bytes() != m.data:
                problems.append(f"not written: {name}")
    return problems


def test_promote_and_cp_against_hostile_answers(folding: Path, hostile_url: str) -> None:
    layout = Layout(folding / "fuzz")
    outcomes: Counter[tuple[str, str]] = Counter()
    started = time.monotonic()
    with httpx.Client(timeout=60) as http:
        for n in range(CASES):
            c = hostile.case(SEED, n)
            outcome = run_case(http, hostile_url, c, layout.target)
            outcomes[c.kind, outcome] += 1
            problems = layout.violations()
            if outcome == "ok":
                problems += written_as_expected(c, layout.target)
            assert not problems, f"case {n} of seed {SEED} ({outcome}): {problems}\n{c}"
            layout.reset()
    elapsed = time.monotonic() - started
    print(f"\n{CASES} promote/cp cases in {elapsed:.1f}s: {dict(sorted(outcomes.items()))}")
    for kind in ("promote", "cp"):
        assert outcomes[kind, "ok"] > CASES // 20, outcomes  # safe cases really write
        assert outcomes[kind, "UnsafePath"] > CASES // 20, outcomes
        assert outcomes[kind, "TooLarge"] > 0, outcomes


# ------------------------------------------------------------------------------------------- uploads
CONFIG_LINES = [
    '[remote "origin"]\n\turl = https://user:{c}@host/x.git\n',
    '[Remote "origin"]\n\tURL = HTTPS://{c}@host/x.git\n',
    '[remote "up"]\n\tpushurl = ssh://git:{c}@host/x.git\n\tfetch = +refs/heads/*:refs/remotes/up/*\n',
    "[remote.legacy]\n\turl = https://u:{c}@host/legacy.git\n",
    '[remote "q"]\n\turl = "https://u:{c}@host/q.git"\n\tproxy = http://u:{c}@proxy\n\tuploadpack = {c}\n',
    "[http]\n\textraheader = Authorization: Bearer {c}\n",
    "[HTTP]\n\tExtraHeader = Authorization: \\\n Basic {c}\n",
    '[http "https://host/"]\n\textraHeader = X-Token: {c}\n\tproxy = http://{c}@p\n',
    "[credential]\n\thelper = store --file=/tmp/{c}\n",
    '[credential "https://host"]\n\tusername = {c}\n',
    "[include]\n\tpath = /tmp/{c}.inc\n",
    '[includeIf "gitdir:/x/"]\n\tpath = {c}\n',
    "[core]\n\tfsmonitor = {c}-cmd\n\tsshCommand = ssh -i {c}\n\thooksPath = /{c}\n",
    '[url "https://{c}@host/"]\n\tinsteadOf = https://host/\n',
    '[submodule "s"]\n\turl = https://u:{c}@h/s.git\n\tupdate = !{c}\n',
    "[lfs]\n\turl = https://u:{c}@h/info/lfs\n",
    "[user]\n\tname = t\n\tpassword = {c}\n",
    '[filter "lfs"]\n\tclean = {c} %f\n',
    "[alias]\n\tst = !{c}\n",
]
HOOKS = [
    "hooks/pre-commit",
    "hooks/post-checkout",
    "HOOKS/pre-push",
    "Hooks/fsmonitor-watchman",
    "hooks/x.sample",
]


def test_uploads_carry_no_credentials_and_no_hooks(folding: Path) -> None:
    repo = folding / "upload-repo"
    repo.mkdir()
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q", "-b", "main"], check=True)
    (repo / "app.py").write_text("print(1)\n")
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "init"], check=True)
    base = (repo / ".git" / "config").read_text()
    started = time.monotonic()
    for n in range(UPLOADS):
        r = random.Random(f"{SEED}:upload:{n}")
        lines = r.sample(CONFIG_LINES, r.randint(1, 6))
        (repo / ".git" / "config").write_text(base + "".join(x.format(c=CANARY) for x in lines))
        hooks = r.sample(HOOKS, r.randint(0, 2))
        for hook in hooks:
            (repo / ".git" / hook).parent.mkdir(exist_ok=True)
            marker = "a sample, never run" if hook.endswith(".sample") else CANARY
            (repo / ".git" / hook).write_text(f"#!/bin/sh\necho {marker}\n")
        members = read_archive(b"".join(stream_worktree(repo, worktree_files(repo))))
        for name, data in members.items():
            assert CANARY.encode() not in data, f"upload {n}: {name} carries the secret ({lines})"
            inside = name.split("/")[1:] if name.startswith(".git/") else []
            assert not (inside and inside[0].casefold() == "hooks" and not name.endswith(".sample")), name
        config = members[".git/config"].decode()
        if any('"origin"' in x for x in lines):
            assert "https://host/x.git" in config, config
        if n % 25 == 0:  # git itself reads what was sent
            listed = subprocess.run(
                ["git", "config", "--file", "-", "--list"], input=config, capture_output=True, text=True
            )
            assert listed.returncode == 0, (config, listed.stderr)
        shutil.rmtree(repo / ".git" / "hooks")
        (repo / ".git" / "hooks").mkdir()
    print(f"\n{UPLOADS} uploads in {time.monotonic() - started:.1f}s")


def read_archive(data: bytes) -> dict[str, bytes]:
    out = {}
    with tarfile.open(fileobj=io.BytesIO(gzip.decompress(data)), mode="r:") as tar:
        for member in tar:
            reader = tar.extractfile(member) if member.isfile() else None
            out[member.name] = reader.read() if reader else member.linkname.encode()
    return out
