"""Copy a local working tree into a ShadowEnvironment: the client side of a source declared `upload: {}`.

Nothing of the user's machine is mounted into an environment, so the tree travels as one gzip'd tar, streamed
with constant memory. It carries what `git add --all` would snapshot (uncommitted and untracked-but-not-ignored
files included) and the history in `.git`, so that commits pinned in lockfiles resolve in the environment's
Gitea too. The operator waits for the annotation `uploads.shadow.dev/<source>` before it snapshots the directory.

The workspace is not the user's machine, so nothing that configures or authenticates git here goes there:
`.git/config` (and submodules' and worktrees' configs) travel rewritten from an allowlist (`GIT_CONFIG_KEPT`,
remote URLs without their user:password), and `.git/hooks` only as its `*.sample` files.

The runtime is reached through the API server's pod proxy, so nothing but the API server has to be exposed.
The proxy consumes `Authorization` (the caller's credentials for the API server), which is why the runtime's
token travels in `X-Sandbox-Runtime-Token`. RBAC needed: get/watch/patch shadowenvironments, get secrets,
create pods/proxy.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import stat
import subprocess
import tarfile
import zlib
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, TypedDict
from urllib.parse import quote, urlsplit, urlunsplit

import httpx

from shadow_operator.sdk import confine, kube
from shadow_operator.sdk.errors import RuntimeRefused, RuntimeUnreachable, UploadError

CHUNK = 256 * 1024
TOKEN_HEADER = "X-Sandbox-Runtime-Token"
# Extraction streams too, so the answer comes soon after the last byte; a long quiet spell means trouble.
UPLOAD_TIMEOUT = httpx.Timeout(300.0, connect=10.0)

Progress = Callable[[int, int], None]


class UploadResult(TypedDict):
    """The runtime's answer, plus the sha256 of the archive as sent."""

    path: str
    files: int
    bytes: int
    sha256: str


# ---------------------------------------------------------------------------------------------- the tree
def check_source(path: str | os.PathLike[str]) -> Path:
    """Refuse, before anything is created in the cluster, a directory an upload would refuse: one that is
    not a directory, or a linked worktree or submodule (its history lives elsewhere)."""
    root = Path(path)
    if not root.is_dir():
        raise UploadError(f"{root} is not a directory")
    if (root / ".git").is_file():
        raise UploadError(
            f"{root}/.git is a file (a linked worktree or a submodule): its history lives outside {root}; "
            "upload the repository's main working tree"
        )
    return root


def worktree_files(path: str | os.PathLike[str]) -> list[str]:
    """What an upload of `path` carries: relative `/`-separated paths of files and symlinks, sorted.

    In a git working tree: what `git add --all` would snapshot (tracked files, deleted ones skipped, and
    untracked files that are not ignored), nested repositories and submodules the same way, and every file of
    `.git/` (the history; transient `*.lock` files left out). A directory inside a repository carries its files
    without history. Anywhere else: every file. Symlinks are listed, never followed; directories are implied.
    """
    root = check_source(path)
    in_repo = (root / ".git").is_dir() or _inside_work_tree(root)
    return sorted(_repo_files(root, "") if in_repo else _all_files(root))


def _repo_files(root: Path, rel: str) -> Iterator[str]:
    here = root / rel
    for name in dict.fromkeys(_ls_files(here)):  # an unmerged path is listed once per stage
        full = here / name
        if not os.path.lexists(full):
            continue
        if full.is_dir() and not full.is_symlink():
            # A submodule or an untracked nested repository; an uninitialised submodule is an empty directory.
            if (full / ".git").exists():
                yield from _repo_files(root, f"{rel}{name.rstrip('/')}/")
            continue
        yield rel + name
    git = here / ".git"
    if git.is_dir():
        yield from (
            f"{rel}.git/{f}"
            for f in _all_files(git)
            if not f.endswith(".lock") and not _is_hook(f"{rel}.git/{f}")
        )
    elif git.is_file() and rel:
        yield f"{rel}.git"  # a submodule's pointer into the parent's .git/modules, which is carried too


def _all_files(root: Path) -> Iterator[str]:
    stack = [""]
    while stack:
        rel = stack.pop()
        with os.scandir(root / rel) as entries:
            for entry in entries:
                if entry.is_symlink() or entry.is_file(follow_symlinks=False):
                    yield rel + entry.name
                elif entry.is_dir(follow_symlinks=False):
                    stack.append(f"{rel}{entry.name}/")


def _inside_work_tree(root: Path) -> bool:
    try:
        done = _run_git(root, "rev-parse", "--is-inside-work-tree")
    except FileNotFoundError:
        return False  # no git: nothing here can be treated as a repository anyway
    return done.returncode == 0 and done.stdout.strip() == "true"


def _ls_files(here: Path) -> list[str]:
    try:
        done = _run_git(here, "ls-files", "-z", "--cached", "--others", "--exclude-standard")
    except FileNotFoundError:
        raise UploadError(f"{here} is a git repository and git is not installed") from None
    if done.returncode != 0:
        raise UploadError(f"git ls-files in {here} failed: {done.stderr.strip()}")
    return [name for name in done.stdout.split("\0") if name]


def _run_git(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    # GIT_DIR, GIT_WORK_TREE or GIT_INDEX_FILE from the caller's shell would list another repository.
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    return subprocess.run(
        ["git", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        errors="surrogateescape",
        check=False,
    )


# -------------------------------------------------------------------------------------- what git keeps
# Keys of a repository's config that travel (section.name, or section.*.name with any subsection). Everything
# else stays here: credentials (credential.*, http.*.extraHeader, user:password in URLs), commands git would run
# (core.fsmonitor, core.sshCommand, core.hooksPath, *.textconv, filter.*, alias.*, remote.*.uploadpack),
# includes of local files, url.*.insteadOf rewrites, proxies.
GIT_CONFIG_KEPT = frozenset(
    {
        *(
            f"core.{k}"
            for k in (
                "repositoryformatversion",
                "filemode",
                "bare",
                "logallrefupdates",
                "ignorecase",
                "precomposeunicode",
                "symlinks",
                "autocrlf",
                "eol",
                "safecrlf",
                "sparsecheckout",
                "sparsecheckoutcone",
                "quotepath",
            )
        ),
        *(
            f"remote.*.{k}"
            for k in ("url", "pushurl", "fetch", "push", "mirror", "tagopt", "prune", "prunetags")
        ),
        *(f"branch.*.{k}" for k in ("remote", "pushremote", "merge", "rebase", "description")),
        *(f"submodule.*.{k}" for k in ("url", "active", "branch")),
        "lfs.repositoryformatversion",
    }
)
_URL_KEYS = frozenset({"url", "pushurl"})


def _git_dir_parts(name: str) -> list[str] | None:
    """The folded components of `name` inside a `.git` (in any spelling), or None when it is not inside one:
    on a case-insensitive disk `.git/Hooks/x` is a hook and `.GIT/CONFIG` the config."""
    parts = name.split("/")
    for i, part in enumerate(parts[:-1]):
        if confine.is_dotgit(part):
            return [confine.fold(p) for p in parts[i + 1 :]]
    return None


def _is_hook(name: str) -> bool:
    """A hook of a repository or of a submodule's repository (`.git/hooks/`, `.git/modules/*/hooks/`) that is
    not one of git's samples: a script the workspace would run."""
    inside = _git_dir_parts(name)
    if inside is None or name.endswith(".sample") or "hooks" not in inside[:-1]:
        return False
    return inside[0] == "hooks" or inside[0] == "modules"


def _is_git_config(name: str) -> bool:
    inside = _git_dir_parts(name)
    if inside is None or inside[-1] not in ("config", "config.worktree"):
        return False
    return len(inside) == 1 or inside[0] in ("modules", "worktrees")


def _without_userinfo(url: str) -> str:
    """A remote URL without credentials: http(s) loses user and password (a user name can be a token), other
    schemes their password; scp-like `user@host:path` and local paths stay as they are."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return url
    if not parts.scheme or "@" not in parts.netloc:
        return url
    user, _, host = parts.netloc.rpartition("@")
    keep = "" if parts.scheme.lower() in ("http", "https", "ftp", "ftps") else user.partition(":")[0]
    return urlunsplit(parts._replace(netloc=f"{keep}@{host}" if keep else host))


def _quote(value: str) -> str:
    escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\t", "\\t")
    return f'"{escaped}"'


def sanitized_git_config(path: Path) -> bytes:
    """A repository config rewritten to the keys of GIT_CONFIG_KEPT, read by git itself (its own parser, no
    includes followed), remote URLs without user:password."""
    try:
        done = _run_git(path.parent, "config", "--file", str(path), "--no-includes", "--list", "-z")
    except FileNotFoundError:
        raise UploadError(f"{path} needs git to be read, and git is not installed") from None
    if done.returncode != 0:
        raise UploadError(f"cannot read {path}: {done.stderr.strip()}", hint="fix it with git config --edit")
    sections: dict[tuple[str, str | None], list[str]] = {}
    for entry in filter(None, done.stdout.split("\0")):
        key, has_value, value = entry.partition("\n")
        section, _, rest = key.partition(".")
        sub, _, name = rest.rpartition(".")
        wanted = f"{section}.*.{name}" if sub else f"{section}.{name}"
        if wanted not in GIT_CONFIG_KEPT:
            continue
        if name in _URL_KEYS:
            value = _without_userinfo(value)
        line = f"\t{name} = {_quote(value)}\n" if has_value else f"\t{name}\n"  # a bare name is true
        sections.setdefault((section, sub or None), []).append(line)
    lines = []
    for (section, subsection), entries in sections.items():
        lines.append(f"[{section}]\n" if subsection is None else f"[{section} {_quote(subsection)}]\n")
        lines.extend(entries)
    return "".join(lines).encode("utf-8", "surrogateescape")


# -------------------------------------------------------------------------------------------- the archive
def stream_worktree(
    path: str | os.PathLike[str],
    files: Iterable[str] | None = None,
    chunk: int = CHUNK,
    *,
    progress: Progress | None = None,
) -> Iterator[bytes]:
    """A tar.gz of `files` (default: `worktree_files(path)`), yielded in pieces of about `chunk` bytes.

    The tar is written here rather than by `tarfile` so that one file is read a piece at a time between yields:
    memory stays near `chunk` however large the files are. Headers come from `TarInfo` (PAX, for long names).
    Owners are not recorded (they mean nothing in the workspace); hard links travel as separate files.
    `progress(done, total)` counts file bytes read, of all the files' sizes.
    """
    root = Path(path)
    entries: list[tuple[str, os.stat_result]] = []
    rewritten: dict[str, bytes] = {}
    for name in worktree_files(root) if files is None else files:
        if _is_hook(name):
            continue
        with contextlib.suppress(FileNotFoundError):  # gone since it was listed, as `git add` would see it
            st = os.lstat(root / name)
            if stat.S_ISREG(st.st_mode) and _is_git_config(name):
                rewritten[name] = sanitized_git_config(root / name)
            entries.append((name, st))
    total = sum(
        len(rewritten[n]) if n in rewritten else st.st_size for n, st in entries if stat.S_ISREG(st.st_mode)
    )
    done = 0
    written = 0  # uncommitted tar bytes, for the end-of-archive padding
    gz = zlib.compressobj(6, zlib.DEFLATED, 16 + zlib.MAX_WBITS)  # gzip framing, mtime 0
    out = bytearray()

    def emit(data: bytes) -> None:
        nonlocal written
        written += len(data)
        out.extend(gz.compress(data))

    for name, st in entries:
        info = _tar_info(root, name, st)
        if info is None:
            continue
        if name in rewritten:
            info.size = len(rewritten[name])
            emit(info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape"))
            emit(rewritten[name] + bytes(-info.size % tarfile.BLOCKSIZE))
            done += info.size
            if progress is not None:
                progress(done, total)
            continue
        emit(info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape"))
        if info.isreg():
            try:
                with open(root / name, "rb") as f:
                    left = info.size
                    while left:
                        data = f.read(min(chunk, left))
                        if not data:
                            raise UploadError(f"{name} shrank while it was being read; upload again")
                        left -= len(data)
                        done += len(data)
                        emit(data)
                        if progress is not None:
                            progress(done, total)
                        if len(out) >= chunk:
                            yield bytes(out)
                            out.clear()
            except OSError as exc:
                raise UploadError(f"cannot read {root / name}: {exc.strerror or exc}") from None
            emit(bytes(-info.size % tarfile.BLOCKSIZE))
        if len(out) >= chunk:
            yield bytes(out)
            out.clear()
    emit(bytes(2 * tarfile.BLOCKSIZE))  # end of archive, padded to a whole record as tar writes it
    emit(bytes(-written % tarfile.RECORDSIZE))
    out.extend(gz.flush())
    for i in range(0, len(out), chunk):
        yield bytes(out[i : i + chunk])


def _tar_info(root: Path, name: str, st: os.stat_result) -> tarfile.TarInfo | None:
    info = tarfile.TarInfo(name)
    info.mode = stat.S_IMODE(st.st_mode)
    info.mtime = int(st.st_mtime)
    if stat.S_ISREG(st.st_mode):
        info.size = st.st_size
    elif stat.S_ISLNK(st.st_mode):
        info.type = tarfile.SYMTYPE
        info.linkname = os.readlink(root / name)
    else:
        return None  # sockets, fifos, devices: nothing a working tree needs
    return info


# ------------------------------------------------------------------------------------------- the upload
def upload_to_runtime(
    runtime_base_url: str,
    token: str,
    dest_dir: str,
    path: str | os.PathLike[str],
    *,
    headers: dict[str, str] | None = None,
    client: httpx.Client | None = None,
    progress: Progress | None = None,
) -> UploadResult:
    """Stream the working tree at `path` into `dest_dir` (relative to the workspace root) of a runtime.

    The token goes in `X-Sandbox-Runtime-Token` and, unless `headers` is given, also as `Authorization:
    Bearer`. Through the API server's proxy pass `headers` (e.g. `{}` with a client that carries the API
    server's credentials): `Authorization` then belongs to the API server. Returns the runtime's answer
    ({path, files, bytes}) and the sha256 of the archive.
    """
    url = f"{runtime_base_url.rstrip('/')}/v1/archive/{quote(dest_dir.strip('/'))}"
    sent = {TOKEN_HEADER: token, "Content-Type": "application/gzip"}
    sent.update({"Authorization": f"Bearer {token}"} if headers is None else headers)
    digest = hashlib.sha256()

    def body() -> Iterator[bytes]:
        for piece in stream_worktree(path, progress=progress):
            digest.update(piece)
            yield piece

    http = client or httpx.Client(trust_env=False)
    try:
        response = http.post(url, content=body(), headers=sent, timeout=UPLOAD_TIMEOUT)
    except httpx.TransportError as exc:
        raise RuntimeUnreachable(f"cannot reach the workspace runtime at {url}: {exc!r}") from None
    finally:
        if client is None:
            http.close()
    if not response.is_success:
        raise RuntimeRefused(
            response.status_code, kube.error_of(response).message, what="the upload: the runtime"
        )
    answer: dict[str, Any] = response.json()
    return UploadResult(
        path=str(answer["path"]),
        files=int(answer["files"]),
        bytes=int(answer["bytes"]),
        sha256=digest.hexdigest(),
    )
