"""Race: N forks of one environment, each running its own command, each verified, ranked; the best promoted.

    with ShadowGateway("my-change") as shadow:
        result = shadow.race(["agent --model a", "agent --model b", "agent --model c"])
        print(result.winner, [(c.name, c.verdict, c.score) for c in result.candidates])

The forks share one snapshot of the source (the fork machinery: `ShadowGateway.fork`); every candidate then
waits for its fork, runs its command in the workspace, takes the diff of what the command changed, and asks
for the environment's verification (the operator's verify, as `shadowctl verify`). The candidates run
concurrently (threads for the sync gateway, tasks for the async one); one that fails is ranked last with its
error and never stops the others.

With promote, the first-ranked PASS is verified again before anything is promoted: its change is carried into
a fresh fork of the same snapshot (the judge, `sdk.reverify`), where no candidate's command ran, and only a PASS
there promotes it, from the judge. A FAIL there promotes nothing, not the next candidate: the ranking that put a
workspace's own word first has just been shown wrong (a candidate that games its checks, or flaky ones), and an
unattended promote is the wrong place to go on down it. The result says why (`refused`); a person decides.

Ranking (`rank_key`): PASS first, then the higher score, then the command's exit code 0 first, then the smaller
change (files, then lines), then the shorter command. A tie on verdict, score and exit code is thus decided by
the smaller change, as a reviewer would; duration only separates equal changes (two identical commands).

Client-side on purpose: see README "Race forks" for why a race is not (yet) a kind of the operator's.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Generator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, cast

import httpx
import yaml
from pydantic import BaseModel, Field

from shadow_operator.api.environment import Verdict
from shadow_operator.sdk import confine, kube, reverify, runtime
from shadow_operator.sdk import environment as envops
from shadow_operator.sdk.errors import NotFound, ShadowError
from shadow_operator.sdk.kube import Op
from shadow_operator.sdk.promote import PromotePlan
from shadow_operator.sdk.runtime import Diff, in_sources

if TYPE_CHECKING:
    from shadow_operator.sdk.gateway import GatewayOps

State = Literal["forking", "running", "verifying", "done", "failed"]
MAX_CANDIDATES = 20


class RaceCandidate(BaseModel):
    """One candidate: a fork, its command, what it changed and its verdict."""

    name: str = Field(description="The fork (a ShadowEnvironment).")
    command: str
    state: State = "forking"
    exit_code: int | None = None
    timed_out: bool = False
    duration_seconds: float | None = Field(default=None, description="The command's own run time.")
    verify_seconds: float | None = Field(default=None, description="Verification, request to verdict.")
    ready_seconds: float | None = Field(default=None, description="From the race's start to a Ready fork.")
    verdict: Literal["PASS", "FAIL"] | None = None
    score: int | None = None
    max_score: int | None = None
    issues: list[str] = Field(default_factory=list)
    changed_files: int = 0
    changed_lines: int = 0
    files: list[str] = Field(default_factory=list, description="Changed paths, workspace-relative.")
    error: str | None = Field(default=None, description="Why the candidate could not finish: code: message.")
    rank: int | None = None
    judged: Literal["PASS", "FAIL"] | None = Field(
        default=None,
        description="With promote, for the first-ranked PASS: the verdict on its change carried into a fresh "
        "fork of the same snapshot (its own workspace does not judge it).",
    )
    judged_issues: list[str] = Field(default_factory=list)


class RaceResult(BaseModel):
    """A race: its candidates, best first, and what was done with them."""

    source: str
    namespace: str
    candidates: list[RaceCandidate] = Field(description="Best first.")
    winner: str | None = Field(
        description="The best candidate when it PASSed (with promote: in a fresh fork too), else null."
    )
    judge: str | None = Field(default=None, description="The fresh fork the winner was verified in again.")
    refused: str | None = Field(default=None, description="Why nothing was promoted, when promote was asked.")
    promoted: list[dict[str, object]] | dict[str, str] | None = Field(
        default=None, description="What promote did with the winner (plans, or the branch pushed)."
    )
    destroyed: list[str] = Field(default_factory=list)
    kept: list[str] = Field(default_factory=list)
    fork_seconds: float = Field(description="Forks requested (one shared snapshot where the storage can).")
    ranked_seconds: float = Field(description="From the start to the ranking.")
    total_seconds: float = Field(description="From the start to the end (promote and cleanup included).")


Update = Callable[[RaceCandidate], None]


def race_base(source: str, prefix: str | None = None) -> str:
    return prefix or f"{source}-race"


def candidate_names(source: str, count: int, prefix: str | None = None) -> list[str]:
    return [f"{race_base(source, prefix)}-{i}" for i in range(1, count + 1)]


def parse_commands(text: str) -> list[str]:
    """Commands from a file: a YAML list of strings, or one per line (blank lines and # comments skipped)."""
    try:
        loaded = yaml.safe_load(text)
    except yaml.YAMLError:
        loaded = None
    if isinstance(loaded, list) and loaded and all(isinstance(x, str) for x in loaded):
        return [x.strip() for x in loaded if x.strip()]
    return [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def plan_commands(commands: Sequence[str], count: int | None) -> list[str]:
    """The command of each candidate: one per command, or with `count` the single command N times."""
    cmds = [c for c in commands if c.strip()]
    if not cmds:
        raise ShadowError("a race needs a command", hint="give COMMAND (with --count N) or --commands FILE")
    if count is not None:
        if len(cmds) != 1:
            raise ShadowError("--count repeats one command", hint="give one COMMAND, or drop --count")
        cmds = cmds * count
    if not 2 <= len(cmds) <= MAX_CANDIDATES:
        raise ShadowError(
            f"a race has 2 to {MAX_CANDIDATES} candidates, not {len(cmds)}",
            hint="--count N, or one command per line in --commands FILE",
        )
    return cmds


def changed_lines(patch: str | None, sources: Sequence[str] | None = None) -> int:
    """Lines added plus lines removed in a unified diff (only in files under `sources`, when given)."""
    if not patch:
        return 0
    counted, total = True, 0
    for line in patch.splitlines():
        if line.startswith("diff --git "):
            path = line.split(" b/", 1)[-1]
            counted = sources is None or in_sources(path, sources)
        elif counted and (
            (line.startswith("+") and not line.startswith("+++"))
            or (line.startswith("-") and not line.startswith("---"))
        ):
            total += 1
    return total


def measure(candidate: RaceCandidate, diff: Diff, sources: Sequence[str]) -> None:
    """The candidate's change inside its sources; the rest of the workspace (the runtime's HANDOFF.md, caches,
    tools a command installed) is neither ranked nor promoted."""
    candidate.files = diff.changed_in(sources)
    candidate.changed_files = len(candidate.files)
    candidate.changed_lines = changed_lines(diff.patch, sources)


def rank_key(c: RaceCandidate) -> tuple[object, ...]:
    """Sort key, best first (see the module's docstring)."""
    return (
        c.error is not None,
        c.verdict != "PASS",
        -(c.score or 0) / (c.max_score or 1),
        c.exit_code != 0,
        c.changed_files,
        c.changed_lines,
        c.duration_seconds if c.duration_seconds is not None else float("inf"),
        c.name,
    )


def rank(candidates: Sequence[RaceCandidate]) -> list[RaceCandidate]:
    ranked = sorted(candidates, key=rank_key)
    for i, c in enumerate(ranked, 1):
        c.rank = i
    return ranked


def winner(ranked: Sequence[RaceCandidate]) -> RaceCandidate | None:
    best = ranked[0] if ranked else None
    return best if best is not None and best.error is None and best.verdict == "PASS" else None


def judged(best: RaceCandidate, judge: str, verdict: Verdict) -> str | None:
    """Record the judge's verdict on the winner's change; the reason nothing is promoted, or None on PASS."""
    best.judged, best.judged_issues = verdict.result, verdict.issues[:20]
    if verdict.result == "PASS":
        return None
    return (
        f"{best.name} PASSed in its own workspace, but its change FAILed in a fresh fork of the same snapshot "
        f"({judge}: {verdict.score}/{verdict.max_score}): nothing promoted"
    )


def run_candidate(
    namespace: str,
    candidate: RaceCandidate,
    *,
    started: float,
    timeout: float,
    command_timeout: float,
    verify_timeout: float,
    on_update: Update | None,
) -> Op[RaceCandidate]:
    """Wait for the fork, run the command, take the diff, verify. Errors end up in `candidate.error`."""

    def moved(state: State) -> None:
        candidate.state = state
        if on_update is not None:
            on_update(candidate)

    try:
        left = max(1.0, timeout - (time.monotonic() - started))
        env = yield from envops.wait(namespace, candidate.name, envops.ready_with_verdict, "Ready", left)
        candidate.ready_seconds = time.monotonic() - started
        ep = yield from envops.runtime_endpoint(env)
        moved("running")
        result = yield from runtime.run_command(ep, candidate.command, timeout=command_timeout)
        candidate.exit_code, candidate.timed_out = result.exit_code, result.timed_out
        candidate.duration_seconds = result.duration_seconds
        # The diff before verification: what the command changed, not what the checks leave behind.
        sources = [plan.path for plan in envops.source_plans(env)]
        measure(candidate, (yield from runtime.diff(ep)), sources)
        moved("verifying")
        asked = time.monotonic()
        verdict = yield from envops.verify(namespace, candidate.name, verify_timeout)
        candidate.verify_seconds = time.monotonic() - asked
        candidate.verdict, candidate.score, candidate.max_score = (
            verdict.result,
            verdict.score,
            verdict.max_score,
        )
        candidate.issues = verdict.issues[:20]
        moved("done")
    except ShadowError as exc:
        candidate.error = f"{exc.code}: {exc.message}"
        moved("failed")
    return candidate


# ------------------------------------------------------------------------------------------- drivers
@dataclass(frozen=True)
class RaceOptions:
    """How a race runs and ends (the keyword arguments of `ShadowGateway.race`)."""

    count: int | None = None
    prefix: str | None = None
    method: str = "Auto"
    promote: bool = False
    to: str | Path | None = None
    to_branch: str | None = None
    message: str = "shadow: promoted the race winner"
    keep: bool = False
    timeout: float = 600.0
    command_timeout: float = 600.0
    verify_timeout: float = 600.0
    on_update: Update | None = None


def _prepare(
    source: str, commands: Sequence[str], options: RaceOptions
) -> tuple[list[RaceCandidate], str | None]:
    """The candidates, and the judge's name when the race may promote."""
    cmds = plan_commands(commands, options.count)
    names = candidate_names(source, len(cmds), options.prefix)
    candidates = [RaceCandidate(name=n, command=c) for n, c in zip(names, cmds, strict=True)]
    for c in candidates:
        if options.on_update is not None:
            options.on_update(c)
    judge = reverify.judge_name(race_base(source, options.prefix)) if options.promote else None
    return candidates, judge


def _candidate_op(
    namespace: str, c: RaceCandidate, started: float, options: RaceOptions
) -> Op[RaceCandidate]:
    return run_candidate(
        namespace,
        c,
        started=started,
        timeout=options.timeout,
        command_timeout=options.command_timeout,
        verify_timeout=options.verify_timeout,
        on_update=options.on_update,
    )


def _judge_op(namespace: str, best: RaceCandidate, judge: str, options: RaceOptions) -> Op[str | list[str]]:
    """The winner verified again in the judge: the paths carried when it PASSed there, else why not."""
    try:
        verdict, carried = yield from reverify.judge(
            namespace,
            best.name,
            judge,
            timeout=options.timeout,
            verify_timeout=options.verify_timeout,
            budget=confine.Budget(option="max_bytes"),
        )
    except ShadowError as exc:
        return f"{best.name} could not be verified again in {judge} ({exc.code}: {exc.message}): nothing promoted"
    return judged(best, judge, verdict) or carried


def ensure_free(namespace: str, names: Sequence[str]) -> Op[None]:
    """Refuse names already taken (a kept race, say): a race only ever deletes forks it made itself."""
    for name in names:
        try:
            yield from envops.get(namespace, name)
        except NotFound:
            continue
        raise ShadowError(
            f"ShadowEnvironment {namespace}/{name} already exists",
            code="AlreadyExists",
            hint=f"destroy it (shadowctl destroy {name} -n {namespace}) or give the race another --prefix",
        )


def _delete(namespace: str, name: str) -> Op[str | None]:
    try:
        yield from envops.delete(namespace, name, wait=True, timeout=180.0)
    except NotFound:
        return None
    return name


def _promoted(result: list[PromotePlan] | dict[str, str]) -> list[dict[str, object]] | dict[str, str]:
    if isinstance(result, dict):
        return result
    return [
        {"source": p.source, "localDir": str(p.local_dir), "write": p.write, "delete": p.delete}
        for p in result
    ]


def _result(
    gw_name: str,
    namespace: str,
    ranked: list[RaceCandidate],
    best: RaceCandidate | None,
    times: tuple[float, float, float],
    promoted: Any,
    destroyed: list[str],
    judge: str | None,
    refused: str | None,
) -> RaceResult:
    started, forked, ranked_at = times
    forks = [c.name for c in ranked] + ([judge] if judge else [])
    return RaceResult(
        source=gw_name,
        namespace=namespace,
        candidates=ranked,
        winner=best.name if best else None,
        judge=judge,
        refused=refused,
        promoted=promoted,
        destroyed=sorted(d for d in destroyed if d),
        kept=[n for n in forks if n not in destroyed],
        fork_seconds=forked - started,
        ranked_seconds=ranked_at - started,
        total_seconds=time.monotonic() - started,
    )


@dataclass(frozen=True)
class Together:
    """A step of the race: these operations at once (threads for the sync driver, tasks for the async one).
    The race is sent their results in order, or the first error is thrown into it."""

    ops: Sequence[Op[Any]]


Race = Generator[Together, list[Any], RaceResult]


def race(gw: GatewayOps, commands: Sequence[str], options: RaceOptions) -> Race:
    """The race, written once over steps (sans-I/O): `run()` drives it on a sync client, `arun()` on an
    async one."""
    candidates, judge = _prepare(gw.name, commands, options)
    names = [c.name for c in candidates] + ([judge] if judge else [])
    yield Together([ensure_free(gw.namespace, names)])
    started = time.monotonic()
    destroyed: list[str] = []
    best: RaceCandidate | None = None
    refused: str | None = None
    try:
        yield Together([gw.fork(names, False, options.timeout, method=options.method, verify=False)])
        forked = time.monotonic()
        yield Together([_candidate_op(gw.namespace, c, started, options) for c in candidates])
        ranked = rank(candidates)
        ranked_at = time.monotonic()
        best = winner(ranked)
        promoted = None
        if judge is not None and best is not None:
            [carried] = yield Together([_judge_op(gw.namespace, best, judge, options)])
            judged_by = gw.sibling(judge)
            if isinstance(carried, str):
                best, refused = None, carried
            elif options.to_branch:
                [pushed] = yield Together([judged_by.push_branch(None, options.to_branch, options.message)])
                promoted = _promoted(pushed)
            else:
                [plans] = yield Together([judged_by.plan_promote(None, options.to, ())])
                plans = reverify.only_carried(plans, carried)
                [applied] = yield Together([judged_by.apply_promote(plans, confine.DEFAULT_MAX_BYTES)])
                promoted = _promoted(applied)
    finally:
        losers = [] if options.keep else [n for n in names if best is None or n != best.name]
        gone = yield Together([_delete(gw.namespace, n) for n in losers])
        destroyed = [d for d in gone if d]
    times = (started, forked, ranked_at)
    return _result(gw.name, gw.namespace, ranked, best, times, promoted, destroyed, judge, refused)


def _resume(steps: Race, outcome: list[Any] | BaseException) -> Together | kube.Finished:
    """Send a step's results into the race, or throw its failure in (the race's cleanup deletes its forks)."""
    try:
        return steps.throw(outcome) if isinstance(outcome, BaseException) else steps.send(outcome)
    except StopIteration as done:
        return kube.Finished(done.value)


def run(http: httpx.Client, steps: Race) -> RaceResult:
    """Drive a race on a synchronous client, each step's operations in threads."""

    def together(step: Together) -> list[Any]:
        if len(step.ops) == 1:
            return [kube.run(http, step.ops[0])]
        with ThreadPoolExecutor(max(1, len(step.ops))) as pool:
            return list(pool.map(lambda op: kube.run(http, op), step.ops))

    step: Together | kube.Finished = next(steps)
    while isinstance(step, Together):
        outcome: list[Any] | BaseException
        try:
            outcome = together(step)
        except BaseException as exc:
            outcome = exc
        step = _resume(steps, outcome)
    return cast(RaceResult, step.value)


async def arun(http: httpx.AsyncClient, steps: Race) -> RaceResult:
    """Drive a race on an asynchronous client, each step's operations as tasks."""
    step: Together | kube.Finished = next(steps)
    while isinstance(step, Together):
        outcome: list[Any] | BaseException
        try:
            outcome = list(await asyncio.gather(*(kube.arun(http, op) for op in step.ops)))
        except BaseException as exc:
            outcome = exc
        step = _resume(steps, outcome)
    return cast(RaceResult, step.value)
