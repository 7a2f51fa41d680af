"""The verdict of seed 001's smoke test: checks per rubric category, scored into PASS or FAIL.

One scorer for both places the checks run: the operator's verify step (the shadow rubric: categories weighing
30, 30 and 40 points out of 100, the threshold the environment names) and the SDK's host-only fallback (the
same categories at 15, 15 and 20 out of 50, PASS at 35). A category without checks (no installable source, no
commands) is left out and the rest is scaled to the maximum, so an environment is never failed, nor passed,
for checks that do not apply to it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final, Literal

from shadow_operator.api.environment import Check, EvidenceCategory, Verdict

SOURCE_VERIFICATION: Final = "sourceVerification"
INSTALLATION_HEALTH: Final = "installationHealth"
CODE_EXECUTION: Final = "codeExecution"


@dataclass(frozen=True)
class CheckResult:
    name: str
    passed: bool
    detail: str = ""


@dataclass(frozen=True)
class Rubric:
    weights: Mapping[str, int]
    max_score: int
    mode: Literal["shadow", "host-only"]


SHADOW = Rubric({SOURCE_VERIFICATION: 30, INSTALLATION_HEALTH: 30, CODE_EXECUTION: 40}, 100, "shadow")
HOST_ONLY = Rubric({SOURCE_VERIFICATION: 15, INSTALLATION_HEALTH: 15, CODE_EXECUTION: 20}, 50, "host-only")
MAX_SCORE = SHADOW.max_score


def score(
    checks: Mapping[str, Sequence[CheckResult]],
    rubric: Rubric,
    *,
    pass_threshold: int,
    verified_at: datetime,
    generation: int | None = None,
    issues: Sequence[str] = (),
) -> Verdict:
    """The verdict for the given checks, per category; `issues` go first (why the checks ran where they did)."""
    evidence: dict[str, EvidenceCategory] = {}
    earned = 0.0
    possible = 0
    found = list(issues)
    for category, weight in rubric.weights.items():
        results = list(checks.get(category) or ())
        if not results:
            continue
        category_score = weight * sum(r.passed for r in results) / len(results)
        earned += category_score
        possible += weight
        evidence[category] = EvidenceCategory(
            score=round(category_score),
            max_score=weight,
            checks=[Check(name=r.name, passed=r.passed, detail=r.detail) for r in results],
        )
        found += [
            f"{category}: {r.name} failed" + (f": {r.detail}" if r.detail else "")
            for r in results
            if not r.passed
        ]
    total = round(rubric.max_score * earned / possible) if possible else 0
    if not possible:
        found.append("nothing to verify: no sources were checked")
    return Verdict(
        result="PASS" if possible and total >= pass_threshold else "FAIL",
        score=total,
        max_score=rubric.max_score,
        pass_threshold=pass_threshold,
        mode=rubric.mode,
        evidence=evidence,
        issues=found,
        verified_at=verified_at.replace(microsecond=0),
        observed_generation=generation,
    )


def score_verdict(
    checks: Mapping[str, Sequence[CheckResult]],
    *,
    pass_threshold: int,
    verified_at: datetime,
    generation: int | None,
) -> dict[str, Any]:
    """The shadow rubric's `status.verdict` object, as the API stores it."""
    verdict = score(
        checks, SHADOW, pass_threshold=pass_threshold, verified_at=verified_at, generation=generation
    )
    return verdict.model_dump(by_alias=True, exclude_none=True, mode="json")
