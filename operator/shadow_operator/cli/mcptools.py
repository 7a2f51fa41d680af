"""The tools `shadowctl mcp` serves, on the official `mcp` SDK (MCPServer), each one call of the Python SDK.

Environments: env_list, env_status, env_create, env_exec, env_read_file, env_write_file, env_list_files,
env_diff, env_promote, env_fork, env_race, env_verify, env_manifest, env_destroy. Plain sandboxes:
sandbox_list, sandbox_claim, sandbox_exec, sandbox_read_file, sandbox_write_file, sandbox_list_files,
sandbox_egress_log, sandbox_delete.

What an agent sends is the input of a stranger: names are DNS labels, workspace paths pass the SDK's
`confine.check` (relative, no `..`, no `.git` in any spelling), local directories must lie inside the roots
the person starting the server gave, and every size is bounded (file reads, writes, command output, diffs,
listings). A promote, or a race that promotes, is refused unless the call says `confirm: true`. Failures are
tool errors carrying the SDK's one-line message and hint; long work (create, verify, race, fork, claim) sends
MCP progress notifications.

Imported only by `shadowctl mcp` (it imports `mcp`, an extra); no `from __future__ import annotations` here:
the MCP SDK reads the tools' annotations to build their input schemas.
"""

import asyncio
import base64
import binascii
import contextlib
import functools
import hmac
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, ParamSpec, TypeVar
from urllib.parse import urlsplit

import httpx
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations
from pydantic import Field
from starlette.types import ASGIApp, Receive, Scope, Send

from shadow_operator import __version__
from shadow_operator.api import constants as c
from shadow_operator.api.environment import ShadowEnvironment
from shadow_operator.cli import environments
from shadow_operator.cli.common import plain
from shadow_operator.sdk import confine, kube, runtime
from shadow_operator.sdk import environment as envops
from shadow_operator.sdk.environment import EnvironmentSpec, GitSource, LocalSource
from shadow_operator.sdk.errors import ShadowError, UnsafePath
from shadow_operator.sdk.gateway import AsyncShadowGateway
from shadow_operator.sdk.race import MAX_CANDIDATES, RaceCandidate
from shadow_operator.sdk.runtime import ExecutionResult, RuntimeEndpoint
from shadow_operator.sdk.sandbox import AsyncSandboxClient

HTTP_PATH = "/mcp"
DEFAULT_READ = 256 * 1024  # bytes of a file one read returns unless it asks for fewer or more
MAX_READ = 1024 * 1024  # ... and at most: a model's context is the scarce thing, not the file
MAX_WRITE = 4 * 1024 * 1024  # bytes one write may carry
MAX_OUTPUT = 64 * 1024  # characters of each of stdout and stderr returned (the tail, where errors are)
MAX_PATCH = 512 * 1024  # characters of a diff's patch returned
MAX_ENTRIES = 2000  # entries of a listing or of a diff's file list returned
MAX_FORKS = 8
MAX_TIMEOUT = 3600.0
GATEWAYS = 64  # environments whose runtime endpoint is kept between calls
HEARTBEAT = 5.0  # seconds between progress notifications while a wait has no news

DNS_LABEL = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"
Name = Annotated[
    str, Field(pattern=DNS_LABEL, max_length=63, description="Name of the environment (a DNS label).")
]
ClaimName = Annotated[
    str, Field(pattern=DNS_LABEL, max_length=63, description="Name of the SandboxClaim (a DNS label).")
]
OptionalName = Annotated[str, Field(pattern=DNS_LABEL, max_length=63)] | None
OptionalSubdomain = (
    Annotated[str, Field(pattern=r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$", description="A storage class.")]
    | None
)
Quantity = (
    Annotated[
        str,
        Field(
            pattern=r"^[0-9]+(\.[0-9]+)?(m|k|M|G|Ki|Mi|Gi)?$",
            max_length=32,
            description="A resource request of the workspace, e.g. 500m (cpu) or 1Gi (memory).",
        ),
    ]
    | None
)
WorkspacePath = Annotated[
    str,
    Field(
        min_length=1,
        max_length=4096,
        description="A path relative to the workspace root: no leading /, no '..', never inside .git.",
    ),
]
Command = Annotated[
    str, Field(min_length=1, max_length=16384, description="A shell command (runs under sh -c).")
]
Timeout = Annotated[float, Field(ge=1, le=MAX_TIMEOUT, description="Seconds to wait at most.")]
Cwd = Annotated[str, Field(max_length=4096, description="Working directory, relative to the workspace root.")]
Encoding = Literal["utf-8", "base64"]
MaxBytes = Annotated[int, Field(ge=1, le=MAX_READ, description="Bytes to return at most.")]
Content = Annotated[str, Field(max_length=2 * MAX_WRITE, description="The file's content, in `encoding`.")]
Depth = Annotated[int, Field(ge=1, le=8, description="Levels of directories to list.")]

P = ParamSpec("P")
T = TypeVar("T")
Endpoint = Callable[[], Awaitable[RuntimeEndpoint]]


@dataclass(frozen=True)
class Config:
    """What the person starting the server chose: the namespace, the local roots, the kubeconfig login."""

    namespace: str
    roots: tuple[Path, ...]
    context: str | None = None
    kubeconfig: str | None = None


# -------------------------------------------------------------------------------------------- checks
def refuse(message: str, hint: str = "") -> ToolError:
    return ToolError(f"{message}\nhint: {hint}" if hint else message)


def tool_errors(fn: Callable[P, Awaitable[T]]) -> Callable[P, Awaitable[T]]:
    """The SDK's typed errors become tool errors with their one-line message and hint (the MCP SDK would
    report any other exception as a bare 'Error executing tool')."""

    @functools.wraps(fn)
    async def call(*args: P.args, **kwargs: P.kwargs) -> T:
        try:
            return await fn(*args, **kwargs)
        except ShadowError as exc:
            raise refuse(" ".join(exc.message.split()), exc.hint) from None

    return call


def workspace_path(path: str, *, root_ok: bool = False) -> str:
    """A path inside the workspace, as the SDK confines what it writes locally; "." is the root if allowed."""
    if root_ok and path.strip("/") in ("", "."):
        return ""
    try:
        confine.check(path)
    except UnsafePath as exc:
        raise refuse(exc.message, "give a path relative to the workspace root, e.g. src/app.py") from None
    return path


def local_dir(path: str, roots: Sequence[Path]) -> Path:
    """A local directory inside one of the roots (a relative path is taken from the first root); symbolic
    links are resolved before the check, so none leads out."""
    given = Path(path).expanduser()
    real = (given if given.is_absolute() else roots[0] / given).resolve()
    if not any(real.is_relative_to(root) for root in roots):
        raise refuse(
            f"{path} is outside the directories this server may use ({', '.join(map(str, roots))})",
            "start shadowctl mcp with --root DIR for each directory agents may work in",
        )
    return real


def parse_git(spec: str) -> GitSource:
    """URL[@ref][:org/name], as `shadowctl create --git` reads it; only https URLs (no local paths, no
    credentials in the URL: the environment's object is readable by others)."""
    where = urlsplit(spec)
    if where.scheme != "https" or "@" in where.netloc or ":" in where.netloc:
        raise refuse(
            f"git source {spec!r}: only https:// URLs without credentials", "e.g. https://host/org/repo"
        )
    return environments.parse_git(spec)


def tail(text: str, limit: int = MAX_OUTPUT) -> tuple[str, bool]:
    return (text, False) if len(text) <= limit else (text[-limit:], True)


def execution(result: ExecutionResult) -> dict[str, Any]:
    stdout, cut_out = tail(result.stdout)
    stderr, cut_err = tail(result.stderr)
    return {
        "exit_code": result.exit_code,
        "timed_out": result.timed_out,
        "stdout": stdout,
        "stderr": stderr,
        "truncated": result.truncated or cut_out or cut_err,
        "duration_seconds": result.duration_seconds,
    }


def content(data: bytes) -> tuple[str, Encoding]:
    try:
        return data.decode(), "utf-8"
    except UnicodeDecodeError:
        return base64.b64encode(data).decode(), "base64"


def payload(text: str, encoding: Encoding) -> bytes:
    try:
        data = base64.b64decode(text, validate=True) if encoding == "base64" else text.encode()
    except binascii.Error:
        raise refuse("content is not valid base64", "send encoding utf-8 for text") from None
    if len(data) > MAX_WRITE:
        raise refuse(f"{len(data)} bytes is over the {MAX_WRITE} bytes one write may carry")
    return data


def summary(env: ShadowEnvironment) -> dict[str, Any]:
    st = env.status
    return {
        "name": env.name,
        "namespace": env.namespace,
        "ready": envops.is_true(env, c.COND_READY),
        "conditions": {x.type: f"{x.status} ({x.reason})" for x in (st.conditions if st else None) or ()},
        "failure": plain(st.failure) if st and st.failure else None,
        "verdict": plain(st.verdict) if st and st.verdict else None,
        "sources": [s.name for s in (st.sources if st else None) or ()],
    }


# ------------------------------------------------------------------------------------------ progress
class Progress:
    """MCP progress notifications for one call, fed by the SDK's callbacks from any thread (an upload reports
    from a worker thread). Only the latest news is sent, numbered, so a burst of callbacks does not flood the
    client; a heartbeat says how long a wait has lasted when nothing else happens."""

    def __init__(self, ctx: Context) -> None:
        self._ctx = ctx
        self._loop = asyncio.get_running_loop()
        self._news: str | None = None
        self._wake = asyncio.Event()
        self._sent = 0
        self._started = time.monotonic()
        self._done = False

    def say(self, message: str) -> None:
        self._loop.call_soon_threadsafe(self._post, message)

    def _post(self, message: str) -> None:
        self._news = message
        self._wake.set()

    async def _pump(self, what: str) -> None:
        while not self._done:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(HEARTBEAT):
                    await self._wake.wait()
            if self._done:
                return
            self._wake.clear()
            news, self._news = self._news, None
            self._sent += 1
            elapsed = time.monotonic() - self._started
            await self._ctx.report_progress(self._sent, None, news or f"{what}: {elapsed:.0f}s")

    @contextlib.asynccontextmanager
    async def running(self, what: str) -> AsyncIterator["Progress"]:
        pump = asyncio.create_task(self._pump(what))
        self.say(what)
        try:
            yield self
        finally:
            # The flag, not only the cancellation: a cancellation that meets the wake-up can be lost.
            self._done = True
            self._wake.set()
            pump.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await pump


# ------------------------------------------------------------------------------------------- the SDK
class Session:
    """One connection to the API server, made on the first call that needs it (listing the tools needs
    none), and the gateways of the environments used lately (each keeps its runtime endpoint)."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self._http: httpx.AsyncClient | None = None
        self._gateways: OrderedDict[str, AsyncShadowGateway] = OrderedDict()

    @property
    def namespace(self) -> str:
        return self.config.namespace

    def http(self) -> httpx.AsyncClient:
        if self._http is None:
            self._http = kube.connect_async(context=self.config.context, kubeconfig=self.config.kubeconfig)
        return self._http

    def gateway(self, name: str) -> AsyncShadowGateway:
        gw = self._gateways.pop(name, None) or AsyncShadowGateway(
            name, namespace=self.namespace, client=self.http()
        )
        self._gateways[name] = gw
        while len(self._gateways) > GATEWAYS:
            self._gateways.popitem(last=False)
        return gw

    def forget(self, name: str) -> None:
        self._gateways.pop(name, None)

    def sandboxes(self) -> AsyncSandboxClient:
        return AsyncSandboxClient(namespace=self.namespace, client=self.http())

    async def run(self, op: kube.Op[T]) -> T:
        return await kube.arun(self.http(), op)

    # The endpoint is looked up only once the path passed: a refused path costs no API call.
    async def read(self, endpoint: Endpoint, path: str, max_bytes: int) -> dict[str, Any]:
        rel = workspace_path(path)
        ep = await endpoint()
        info = await self.run(runtime.stat(ep, rel))
        if info is None:
            raise refuse(f"{rel}: no such file in the workspace", "list the directory with *_list_files")
        if info.get("type") != "file":
            raise refuse(f"{rel} is a {info.get('type')}, not a file", "list it with *_list_files")
        data, more = await self.run(runtime.read_head(ep, rel, max_bytes))
        text, encoding = content(data)
        return {
            "path": rel,
            "size": info.get("size"),
            "truncated": more,
            "encoding": encoding,
            "content": text,
        }

    async def write(self, endpoint: Endpoint, path: str, text: str, encoding: Encoding) -> dict[str, Any]:
        rel = workspace_path(path)
        data = payload(text, encoding)
        await self.run(runtime.write_file(await endpoint(), rel, data))
        return {"path": rel, "bytes": len(data)}

    async def listing(self, endpoint: Endpoint, path: str, depth: int) -> dict[str, Any]:
        rel = workspace_path(path, root_ok=True)
        entries = await self.run(runtime.tree(await endpoint(), rel, depth=depth))
        keys = ("path", "type", "size")
        return {
            "path": rel or ".",
            "entries": [{k: e.get(k) for k in keys} for e in entries[:MAX_ENTRIES]],
            "truncated": len(entries) > MAX_ENTRIES,
        }

    async def aclose(self) -> None:
        """Close the connection: the server's lifespan ends (stdio: the agent went away; HTTP: the process
        stops, the lifespan being the app's, not a session's)."""
        if self._http is not None:
            await self._http.aclose()


# -------------------------------------------------------------------------------------------- tools
READ_ONLY = ToolAnnotations(read_only_hint=True, destructive_hint=False)
CHANGES = ToolAnnotations(read_only_hint=False, destructive_hint=False)
DESTRUCTIVE = ToolAnnotations(read_only_hint=False, destructive_hint=True)


def registrar(server: MCPServer[Any]) -> Callable[[ToolAnnotations], Callable[[Callable[..., Any]], None]]:
    """`@tool(annotations)`: add a tool, its SDK errors turned into tool errors."""

    def tool(annotations: ToolAnnotations) -> Callable[[Callable[..., Any]], None]:
        return lambda fn: server.add_tool(tool_errors(fn), annotations=annotations)

    return tool


def environment_tools(server: MCPServer[Any], s: Session) -> None:
    tool = registrar(server)

    def env_endpoint(name: str) -> Endpoint:
        return lambda: s.gateway(name).runtime_endpoint()

    @tool(READ_ONLY)
    async def env_list() -> dict[str, Any]:
        """List the ShadowEnvironments of the namespace: readiness, verdict, failure."""
        # One object, not a bare list: MCP would send a list as one content block per item, and none when empty.
        found = [summary(env) for env in await s.run(envops.list_(s.namespace))]
        return {
            "namespace": s.namespace,
            "environments": found[:MAX_ENTRIES],
            "truncated": len(found) > MAX_ENTRIES,
        }

    @tool(READ_ONLY)
    async def env_status(name: Name) -> dict[str, Any]:
        """An environment's conditions, sources, verdict and failure."""
        return summary(await s.gateway(name).status())

    @tool(CHANGES)
    async def env_create(
        name: Name,
        ctx: Context,
        local: Annotated[
            Sequence[str],
            Field(
                max_length=8,
                description="Local directories to copy in (uncommitted work included), inside the server's "
                "roots; a relative path is taken from the first root.",
            ),
        ] = (),
        git: Annotated[
            Sequence[str],
            Field(max_length=8, description="Git sources to clone: https URL[@ref][:org/name]."),
        ] = (),
        verify_commands: Annotated[
            Sequence[Command], Field(max_length=16, description="Smoke checks that give the verdict.")
        ] = (),
        template: OptionalName = None,
        pool: OptionalName = None,
        storage_class: OptionalSubdomain = None,
        cpu: Quantity = None,
        memory: Quantity = None,
        timeout: Timeout = 600.0,
    ) -> dict[str, Any]:
        """Create an environment from local directories and/or git repositories: its own workspace and Gitea,
        the sources copied in, then the smoke checks; waits for Ready and the verdict (progress is reported)."""
        sources = [LocalSource(local_dir(p, s.config.roots)) for p in local]
        spec = EnvironmentSpec(
            local=sources,
            git=[parse_git(g) for g in git],
            template=template,
            pool=pool,
            storage_class=storage_class,
            requests={k: v for k, v in (("cpu", cpu), ("memory", memory)) if v},
            verify_commands=list(verify_commands),
        )
        if not spec.local and not spec.git:
            raise refuse("nothing to copy in", "give local directories or git URLs")
        gw = s.gateway(name)
        async with Progress(ctx).running(f"creating {name}") as progress:

            def uploaded(source: str, done: int, total: int) -> None:
                progress.say(
                    f"uploading {source}: {done >> 10} KiB" + (f" of {total >> 10}" if total else "")
                )

            def changed(env: ShadowEnvironment) -> None:
                ready = envops.conditions(env).get(c.COND_READY)
                progress.say(f"{name}: {ready.reason}: {ready.message}" if ready else f"{name}: starting")

            await gw.start(spec, wait=False, timeout=timeout, progress=uploaded)
            env = await gw.wait_ready(timeout, on_change=changed)
        return summary(env)

    @tool(CHANGES)
    async def env_exec(
        name: Name, command: Command, cwd: Cwd = "", timeout: Timeout = 300.0
    ) -> dict[str, Any]:
        """Run a command in the environment's workspace; returns the exit code and the tail of its output."""
        cwd = workspace_path(cwd, root_ok=True)
        return execution(await s.gateway(name).exec(command, timeout, cwd=cwd))

    @tool(READ_ONLY)
    async def env_read_file(
        name: Name,
        path: WorkspacePath,
        max_bytes: MaxBytes = DEFAULT_READ,
    ) -> dict[str, Any]:
        """Read a file of the workspace (at most max_bytes; `truncated` says there was more). Text comes as
        utf-8, anything else as base64."""
        return await s.read(env_endpoint(name), path, max_bytes)

    @tool(CHANGES)
    async def env_write_file(
        name: Name,
        path: WorkspacePath,
        content: Content,
        encoding: Encoding = "utf-8",
    ) -> dict[str, Any]:
        """Write a file in the workspace (parents are created), replacing it if it exists."""
        return await s.write(env_endpoint(name), path, content, encoding)

    @tool(READ_ONLY)
    async def env_list_files(name: Name, path: WorkspacePath = ".", depth: Depth = 1) -> dict[str, Any]:
        """List a directory of the workspace, `depth` levels down."""
        return await s.listing(env_endpoint(name), path, depth)

    @tool(READ_ONLY)
    async def env_diff(name: Name, paths_only: bool = False) -> dict[str, Any]:
        """What changed in the workspace since its sources were copied in: paths, and the patch."""
        diff = await s.gateway(name).diff(paths_only=paths_only)
        cut = diff.patch is not None and len(diff.patch) > MAX_PATCH
        return {
            "added": diff.added[:MAX_ENTRIES],
            "modified": diff.modified[:MAX_ENTRIES],
            "deleted": diff.deleted[:MAX_ENTRIES],
            "patch": diff.patch[:MAX_PATCH] if diff.patch else diff.patch,  # a patch reads from its start
            "truncated": cut or len(diff.files) > MAX_ENTRIES,
        }

    @tool(DESTRUCTIVE)
    async def env_promote(
        name: Name,
        confirm: Annotated[
            bool, Field(description="Must be true: promote writes into your local directory (or a branch).")
        ] = False,
        source: OptionalName = None,
        to: Annotated[
            str | None, Field(max_length=4096, description="Local directory (inside the roots).")
        ] = None,
        paths: Annotated[Sequence[str], Field(max_length=256, description="Only these paths (globs).")] = (),
        to_branch: Annotated[
            str | None, Field(max_length=255, description="Push to this branch of the Gitea instead.")
        ] = None,
    ) -> dict[str, Any]:
        """Carry the environment's changes back: changed files into the local directory it was created from
        (never .git, never through a link), or a commit to a branch of its Gitea. Refused unless confirm is
        true; look at env_diff first."""
        if not confirm:
            raise refuse(
                f"promote of {name} refused: it writes the environment's changes outside it, and the call did "
                "not say confirm=true",
                "look at env_diff first, then call env_promote again with confirm=true",
            )
        gw = s.gateway(name)
        if to_branch:
            return await gw.promote(source=source, to_branch=to_branch)  # type: ignore[return-value]
        target = local_dir(to, s.config.roots) if to else None
        plans = await gw.plan_promote(source=source, to=target, paths=paths)
        for plan in plans:
            local_dir(str(plan.local_dir), s.config.roots)
        done = await gw.apply_promote(plans)
        return {
            "promoted": [
                {
                    "source": p.source,
                    "local_dir": str(p.local_dir),
                    "written": p.write,
                    "deleted": p.delete,
                    "refused": p.refused,
                }
                for p in done
            ]
        }

    @tool(CHANGES)
    async def env_fork(
        name: Name,
        ctx: Context,
        count: Annotated[int, Field(ge=1, le=MAX_FORKS)] = 1,
        names: Annotated[Sequence[Name], Field(max_length=MAX_FORKS)] = (),
        timeout: Timeout = 600.0,
    ) -> dict[str, Any]:
        """Fork the environment: independent copies of its workspace, uncommitted work included (named
        NAME-fork-1..N unless named); waits until they are Ready."""
        async with Progress(ctx).running(f"forking {name}"):
            forks = await s.gateway(name).fork(*names, count=None if names else count, timeout=timeout)
        return {"forks": [f.name for f in forks]}

    @tool(CHANGES)
    async def env_race(
        name: Name,
        ctx: Context,
        commands: Annotated[
            Sequence[Command],
            Field(
                min_length=1,
                max_length=MAX_CANDIDATES,
                description="One command per candidate, or one command with count.",
            ),
        ],
        count: Annotated[int | None, Field(ge=2, le=MAX_CANDIDATES)] = None,
        promote: Annotated[
            bool, Field(description="Promote the winner (after it passes again in a fresh fork).")
        ] = False,
        confirm: Annotated[bool, Field(description="Must be true when promote is.")] = False,
        keep: bool = False,
        command_timeout: Timeout = 600.0,
        timeout: Timeout = 600.0,
    ) -> dict[str, Any]:
        """Race candidates: fork the environment once per command, run each in its fork, verify and rank
        them; with promote (and confirm) the winner's change is promoted into the local directory."""
        if promote and not confirm:
            raise refuse(
                f"race of {name} with promote refused: the call did not say confirm=true",
                "race without promote first, or say confirm=true",
            )
        gw = s.gateway(name)
        if promote:
            for plan in await gw.plan_promote():
                local_dir(str(plan.local_dir), s.config.roots)
        async with Progress(ctx).running(f"racing {name}") as progress:

            def update(candidate: RaceCandidate) -> None:
                verdict = f" {candidate.verdict}" if candidate.verdict else ""
                progress.say(f"{candidate.name}: {candidate.state}{verdict}")

            result = await gw.race(
                list(commands),
                count=count,
                promote=promote,
                keep=keep,
                timeout=timeout,
                command_timeout=command_timeout,
                verify_timeout=timeout,
                on_update=update,
            )
        data: dict[str, Any] = plain(result)
        return data

    @tool(CHANGES)
    async def env_verify(name: Name, ctx: Context, timeout: Timeout = 600.0) -> dict[str, Any]:
        """Run the environment's smoke checks again and return the new verdict (progress is reported)."""
        async with Progress(ctx).running(f"verifying {name}"):
            verdict = await s.gateway(name).verify(timeout)
        data: dict[str, Any] = plain(verdict)
        return data

    @tool(READ_ONLY)
    async def env_manifest(name: Name) -> dict[str, Any]:
        """The handoff manifest: sources, verdict, changes and where they go, for the next agent."""
        data: dict[str, Any] = plain(await s.gateway(name).manifest())
        return data

    @tool(DESTRUCTIVE)
    async def env_destroy(name: Name, timeout: Timeout = 120.0) -> dict[str, Any]:
        """Delete the environment with its workspace, Gitea and volumes; waits until it is gone."""
        await s.gateway(name).stop(wait=True, timeout=timeout)
        s.forget(name)
        return {"deleted": name, "namespace": s.namespace}


def sandbox_tools(server: MCPServer[Any], s: Session) -> None:
    tool = registrar(server)

    def endpoint(claim: str) -> Endpoint:
        async def find() -> RuntimeEndpoint:
            return await (await s.sandboxes().get_sandbox(claim)).endpoint()

        return find

    @tool(READ_ONLY)
    async def sandbox_list() -> dict[str, Any]:
        """List the SandboxClaims of the namespace."""
        claims = await s.sandboxes().list_sandboxes()
        found = [
            {
                "claim": body["metadata"]["name"],
                "sandbox": ((body.get("status") or {}).get("sandbox") or {}).get("name"),
                "ready": any(
                    x.get("type") == c.COND_READY and x.get("status") == "True"
                    for x in (body.get("status") or {}).get("conditions") or ()
                ),
            }
            for body in claims[:MAX_ENTRIES]
        ]
        return {"namespace": s.namespace, "claims": found, "truncated": len(claims) > MAX_ENTRIES}

    @tool(CHANGES)
    async def sandbox_claim(
        ctx: Context,
        template: OptionalName = None,
        warmpool: OptionalName = None,
        claim: OptionalName = None,
        timeout: Timeout = 180.0,
    ) -> dict[str, Any]:
        """Claim a plain sandbox from a template (cold start) or a warm pool; waits until it is Ready."""
        async with Progress(ctx).running("claiming a sandbox"):
            sandbox = await s.sandboxes().create_sandbox(
                template, warmpool=warmpool, claim_name=claim, sandbox_ready_timeout=timeout
            )
        return {"claim": sandbox.claim_name, "sandbox": sandbox.sandbox_name, "namespace": sandbox.namespace}

    @tool(CHANGES)
    async def sandbox_exec(
        claim: ClaimName, command: Command, cwd: Cwd = "", timeout: Timeout = 60.0
    ) -> dict[str, Any]:
        """Run a command in the sandbox; returns the exit code and the tail of its output."""
        cwd = workspace_path(cwd, root_ok=True)
        sandbox = await s.sandboxes().get_sandbox(claim)
        return execution(await sandbox.commands.run(command, timeout, cwd=cwd))

    @tool(READ_ONLY)
    async def sandbox_read_file(
        claim: ClaimName,
        path: WorkspacePath,
        max_bytes: MaxBytes = DEFAULT_READ,
    ) -> dict[str, Any]:
        """Read a file of the sandbox (at most max_bytes; text as utf-8, anything else as base64)."""
        return await s.read(endpoint(claim), path, max_bytes)

    @tool(CHANGES)
    async def sandbox_write_file(
        claim: ClaimName,
        path: WorkspacePath,
        content: Content,
        encoding: Encoding = "utf-8",
    ) -> dict[str, Any]:
        """Write a file in the sandbox (parents are created)."""
        return await s.write(endpoint(claim), path, content, encoding)

    @tool(READ_ONLY)
    async def sandbox_list_files(
        claim: ClaimName, path: WorkspacePath = ".", depth: Depth = 1
    ) -> dict[str, Any]:
        """List a directory of the sandbox, `depth` levels down."""
        return await s.listing(endpoint(claim), path, depth)

    @tool(READ_ONLY)
    async def sandbox_egress_log(claim: ClaimName, refused_only: bool = False) -> dict[str, Any]:
        """The egress gateway's decisions for the sandbox, the most recent last; a refusal's `hint` is the
        egress rule that would allow it (the platform's template decides whether it may be added)."""
        decisions = await (await s.sandboxes().get_sandbox(claim)).egress_log()
        shown = [d.to_dict() for d in decisions if d.refused or not refused_only]
        return {"decisions": shown[-MAX_ENTRIES:], "truncated": len(shown) > MAX_ENTRIES}

    @tool(DESTRUCTIVE)
    async def sandbox_delete(claim: ClaimName) -> dict[str, Any]:
        """Delete the claim, and with it its sandbox."""
        await s.sandboxes().delete_sandbox(claim)
        return {"deleted": claim, "namespace": s.namespace}


# ------------------------------------------------------------------------------------------- servers
INSTRUCTIONS = (
    "Isolated copies of the user's work on Kubernetes. env_create copies local directories or git "
    "repositories into a ShadowEnvironment; work there with env_exec and the env_*_file tools; env_verify "
    "runs its smoke checks; env_diff shows the change; env_promote (confirm=true, after the user agreed) "
    "carries it back; env_destroy deletes it. env_fork and env_race try several attempts side by side. "
    "sandbox_* are plain disposable sandboxes."
)


class BearerToken:
    """ASGI middleware: every HTTP request carries `Authorization: Bearer <token>` or gets 401."""

    def __init__(self, app: ASGIApp, token: str) -> None:
        self.app = app
        self.expected = f"Bearer {token}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            given = next((v for k, v in scope["headers"] if k == b"authorization"), b"")
            if not hmac.compare_digest(given, self.expected):
                body = b'{"error":"a bearer token is required (Authorization: Bearer TOKEN)"}'
                await send(
                    {
                        "type": "http.response.start",
                        "status": 401,
                        "headers": [
                            (b"content-type", b"application/json"),
                            (b"www-authenticate", b'Bearer realm="shadowctl mcp"'),
                        ],
                    }
                )
                await send({"type": "http.response.body", "body": body})
                return
        await self.app(scope, receive, send)


class GuardedServer(MCPServer[Any]):
    """MCPServer whose streamable HTTP app asks every request for the bearer token."""

    def __init__(self, token: str, **kw: Any) -> None:
        super().__init__(**kw)
        self._token = token

    def streamable_http_app(self, **kw: Any) -> Any:
        app = super().streamable_http_app(**kw)
        app.add_middleware(BearerToken, token=self._token)
        return app


def build(config: Config, server_class: Callable[..., MCPServer[Any]] = MCPServer) -> MCPServer[Any]:
    session = Session(config)

    @contextlib.asynccontextmanager
    async def lifespan(_: MCPServer[Any]) -> AsyncIterator[None]:
        try:
            yield None
        finally:
            await session.aclose()

    server = server_class(
        name="shadowctl",
        version=__version__,
        instructions=INSTRUCTIONS,
        lifespan=lifespan,
        log_level="WARNING",
    )
    environment_tools(server, session)
    sandbox_tools(server, session)
    return server


def serve_stdio(config: Config) -> None:
    build(config).run("stdio")


def serve_http(config: Config, host: str, port: int, token: str) -> None:
    server = build(config, functools.partial(GuardedServer, token))
    server.run("streamable-http", host=host, port=port, streamable_http_path=HTTP_PATH)
