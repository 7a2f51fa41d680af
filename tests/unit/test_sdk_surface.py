"""The SDK's public surface: the async twin of every class has each of the sync one's public methods (with the
same parameters), and every public method and function of the SDK says what it does."""

from __future__ import annotations

import asyncio
import inspect
from pathlib import Path

import httpx
import pytest
import shadow_operator.sdk as sdk
import yaml

pytestmark = pytest.mark.unit

TWINS = [
    (sdk.ShadowGateway, sdk.AsyncShadowGateway),
    (sdk.SandboxClient, sdk.AsyncSandboxClient),
    (sdk.Sandbox, sdk.AsyncSandbox),
]
# Lifecycle names that differ by design between the twins (close/aclose, with/async with).
RENAMED = {"close": "aclose", "__enter__": "__aenter__", "__exit__": "__aexit__"}


def public(cls: type) -> dict[str, object]:
    return {
        name: member
        for name, member in inspect.getmembers(cls)
        if not name.startswith("_") and (callable(member) or isinstance(member, property))
    }


@pytest.mark.parametrize(("sync", "asynchronous"), TWINS, ids=lambda c: c.__name__)
def test_the_async_twin_has_every_sync_method(sync: type, asynchronous: type) -> None:
    theirs = public(asynchronous)
    missing = [RENAMED.get(n, n) for n in public(sync) if RENAMED.get(n, n) not in theirs]
    assert missing == [], f"{asynchronous.__name__} lacks {missing}"
    for name, member in public(sync).items():
        twin = theirs[RENAMED.get(name, name)]
        if isinstance(member, property) or name in RENAMED:
            continue
        assert list(inspect.signature(member).parameters) == list(inspect.signature(twin).parameters), name  # type: ignore[arg-type]


def test_every_public_sdk_method_and_function_has_a_docstring() -> None:
    undocumented = []
    for name in sdk.__all__:
        obj = getattr(sdk, name)
        if inspect.isclass(obj):
            if issubclass(obj, BaseException):
                continue
            for member_name, member in public(obj).items():
                defined_here = any(
                    member_name in vars(k) for k in obj.__mro__ if k.__module__.startswith("shadow_operator")
                )
                if defined_here and not inspect.getdoc(member):
                    undocumented.append(f"{name}.{member_name}")
        elif callable(obj) and not inspect.getdoc(obj):
            undocumented.append(name)
    assert undocumented == []


def test_every_client_defaults_to_the_contexts_namespace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "config"
    config.write_text(
        yaml.safe_dump(
            {
                "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u", "namespace": "team-a"}}],
                "current-context": "x",
            }
        )
    )
    monkeypatch.setenv("KUBECONFIG", str(config))
    with sdk.SandboxClient() as client, sdk.ShadowGateway("env") as gateway:
        assert client.namespace == gateway.namespace == "team-a"
    assert sdk.AsyncSandboxClient(client=httpx.AsyncClient()).namespace == "team-a"
    for function in (sdk.upload_source, sdk.preview_link, sdk.apreview_link):
        assert inspect.signature(function).parameters["namespace"].default is None, function.__name__


def test_a_keyword_option_the_sdk_does_not_know_is_refused_before_anything_is_sent() -> None:
    # The twins take their keyword options as **options (typed by StartOptions, ForkOptions, PromoteOptions,
    # ClaimOptions, LinkOptions) and hand them to the one operation that declares them: a misspelt option is
    # still a TypeError, as with an explicit signature, and never silently dropped. Port 1: nothing listens.
    server = "http://127.0.0.1:1"

    async def asynchronous() -> None:
        async with sdk.AsyncShadowGateway(
            "env", namespace="ns", client=httpx.AsyncClient(base_url=server)
        ) as gw:
            for call in (
                lambda: gw.start(None, wiat=False),  # type: ignore[call-arg]
                lambda: gw.fork(cuont=2),  # type: ignore[call-arg]
                lambda: gw.promote(to_brnach="x"),  # type: ignore[call-arg]
            ):
                with pytest.raises(TypeError, match="unexpected keyword"):
                    await call()
        client = sdk.AsyncSandboxClient(namespace="ns", client=httpx.AsyncClient(base_url=server))
        with pytest.raises(TypeError, match="unexpected keyword"):
            await client.create_sandbox("python", warm_pool="p")  # type: ignore[call-arg]
        with pytest.raises(TypeError, match="unexpected keyword"):
            await sdk.apreview_link("sb", "ns", ttl=60, http=httpx.AsyncClient(base_url=server))  # type: ignore[call-arg]

    with sdk.ShadowGateway("env", namespace="ns", client=httpx.Client(base_url=server)) as gw:
        for call in (
            lambda: gw.start(None, wiat=False),  # type: ignore[call-arg]
            lambda: gw.fork(cuont=2),  # type: ignore[call-arg]
            lambda: gw.promote(to_brnach="x"),  # type: ignore[call-arg]
        ):
            with pytest.raises(TypeError, match="unexpected keyword"):
                call()
    client = sdk.SandboxClient(namespace="ns", client=httpx.Client(base_url=server))
    with pytest.raises(TypeError, match="unexpected keyword"):
        client.create_sandbox("python", warm_pool="p")  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="unexpected keyword"):
        sdk.preview_link("sb", "ns", ttl=60, http=httpx.Client(base_url=server))  # type: ignore[call-arg]
    asyncio.run(asynchronous())
