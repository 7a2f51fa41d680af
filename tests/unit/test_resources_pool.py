"""Whether an environment may take a pool's instance: the fields that shape an instance, and its hash."""

from __future__ import annotations

import pytest
from shadow_operator.api import constants as c
from shadow_operator.resources import environment as res
from shadow_operator.resources import pool as pools

pytestmark = pytest.mark.unit

DEFAULT = "workspace"
TEMPLATE = {
    "metadata": {"name": "workspace"},
    "spec": {"podTemplate": {"spec": {"containers": [{"name": "r"}]}}},
}
POOL_SPEC = {
    "replicas": 3,
    "workspace": {"mountPath": "/workspace", "size": "10Gi"},
    "gitea": {"enabled": True, "organization": "shadow"},
    "journal": True,
}


def env_spec(**changes: object) -> dict[str, object]:
    spec: dict[str, object] = {
        "sources": [{"name": "app", "repo": "app", "upload": {}}],
        "verify": {"passThreshold": 75},
        "startupTimeoutSeconds": 600,
        "pool": "p",
        **POOL_SPEC,
    }
    spec.pop("replicas")
    spec.update(changes)
    return spec


def test_fields_that_do_not_shape_an_instance_are_not_compared() -> None:
    assert pools.differences(env_spec(), POOL_SPEC, DEFAULT) == []
    assert (
        pools.differences(
            env_spec(idleTimeoutSeconds=600, shutdownTime="2030-01-01T00:00:00Z"), POOL_SPEC, DEFAULT
        )
        == []
    )
    # The operator's default template, named or not; empty lists and unset lists alike.
    assert pools.differences(env_spec(template=DEFAULT, env=[], gitRewrites=[]), POOL_SPEC, DEFAULT) == []


def test_each_shaping_field_that_differs_is_named() -> None:
    spec = env_spec(
        template="gpu",
        workspace={"mountPath": "/home/me/app", "size": "10Gi", "from": {"environment": "x"}},
        gitea={"enabled": True, "organization": "acme"},
        env=[{"name": "A", "value": "1"}],
        resources={"limits": {"cpu": "2"}},
    )
    assert pools.differences(spec, POOL_SPEC, DEFAULT) == [
        "template",
        "workspace.mountPath",
        "gitea.organization",
        "env",
        "resources",
    ]


def test_the_hash_follows_the_template_and_the_fields_not_the_rest() -> None:
    first = pools.instance_hash(POOL_SPEC, TEMPLATE, DEFAULT)
    assert pools.instance_hash(env_spec(), TEMPLATE, DEFAULT) == first
    changed = {**TEMPLATE, "spec": {"podTemplate": {"spec": {"containers": [{"name": "r", "image": "new"}]}}}}
    assert pools.instance_hash(POOL_SPEC, changed, DEFAULT) != first
    assert pools.instance_hash({**POOL_SPEC, "journal": False}, TEMPLATE, DEFAULT) != first


def test_an_instance_is_built_like_an_environment_of_its_name() -> None:
    pool = {
        "metadata": {"name": "p", "namespace": "team", "uid": "u"},
        "spec": {**POOL_SPEC, "gitRewrites": [{"from": "https://github.com/acme/", "to": "acme"}]},
    }
    name = pools.new_instance_name(pool["metadata"]["name"])
    assert name.startswith("p-") and len(name) == len("p-") + 5
    body = pools.instance_body(pool, name)
    assert body["metadata"] == {"name": name, "namespace": "team"}
    assert "replicas" not in body["spec"]
    url = res.gitea_url(body, "cluster.local")
    sandbox = pools.mark_instance(res.build_workspace_sandbox(body, TEMPLATE, gitea_base_url=url), "p", "h")
    assert sandbox["metadata"]["name"] == name
    assert sandbox["metadata"]["labels"][c.LABEL_POOL] == "p"
    assert sandbox["metadata"]["annotations"][c.ANNOTATION_POOL_HASH] == "h"
    env = {e["name"]: e.get("value") for e in sandbox["spec"]["podTemplate"]["spec"]["containers"][0]["env"]}
    assert env["GIT_CONFIG_KEY_0"] == f"url.{url}/acme/.insteadOf" and res.gitea_name(name) in url
    # Names stay short enough for the Gitea StatefulSet's Pod (no hashing), whatever the pool's name.
    assert len(res.gitea_name(pools.new_instance_name("p" * 253))) <= 52
    assert pools.selector("p" * 100) == f"{c.LABEL_POOL}={pools.label_value('p' * 100)}"
    assert len(pools.label_value("p" * 100)) <= 63
