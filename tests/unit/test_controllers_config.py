"""The operator's settings, read from its environment in one place: defaults, fallbacks, and an error that
names the variable."""

from __future__ import annotations

import pytest
from shadow_operator.controllers.config import Config
from shadow_operator.resources.podsecurity import PodSecurity

pytestmark = pytest.mark.unit


def test_an_empty_environment_gives_the_defaults() -> None:
    assert Config.from_env({}) == Config()
    assert Config().ingress_namespaces == ("shadow-system",)
    assert Config().pod_security == PodSecurity()


def test_the_operator_namespace_falls_back_to_the_pods_and_leads_the_ingress_namespaces() -> None:
    env = {"POD_NAMESPACE": "ops", "SHADOW_OPERATOR_NAMESPACE": " ", "SHADOW_INGRESS_NAMESPACES": "a, ops,a"}
    config = Config.from_env(env)
    assert config.operator_namespace == "ops"
    assert config.ingress_namespaces == ("ops", "a")
    assert Config.from_env({**env, "SHADOW_OPERATOR_NAMESPACE": "op"}).ingress_namespaces == (
        "op",
        "a",
        "ops",
    )


def test_values_are_parsed_from_text() -> None:
    config = Config.from_env(
        {"SHADOW_METRICS_PORT": "9000", "SHADOW_LOG_FORMAT": "JSON", "SHADOW_ALLOW_SERVICE_ACCOUNT": "True"}
    )
    assert (config.metrics_port, config.json_logs, config.pod_security.allow_service_account) == (
        9000,
        True,
        True,
    )
    assert Config.from_env({"SHADOW_LOG_FORMAT": "text"}).json_logs is False


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("SHADOW_METRICS_PORT", "80s"),
        ("SHADOW_MAX_BUNDLE_BYTES", "1Gi"),
        ("SHADOW_GIT_PUSH_CONCURRENCY", "two"),
    ],
)
def test_a_bad_number_names_its_variable(name: str, value: str) -> None:
    with pytest.raises(ValueError, match=rf"^{name}: .*integer.* \(got '{value}'\)$"):
        Config.from_env({name: value})


def test_every_bad_variable_is_named_at_once() -> None:
    with pytest.raises(ValueError) as raised:
        Config.from_env({"SHADOW_POD_SECURITY_AUDIT": "lax", "SHADOW_ALLOW_HOST_PATH": "1"})
    assert str(raised.value) == (
        "SHADOW_ALLOW_HOST_PATH: '1' is neither true nor false; "
        "SHADOW_POD_SECURITY_AUDIT: 'lax' is not a Pod Security level (privileged, baseline, restricted)"
    )


def test_workers_per_kind_and_the_namespace_share_reach_each_kinds_queue() -> None:
    """The chart's operator.workers and namespaceShare: set ones win, the rest keep the reconciler's defaults
    (before, SHADOW_WORKERS was rendered by the chart and read by nothing)."""
    from shadow_operator.controllers import RECONCILERS, settings

    config = Config.from_env({"SHADOW_WORKERS": '{"ShadowEnvironment": 12}', "SHADOW_NAMESPACE_SHARE": "2"})
    tuned = {rec.name(): settings.concurrency(config, rec) for rec in RECONCILERS}
    assert (tuned["ShadowEnvironment"].workers, tuned["ShadowEnvironment"].namespace_share) == (12, 2)
    assert (tuned["SandboxClaim"].workers, tuned["SandboxClaim"].namespace_share) == (16, 2)
    defaults = settings.concurrency(Config.from_env({"SHADOW_WORKERS": "{}"}), RECONCILERS[0])
    assert (defaults.workers, defaults.namespace_share) == (RECONCILERS[0].workers, None)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (
            '{"Sandboxes": 4}',
            "'Sandboxes' is not a kind the operator reconciles (one of Sandbox, SandboxClaim",
        ),
        ('{"Sandbox": 0}', "workers for Sandbox must be a whole number of at least 1, got 0"),
        ("[8]", "expected an object of kind: workers"),
        ("8", "expected an object of kind: workers"),
    ],
)
def test_bad_workers_are_refused_with_the_kinds_named(value: str, message: str) -> None:
    with pytest.raises(ValueError, match="SHADOW_WORKERS") as refused:
        Config.from_env({"SHADOW_WORKERS": value})
    assert message in str(refused.value)


def test_the_transfer_pace_and_push_slots_come_from_the_environment() -> None:
    config = Config.from_env(
        {
            "SHADOW_TRANSFER_MIN_RATE": "1024",
            "SHADOW_TRANSFER_WINDOW": "5",
            "SHADOW_GIT_PUSH_CONCURRENCY_PER_NAMESPACE": "2",
            "SHADOW_GIT_PUSH_TIMEOUT": "60",
        }
    )
    assert (config.transfer_pace.min_rate, config.transfer_pace.min_bytes) == (1024, 5120)
    assert (config.git_push_concurrency_per_namespace, config.git_push_timeout) == (2, 60.0)
    with pytest.raises(ValueError, match="SHADOW_GIT_PUSH_CONCURRENCY_PER_NAMESPACE"):
        Config.from_env({"SHADOW_GIT_PUSH_CONCURRENCY_PER_NAMESPACE": "0"})
