"""Push a workspace's snapshot to its Gitea from the operator, so that no process the tenant can influence ever
holds the Gitea token.

The workspace only commits and writes a `git bundle` (resources/copyin.py SNAPSHOT, no credential there). Here the
operator streams that bundle out of the workspace with a size limit, checks it (`git bundle verify`, a fetch with
`transfer.fsckObjects` into a fresh bare repository in a private temporary directory) and pushes from that
repository. Every git here runs with an environment built from nothing: no system or user configuration
(`GIT_CONFIG_NOSYSTEM`, an empty `HOME`), no hooks, no proxy variables, http(s) only, no redirects, bounded file
size, address space and time; the token travels as `http.extraHeader` through `GIT_CONFIG_*` variables, never on
a command line, and never in an error message.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from shadow_operator.api import constants as c
from shadow_operator.clients.pacing import Slots
from shadow_operator.clients.runtime import DownloadTooLarge, Runtime, RuntimeUnavailable

OUTPUT_LIMIT = 64 * 1024  # bytes of a git's stdout/stderr kept (the rest is read and dropped)
# Refs of a bundle that are fetched; anything else it carries (notes, stash, other remotes) is ignored.
FETCH_REFSPECS = (
    f"+{c.GIT_SNAPSHOT_REF}:{c.GIT_SNAPSHOT_REF}",
    "+refs/heads/*:refs/heads/*",
    "+refs/remotes/origin/*:refs/remotes/origin/*",
    "+refs/tags/*:refs/tags/*",
)
# Every git here: nothing of the host's or the repository's configuration, no hooks, one thread, small mmap
# windows (a hostile pack must not need more memory than RLIMIT_AS allows), packs kept as they are.
HARDENED_CONFIG = (
    ("core.hooksPath", "/dev/null"),
    ("core.fsmonitor", "false"),
    ("core.packedGitWindowSize", "32m"),
    ("core.packedGitLimit", "256m"),
    ("core.deltaBaseCacheLimit", "32m"),
    ("core.bigFileThreshold", "16m"),
    ("pack.threads", "1"),
    ("transfer.unpackLimit", "1"),
    ("transfer.fsckObjects", "true"),
    # Legacy but harmless (zero-padded modes come from old git versions; real repositories have them).
    ("fetch.fsck.zeroPaddedFilemode", "ignore"),
    ("receive.fsck.zeroPaddedFilemode", "ignore"),
    ("credential.helper", ""),
)
# The push itself: over http(s) only (the bundle fetch reads a local file), never redirected.
PUSH_CONFIG = (
    ("protocol.allow", "never"),
    ("protocol.http.allow", "always"),
    ("protocol.https.allow", "always"),
    ("http.followRedirects", "false"),
    # Gitea stalled (its Pod is in the tenant's namespace): under 1 KiB/s for 30 s ends the push, and its slot.
    ("http.lowSpeedLimit", "1024"),
    ("http.lowSpeedTime", "30"),
)
ADDRESS_SPACE_LIMIT = 1 << 30


class PushFailed(Exception):
    """The snapshot could not be pushed; the message is fit for status and events (no secret in it)."""


@dataclass(frozen=True)
class PushSettings:
    """One per operator: `slots` bounds the pushes under way, so the work dir (an emptyDir whose overflow
    would evict the operator) never holds more than about slots.total x 2 x max_bundle_bytes, and one namespace
    never holds more than slots.per_namespace of them. `timeout` bounds each step of a push in total (the
    bundle's download, each git command)."""

    work_dir: str | None = None  # where the temporary bare repositories go (the operator's emptyDir)
    max_bundle_bytes: int = 1 << 30
    max_refs: int = 5000
    timeout: float = 900.0
    cleanup_seconds: float = 10.0  # for deleting the bundle in the workspace, which may be stopped
    slots: Slots = field(default_factory=lambda: Slots(total=2, per_namespace=1), compare=False)


def push_refspecs(refs: Iterable[str], branch: str, *, everything: bool) -> list[str]:
    """What to push from the verified repository: the snapshot to `branch`; with `everything`, also the
    repository's branches (local ones before origin's of the same name) and its tags."""
    specs = [f"+{c.GIT_SNAPSHOT_REF}:refs/heads/{branch}"]
    if not everything:
        return specs
    refs = list(refs)
    seen = {branch}
    heads = [r for r in refs if r.startswith("refs/heads/")]
    remotes = [r for r in refs if r.startswith("refs/remotes/origin/") and r != "refs/remotes/origin/HEAD"]
    for ref in heads + remotes:
        name = ref.split("/", 2)[2] if ref.startswith("refs/heads/") else ref.split("/", 3)[3]
        if name not in seen:
            seen.add(name)
            specs.append(f"+{ref}:refs/heads/{name}")
    if any(r.startswith("refs/tags/") for r in refs):
        specs.append("+refs/tags/*:refs/tags/*")
    return specs


async def push_snapshot(
    runtime: Runtime,
    bundle_path: str,
    *,
    remote_url: str,
    token: str,
    branch: str,
    everything: bool,
    settings: PushSettings,
    tenant: str,
) -> None:
    """Fetch the bundle the workspace wrote at `bundle_path` (then delete it there), verify it, and push the
    snapshot to `branch` of `remote_url` (with `everything`: the repository's branches and tags too). The push
    takes one of the operator's slots, within the share of the namespace `tenant`."""
    async with settings.slots.hold(tenant):
        with tempfile.TemporaryDirectory(prefix="shadow-push-", dir=settings.work_dir) as tmp:
            home, bundle, repo = Path(tmp, "home"), Path(tmp, "snapshot.bundle"), Path(tmp, "repo.git")
            home.mkdir(mode=0o700)
            size = await _download(runtime, bundle_path, bundle, settings)
            # The pack the fetch writes is the bundle's own (kept as it is): no file may be much larger.
            git = _Git(home, timeout=settings.timeout, file_limit=size + (64 << 20), secrets=[token])
            await git.run("init", "--quiet", "--bare", "--template=", str(repo))
            await git.run("bundle", "verify", "--quiet", str(bundle), cwd=repo, what="the snapshot bundle")
            await git.run("fetch", "--quiet", "--no-write-fetch-head", str(bundle), *FETCH_REFSPECS, cwd=repo)
            listed = await git.run("for-each-ref", "--format=%(refname)", cwd=repo)
            refs = listed.split()
            if c.GIT_SNAPSHOT_REF not in refs:
                raise PushFailed("the snapshot bundle carries no snapshot commit")
            if len(refs) > settings.max_refs:
                raise PushFailed(
                    f"the repository has {len(refs)} refs, more than the {settings.max_refs} pushed"
                )
            try:
                await git.run("check-ref-format", f"refs/heads/{branch}")
            except PushFailed:
                raise PushFailed(f"{branch!r} is not a valid branch name") from None
            await git.run(
                "push",
                "--quiet",
                "--force",
                remote_url,
                *push_refspecs(refs, branch, everything=everything),
                cwd=repo,
                config=[*PUSH_CONFIG, ("http.extraHeader", f"Authorization: token {token}")],
                what=f"push to {remote_url}",
            )


async def _download(runtime: Runtime, bundle_path: str, bundle: Path, settings: PushSettings) -> int:
    """The bundle from the workspace into `bundle` (deleted there either way): its size."""
    try:
        return await runtime.download(
            bundle_path, bundle, limit=settings.max_bundle_bytes, timeout=settings.timeout
        )
    except DownloadTooLarge as exc:
        raise PushFailed(
            f"the snapshot is larger than {exc.limit} bytes, the most the operator pushes (chart value "
            "operator.gitPush.maxBundleBytes)"
        ) from None
    finally:
        # Briefly: after a stall the runtime is likely stopped still, and the push's slot is held until this ends.
        with contextlib.suppress(RuntimeUnavailable, TimeoutError):
            async with asyncio.timeout(settings.cleanup_seconds):
                await runtime.delete(bundle_path)


class _Git:
    def __init__(self, home: Path, *, timeout: float, file_limit: int, secrets: Sequence[str]) -> None:
        self.timeout = timeout
        self.file_limit = file_limit
        self.secrets = [s for s in secrets if s]
        self.env = {
            "PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"),
            "HOME": str(home),
            "XDG_CONFIG_HOME": str(home),
            "GIT_CONFIG_NOSYSTEM": "1",
            "GIT_CONFIG_GLOBAL": os.devnull,
            "GIT_TERMINAL_PROMPT": "0",
            "GIT_NO_REPLACE_OBJECTS": "1",
            "LC_ALL": "C",
        }

    async def run(
        self,
        *args: str,
        cwd: Path | None = None,
        config: Sequence[tuple[str, str]] = (),
        what: str | None = None,
    ) -> str:
        env = dict(self.env)
        pairs = [*HARDENED_CONFIG, *config]
        env["GIT_CONFIG_COUNT"] = str(len(pairs))
        for i, (key, value) in enumerate(pairs):
            env[f"GIT_CONFIG_KEY_{i}"] = key
            env[f"GIT_CONFIG_VALUE_{i}"] = value
        # Limits through the shell (a preexec_fn is not safe in a threaded process): bounded file size (in
        # 512-byte blocks) and address space (KiB), whatever the bundle holds.
        proc = await asyncio.create_subprocess_exec(
            "/bin/sh",
            "-c",
            'ulimit -f "$1" && ulimit -v "$2" && shift 2 && exec git "$@"',
            "git",
            str(self.file_limit // 512 + 1),
            str(ADDRESS_SPACE_LIMIT // 1024),
            *args,
            cwd=cwd,
            env=env,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        assert proc.stdout is not None and proc.stderr is not None
        try:
            async with asyncio.timeout(self.timeout):
                out, err = await asyncio.gather(_bounded(proc.stdout), _bounded(proc.stderr))
                code = await proc.wait()
        except TimeoutError:
            proc.kill()
            await proc.wait()
            raise PushFailed(f"{what or 'git ' + args[0]} took longer than {self.timeout:g}s") from None
        if code != 0:
            detail = err.decode(errors="replace").strip().splitlines()[-3:]
            message = "; ".join(detail) or f"exit code {code}"
            for secret in self.secrets:
                message = message.replace(secret, "***")
            raise PushFailed(f"{what or 'git ' + args[0]} failed: {message[-600:]}")
        return out.decode(errors="replace")


async def _bounded(stream: asyncio.StreamReader) -> bytes:
    """Read a stream to its end, keeping its first OUTPUT_LIMIT bytes."""
    kept = bytearray()
    while chunk := await stream.read(65536):
        if len(kept) < OUTPUT_LIMIT:
            kept += chunk[: OUTPUT_LIMIT - len(kept)]
    return bytes(kept)
