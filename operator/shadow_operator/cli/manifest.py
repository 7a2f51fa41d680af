"""`shadowctl manifest`: seed 001's handoff manifest of an environment, for a smoke-test agent."""

from __future__ import annotations

import typer

from shadow_operator.cli.common import NameArg, NamespaceOpt, OutputOpt, connect, emit
from shadow_operator.cli.fallback import FallbackLocalOpt, FallbackOpt, FallbackVerifyOpt, local_sources, warn
from shadow_operator.sdk.environment import EnvironmentSpec
from shadow_operator.sdk.gateway import ShadowGateway


def manifest(
    name: NameArg,
    namespace: NamespaceOpt = "",
    fallback: FallbackOpt = None,
    local: FallbackLocalOpt = None,
    verify_command: FallbackVerifyOpt = None,
    output: OutputOpt = "yaml",
) -> None:
    """Print the handoff manifest (shadow_id, shadow_available, local_sources, test_context, fallback_mode,
    failure_reason, verdict) as YAML or JSON; its JSON Schema is sdk/schemas/handoff-manifest.schema.json.

    With --fallback host-only, an environment that cannot be had is checked on this machine instead (in a
    temporary copy of the sources) and the manifest says so: fallback_mode true, mode host-only.
    """
    spec = None
    if local or verify_command:
        spec = EnvironmentSpec(local=local_sources(local or ()), verify_commands=tuple(verify_command or ()))
    with ShadowGateway(name, namespace=namespace, client=connect()) as gw:
        found = gw.manifest(fallback=fallback, spec=spec)
    if found.fallback_mode:
        warn(found)
    emit(found.dump(), "yaml" if output == "text" else output)


def register(app: typer.Typer) -> None:
    app.command("manifest")(manifest)
