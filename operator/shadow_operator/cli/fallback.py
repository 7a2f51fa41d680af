"""`--fallback host-only` of create, verify and manifest: seed 001's host-only checks when no shadow can be had.

Opt-in and loud: a yellow line on stderr says the shadow is unavailable and why, the verdict says
`mode: host-only` and scores out of 50 (pass at 35), and the checks ran in a temporary copy of the sources.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from shadow_operator.cli.common import connect, emit, err, fail, out
from shadow_operator.sdk.errors import ShadowError

if TYPE_CHECKING:  # loaded by the verbs that use them (a `shadowctl list` needs none)
    from shadow_operator.api.environment import ShadowEnvironment
    from shadow_operator.sdk.environment import EnvironmentSpec, LocalSource
    from shadow_operator.sdk.manifest import HandoffManifest

FallbackOpt = Annotated[
    str | None,
    typer.Option(
        "--fallback",
        help="host-only: when the environment cannot be had (no cluster, no operator, a failure code), run "
        "the verification on this machine in a temporary copy of the sources (scored out of 50, labelled).",
    ),
]
FallbackLocalOpt = Annotated[
    list[str] | None,
    typer.Option("--local", help="With --fallback: the local directories to check (default: as recorded)."),
]
FallbackVerifyOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--verify",
        help="With --fallback: a command to run on this machine (the cluster's are never run here).",
    ),
]


def local_sources(specs: Sequence[str]) -> list[LocalSource]:
    from shadow_operator.sdk.environment import LocalSource

    sources = []
    for spec in specs:
        path_text, _, repo = spec.partition(":")
        path = Path(path_text).expanduser().resolve()
        if not path.is_dir():
            fail(f"--local {spec}: {path} is not a directory", "give the path of a local repository")
        sources.append(LocalSource(path, repo))
    return sources


def warn(manifest: HandoffManifest) -> None:
    from shadow_operator.sdk import hostonly

    verdict = manifest.verdict
    result = f"{verdict.result} {verdict.score}/{verdict.max_score}" if verdict else "no verdict"
    err.print(
        f"[yellow]shadow unavailable ({manifest.failure_reason}): HOST-ONLY verification on this machine, in "
        f"a temporary copy of the sources: {result} (pass at {hostonly.PASS_THRESHOLD})[/yellow]"
    )


def show_verdict(manifest: HandoffManifest, output: str) -> None:
    """The host-only verdict as `shadowctl verify` prints one; exit 1 on FAIL."""
    warn(manifest)
    verdict = manifest.verdict
    assert verdict is not None
    data = {**manifest.dump()["verdict"], "failureReason": manifest.failure_reason, "fallbackMode": True}
    if not emit(data, output):
        colour = "green" if verdict.result == "PASS" else "red"
        out.print(
            f"[{colour}]{verdict.result}[/{colour}] {verdict.score}/{verdict.max_score} host-only "
            f"(pass at {verdict.pass_threshold})"
        )
        for issue in verdict.issues:
            out.print(f"  - {issue}", markup=False)
    raise typer.Exit(0 if verdict.result == "PASS" else 1)


def host_only_manifest(
    name: str, namespace: str, exc: ShadowError, spec: EnvironmentSpec | None
) -> HandoffManifest:
    """The host-only manifest; the environment and this machine's record of its directories are keyed by the
    cluster, so without usable credentials there is neither (only --local is copied)."""
    from shadow_operator.sdk import kube, localdirs
    from shadow_operator.sdk import manifest as manifestops

    try:
        http = connect()
    except ShadowError:
        return manifestops.fallback_for(exc, exc.code, lambda: None, {}, None, spec, name)

    def known() -> ShadowEnvironment | None:
        try:
            return kube.run(http, manifestops.known_environment(namespace, name))
        except ShadowError:
            return None

    with http:
        recorded = localdirs.recorded(str(http.base_url), namespace, name)
        return manifestops.fallback_for(exc, exc.code, known, recorded, None, spec, name)


def with_fallback(verb: Callable[..., None]) -> Callable[..., None]:
    """A verb that, given --fallback host-only, answers with the host-only verdict when the environment
    cannot be had. It reads the verb's own options: name, namespace, output, and --local/--verify (create's
    sources and checks; for verify, the sources and checks to use when the cluster cannot say)."""

    @functools.wraps(verb)
    def run(**options: Any) -> None:
        from shadow_operator.sdk import hostonly
        from shadow_operator.sdk import manifest as manifestops
        from shadow_operator.sdk.environment import EnvironmentSpec

        if not hostonly.check_fallback(options.get("fallback")):
            return verb(**options)
        try:
            return verb(**options)
        except manifestops.UNAVAILABLE as exc:
            spec = EnvironmentSpec(
                local=local_sources(options.get("local") or ()),
                verify_commands=tuple(options.get("verify_command") or ()),
            )
            show_verdict(
                host_only_manifest(options["name"], options["namespace"], exc, spec), options["output"]
            )

    return run
