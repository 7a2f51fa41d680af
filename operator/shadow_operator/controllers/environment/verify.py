"""The verify step: seed 001's rubric (the sources are in the workspace and in Gitea, they install from their
rewritten git URLs, the verify commands exit 0), scored into status.verdict once per generation or request."""

from __future__ import annotations

import contextlib
from datetime import UTC, datetime

from shadow_operator.api import constants as c
from shadow_operator.api.environment import SourceStatus
from shadow_operator.clients.gitea import Gitea, GiteaError
from shadow_operator.clients.runtime import (
    ExecutionResult,
    Runtime,
    RuntimeAnswerTooLarge,
    RuntimeUnavailable,
)
from shadow_operator.common.verdict import (
    CODE_EXECUTION,
    INSTALLATION_HEALTH,
    SHADOW,
    SOURCE_VERIFICATION,
    CheckResult,
    score,
)
from shadow_operator.controllers.environment.state import Pass, Ports, StepFailed
from shadow_operator.resources import copyin


class VerifyStep:
    def __init__(self, deps: Ports) -> None:
        self.deps = deps

    async def verify(self, state: Pass) -> None:
        env, deps = state.env, self.deps
        verify = env.spec.verify
        trigger = env.metadata.annotations.get(c.ANNOTATION_VERIFY_REQUEST)
        verdict = state.status.verdict
        if not verify.enabled and trigger is None:
            state.remove(c.COND_VERIFIED)
            return
        if verdict and verdict.observed_generation == env.metadata.generation and verdict.trigger == trigger:
            return
        checks: dict[str, list[CheckResult]] = {
            SOURCE_VERIFICATION: [],
            INSTALLATION_HEALTH: [],
            CODE_EXECUTION: [],
        }
        sources = state.status.sources or []
        async with deps.runtime_for(env.namespace, state.instance, state.status.runtime_url) as runtime:
            try:
                gitea_url = deps.gitea_api_url(state.named) if env.spec.gitea.enabled else None
                await self._check_sources(gitea_url, runtime, sources, checks[SOURCE_VERIFICATION])
                if verify.install:
                    await _check_installs(runtime, sources, checks[INSTALLATION_HEALTH])
                for command in verify.commands or ():
                    try:
                        result = await runtime.sh(
                            command.command,
                            cwd=command.cwd or "",
                            timeout=float(command.timeout_seconds),
                            tag=f"shadow-operator: verify {command.name}",
                        )
                    except RuntimeAnswerTooLarge as exc:
                        checks[CODE_EXECUTION].append(CheckResult(command.name, False, str(exc)))
                        continue
                    detail = f"exit code {result.exit_code}" + (" (timed out)" if result.timed_out else "")
                    if result.output:
                        detail += ": " + _evidence(result, 400)
                    checks[CODE_EXECUTION].append(CheckResult(command.name, result.ok, detail))
            except RuntimeUnavailable as exc:
                raise StepFailed(None, "RuntimeUnreachable", str(exc)) from None
        new = score(
            checks,
            SHADOW,
            pass_threshold=verify.pass_threshold,
            verified_at=datetime.now(UTC),
            generation=env.metadata.generation,
        )
        new.trigger = trigger
        state.status.verdict = new
        state.mark("verified")
        passed = new.result == "PASS"
        message = f"{new.result}: score {new.score}/{new.max_score} (threshold {new.pass_threshold})"
        state.set(c.COND_VERIFIED, passed, "VerificationPassed" if passed else "VerificationFailed", message)
        if passed:
            deps.recorder.info(env.body, reason="VerificationPassed", message=message)
        else:
            deps.recorder.warn(
                env.body, reason="VerificationFailed", message=message + "; " + "; ".join(new.issues)[:600]
            )

    async def _check_sources(
        self, gitea_url: str | None, runtime: Runtime, sources: list[SourceStatus], out: list[CheckResult]
    ) -> None:
        async with contextlib.AsyncExitStack() as stack:
            gitea = None
            if gitea_url is not None:
                gitea = await stack.enter_async_context(self.deps.open_gitea(gitea_url, username=""))
            for src in sources:
                check = f"{src.name}: workspace has {src.commit[:12]}"
                try:
                    result = await runtime.sh(
                        copyin.VERIFY_SOURCE,
                        env={"SHADOW_PATH": src.path, "SHADOW_COMMIT": src.commit},
                        timeout=60.0,
                        tag="shadow-operator: verify source",
                    )
                except RuntimeAnswerTooLarge as exc:
                    out.append(CheckResult(check, False, str(exc)))
                else:
                    out.append(CheckResult(check, result.ok, "" if result.ok else _evidence(result, 300)))
                if gitea is not None:
                    out.append(await _gitea_holds_snapshot(gitea, src))


async def _check_installs(runtime: Runtime, sources: list[SourceStatus], out: list[CheckResult]) -> None:
    for src in sources:
        detected = await runtime.sh(
            copyin.DETECT_PROJECT, env={"SHADOW_PATH": src.path}, timeout=30.0, tag="shadow-operator: detect"
        )
        kind = (copyin.parse_result(detected.stdout) or ["other"])[0]
        if kind not in ("python", "node"):
            continue
        # Python installs go through the public URL that the rewrites redirect (the fidelity this is about);
        # npm turns GitHub URLs into tarball downloads that bypass git, so it uses Gitea's URL.
        url = src.public_url if kind == "python" and src.public_url else src.clone_url
        script = copyin.INSTALL_PYTHON if kind == "python" else copyin.INSTALL_NODE
        check = f"{src.name}: installs from git"
        try:
            result = await runtime.sh(
                script,
                env={"SHADOW_URL": url, "SHADOW_BRANCH": src.branch, **copyin.author_env()},
                timeout=600.0,
                tag="shadow-operator: verify install",
            )
        except RuntimeAnswerTooLarge as exc:
            out.append(CheckResult(check, False, str(exc)))
            continue
        tool = "pip" if kind == "python" else "npm"
        detail = f"{tool} install from {url}@{src.branch}: exit code {result.exit_code}"
        if not result.ok and result.output:
            detail += ": " + _evidence(result, 400)
        out.append(CheckResult(check, result.ok, detail))


def _evidence(result: ExecutionResult, limit: int) -> str:
    """The tail of a command's output for a verdict, saying when the output was longer than what was kept."""
    tail = copyin.tail(result.output, limit)
    return f"(output truncated) {tail}" if result.truncated else tail


async def _gitea_holds_snapshot(gitea: Gitea, src: SourceStatus) -> CheckResult:
    org, _, repo = src.repo.partition("/")
    try:
        head, error = await gitea.branch_commit(org, repo, src.branch), ""
    except GiteaError as exc:
        head, error = None, str(exc)
    ok = head == src.commit
    detail = error or ("" if ok else f"branch {src.branch} is at {head or 'nothing'}")
    return CheckResult(f"{src.name}: Gitea {src.repo}@{src.branch} is the snapshot", ok, detail)
