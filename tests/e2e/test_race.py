"""Race on kind (issue 21): three candidates forked from one environment (one shared snapshot), each running its
own attempt at a fix, each verified; exactly one makes the check pass. The ranking puts it first, its change
PASSes again in a fresh fork (the judge), promote of the winner writes exactly its change into the local
directory, the losers and the judge are gone and the source is untouched. The winner's handoff manifest
(seed 001) is read from the cluster and validated against the schema. A candidate that games its own checks
PASSes in its workspace, FAILs in the judge, and nothing is promoted."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import jsonschema
import pytest
from shadow_operator.sdk import ShadowGateway
from shadow_operator.sdk import manifest as manifestops

from tests.e2e.cluster import Cluster
from tests.e2e.test_cli_sdk import REQUESTS, TIMEOUT, ctl, ok
from tests.e2e.test_fork import SNAPSHOT_CLASS, read
from tests.support.hostile_repo import git
from tests.support.race import BROKEN, CHECK, GAMED

pytestmark = pytest.mark.e2e

# Candidates in file order: a wrong fix, no fix (and a failing exit), the right fix.
CANDIDATES = [
    "sed -i 's/a - b/a * b/' core/calc.py",
    "echo '# looked around' >> core/README.md && exit 1",
    "sed -i 's/a - b/a + b/' core/calc.py",
]


def repository(root: Path) -> Path:
    repo = root / "core"
    repo.mkdir(parents=True)
    (repo / "calc.py").write_text(BROKEN)
    (repo / "README.md").write_text("# calc\n")
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", ".")
    git(repo, "commit", "-q", "-m", "add, broken")
    return repo


def broken_environment(cluster: Cluster, ns: str, source: str, repo: Path) -> None:
    status = json.loads(
        ok(
            ctl(
                cluster, "create", source, "-n", ns, "--local", str(repo), "--verify", CHECK,
                "--storage-class", SNAPSHOT_CLASS, "--cpu", REQUESTS["cpu"], "--memory", REQUESTS["memory"],
                "--timeout", TIMEOUT, "-o", "json",
            )
        )
    )["status"]  # fmt: skip
    assert status["verdict"]["result"] == "FAIL"  # the source is broken: that is what the race is for


def test_race_three_candidates_one_passes(
    cluster: Cluster, e2e_namespace: str, tmp_path: Path, timings: dict[str, float]
) -> None:
    ns, source = e2e_namespace, f"race-{uuid.uuid4().hex[:6]}"
    repo = repository(tmp_path)
    broken_environment(cluster, ns, source, repo)
    commands = tmp_path / "candidates.txt"
    commands.write_text("# three approaches\n" + "\n".join(CANDIDATES) + "\n")

    raced = ctl(
        cluster, "race", source, "-n", ns, "--commands", str(commands), "--promote",
        "--timeout", TIMEOUT, "--verify-timeout", TIMEOUT, "-o", "json",
    )  # fmt: skip
    result = json.loads(ok(raced))
    names = [f"{source}-race-{i}" for i in (1, 2, 3)]
    ranked = result["candidates"]
    assert [c["name"] for c in ranked] == [names[2], names[0], names[1]], ranked
    first, wrong, nothing = ranked
    assert (first["verdict"], first["exit_code"], first["files"]) == ("PASS", 0, ["core/calc.py"])
    assert first["changed_lines"] == 2 and first["rank"] == 1 and "error" not in first  # -o json omits nulls
    assert (wrong["verdict"], wrong["exit_code"], wrong["files"]) == ("FAIL", 0, ["core/calc.py"])
    assert (nothing["verdict"], nothing["exit_code"], nothing["files"]) == ("FAIL", 1, ["core/README.md"])
    assert result["winner"] == names[2]
    judge = f"{source}-race-judge"
    assert (result["judge"], first["judged"]) == (judge, "PASS")  # its change alone passed in a fresh fork

    # Promote wrote exactly the winner's change into the local directory; nothing else moved.
    assert result["promoted"] == [
        {"source": "core", "localDir": str(repo), "write": ["calc.py"], "delete": []}
    ]
    assert (repo / "calc.py").read_text() == BROKEN.replace("a - b", "a + b")
    assert (repo / "README.md").read_text() == "# calc\n"
    assert git(repo, "status", "--porcelain") == "M calc.py"

    # The losers and the judge are gone, the winner kept, the source untouched (its file, its diff, its verdict).
    assert sorted(result["destroyed"]) == sorted([*names[:2], judge]) and result["kept"] == [names[2]]
    for loser in [*names[:2], judge]:
        assert cluster.get(ns, "shadowenvironments", loser) is None
    kept = cluster.get(ns, "shadowenvironments", names[2])
    assert kept is not None
    assert read(cluster, ns, source, "core/calc.py") == BROKEN
    unchanged = json.loads(ok(ctl(cluster, "diff", source, "-n", ns, "--stat", "-o", "json")))
    assert (unchanged["added"], unchanged["modified"], unchanged["deleted"]) == ([], [], [])
    src = cluster.get(ns, "shadowenvironments", source) or {}
    assert src["status"]["verdict"]["result"] == "FAIL"

    # The winner's handoff manifest, from its status and diff.
    with ShadowGateway(names[2], namespace=ns) as gw:
        manifest = gw.manifest().dump()
    jsonschema.Draft202012Validator(json.loads(manifestops.SCHEMA_PATH.read_text())).validate(manifest)
    assert manifest["shadow_id"] == names[2] and manifest["shadow_available"] is True
    assert manifest["test_context"]["changed_files"] == ["core/calc.py"]
    assert manifest["test_context"]["affected_modules"] == ["calc"]
    assert manifest["local_sources"][0]["path"] == str(repo)
    assert manifest["local_sources"][0]["snapshot_commit"] == kept["status"]["sources"][0]["commit"]
    assert (manifest["fallback_mode"], manifest["verdict"]["result"]) == (False, "PASS")

    slowest = max(c["duration_seconds"] + c["verify_seconds"] for c in ranked)
    timings["race_3_ranked_seconds"] = result["ranked_seconds"]
    timings["race_3_overhead_seconds"] = result["ranked_seconds"] - slowest
    for name in (names[2], source):
        ok(ctl(cluster, "destroy", name, "-n", ns))


def test_race_a_candidate_that_games_its_checks_is_not_promoted(
    cluster: Cluster, e2e_namespace: str, tmp_path: Path
) -> None:
    """Its own workspace says PASS (a stale .pyc of the right fix), its diff is small, it ranks first; carried
    into the judge, a fresh fork of the same snapshot, its change alone FAILs, and --promote writes nothing."""
    ns, source = e2e_namespace, f"gamed-{uuid.uuid4().hex[:6]}"
    repo = repository(tmp_path)
    broken_environment(cluster, ns, source, repo)
    commands = tmp_path / "candidates.txt"
    commands.write_text(f"{GAMED}\nexit 1\n")

    raced = ctl(
        cluster, "race", source, "-n", ns, "--commands", str(commands), "--promote",
        "--timeout", TIMEOUT, "--verify-timeout", TIMEOUT, "-o", "json",
    )  # fmt: skip
    assert raced.returncode == 1 and "Traceback" not in raced.stderr, raced.stderr
    result = json.loads(raced.stdout)
    names, judge = [f"{source}-race-{i}" for i in (1, 2)], f"{source}-race-judge"
    gamed = result["candidates"][0]
    assert (gamed["name"], gamed["verdict"], gamed["exit_code"], gamed["files"]) == (
        names[0],
        "PASS",
        0,
        ["core/calc.py"],
    )
    assert gamed["changed_lines"] == 2 and gamed["judged"] == "FAIL"
    assert "winner" not in result and "promoted" not in result  # -o json omits nulls
    assert result["refused"].startswith(f"{names[0]} PASSed in its own workspace, but its change FAILed")
    assert "nothing promoted" in result["refused"]

    # Nothing was written locally; every fork the race made is gone; the source still holds the broken file.
    assert (repo / "calc.py").read_text() == BROKEN
    assert git(repo, "status", "--porcelain") == ""
    assert sorted(result["destroyed"]) == sorted([*names, judge]) and result["kept"] == []
    for fork in [*names, judge]:
        assert cluster.get(ns, "shadowenvironments", fork) is None
    assert read(cluster, ns, source, "core/calc.py") == BROKEN
    ok(ctl(cluster, "destroy", source, "-n", ns))
