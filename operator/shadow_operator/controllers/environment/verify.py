"""The verify step: seed 001's rubric (the sources are in the workspace and in Gitea, they install from their
rewritten git URLs, the verify commands exit 0), scored into status.verdict once per generation or request."""

from __future__ import annotations

import asyncio
import contextlib
from datetime import UTC, datetime, timedelta

from shadow_operator.api import constants as c
from shadow_operator.api.environment import Category, Probe, SourceStatus, VerifyRun, VerifyRunCheck
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
GITEA_RETRY_SECONDS = 0.5  # between asks while Gitea answers 500 or no branch (within GITEA_CHECK_SECONDS)
# The sources' probes (quick git and file tests in the workspace), looked in on sooner than the other checks.
PROBE_POLL_SECONDS = 0.2
SOURCE_SECONDS = 60.0  # a SourceCommit probe's timeout
DETECT_SECONDS = 30.0  # a ProjectKind probe's timeout
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
                    run = await self._plan(state, trigger)
                    state.status.verify_run = run
                wait = await self._advance(state, runtime, run)
            except RuntimeUnavailable as exc:
                raise StepFailed(None, "RuntimeUnreachable", str(exc)) from None
        if wait is not None:
            return wait
        self._conclude(state, run)
        return None

    async def _plan(self, state: Pass, trigger: str | None) -> VerifyRun:
        """A new run: Gitea's checks done now (bounded in total), the rest listed to run in the workspace, where
        nothing is awaited in the pass: each source's probes side by side, then install checks and commands in
        turn."""
        env = state.env
        sources = state.status.sources or []
        held = await self._gitea_holds(state, sources)
        checks: list[VerifyRunCheck] = []
        for src, gitea in zip(sources, held, strict=True):
            checks.append(_probe(SOURCE_VERIFICATION, _commit_check(src), src, "SourceCommit"))
            if gitea is not None:
                checks.append(_done(SOURCE_VERIFICATION, gitea))
        if env.spec.verify.install:
            checks += [
                _probe(INSTALLATION_HEALTH, f"{x.name}: project kind", x, "ProjectKind") for x in sources
            ]
        for command in env.spec.verify.commands or ():
            checks.append(VerifyRunCheck(category=CODE_EXECUTION, name=command.name, command=command.name))
        return VerifyRun(
            generation=env.metadata.generation or 0, trigger=trigger, started_at=state.now(), checks=checks
        )

    async def _advance(self, state: Pass, runtime: Runtime, run: VerifyRun) -> float | None:
        """Look in on the checks under way and start the next: the sources' probes all at once, then the
        other checks one at a time. The seconds until the next look, or None when every check has ended."""
        now = state.now()
        started = running = False
        for check in [x for x in run.checks if x.probe is not None and x.passed is None]:
            if check.process is None:
                started |= await self._start(state, runtime, check, now)
            else:
                running |= await self._look(state, runtime, run, check, now)
        if started or running:
            return PROBE_POLL_SECONDS if started else POLL_SECONDS
        for check in run.checks:
            if check.passed is not None:
                continue
            if check.process is None:
                if await self._start(state, runtime, check, now):
                    return POLL_SECONDS
            elif await self._look(state, runtime, run, check, now):
                return _next_look(check, now)
        return None

    async def _start(self, state: Pass, runtime: Runtime, check: VerifyRunCheck, now: datetime) -> bool:
        """Start a check as a background process of the runtime: False when it cannot run (it failed)."""
        program = self._program(state, check)
        if isinstance(program, str):
            check.passed, check.detail = False, program
            return False
        script, env, cwd, timeout = program
        check.process = await runtime.start(
            script, env=env, cwd=cwd, timeout=timeout, tag=f"shadow-operator: verify {check.name}"
        )
        check.started_at = now
        check.deadline = now + timedelta(seconds=timeout + GRACE_SECONDS)
        return True

    async def _look(
        self, state: Pass, runtime: Runtime, run: VerifyRun, check: VerifyRunCheck, now: datetime
    ) -> bool:
        """Look in on a started check: True while it runs, else its outcome is recorded and its process
        removed."""
        assert check.process is not None
        running = await runtime.running(check.process)
        if running is None:
            check.passed, check.detail = False, LOST
            return False
        if running:
            if check.deadline is not None and now >= check.deadline:
                await runtime.remove(check.process)
                check.passed = False
                check.detail = "the workspace's runtime did not end the command at its timeout: killed"
                return False
            return True
        try:
            result = await runtime.result(check.process)
        except RuntimeAnswerTooLarge as exc:
            check.passed, check.detail = False, str(exc)
        else:
            if result is None:
                check.passed, check.detail = False, LOST
            elif check.probe == "ProjectKind":
                _detected(run, check, result)
            else:
                check.passed, check.detail = result.ok, _detail(check, state, result)
        await runtime.remove(check.process)
        return False

    def _program(self, state: Pass, check: VerifyRunCheck) -> tuple[str, dict[str, str], str, float] | str:
        """What a check runs in the workspace: (script, environment, working directory, timeout), or why it
        cannot run."""
        env = state.env
        gone = "no longer in the environment's spec"
        if check.command is not None:
            command = next((x for x in env.spec.verify.commands or () if x.name == check.command), None)
            if command is None:
                return gone
            return command.command, {}, command.cwd or "", float(command.timeout_seconds)
        if check.probe is not None:
            src = _source(state, check)
            if src is None:
                return gone
            if check.probe == "ProjectKind":
                return copyin.DETECT_PROJECT, {"SHADOW_PATH": src.path}, "", DETECT_SECONDS
            if check.name != _commit_check(src):
                return f"the source was copied in again during the verification (now at {src.commit[:12]})"
            inputs = {"SHADOW_PATH": src.path, "SHADOW_COMMIT": src.commit}
            return copyin.VERIFY_SOURCE, inputs, "", SOURCE_SECONDS
        install = _install_from(state, check)
        if install is None:
            return gone
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
            if check.probe == "ProjectKind":
                continue  # not in the rubric: it only decides the source's install check
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

    async def _gitea_holds(self, state: Pass, sources: list[SourceStatus]) -> list[CheckResult | None]:
        """For each source, whether Gitea holds its snapshot (None without Gitea): API calls of the operator's,
        not work in the workspace, all of them within GITEA_CHECK_SECONDS."""
        if not state.env.spec.gitea.enabled:
            return [None for _ in sources]
        url = self.deps.gitea_api_url(state.named)
        async with self.deps.open_gitea(url, username="") as gitea:
            deadline = asyncio.get_running_loop().time() + GITEA_CHECK_SECONDS
            return [await _gitea_holds_snapshot(gitea, src, deadline) for src in sources]


def _probe(category: Category, name: str, src: SourceStatus, probe: Probe) -> VerifyRunCheck:
    return VerifyRunCheck(category=category, name=name, source=src.name, probe=probe)


def _commit_check(src: SourceStatus) -> str:
    """The name of a source's SourceCommit check (it names the commit checked)."""
    return f"{src.name}: workspace has {src.commit[:12]}"


def _source(state: Pass, check: VerifyRunCheck) -> SourceStatus | None:
    return next((x for x in state.status.sources or () if x.name == check.source), None)


def _detected(run: VerifyRun, check: VerifyRunCheck, result: ExecutionResult) -> None:
    """A ProjectKind probe ended: a python or node source gets its install check, right after the probe (any
    other answer, a failed detection included, none)."""
    kind = (copyin.parse_result(result.stdout) or ["other"])[0]
    kind = kind if kind in ("python", "node") else "other"
    check.passed = result.ok
    check.detail = kind if result.ok else f"{kind}: exit code {result.exit_code}: {_evidence(result, 200)}"
    if kind == "other":
        return
    install = VerifyRunCheck(
        category=INSTALLATION_HEALTH,
        name=f"{check.source}: installs from git",
        source=check.source,
        tool="pip" if kind == "python" else "npm",
    )
    run.checks.insert(run.checks.index(check) + 1, install)


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
    src = _source(state, check)
    if src is None:
        return None
    return (src.public_url if check.tool == "pip" and src.public_url else src.clone_url), src.branch


def _detail(check: VerifyRunCheck, state: Pass, result: ExecutionResult) -> str:
    """A finished check's evidence: what ran, its exit code, the tail of its output."""
    if check.probe is not None:  # SourceCommit: git's complaint when the commit is not there
        if result.ok:
            return ""
        stopped = f"timed out after {SOURCE_SECONDS:g}s: " if result.timed_out else ""
        return stopped + _evidence(result, 300)
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
    """Whether Gitea's branch is at the snapshot, asked before `deadline` (the event loop's time). Gitea records a
    pushed branch in its database from a queue: just after the copy-in's push it may answer 500, or not know the
    branch yet, for a moment; so those answers are asked again until the deadline (another head is final)."""
    org, _, repo = src.repo.partition("/")
    head, error, answered = None, "", False
    try:
        async with asyncio.timeout_at(deadline):
            while True:
                try:
                    head, error = await gitea.branch_commit(org, repo, src.branch), ""
                except GiteaError as exc:
                    if exc.status < 500:
                        raise
                    head, error = None, str(exc)
                answered = True
                if head is not None:
                    break
                await asyncio.sleep(GITEA_RETRY_SECONDS)
    except GiteaError as exc:
        head, error = None, str(exc)
    except TimeoutError:
        if not answered:
            error = f"Gitea stalled: no answer within {GITEA_CHECK_SECONDS:g}s in total"
    ok = head == src.commit
    detail = error or ("" if ok else f"branch {src.branch} is at {head or 'nothing'}")
    return CheckResult(f"{src.name}: Gitea {src.repo}@{src.branch} is the snapshot", ok, detail)
