"""A race's winner, verified again where it cannot have tampered: the change it made, carried into a fresh fork.

A candidate's verdict is its own workspace's word. Its command ran there with the same rights as the checks that
follow, so it can change what they run without the change showing: a stale bytecode file beside the module
(`__pycache__` is never in a diff), a tool it installed outside the sources, a process left running. It can
thus FAIL the real checks, PASS in its workspace, and rank first with a small diff.

So before a race promotes, its judge decides: one more fork of the same snapshot, in which no candidate's command
ever ran. The winner's change inside its sources (the files a promote would write or delete, with their execute
bits; links are never carried, as promote never writes them; nor the directories no baseline diffs, whatever
the winner's workspace, which may have rewritten its own baseline, says) is copied into the judge, and the environment's
own verification runs there. Only a PASS there promotes, and what is promoted is read from the judge, limited
to the carried paths: what was verified, not whatever the winner's workspace holds by then.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from shadow_operator.api.environment import Verdict
from shadow_operator.sdk import confine, runtime
from shadow_operator.sdk import environment as envops
from shadow_operator.sdk.errors import RuntimeRefused
from shadow_operator.sdk.kube import Op
from shadow_operator.sdk.promote import PromotePlan
from shadow_operator.sdk.runtime import RuntimeEndpoint


def judge_name(base: str) -> str:
    """The judge's name beside the candidates' (`BASE-1..N`)."""
    return f"{base}-judge"


def carried_path(path: str, sources: Sequence[str]) -> bool:
    """Whether a changed path is part of a change the judge takes: inside the sources, a path promote would
    write (`confine`), and in none of the directories the baseline leaves out (a `.pyc` could stand in for
    its source; the workspace's own diff would not show it unless its baseline was tampered with)."""
    return runtime.in_sources(path, sources) and confine.is_safe(path) and not confine.undiffed(path)


def carry(
    src: RuntimeEndpoint, dst: RuntimeEndpoint, sources: Sequence[str], budget: confine.Budget
) -> Op[list[str]]:
    """Copy what changed inside `sources` in one workspace into another (same layout); returns the paths carried,
    workspace-relative and sorted (only `carried_path`s). The bytes are counted against `budget` (sizes
    declared first, then as they arrive)."""
    diff = yield from runtime.diff(src, paths_only=True)
    carried = []
    for path in sorted({*diff.added, *diff.modified} - set(diff.deleted)):
        if not carried_path(path, sources):
            continue
        try:
            info = yield from runtime.stat(src, path)
        except RuntimeRefused as exc:
            if exc.status != 403:
                raise
            continue  # the runtime refuses a path through a link leading out of the workspace
        if info is None or info.get("type") != "file":
            continue  # gone since the diff, a directory (made with its files), or a link (never carried)
        budget.member(path, confine.number(info.get("size"), 10))
        data = yield from runtime.read_file(src, path)
        budget.take(path, len(data))
        mode = confine.safe_mode(confine.number(info.get("mode"), 8))
        yield from runtime.write_file(dst, path, data, mode=mode)
        carried.append(path)
    for path in sorted(diff.deleted):
        if not carried_path(path, sources):
            continue
        if (yield from runtime.stat(dst, path)) is not None:
            yield from runtime.delete_path(dst, path)
        carried.append(path)
    return sorted(carried)


def judge(
    namespace: str,
    candidate: str,
    judge_env: str,
    *,
    timeout: float,
    verify_timeout: float,
    budget: confine.Budget,
) -> Op[tuple[Verdict, list[str]]]:
    """Carry the candidate's change into the judge (waiting for it to be Ready) and verify it there: the verdict
    of the judge, and the paths carried. The sources are the judge's, read from the cluster (the candidate's
    workspace has no say in them)."""
    env = yield from envops.get(namespace, candidate)
    src = yield from envops.runtime_endpoint(env)
    fresh = yield from envops.wait(namespace, judge_env, envops.ready_with_verdict, "Ready", timeout)
    dst = yield from envops.runtime_endpoint(fresh)
    sources = [plan.path for plan in envops.source_plans(fresh)]
    carried = yield from carry(src, dst, sources, budget)
    verdict = yield from envops.verify(namespace, judge_env, verify_timeout)
    return verdict, carried


def only_carried(plans: Sequence[PromotePlan], carried: Sequence[str]) -> list[PromotePlan]:
    """The judge's promote plans limited to the carried paths: what its verification left behind (build output,
    caches) is not part of the change."""
    paths = set(carried)
    kept = []
    for plan in plans:
        prefix = plan.workspace_dir.strip("/") + "/"
        kept.append(
            replace(
                plan,
                write=[p for p in plan.write if prefix + p in paths],
                delete=[p for p in plan.delete if prefix + p in paths],
            )
        )
    return kept
