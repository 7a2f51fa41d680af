"""The verdict of seed 001's smoke test: checks per rubric category, scored into PASS or FAIL.

Categories weigh 30 (source verification), 30 (installation health) and 40 (code execution) points. A
category without checks (no installable source, no commands) is left out and the rest is scaled to 100, so an
environment is never failed, nor passed, for checks that do not apply to it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

SOURCE_VERIFICATION = "sourceVerification"
INSTALLATION_HEALTH = "installationHealth"
CODE_EXECUTION = "codeExecution"
WEIGHTS: Mapping[str, int] = {SOURCE_VERIFICATION: 30, INSTALLATION_HEALTH: 30, CODE_EXECUTION: 40}
MAX_SCORE = 100


@dataclass(frozen=True)
class CheckResult:
    name: str
    passed: bool
    detail: str = ""


def score_verdict(
    checks: Mapping[str, Sequence[CheckResult]],
    *,
    pass_threshold: int,
    verified_at: datetime,
    generation: int | None,
) -> dict[str, Any]:
    """The `status.verdict` object for the given checks, per category."""
    evidence: dict[str, Any] = {}
    earned = 0.0
    possible = 0
    issues: list[str] = []
    for category, weight in WEIGHTS.items():
        results = list(checks.get(category) or ())
        if not results:
            continue
        passed = sum(1 for r in results if r.passed)
        category_score = weight * passed / len(results)
        earned += category_score
        possible += weight
        evidence[category] = {
            "score": round(category_score),
            "maxScore": weight,
            "checks": [{"name": r.name, "passed": r.passed, "detail": r.detail} for r in results],
        }
        issues += [
            f"{category}: {r.name} failed" + (f": {r.detail}" if r.detail else "")
            for r in results
            if not r.passed
        ]
    score = round(MAX_SCORE * earned / possible) if possible else 0
    result = "PASS" if possible and score >= pass_threshold else "FAIL"
    if not possible:
        issues.append("nothing to verify: no sources were checked")
    verdict: dict[str, Any] = {
        "result": result,
        "score": score,
        "maxScore": MAX_SCORE,
        "passThreshold": pass_threshold,
        "mode": "shadow",
        "evidence": evidence,
        "issues": issues,
        "verifiedAt": verified_at.strftime("%Y-%m-%dT%H:%M:%SZ"),
    }
    if generation is not None:
        verdict["observedGeneration"] = generation
    return verdict
