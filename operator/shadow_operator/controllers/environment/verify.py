"""The verify step: seed 001's rubric (the sources are in the workspace and in Gitea, they install from their
rewritten git URLs, the verify commands exit 0), scored into status.verdict once per generation or request."""

from __future__ import annotations

import asyncio
import contextlib
from datetime import UTC, datetime, timedelta

from shadow_operator.api import constants as c
from shadow_operator.api.environment import Category, SourceStatus, VerifyRun, VerifyRunCheck
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

# Between looks at a check running in the workspace: every POLL_SECONDS at first, then a POLL_SHARE of the time
# it has run so far, at most MAX_POLL_SECONDS apart. Each look is a reconcile pass and a call to the runtime:
# twenty day-long checks looked at every 2 s cost the operator 0.4 of a core on kind; a verdict comes at most a
# fifth of its checks' time (and 30 s) after they end.
POLL_SECONDS = 2.0
POLL_SHARE = 0.2
MAX_POLL_SECONDS = 30.0
GRACE_SECONDS = 30.0  # past a check's own timeout, before the operator stops waiting for its runtime to say
# The quick checks of Gitea (does it hold each snapshot), all of them in total: they run in the pass, and the
# environment's Gitea, which its tenant can reach, may stall.
GITEA_CHECK_SECONDS = 10.0
LOST = (
    "the workspace's runtime no longer knows this check's process (it restarted, or forgot it): request the "
    "verification again (shadowctl verify)"
)


class VerifyStep:
    def __init__(self, deps: Ports) -> None:
        self.deps = deps

    async def verify(self, state: Pass) -> float | None:
        """Verify once per generation or request: the seconds until the next look while checks run in the
        workspace (each a background process of its runtime, see VerifyRun), else None."""
        env, deps = state.env, self.deps
        verify = env.spec.verify
        trigger = env.metadata.annotations.get(c.ANNOTATION_VERIFY_REQUEST)
        verdict = state.status.verdict
        generation = env.metadata.generation
        if not verify.enabled and trigger is None:
            state.remove(c.COND_VERIFIED)
            return None
        if verdict and verdict.observed_generation == generation and verdict.trigger == trigger:
            return None
        run = state.status.verify_run
        async with deps.runtime_for(env.namespace, state.instance, state.status.runtime_url) as runtime:
            try:
                if run is None or run.generation != generation or run.trigger != trigger:
                    if run is not None:
                        await _abandon(runtime, run)  # superseded by a new generation or request
                    run = await self._plan(state, runtime, trigger)
                    state.status.verify_run = run
                wait = await self._advance(state, runtime, run)
            except RuntimeUnavailable as exc:
                raise StepFailed(None, "RuntimeUnreachable", str(exc)) from None
        if wait is not None:
            return wait
        self._conclude(state, run)
        return None

    async def _plan(self, state: Pass, runtime: Runtime, trigger: str | None) -> VerifyRun:
        """A new run: the quick checks done now (each bounded to a minute), the rest listed to run in turn."""
        env = state.env
        sources = state.status.sources or []
        checks: list[VerifyRunCheck] = []
        gitea_url = self.deps.gitea_api_url(state.named) if env.spec.gitea.enabled else None
        found: list[CheckResult] = []
        await self._check_sources(gitea_url, runtime, sources, found)
        checks += [_done(SOURCE_VERIFICATION, r) for r in found]
        if env.spec.verify.install:
            for src in sources:
                detected = await runtime.sh(
                    copyin.DETECT_PROJECT,
                    env={"SHADOW_PATH": src.path},
                    timeout=30.0,
                    tag="shadow-operator: detect",
                )
                kind = (copyin.parse_result(detected.stdout) or ["other"])[0]
                if kind in ("python", "node"):
                    checks.append(
                        VerifyRunCheck(
                            category=INSTALLATION_HEALTH,
                            name=f"{src.name}: installs from git",
                            source=src.name,
                            tool="pip" if kind == "python" else "npm",
                        )
                    )
        for command in env.spec.verify.commands or ():
            checks.append(VerifyRunCheck(category=CODE_EXECUTION, name=command.name, command=command.name))
        return VerifyRun(
            generation=env.metadata.generation or 0, trigger=trigger, started_at=state.now(), checks=checks
        )

    async def _advance(self, state: Pass, runtime: Runtime, run: VerifyRun) -> float | None:
        """Look in on the check under way and start the next: the seconds until the next look, or None when
        every check has ended."""
        now = state.now()
        for check in run.checks:
            if check.passed is not None:
                continue
            if check.process is None:
                program = self._program(state, check)
                if program is None:  # its command or source went from the spec meanwhile
                    check.passed, check.detail = False, "no longer in the environment's spec"
                    continue
                script, env, cwd, timeout = program
                check.process = await runtime.start(
                    script, env=env, cwd=cwd, timeout=timeout, tag=f"shadow-operator: verify {check.name}"
                )
                check.started_at = now
                check.deadline = now + timedelta(seconds=timeout + GRACE_SECONDS)
                return POLL_SECONDS
            running = await runtime.running(check.process)
            if running is None:
                check.passed, check.detail = False, LOST
                continue
            if running:
                if check.deadline is not None and now >= check.deadline:
                    await runtime.remove(check.process)
                    check.passed = False
                    check.detail = "the workspace's runtime did not end the command at its timeout: killed"
                    continue
                return _next_look(check, now)
            try:
                result = await runtime.result(check.process)
            except RuntimeAnswerTooLarge as exc:
                check.passed, check.detail = False, str(exc)
            else:
                if result is None:
                    check.passed, check.detail = False, LOST
                else:
                    check.passed, check.detail = result.ok, _detail(check, state, result)
            await runtime.remove(check.process)
        return None

    def _program(self, state: Pass, check: VerifyRunCheck) -> tuple[str, dict[str, str], str, float] | None:
        """What a check runs in the workspace: (script, environment, working directory, timeout)."""
        env = state.env
        if check.command is not None:
            command = next((x for x in env.spec.verify.commands or () if x.name == check.command), None)
            if command is None:
                return None
            return command.command, {}, command.cwd or "", float(command.timeout_seconds)
        install = _install_from(state, check)
        if install is None:
            return None
        url, branch = install
        script = copyin.INSTALL_PYTHON if check.tool == "pip" else copyin.INSTALL_NODE
        return script, {"SHADOW_URL": url, "SHADOW_BRANCH": branch, **copyin.author_env()}, "", 600.0

    def _conclude(self, state: Pass, run: VerifyRun) -> None:
        env, deps = state.env, self.deps
        checks: dict[str, list[CheckResult]] = {
            SOURCE_VERIFICATION: [],
            INSTALLATION_HEALTH: [],
            CODE_EXECUTION: [],
        }
        for check in run.checks:
            checks[check.category].append(CheckResult(check.name, bool(check.passed), check.detail))
        new = score(
            checks,
            SHADOW,
            pass_threshold=env.spec.verify.pass_threshold,
            verified_at=datetime.now(UTC),
            generation=run.generation,
        )
        new.trigger = run.trigger
        state.status.verdict = new
        state.status.verify_run = None  # set explicitly: the status patch clears it
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
            gitea_deadline = asyncio.get_running_loop().time() + GITEA_CHECK_SECONDS
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
                    out.append(await _gitea_holds_snapshot(gitea, src, gitea_deadline))


def _next_look(check: VerifyRunCheck, now: datetime) -> float:
    """Seconds until the next look at a check still running: a share of how long it has run, within bounds
    (never past its deadline)."""
    ran = (now - check.started_at).total_seconds() if check.started_at else 0.0
    wait = min(max(POLL_SECONDS, POLL_SHARE * ran), MAX_POLL_SECONDS)
    if check.deadline is not None:
        wait = min(wait, max((check.deadline - now).total_seconds(), POLL_SECONDS))
    return wait


def _done(category: Category, result: CheckResult) -> VerifyRunCheck:
    return VerifyRunCheck(
        category=category,
        name=result.name,
        passed=result.passed,
        detail=result.detail,
    )


def _install_from(state: Pass, check: VerifyRunCheck) -> tuple[str, str] | None:
    """An install check's (URL, branch); None when its source went from the status. Python installs go through
    the public URL that the rewrites redirect (the fidelity this is about); npm turns GitHub URLs into tarball
    downloads that bypass git, so it uses Gitea's URL."""
    src = next((x for x in state.status.sources or () if x.name == check.source), None)
    if src is None:
        return None
    return (src.public_url if check.tool == "pip" and src.public_url else src.clone_url), src.branch


def _detail(check: VerifyRunCheck, state: Pass, result: ExecutionResult) -> str:
    """A finished check's evidence: what ran, its exit code, the tail of its output."""
    if check.tool is not None:
        url, branch = _install_from(state, check) or ("", "")
        detail = f"{check.tool} install from {url}@{branch}: exit code {result.exit_code}"
        if not result.ok and result.output:
            detail += ": " + _evidence(result, 400)
        return detail
    detail = f"exit code {result.exit_code}" + (" (timed out)" if result.timed_out else "")
    if result.output:
        detail += ": " + _evidence(result, 400)
    return detail


async def _abandon(runtime: Runtime, run: VerifyRun) -> None:
    """End the superseded run's check still running in the workspace (best effort)."""
    for check in run.checks:
        if check.passed is None and check.process is not None:
            with contextlib.suppress(RuntimeUnavailable):
                await runtime.remove(check.process)


def _evidence(result: ExecutionResult, limit: int) -> str:
    """The tail of a command's output for a verdict, saying when the output was longer than what was kept."""
    tail = copyin.tail(result.output, limit)
    return f"(output truncated) {tail}" if result.truncated else tail


async def _gitea_holds_snapshot(gitea: Gitea, src: SourceStatus, deadline: float) -> CheckResult:
    """Whether Gitea's branch is at the snapshot, asked before `deadline` (the event loop's time)."""
    org, _, repo = src.repo.partition("/")
    try:
        async with asyncio.timeout_at(deadline):
            head, error = await gitea.branch_commit(org, repo, src.branch), ""
    except GiteaError as exc:
        head, error = None, str(exc)
    except TimeoutError:
        head, error = None, f"Gitea stalled: no answer within {GITEA_CHECK_SECONDS:g}s in total"
    ok = head == src.commit
    detail = error or ("" if ok else f"branch {src.branch} is at {head or 'nothing'}")
    return CheckResult(f"{src.name}: Gitea {src.repo}@{src.branch} is the snapshot", ok, detail)
