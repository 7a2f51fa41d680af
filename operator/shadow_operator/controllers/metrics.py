"""Prometheus metrics of the Sandbox API controllers (served on SHADOW_METRICS_PORT)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

CLAIM_STARTUP_LATENCY = Histogram(
    "agent_sandbox_claim_startup_latency_ms",
    "Time from the claim being requested (agents.x-k8s.io/client-first-requested-at, else its creation) to Ready.",
    ["namespace", "launch_type"],
    buckets=(50, 100, 200, 300, 500, 750, 1000, 2000, 5000, 10000, 30000, 60000, 120000),
)
WARM_POOL_SIZE = Gauge(
    "shadow_operator_warm_pool_sandboxes", "Warm sandboxes in a pool.", ["namespace", "pool"]
)
WARM_POOL_READY = Gauge(
    "shadow_operator_warm_pool_ready_sandboxes", "Ready warm sandboxes.", ["namespace", "pool"]
)
WARM_POOL_DESIRED = Gauge(
    "shadow_operator_warm_pool_desired_sandboxes", "spec.replicas of a pool.", ["namespace", "pool"]
)
ENVIRONMENT_PHASE_SECONDS = Histogram(
    "shadow_operator_environment_phase_seconds",
    "Seconds from a ShadowEnvironment's creation to the end of each phase (status.timings): scheduled, "
    "workspaceReady, giteaReady, uploaded, copiedIn, ready, verified, cloned.",
    ["namespace", "phase"],
    buckets=(0.5, 1, 2, 3, 5, 8, 10, 15, 20, 30, 45, 60, 120, 300, 600),
)
ENVIRONMENT_POOL_INSTANCES = Gauge(
    "shadow_operator_environment_pool_instances",
    "Unclaimed instances of a ShadowEnvironmentPool, by state: ready (workspace and Gitea Ready), starting, "
    "desired (spec.replicas).",
    ["namespace", "pool", "state"],
)
POOL_TAKES = Counter(
    "shadow_operator_environment_pool_takes_total",
    "ShadowEnvironments created naming a pool, by outcome (status.pool.reason): Adopted, PoolEmpty, "
    "PoolMismatch, PoolNotFound, Fork.",
    ["namespace", "pool", "reason"],
)
SANDBOXES_SUSPENDED = Gauge(
    "shadow_operator_sandboxes_suspended",
    "Sandboxes whose Pod is gone while they are kept, by cause: idle (spec.autoSuspendPolicy) or scale "
    "(operatingMode Suspended, replicas 0).",
    ["namespace", "cause"],
)
SANDBOX_SUSPENDS = Counter(
    "shadow_operator_sandbox_suspends_total",
    "Sandbox suspensions, by cause: idle (decided by the operator), scale (the spec asked for it).",
    ["namespace", "cause"],
)
SANDBOX_RESUMES = Counter(
    "shadow_operator_sandbox_resumes_total",
    "Sandbox resumes, by cause: annotation (a new shadow.dev/resume-requested value woke an idle sandbox), "
    "scale (the spec asked for it to run again).",
    ["namespace", "cause"],
)
SANDBOX_RESUME_SECONDS = Histogram(
    "shadow_operator_sandbox_resume_seconds",
    "Seconds from the operator seeing a resume request (annotation or spec) to the Sandbox being Ready again.",
    ["namespace"],
    buckets=(0.25, 0.5, 1, 1.5, 2, 3, 4, 6, 8, 10, 15, 20, 30, 60, 120),
)
