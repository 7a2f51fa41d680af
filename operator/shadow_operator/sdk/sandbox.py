"""SandboxClient: claim plain sandboxes (from a template or a warm pool) and use them, sync and async twins.

Names follow the `k8s-agent-sandbox` SDK (create_sandbox, get_sandbox, delete_sandbox; a Sandbox handle with
`commands.run()` and `files.read()/write()`; `terminate()`), but the runtime is reached through the API
server's pod proxy, so nothing has to be port-forwarded or exposed.

    with SandboxClient() as client:
        sandbox = client.create_sandbox("python", namespace="default")
        print(sandbox.commands.run("python3 -V").stdout)
        sandbox.files.write("hello.txt", b"hi")
    # sandboxes the client created are deleted on exit
"""

from __future__ import annotations

import contextlib
import secrets
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypedDict, TypeVar, Unpack

import httpx

from shadow_operator.api import constants as c
from shadow_operator.api import naming
from shadow_operator.api.kinds import SANDBOX, SANDBOX_CLAIM
from shadow_operator.common import egress
from shadow_operator.sdk import errors, kube, runtime, wake
from shadow_operator.sdk.egress import EgressDecision
from shadow_operator.sdk.egress import log as egress_log
from shadow_operator.sdk.errors import NotFound, ShadowError, WaitTimeout
from shadow_operator.sdk.kube import Body, Call, Op
from shadow_operator.sdk.runtime import ExecOptions, ExecutionResult, RuntimeEndpoint

T = TypeVar("T")
S = TypeVar("S")

# Claim conditions that will not resolve by waiting: the claim names something that does not exist.
BLOCKING_REASONS = {
    c.REASON_TEMPLATE_NOT_FOUND: errors.SandboxTemplateNotFoundError,
    c.REASON_WARM_POOL_NOT_FOUND: errors.SandboxWarmPoolNotFoundError,
    c.REASON_ENV_INJECTION_REJECTED: errors.SandboxClaimFailedError,
    c.REASON_VOLUME_CLAIM_TEMPLATES_ERROR: errors.SandboxClaimFailedError,
    c.REASON_INVALID_METADATA: errors.SandboxClaimFailedError,
}


@dataclass(frozen=True)
class SandboxRef:
    claim_name: str
    sandbox_name: str
    namespace: str
    # The Sandbox as read when it was found asleep: the first call wakes it without failing once first.
    asleep: Body | None = field(default=None, compare=False, repr=False)


# ------------------------------------------------------------------------------- operations (shared)
def build_claim(
    claim_name: str,
    namespace: str,
    *,
    template: str | None,
    warmpool: str | None,
    labels: dict[str, str] | None = None,
    env: dict[str, str] | None = None,
    allow: Sequence[str] | None = None,
) -> Body:
    """`allow`: egress rules ([METHOD,...] HOST[:PORT][/PATH]) narrowing the template's spec.egress."""
    if bool(template) == bool(warmpool):
        raise ShadowError(
            "give exactly one of a template or a warm pool", hint="--template NAME or --warmpool NAME"
        )
    spec: Body = (
        {"warmPoolRef": {"name": warmpool}} if warmpool else {"sandboxTemplateRef": {"name": template}}
    )
    if env:
        spec["env"] = [{"name": k, "value": v} for k, v in env.items()]
    if allow is not None:
        spec["egress"] = {"rules": egress_rules(allow)}
    return {
        "apiVersion": SANDBOX_CLAIM.api_version,
        "kind": SANDBOX_CLAIM.kind,
        "metadata": {"name": claim_name, "namespace": namespace, **({"labels": labels} if labels else {})},
        "spec": spec,
    }


def egress_rules(allow: Sequence[str]) -> list[dict[str, object]]:
    try:
        return [egress.parse_allow(item) for item in allow]
    except ValueError as error:
        raise ShadowError(str(error), hint="see `kubectl explain sandboxclaim.spec.egress`") from None


def claim_ready(body: Body) -> SandboxRef | None:
    """The bound sandbox once the claim is Ready; a blocking reason raises its typed error."""
    meta, status = body["metadata"], body.get("status") or {}
    ready = next((x for x in status.get("conditions") or () if x.get("type") == c.COND_READY), None)
    if ready is None:
        return None
    if ready.get("status") == "True":
        name = (status.get("sandbox") or {}).get("name") or meta["name"]
        return SandboxRef(meta["name"], name, meta["namespace"])
    error = BLOCKING_REASONS.get(str(ready.get("reason")))
    if error is not None:
        raise error(
            f"SandboxClaim {meta['namespace']}/{meta['name']}: {ready.get('message')}",
            code=ready.get("reason"),
        )
    return None


def create(body: Body, timeout: float) -> Op[SandboxRef]:
    meta = body["metadata"]
    what = f"SandboxClaim {meta['namespace']}/{meta['name']}"
    created = yield from kube.send(
        Call("POST", SANDBOX_CLAIM.path(meta["namespace"]), f"create {what}", body=body)
    )
    return (yield from wait_claim(created, timeout))


def wait_claim(current: Body, timeout: float) -> Op[SandboxRef]:
    meta = current["metadata"]
    what = f"SandboxClaim {meta['namespace']}/{meta['name']}"

    def timed_out(body: Body) -> ShadowError:
        ready: Body = next(
            (x for x in (body.get("status") or {}).get("conditions") or () if x.get("type") == c.COND_READY),
            {},
        )
        now = (
            f"Ready is {ready.get('status')} ({ready.get('reason')}): {ready.get('message')}"
            if ready
            else "no status yet"
        )
        return WaitTimeout(
            f"{what} not ready after {timeout:g}s; {now}",
            hint=f"kubectl -n {meta['namespace']} describe sandboxclaim {meta['name']}",
        )

    return (
        yield from kube.wait_for(
            SANDBOX_CLAIM.path(meta["namespace"]),
            meta["name"],
            what,
            current,
            claim_ready,
            time.monotonic() + timeout,
            time.monotonic,
            timed_out,
            lambda: errors.SandboxNotFoundError(f"{what} was deleted while waiting"),
        )
    )


def get(claim_name: str, namespace: str) -> Op[SandboxRef]:
    what = f"SandboxClaim {namespace}/{claim_name}"
    try:
        body = yield from kube.get(SANDBOX_CLAIM.path(namespace, claim_name), what)
    except NotFound:
        raise errors.SandboxNotFoundError(f"{what} does not exist") from None
    ref = claim_ready(body)
    if ref is None:
        ref = yield from sleeping(body)
    if ref is None:
        raise errors.SandboxNotReadyError(
            f"{what} is not ready", hint=f"kubectl -n {namespace} describe sandboxclaim {claim_name}"
        )
    return ref


def sleeping(claim: Body) -> Op[SandboxRef | None]:
    """The claim's sandbox when it is not Ready only because it sleeps (suspended for idleness): the first
    call wakes it."""
    meta = claim["metadata"]
    name = ((claim.get("status") or {}).get("sandbox") or {}).get("name")
    if not name:
        return None
    try:
        body = yield from kube.get(
            SANDBOX.path(meta["namespace"], name), f"Sandbox {meta['namespace']}/{name}"
        )
    except NotFound:
        return None
    return SandboxRef(meta["name"], name, meta["namespace"], body) if wake.asleep(body) else None


def list_claims(namespace: str | None) -> Op[list[Body]]:
    """The SandboxClaims of `namespace`, or of every namespace (None)."""
    where = f"in {namespace}" if namespace else "in all namespaces"
    body = yield from kube.get(SANDBOX_CLAIM.path(namespace), f"list SandboxClaims {where}")
    return list(body["items"])


def delete(claim_name: str, namespace: str) -> Op[None]:
    what = f"SandboxClaim {namespace}/{claim_name}"
    try:
        yield Call("DELETE", SANDBOX_CLAIM.path(namespace, claim_name), f"delete {what}")
    except NotFound:
        raise errors.SandboxNotFoundError(f"{what} does not exist") from None


def endpoint(ref: SandboxRef) -> Op[RuntimeEndpoint]:
    """The sandbox's runtime through the pod proxy (the Pod is named like the Sandbox)."""
    body = ref.asleep
    if not (body and (body.get("status") or {}).get("runtimeURL")):
        body = yield from kube.get(
            SANDBOX.path(ref.namespace, ref.sandbox_name), f"Sandbox {ref.namespace}/{ref.sandbox_name}"
        )
    status = body.get("status") or {}
    secret = status.get("runtimeTokenSecret") or naming.token_secret_name(ref.sandbox_name)
    url = status.get("runtimeURL") or ""
    port = int(url.rsplit(":", 1)[1].split("/")[0]) if url.count(":") == 2 else c.RUNTIME_DEFAULT_PORT
    token = yield from runtime.read_token(ref.namespace, secret)
    return runtime.endpoint(ref.namespace, ref.sandbox_name, port, token)


def claim_name_for(prefix: str = "sandbox") -> str:
    return f"{prefix}-{secrets.token_hex(4)}"


def _woken(sandbox: Sandbox | AsyncSandbox, make: Callable[[], Op[T]]) -> Op[T]:
    """A runtime operation that wakes the sandbox first if it finds it asleep (both twins)."""
    ref, asleep = sandbox.ref, sandbox.asleep
    sandbox.asleep = None  # read once: later calls find out for themselves
    return wake.on_sandbox(
        ref.namespace,
        ref.sandbox_name,
        make,
        timeout=sandbox.wake_timeout,
        progress=sandbox.on_wake,
        asleep=asleep,
        claim=ref.claim_name,
    )


# --------------------------------------------------------------------------------------------- sync
class CommandExecutor:
    def __init__(self, sandbox: Sandbox) -> None:
        self._sandbox = sandbox

    def run(
        self, command: str | list[str], timeout: float = 60.0, **options: Unpack[ExecOptions]
    ) -> ExecutionResult:
        """Run a command (a string under `sh -c`, a list without a shell); `cwd` and `env` as
        `runtime.ExecOptions`."""
        result: ExecutionResult = self._sandbox._run(
            lambda ep: runtime.run_command(ep, command, timeout=timeout, **options)
        )
        return result

    def stream(
        self, command: str | list[str], timeout: float = 60.0, *, cwd: str = ""
    ) -> Iterator[dict[str, Any]]:
        """Output events as they come: {type: start|stdout|stderr|exit, ...}."""
        call = runtime.exec_call(self._sandbox.endpoint(), command, cwd=cwd, timeout=timeout, stream=True)
        yield from runtime.stream_events(self._sandbox._http, call)


class Filesystem:
    def __init__(self, sandbox: Sandbox) -> None:
        self._sandbox = sandbox

    def read(self, path: str) -> bytes:
        return self._sandbox._run(lambda ep: runtime.read_file(ep, path))

    def write(self, path: str, content: bytes | str) -> None:
        data = content.encode() if isinstance(content, str) else content
        self._sandbox._run(lambda ep: runtime.write_file(ep, path, data))

    def exists(self, path: str) -> bool:
        return self._sandbox._run(lambda ep: runtime.stat(ep, path)) is not None

    def delete(self, path: str, recursive: bool = False) -> None:
        self._sandbox._run(lambda ep: runtime.delete_path(ep, path, recursive=recursive))


class SandboxHandle(Generic[kube.C]):
    """What both Sandbox twins are made of: the claim's reference, an httpx client (`C`: sync or async), and
    the runtime's endpoint once read."""

    def __init__(
        self,
        http: kube.C,
        ref: SandboxRef,
        on_wake: wake.Progress | None = None,
        wake_timeout: float = wake.WAKE_TIMEOUT,
    ) -> None:
        self._http = http
        self.ref = ref
        self._ep: RuntimeEndpoint | None = None
        self.asleep = ref.asleep  # the Sandbox as found asleep, until the first call wakes it
        self.on_wake = on_wake  # told "waking sandbox …" when a call wakes it up
        self.wake_timeout = wake_timeout
        self._attach()

    def _attach(self) -> None:
        """Each twin's `commands` and `files`."""
        raise NotImplementedError

    claim_name = property(lambda self: self.ref.claim_name, doc="The SandboxClaim's name.")
    sandbox_name = property(
        lambda self: self.ref.sandbox_name,
        doc="The Sandbox's name (the claim's, or the warm pool's sandbox it adopted).",
    )
    namespace = property(lambda self: self.ref.namespace, doc="The namespace of the claim and its sandbox.")


class Sandbox(SandboxHandle[httpx.Client]):
    """A claimed sandbox: `commands`, `files`, `terminate()`."""

    def _attach(self) -> None:
        self.commands = CommandExecutor(self)
        self.files = Filesystem(self)

    def endpoint(self) -> RuntimeEndpoint:
        """The sandbox's runtime through the API server's pod proxy (read once)."""
        if self._ep is None:
            self._ep = kube.run(self._http, endpoint(self.ref))
        return self._ep

    def _run(self, make: Callable[[RuntimeEndpoint], Op[T]]) -> T:
        ep = self.endpoint()
        return kube.run(self._http, _woken(self, lambda: make(ep)))

    def run(self, command: str | list[str], timeout: float = 60.0) -> ExecutionResult:
        """Run a command in the sandbox (a string under `sh -c`, a list without a shell)."""
        return self.commands.run(command, timeout)

    def egress_log(self) -> list[EgressDecision]:
        """The egress gateway's decisions for this sandbox, the most recent last: each kind (allowed or
        refused, method, host) once, counted; a refusal names the rule that would allow it."""
        return kube.run(self._http, egress_log(self.namespace, self.sandbox_name))

    def terminate(self) -> None:
        """Delete the claim (and with it the sandbox)."""
        kube.run(self._http, delete(self.claim_name, self.namespace))


class ClaimOptions(TypedDict, total=False):
    """How `create_sandbox` claims (sync and async alike); all optional."""

    warmpool: str | None  # adopt a sandbox of this warm pool instead of starting one from the template
    namespace: str | None  # the claim's namespace (default: the client's)
    claim_name: str | None  # the claim's name (default: sandbox-<random>)
    sandbox_ready_timeout: float  # seconds to wait for Ready (default 180)
    labels: dict[str, str] | None  # added to the claim
    env: dict[str, str] | None  # variables injected into the sandbox's container
    allow: (
        Sequence[str] | None
    )  # narrows the template's egress allowlist ([METHOD,...] HOST[:PORT][/PATH] each)


class ClaimsHolder(kube.Holder[kube.C], Generic[kube.C, S]):
    """What both SandboxClient twins are made of: a namespace, an httpx client, the sandboxes (`S`) created."""

    def __init__(
        self,
        *,
        namespace: str | None = None,
        client: kube.C | None = None,
        on_wake: wake.Progress | None = None,
        wake_timeout: float = wake.WAKE_TIMEOUT,
    ) -> None:
        super().__init__(client)
        # As kubectl: the kubeconfig context's namespace unless one is named.
        self.namespace = namespace or kube.context_namespace()
        self._created: list[S] = []
        # Told "waking sandbox …" when a call finds its sandbox suspended for idleness and wakes it; such a
        # call waits `wake_timeout` seconds at most for it.
        self.on_wake = on_wake
        self.wake_timeout = wake_timeout

    def _claim_op(
        self,
        template: str | None,
        *,
        warmpool: str | None = None,
        namespace: str | None = None,
        claim_name: str | None = None,
        sandbox_ready_timeout: float = 180.0,
        labels: dict[str, str] | None = None,
        env: dict[str, str] | None = None,
        allow: Sequence[str] | None = None,
    ) -> Op[SandboxRef]:
        """create_sandbox's operation, for both twins: its options' defaults, and the refusal of a name
        that is not one of them (`ClaimOptions` types them for the caller)."""
        name = claim_name or claim_name_for()
        body = build_claim(
            name,
            namespace or self.namespace,
            template=template,
            warmpool=warmpool,
            labels=labels,
            env=env,
            allow=allow,
        )
        return create(body, sandbox_ready_timeout)


class SandboxClient(ClaimsHolder[httpx.Client, "Sandbox"], kube.ClientHolder):
    """Claims sandboxes; as a context manager it deletes, on exit, the ones it created."""

    def create_sandbox(self, template: str | None = None, **options: Unpack[ClaimOptions]) -> Sandbox:
        """Claim a sandbox from a template (cold start) or a warm pool, and wait (watching) until Ready;
        `warmpool`, `namespace`, `claim_name`, `sandbox_ready_timeout`, `labels`, `env`, `allow` as
        `ClaimOptions` (`allow` narrows the template's egress allowlist: [METHOD,...] HOST[:PORT][/PATH] each)."""
        ref = kube.run(self._http, self._claim_op(template, **options))
        sandbox = Sandbox(self._http, ref, self.on_wake, self.wake_timeout)
        self._created.append(sandbox)
        return sandbox

    def get_sandbox(self, claim_name: str, namespace: str | None = None) -> Sandbox:
        """A sandbox already claimed, by its claim's name."""
        ref = kube.run(self._http, get(claim_name, namespace or self.namespace))
        return Sandbox(self._http, ref, self.on_wake, self.wake_timeout)

    def list_sandboxes(self, namespace: str | None = None) -> list[Body]:
        """The SandboxClaims of a namespace (this client's by default), as the API server has them."""
        return kube.run(self._http, list_claims(namespace or self.namespace))

    def delete_sandbox(self, claim_name: str, namespace: str | None = None) -> None:
        """Delete a claim (and with it its sandbox)."""
        kube.run(self._http, delete(claim_name, namespace or self.namespace))

    def delete_all(self) -> None:
        """Delete every claim this client created."""
        for sandbox in self._created:
            with contextlib.suppress(errors.SandboxNotFoundError):
                sandbox.terminate()
        self._created.clear()

    def __exit__(self, *exc: object) -> None:
        try:
            self.delete_all()
        finally:
            self.close()


# -------------------------------------------------------------------------------------------- async
class AsyncCommandExecutor:
    def __init__(self, sandbox: AsyncSandbox) -> None:
        self._sandbox = sandbox

    async def run(
        self, command: str | list[str], timeout: float = 60.0, **options: Unpack[ExecOptions]
    ) -> ExecutionResult:
        result: ExecutionResult = await self._sandbox._run(
            lambda ep: runtime.run_command(ep, command, timeout=timeout, **options)
        )
        return result

    async def stream(
        self, command: str | list[str], timeout: float = 60.0, *, cwd: str = ""
    ) -> AsyncIterator[dict[str, Any]]:
        call = runtime.exec_call(
            await self._sandbox.endpoint(), command, cwd=cwd, timeout=timeout, stream=True
        )
        async for event in runtime.astream_events(self._sandbox._http, call):
            yield event


class AsyncFilesystem:
    def __init__(self, sandbox: AsyncSandbox) -> None:
        self._sandbox = sandbox

    async def read(self, path: str) -> bytes:
        return await self._sandbox._run(lambda ep: runtime.read_file(ep, path))

    async def write(self, path: str, content: bytes | str) -> None:
        data = content.encode() if isinstance(content, str) else content
        await self._sandbox._run(lambda ep: runtime.write_file(ep, path, data))

    async def exists(self, path: str) -> bool:
        return await self._sandbox._run(lambda ep: runtime.stat(ep, path)) is not None

    async def delete(self, path: str, recursive: bool = False) -> None:
        await self._sandbox._run(lambda ep: runtime.delete_path(ep, path, recursive=recursive))


@kube.documented_as(Sandbox)
class AsyncSandbox(SandboxHandle[httpx.AsyncClient]):
    def _attach(self) -> None:
        self.commands = AsyncCommandExecutor(self)
        self.files = AsyncFilesystem(self)

    async def endpoint(self) -> RuntimeEndpoint:
        if self._ep is None:
            self._ep = await kube.arun(self._http, endpoint(self.ref))
        return self._ep

    async def _run(self, make: Callable[[RuntimeEndpoint], Op[T]]) -> T:
        ep = await self.endpoint()
        return await kube.arun(self._http, _woken(self, lambda: make(ep)))

    async def run(self, command: str | list[str], timeout: float = 60.0) -> ExecutionResult:
        return await self.commands.run(command, timeout)

    async def egress_log(self) -> list[EgressDecision]:
        """As `Sandbox.egress_log`."""
        return await kube.arun(self._http, egress_log(self.namespace, self.sandbox_name))

    async def terminate(self) -> None:
        await kube.arun(self._http, delete(self.claim_name, self.namespace))


@kube.documented_as(SandboxClient)
class AsyncSandboxClient(ClaimsHolder[httpx.AsyncClient, "AsyncSandbox"], kube.AsyncClientHolder):
    """The async twin of SandboxClient."""

    async def create_sandbox(
        self, template: str | None = None, **options: Unpack[ClaimOptions]
    ) -> AsyncSandbox:
        ref = await kube.arun(self._http, self._claim_op(template, **options))
        sandbox = AsyncSandbox(self._http, ref, self.on_wake, self.wake_timeout)
        self._created.append(sandbox)
        return sandbox

    async def get_sandbox(self, claim_name: str, namespace: str | None = None) -> AsyncSandbox:
        ref = await kube.arun(self._http, get(claim_name, namespace or self.namespace))
        return AsyncSandbox(self._http, ref, self.on_wake, self.wake_timeout)

    async def list_sandboxes(self, namespace: str | None = None) -> list[Body]:
        return await kube.arun(self._http, list_claims(namespace or self.namespace))

    async def delete_sandbox(self, claim_name: str, namespace: str | None = None) -> None:
        await kube.arun(self._http, delete(claim_name, namespace or self.namespace))

    async def delete_all(self) -> None:
        for sandbox in self._created:
            with contextlib.suppress(errors.SandboxNotFoundError):
                await sandbox.terminate()
        self._created.clear()

    async def __aexit__(self, *exc: object) -> None:
        try:
            await self.delete_all()
        finally:
            await self.aclose()
