"""Issue 18, M8: where promote writes may not be moved by someone who can only patch the cluster object.

The annotation `local.shadow.dev/<source>` is the cluster's word; promote takes it only where it matches what
this machine recorded when it created, uploaded or forked the environment (sdk/localdirs.py)."""

from __future__ import annotations

import copy
from pathlib import Path

import httpx
import pytest
from shadow_operator.api.environment import ShadowEnvironment
from shadow_operator.sdk import ShadowGateway, localdirs
from shadow_operator.sdk import environment as envops
from shadow_operator.sdk.environment import EnvironmentSpec, LocalSource
from shadow_operator.sdk.errors import PromoteError

pytestmark = pytest.mark.unit

CLUSTER = "https://cluster.example:6443"
KEY = envops.ANNOTATION_LOCAL_PREFIX + "core"


@pytest.fixture
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    return tmp_path / "state"


def environment(name: str, core: Path, annotated: str | None = None) -> ShadowEnvironment:
    body = copy.deepcopy(envops.build_environment(name, "team", EnvironmentSpec(local=[LocalSource(core)])))
    if annotated is not None:
        body["metadata"]["annotations"][KEY] = annotated
    return ShadowEnvironment.from_body(body)


def targets(env: ShadowEnvironment, to: str | None = None) -> list[Path]:
    with httpx.Client(base_url=CLUSTER) as http, ShadowGateway(env.name, namespace="team", client=http) as gw:
        return [local for _, local in gw._ops._promote_targets(env, None, to)]


def test_a_patched_annotation_does_not_move_promote(state: Path, tmp_path: Path) -> None:
    core = tmp_path / "core"
    core.mkdir()
    # Created elsewhere (or before this machine kept records): the annotation alone is not enough.
    with pytest.raises(PromoteError, match="no record") as refused:
        targets(environment("env", core, annotated=str(Path.home())))
    assert "--to PATH" in refused.value.hint
    # Recorded here, as create and upload do: the annotation must say the same.
    localdirs.record(CLUSTER, "team", "env", {"core": core})
    assert targets(environment("env", core)) == [core.resolve()]
    with pytest.raises(PromoteError, match="no record"):
        targets(environment("env", core, annotated="~"))
    assert targets(environment("env", core, annotated="~"), to=str(tmp_path / "x")) == [tmp_path / "x"]
    # The record is this machine's own, per cluster, namespace and environment.
    assert (state / "shadow-operator" / "environments").is_dir()
    assert localdirs.recorded("https://other:6443", "team", "env") == {}


def test_forks_inherit_the_record_and_stop_forgets_it(state: Path, tmp_path: Path) -> None:
    core = tmp_path / "core"
    core.mkdir()
    localdirs.record(CLUSTER, "team", "env", {"core": core})
    localdirs.copy(CLUSTER, "team", "env", ["env-fork-1"])  # what `shadowctl fork` and gateway.fork do
    assert targets(environment("env-fork-1", core)) == [core.resolve()]
    localdirs.forget(CLUSTER, "team", "env-fork-1")
    with pytest.raises(PromoteError, match="no record"):
        targets(environment("env-fork-1", core))
