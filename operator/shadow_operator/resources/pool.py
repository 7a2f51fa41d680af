"""A ShadowEnvironmentPool's instances, and whether an environment may take one.

An instance is what a ShadowEnvironment without sources starts: its workspace Sandbox and its Gitea, built by
the environment builders from an environment-shaped body (`instance_body`) named after the instance. So an
environment that takes one owns exactly what it would have started itself, named after the instance
(status.sandbox) instead of after itself.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import string
from collections.abc import Mapping
from typing import Any

from shadow_operator.api import constants as c
from shadow_operator.api import naming
from shadow_operator.api.kinds import NETWORK_POLICY, SECRET, SERVICE, STATEFUL_SET, ResourceKind
from shadow_operator.api.pool import SHAPING_FIELDS, WORKSPACE_FIELDS
from shadow_operator.resources import environment as res
from shadow_operator.resources import gitea_policy

Body = Mapping[str, Any]

# An instance's name: the pool's (cut to leave the Gitea StatefulSet's name unhashed) and a random suffix.
NAME_PREFIX_MAX = 40
SUFFIX_ALPHABET = string.ascii_lowercase + string.digits


def shaping(spec: Mapping[str, Any], default_template: str) -> dict[str, Any]:
    """The fields of an environment's or a pool's spec an instance is made from, with defaults made explicit
    (an unset template is the operator's default one; empty lists are unset)."""
    shape: dict[str, Any] = {key: spec.get(key) for key in SHAPING_FIELDS}
    shape["template"] = spec.get("template") or default_template
    workspace = spec.get("workspace") or {}
    shape["workspace"] = {key: workspace.get(key) for key in WORKSPACE_FIELDS}
    for key in ("gitRewrites", "env"):
        shape[key] = shape[key] or None
    return shape


def differences(
    env_spec: Mapping[str, Any], pool_spec: Mapping[str, Any], default_template: str
) -> list[str]:
    """The spec fields (dotted, e.g. `workspace.size`) in which an environment differs from its pool."""
    mine, theirs = shaping(env_spec, default_template), shaping(pool_spec, default_template)
    found: list[str] = []
    for key in SHAPING_FIELDS:
        if mine[key] == theirs[key]:
            continue
        if isinstance(mine[key], dict) and isinstance(theirs[key], dict) and key != "resources":
            found += [
                f"{key}.{sub}"
                for sub in sorted(set(mine[key]) | set(theirs[key]))
                if mine[key].get(sub) != theirs[key].get(sub)
            ]
        else:
            found.append(key)
    return found


def instance_hash(spec: Mapping[str, Any], template: Body, default_template: str) -> str:
    """What an instance was made from: the shaping fields and the template's spec. An environment takes an
    instance only when its own hash is the same; the pool replaces instances of an older hash."""
    made_of = {"shape": shaping(spec, default_template), "template": template.get("spec") or {}}
    text = json.dumps(made_of, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def new_instance_name(pool: str) -> str:
    suffix = "".join(secrets.choice(SUFFIX_ALPHABET) for _ in range(5))
    return f"{pool[:NAME_PREFIX_MAX].rstrip('-')}-{suffix}"


def instance_body(pool: Body, name: str) -> dict[str, Any]:
    """The environment-shaped body the builders make an instance from: the pool's shaping fields, the
    instance's name and the pool's namespace."""
    spec = {key: value for key, value in (pool.get("spec") or {}).items() if key in SHAPING_FIELDS}
    return {
        "apiVersion": f"{c.SHADOW_GROUP}/{c.SHADOW_VERSION}",
        "kind": "ShadowEnvironment",
        "metadata": {"name": name, "namespace": pool["metadata"]["namespace"]},
        "spec": spec,
    }


def label_value(pool: str) -> str:
    """The pool's name as a label value (a name hash when it is longer than a label value may be)."""
    return pool if len(pool) <= 63 else naming.name_hash(pool)


def mark_instance(sandbox: dict[str, Any], pool: str, made_of: str) -> dict[str, Any]:
    """The pool's label (the instance is unclaimed while it has it) and the hash it was made from."""
    meta = sandbox["metadata"]
    meta.setdefault("labels", {})[c.LABEL_POOL] = label_value(pool)
    meta.setdefault("annotations", {})[c.ANNOTATION_POOL_HASH] = made_of
    return sandbox


def selector(pool: str) -> str:
    return f"{c.LABEL_POOL}={label_value(pool)}"


def instance_objects(instance: str) -> list[tuple[ResourceKind, str]]:
    """Gitea's objects of an instance (beside its Sandbox), in the order an environment takes them over."""
    return [
        (SECRET, res.gitea_secret_name(instance)),
        (SERVICE, res.gitea_name(instance)),
        (NETWORK_POLICY, gitea_policy.gitea_network_policy_name(instance)),
        (NETWORK_POLICY, gitea_policy.workspace_policy_name(instance)),
        (STATEFUL_SET, res.gitea_name(instance)),
    ]
