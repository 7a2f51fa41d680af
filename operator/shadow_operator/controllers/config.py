"""Operator configuration, read once at start-up from the environment (the chart sets these).

Each setting is declared once below with the variable it comes from (`validation_alias`); `Config.from_env`
reads and checks them all in one go, and names the variable in any error. An empty variable counts as unset.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    AliasChoices,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    model_validator,
)
from pydantic_core import ErrorDetails

from shadow_operator.api.kinds import CUSTOM_KINDS
from shadow_operator.clients.pacing import DEFAULT_MIN_RATE, DEFAULT_WINDOW, Pace
from shadow_operator.clients.runtime import DEFAULT_MAX_ANSWER_BYTES
from shadow_operator.common.podsecurity import LEVELS
from shadow_operator.resources.environment import GITEA_RESOURCES
from shadow_operator.resources.gitea_policy import GiteaSettings
from shadow_operator.resources.networkpolicy import denied_ranges
from shadow_operator.resources.podsecurity import PodSecurity


def _names(value: object) -> object:
    """A comma-separated list (the chart's `join ","`), without blanks or repeats."""
    if isinstance(value, str):
        return tuple(dict.fromkeys(name.strip() for name in value.split(",") if name.strip()))
    return value


def _level(value: str) -> str:
    if value not in LEVELS:
        raise ValueError(f"{value!r} is not a Pod Security level ({', '.join(LEVELS)})")
    return value


def _flag(value: object) -> object:
    if isinstance(value, str):
        if value.lower() not in ("true", "false"):
            raise ValueError(f"{value!r} is neither true nor false")
        return value.lower() == "true"
    return value


def _namespaced_name(value: str | None) -> str | None:
    if value is not None:
        namespace, slash, rest = value.partition("/")
        if not slash or not namespace or not rest or "/" in rest:
            raise ValueError(f"{value!r} is not NAMESPACE/NAME")
    return value


def _cidrs(value: tuple[str, ...]) -> tuple[str, ...]:
    denied_ranges(value)  # refuses a malformed range, or one that covers every address
    return value


def _json_logs(value: object) -> object:
    return value.lower() == "json" if isinstance(value, str) else value


def _workers(value: object) -> object:
    """Workers per kind, given as JSON (the chart's toJson): {"ShadowEnvironment": 8}."""
    if isinstance(value, str):
        try:
            value = json.loads(value) if value.strip() else {}
        except json.JSONDecodeError as exc:
            raise ValueError(f"not JSON ({exc.msg})") from None
    if not isinstance(value, Mapping):
        raise ValueError(
            f'expected an object of kind: workers, e.g. {{"ShadowEnvironment": 8}}, got {value!r}'
        )
    kinds = sorted(k.kind for k in CUSTOM_KINDS)
    for kind, count in value.items():
        if kind not in kinds:
            raise ValueError(f"{kind!r} is not a kind the operator reconciles (one of {', '.join(kinds)})")
        if not isinstance(count, int) or isinstance(count, bool) or count < 1:
            raise ValueError(f"workers for {kind} must be a whole number of at least 1, got {count!r}")
    return value


def _resources(value: object) -> object:
    """A core/v1 ResourceRequirements given as JSON (the chart's toJson)."""
    if not isinstance(value, str):
        return value
    try:
        parsed = json.loads(value)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not JSON ({exc.msg})") from None
    if not isinstance(parsed, dict) or set(parsed) - {"requests", "limits"}:
        raise ValueError(f"expected an object with only `requests` and `limits`, got {value[:200]!r}")
    for part, quantities in parsed.items():
        if not isinstance(quantities, dict) or not all(
            isinstance(k, str) and isinstance(v, str | int | float) for k, v in quantities.items()
        ):
            raise ValueError(f"`{part}` must map resource names to quantities, got {quantities!r}")
    return parsed


# PodSecurity's loosenings, each a setting of the same name.
_ALLOWANCES = {f.name for f in dataclasses.fields(PodSecurity)} - {"level"}

Names = Annotated[tuple[str, ...], BeforeValidator(_names)]
Level = Annotated[str, AfterValidator(_level)]
Flag = Annotated[bool, BeforeValidator(_flag)]


class Config(BaseModel):
    model_config = ConfigDict(frozen=True, validate_by_name=True, validate_by_alias=True)

    cluster_domain: str = Field("cluster.local", validation_alias="SHADOW_CLUSTER_DOMAIN")
    preview_domain: str | None = Field(None, validation_alias="SHADOW_PREVIEW_DOMAIN")
    preview_scheme: str = Field("https", validation_alias="SHADOW_PREVIEW_SCHEME")
    # The preview router's keys Secret (`namespace/name`) and the namespaces it serves: the operator writes each
    # of those namespaces its own link keys, derived from that Secret's (controllers/previewkeys.py).
    preview_keys_secret: Annotated[str | None, AfterValidator(_namespaced_name)] = Field(
        None, validation_alias="SHADOW_PREVIEW_KEYS_SECRET"
    )
    preview_namespaces: Names = Field((), validation_alias="SHADOW_PREVIEW_NAMESPACES")
    operator_namespace: str = Field(
        "shadow-system", validation_alias=AliasChoices("SHADOW_OPERATOR_NAMESPACE", "POD_NAMESPACE")
    )
    # Namespaces the default NetworkPolicy lets in beside the operator's (e.g. a separate preview router's).
    extra_ingress_namespaces: Names = Field((), validation_alias="SHADOW_INGRESS_NAMESPACES")
    # The cluster's pod and service ranges, denied to sandboxes' egress beside every non-global range (they
    # must be named where they are globally routable addresses; RFC 1918 ranges are denied anyway).
    cluster_cidrs: Annotated[Names, AfterValidator(_cidrs)] = Field(
        (), validation_alias="SHADOW_CLUSTER_CIDRS"
    )
    metrics_port: int = Field(8081, validation_alias="SHADOW_METRICS_PORT")
    json_logs: Annotated[bool, BeforeValidator(_json_logs)] = Field(
        False, validation_alias="SHADOW_LOG_FORMAT"
    )
    # ShadowEnvironment: the SandboxTemplate a workspace starts from unless it names one, and Gitea's image.
    default_template: str = Field("workspace", validation_alias="SHADOW_DEFAULT_TEMPLATE")
    gitea_image: str = Field("shadow-operator/gitea:latest", validation_alias="SHADOW_GITEA_IMAGE")
    gitea_image_pull_policy: str = Field("IfNotPresent", validation_alias="SHADOW_GITEA_IMAGE_PULL_POLICY")
    # Each environment's Gitea container resources (core/v1 ResourceRequirements, as JSON).
    gitea_resources: Annotated[Mapping[str, Any], BeforeValidator(_resources)] = Field(
        GITEA_RESOURCES, validation_alias="SHADOW_GITEA_RESOURCES"
    )
    # Where the operator reaches an environment's Gitea API; default: its in-cluster Service. Set it when the
    # operator runs outside the cluster (with a port-forward) or in tests against a Gitea on loopback.
    gitea_api_url: str | None = Field(None, validation_alias="SHADOW_GITEA_API_URL")
    # The setup of an environment's Gitea (controllers/environment/gitea.py), in total: past it, GiteaStalled.
    gitea_setup_timeout: float = Field(120.0, gt=0, validation_alias="SHADOW_GITEA_SETUP_TIMEOUT")
    # After a setup that failed, the next starts no sooner than this: its end wakes a pass at once, and without
    # a pause a Gitea that refuses connections would be tried (and counted) in a tight loop.
    gitea_setup_retry: float = Field(3.0, ge=0, validation_alias="SHADOW_GITEA_SETUP_RETRY")
    # Likewise for workspace runtimes (default: each workspace's status.runtimeURL): one runtime on loopback
    # answering for every workspace, for an operator outside the cluster or tests without a kubelet.
    runtime_api_url: str | None = Field(None, validation_alias="SHADOW_RUNTIME_API_URL")
    # The egress gateway (issue 29): its proxy address (host:port) for sandboxes of templates with spec.egress,
    # and the file holding the key their proxy credentials derive from (the gateway's; a Secret in the chart).
    egress_proxy: str | None = Field(None, validation_alias="SHADOW_EGRESS_PROXY")
    egress_key_file: str | None = Field(None, validation_alias="SHADOW_EGRESS_KEY_FILE")

    def egress_gateway(self) -> tuple[str, bytes] | None:
        """(proxy host:port, credential key), or None where no gateway is configured."""
        if not self.egress_proxy or not self.egress_key_file:
            return None
        with open(self.egress_key_file, "rb") as key:
            return self.egress_proxy, key.read().strip()

    # The most the operator reads of one answer of a workspace runtime (which the tenant's code controls).
    runtime_max_answer_bytes: int = Field(
        DEFAULT_MAX_ANSWER_BYTES, validation_alias="SHADOW_RUNTIME_MAX_ANSWER_BYTES"
    )
    # What a sandbox's pod may ask of its node (the chart's podSecurity values; its admission policy agrees):
    # see `pod_security`.
    pod_security_level: Level = Field("restricted", validation_alias="SHADOW_POD_SECURITY_LEVEL")
    allow_privileged: Flag = Field(False, validation_alias="SHADOW_ALLOW_PRIVILEGED")
    allow_host_namespaces: Flag = Field(False, validation_alias="SHADOW_ALLOW_HOST_NAMESPACES")
    allow_host_path: Flag = Field(False, validation_alias="SHADOW_ALLOW_HOST_PATH")
    allow_service_account: Flag = Field(False, validation_alias="SHADOW_ALLOW_SERVICE_ACCOUNT")
    # The tenant namespaces labelled at start-up to enforce pod_security.level (Pod Security admission), and
    # the levels of its warn and audit modes there.
    pod_security_namespaces: Names = Field((), validation_alias="SHADOW_POD_SECURITY_NAMESPACES")
    pod_security_warn: Level = Field("restricted", validation_alias="SHADOW_POD_SECURITY_WARN")
    pod_security_audit: Level = Field("restricted", validation_alias="SHADOW_POD_SECURITY_AUDIT")
    # Pushes to Gitea (clients/gitpush.py): where the temporary repositories go (an emptyDir in the chart) and
    # the largest snapshot bundle taken from a workspace.
    git_work_dir: str | None = Field(None, validation_alias="SHADOW_GIT_WORK_DIR")
    max_bundle_bytes: int = Field(1 << 30, validation_alias="SHADOW_MAX_BUNDLE_BYTES")
    git_push_concurrency: int = Field(2, ge=1, validation_alias="SHADOW_GIT_PUSH_CONCURRENCY")
    git_push_timeout: float = Field(900.0, gt=0, validation_alias="SHADOW_GIT_PUSH_TIMEOUT")
    git_push_concurrency_per_namespace: int = Field(
        1, ge=1, validation_alias="SHADOW_GIT_PUSH_CONCURRENCY_PER_NAMESPACE"
    )
    # Transfers with a workspace runtime (clients/pacing.py): at least this many bytes per second over every
    # window, or the transfer ends as stalled (failure code RuntimeStalled) and frees its worker and slot.
    transfer_min_rate: int = Field(DEFAULT_MIN_RATE, ge=1, validation_alias="SHADOW_TRANSFER_MIN_RATE")
    transfer_window: float = Field(DEFAULT_WINDOW, gt=0, validation_alias="SHADOW_TRANSFER_WINDOW")
    # Concurrent reconciles: per kind (a JSON object, e.g. {"ShadowEnvironment": 8}; kinds left out keep their
    # default), and the most of a kind's workers one namespace may hold at once (0: all but one).
    workers: Annotated[Mapping[str, int], BeforeValidator(_workers)] = Field(
        default_factory=dict, validation_alias="SHADOW_WORKERS"
    )
    namespace_share: int = Field(0, ge=0, validation_alias="SHADOW_NAMESPACE_SHARE")
    # Long work off the workers (engine/operations.py: copy-ins, fork copies): at most this many under way at
    # once per kind, and of those from one namespace.
    operations: int = Field(32, ge=1, validation_alias="SHADOW_OPERATIONS")
    operations_per_namespace: int = Field(4, ge=1, validation_alias="SHADOW_OPERATIONS_PER_NAMESPACE")
    # A SandboxWarmPool whose members claims are taking replaces them once the claims pause for this long
    # (seconds; 0: at once), and at the latest this long after it first fell short: the new Pods start on the
    # nodes the claimed sandboxes are answering their first commands on (controllers/warmpool.py).
    warm_pool_refill_delay: float = Field(1.0, ge=0, validation_alias="SHADOW_WARM_POOL_REFILL_DELAY")
    warm_pool_refill_max_delay: float = Field(
        10.0, ge=0, validation_alias="SHADOW_WARM_POOL_REFILL_MAX_DELAY"
    )
    # A sandbox suspended for idleness loses its Pod with this grace period (the Pod's own when shorter): a
    # process that ignores SIGTERM would otherwise hold the Pod, and a wake meanwhile, for 30 s. At least 1:
    # 0 would remove the Pod while its containers still run, and a new Pod of the same name could start.
    idle_suspend_grace_seconds: int = Field(3, ge=1, validation_alias="SHADOW_IDLE_SUSPEND_GRACE_SECONDS")

    @model_validator(mode="after")
    def _pod_security_holds(self) -> Config:
        """A loosening its level does not allow is refused at start-up (PodSecurity checks that)."""
        _ = self.pod_security
        return self

    @property
    def transfer_pace(self) -> Pace:
        return Pace(min_rate=self.transfer_min_rate, window=self.transfer_window)

    @property
    def pod_security(self) -> PodSecurity:
        """What a sandbox's pod may ask of its node (the level and the allow_* settings above)."""
        return PodSecurity(level=self.pod_security_level, **self.model_dump(include=_ALLOWANCES))

    @property
    def ingress_namespaces(self) -> tuple[str, ...]:
        """The namespaces the default NetworkPolicy lets in: the operator's, then the extra ones."""
        return tuple(dict.fromkeys([self.operator_namespace, *self.extra_ingress_namespaces]))

    @property
    def gitea(self) -> GiteaSettings:
        return GiteaSettings(
            operator_namespace=self.operator_namespace,
            image=self.gitea_image,
            cluster_domain=self.cluster_domain,
            pull_policy=self.gitea_image_pull_policy,
            resources=self.gitea_resources,
        )

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Config:
        """The settings from `env` (default: the process environment); a bad value is a ValueError naming its
        variable."""
        given = {name: value.strip() for name, value in (os.environ if env is None else env).items()}
        try:
            return cls.model_validate({name: value for name, value in given.items() if value})
        except ValidationError as exc:
            raise ValueError("; ".join(_problem(error) for error in exc.errors())) from None


def _problem(error: ErrorDetails) -> str:
    """One error, in the variable's name: `SHADOW_X: what is wrong (got 'value')`."""
    if error["type"] == "value_error":  # our own checks' messages quote the value already
        message = str(error["ctx"]["error"])
    else:
        message = f"{error['msg']} (got {error['input']!r})"
    return f"{error['loc'][0]}: {message}" if error["loc"] else message
