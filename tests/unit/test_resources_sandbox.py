"""Child manifests and status conditions of a Sandbox (pure functions, no cluster)."""

from __future__ import annotations

from typing import Any

import pytest
from shadow_operator.api import constants as c
from shadow_operator.api import naming
from shadow_operator.common.egress import proxy_token
from shadow_operator.resources import conditions as conds
from shadow_operator.resources import podsecurity
from shadow_operator.resources import sandbox as res

pytestmark = pytest.mark.unit


def make_sandbox(**spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "apiVersion": "agents.x-k8s.io/v1beta1",
        "kind": "Sandbox",
        "metadata": {"name": "demo", "namespace": "ns", "uid": "uid-1", "generation": 3},
        "spec": {
            "podTemplate": {
                "metadata": {
                    "labels": {"app": "web", "agents.x-k8s.io/sandbox-name-hash": "hijack"},
                    "annotations": {"note": "x", "shadow.dev/secret": "y"},
                },
                "spec": {
                    "containers": [
                        {"name": "sidecar", "image": "busybox", "ports": [{"containerPort": 9000}]},
                        {
                            "name": "main",
                            "image": "runtime",
                            "ports": [
                                {"name": "runtime", "containerPort": 8888},
                                {"name": "preview", "containerPort": 3000},
                            ],
                        },
                    ],
                    "volumes": [{"name": "work", "emptyDir": {}}],
                },
            },
            "operatingMode": "Running",
        },
    }
    body["spec"].update(spec)
    return body


def test_name_hash_is_fnv1a_32() -> None:
    # Reference values of FNV-1a 32-bit.
    assert naming.name_hash("") == "811c9dc5"
    assert naming.name_hash("a") == "e40c292c"
    assert naming.name_hash("foobar") == "bf9cf968"


def test_pod_golden() -> None:
    vct = [{"metadata": {"name": "work"}, "spec": {"accessModes": ["ReadWriteOnce"]}}]
    pod = res.build_pod(make_sandbox(volumeClaimTemplates=vct), token_secret="demo-runtime-token")
    assert pod["metadata"] == {
        "name": "demo",
        "namespace": "ns",
        "labels": {"app": "web", c.LABEL_SANDBOX_NAME_HASH: naming.name_hash("demo")},
        "annotations": {"note": "x"},
        "ownerReferences": [
            {
                "apiVersion": "agents.x-k8s.io/v1beta1",
                "kind": "Sandbox",
                "name": "demo",
                "uid": "uid-1",
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ],
    }
    spec = pod["spec"]
    assert spec["automountServiceAccountToken"] is False
    assert spec["securityContext"] == {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}
    assert spec["volumes"] == [
        {"name": "work", "persistentVolumeClaim": {"claimName": "work-demo"}},
        {"name": c.RUNTIME_TOKEN_VOLUME, "secret": {"secretName": "demo-runtime-token"}},
    ]
    sidecar, main = spec["containers"]
    assert "volumeMounts" not in sidecar and "env" not in sidecar
    assert main["volumeMounts"] == [
        {"name": c.RUNTIME_TOKEN_VOLUME, "mountPath": "/var/run/secrets/sandbox-runtime", "readOnly": True}
    ]
    assert main["env"] == [
        {"name": "SANDBOX_RUNTIME_TOKEN_FILE", "value": "/var/run/secrets/sandbox-runtime/token"}
    ]
    for container in spec["containers"]:
        assert container["securityContext"] == {
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
        }


def test_explicit_template_security_wins() -> None:
    body = make_sandbox()
    body["spec"]["podTemplate"]["spec"]["automountServiceAccountToken"] = True
    body["spec"]["podTemplate"]["spec"]["securityContext"] = {"runAsNonRoot": False}
    spec = res.build_pod(body, token_secret="t")["spec"]
    assert spec["automountServiceAccountToken"] is True
    assert spec["securityContext"]["runAsNonRoot"] is False


def test_runtime_class_passes_through_to_the_pod_and_the_pod_security_check() -> None:
    body = make_sandbox()
    body["spec"]["podTemplate"]["spec"]["runtimeClassName"] = "gvisor"
    spec = res.build_pod(body, token_secret="t")["spec"]
    assert spec["runtimeClassName"] == "gvisor"
    # A sandboxing runtime asks the node for nothing: the chart's defaults allow it.
    assert podsecurity.violations(spec, podsecurity.PodSecurity()) == []


def test_token_goes_to_first_container_without_runtime_port() -> None:
    body = make_sandbox()
    body["spec"]["podTemplate"]["spec"]["containers"][1]["ports"] = []
    first = res.build_pod(body, token_secret="t")["spec"]["containers"][0]
    assert first["env"][-1]["name"] == c.RUNTIME_TOKEN_ENV


def test_service_ports_are_sorted_and_named() -> None:
    svc = res.build_service(make_sandbox(service=True))
    assert svc["spec"]["clusterIP"] == "None"
    assert svc["spec"]["selector"] == {c.LABEL_SANDBOX_NAME_HASH: naming.name_hash("demo")}
    assert svc["spec"]["ports"] == [
        {"name": "preview", "port": 3000, "protocol": "TCP", "targetPort": 3000},
        {"name": "runtime", "port": 8888, "protocol": "TCP", "targetPort": 8888},
        {"name": "p-9000-tcp", "port": 9000, "protocol": "TCP", "targetPort": 9000},
    ]


def test_token_secret_never_leaks_into_labels() -> None:
    secret = res.build_token_secret(make_sandbox(), "s3cr3t")
    assert secret["metadata"]["name"] == "demo-runtime-token"
    assert secret["stringData"] == {"token": "s3cr3t"}
    assert "s3cr3t" not in str(secret["metadata"])


def running_pod(ready: bool = True, ip: str | None = "10.0.0.7") -> dict[str, Any]:
    return {
        "metadata": {"name": "demo", "ownerReferences": [{"uid": "uid-1", "controller": True}]},
        "spec": {"nodeName": "kwok-0"},
        "status": {
            "phase": "Running",
            "podIPs": [{"ip": ip}] if ip else [],
            "conditions": [
                {"type": "PodScheduled", "status": "True"},
                {"type": "Ready", "status": "True" if ready else "False"},
            ],
        },
    }


def ready_of(body: dict[str, Any], seen: res.Observed) -> dict[str, Any]:
    desired, _ = res.compute_conditions(body, seen)
    found = conds.find(desired, c.COND_READY)
    assert found is not None
    return found.model_dump(by_alias=True)


def test_ready_needs_pod_ready_ip_and_service() -> None:
    body = make_sandbox(service=True)
    assert (
        ready_of(body, res.Observed(pod=running_pod(), service={"metadata": {"name": "demo"}}))["status"]
        == "True"
    )
    not_ready = ready_of(body, res.Observed(pod=running_pod(), service=None))
    assert (not_ready["status"], not_ready["reason"]) == ("False", c.REASON_DEPENDENCIES_NOT_READY)
    assert "Service does not exist" in not_ready["message"]
    assert ready_of(body, res.Observed(pod=running_pod(ip=None), service={}))["message"].startswith(
        "Pod is Ready but has no podIPs"
    )
    assert ready_of(body, res.Observed(pod=running_pod(ready=False), service={}))["status"] == "False"
    assert ready_of(body, res.Observed(pod=running_pod()))["observedGeneration"] == 3


@pytest.mark.parametrize(
    ("seen", "reason"),
    [
        (res.Observed(expired=True), c.REASON_SANDBOX_EXPIRED),
        (res.Observed(multiple_pods=2), c.REASON_MULTIPLE_PODS),
        (res.Observed(error="boom"), c.REASON_RECONCILER_ERROR),
    ],
)
def test_failure_reasons(seen: res.Observed, reason: str) -> None:
    assert ready_of(make_sandbox(), seen)["reason"] == reason


def test_suspended_conditions() -> None:
    body = make_sandbox(operatingMode="Suspended")
    desired, remove = res.compute_conditions(body, res.Observed(pod=None))
    by_type = {cond.type: cond.model_dump(by_alias=True) for cond in desired}
    assert by_type[c.COND_SUSPENDED]["status"] == "True"
    assert by_type[c.COND_SUSPENDED]["reason"] == c.REASON_POD_TERMINATED
    assert by_type[c.COND_READY]["reason"] == c.REASON_SANDBOX_SUSPENDED
    assert c.COND_POD_SCHEDULED in remove
    legacy = make_sandbox(replicas=0)
    assert res.is_suspended(legacy["spec"])


def test_finished_pod() -> None:
    pod = running_pod()
    pod["status"]["phase"] = "Failed"
    desired, _ = res.compute_conditions(make_sandbox(), res.Observed(pod=pod))
    by_type = {cond.type: cond.model_dump(by_alias=True) for cond in desired}
    assert by_type[c.COND_FINISHED]["reason"] == c.REASON_POD_FAILED
    assert by_type[c.COND_READY]["reason"] == c.REASON_POD_FAILED


def test_urls() -> None:
    body = make_sandbox(service=True)
    seen = res.Observed(pod=running_pod(), service={"metadata": {"name": "demo"}})
    assert res.runtime_url(body, seen, "cluster.local") == "http://demo.ns.svc.cluster.local:8888"
    assert res.runtime_url(body, res.Observed(pod=running_pod()), "cluster.local") == "http://10.0.0.7:8888"
    assert res.preview_url(body, "preview.example.com", "https") == "https://demo.preview.example.com/"
    assert res.preview_url(body, None, "https") is None


def test_long_names_stay_bounded_and_distinct() -> None:
    a, b = "x" * 250 + "a", "x" * 250 + "b"
    assert len(naming.token_secret_name(a)) <= 253
    assert naming.token_secret_name(a) != naming.token_secret_name(b)


def test_only_an_environments_own_workspace_pod_carries_its_environment_label() -> None:
    """Gitea's NetworkPolicies admit the Pod labelled with its environment's instance: a label the Sandbox's
    podTemplate or metadata names is not enough, only a ShadowEnvironment (or a ShadowEnvironmentPool, whose
    instances environments take) controlling the Sandbox, and the value is always the Sandbox's own name."""
    plain = make_sandbox()
    plain["metadata"]["labels"] = {c.LABEL_ENVIRONMENT: "demo"}
    plain["spec"]["podTemplate"]["metadata"]["labels"][c.LABEL_ENVIRONMENT] = "demo"
    labels, _ = res.build_pod_labels_and_annotations(plain)
    assert c.LABEL_ENVIRONMENT not in labels

    owned = make_sandbox()
    ref = {
        "apiVersion": f"{c.SHADOW_GROUP}/v1alpha1",
        "kind": "ShadowEnvironment",
        "uid": "e",
        "controller": True,
    }
    owned["metadata"]["ownerReferences"] = [{**ref, "name": "demo"}]
    labels, _ = res.build_pod_labels_and_annotations(owned)
    assert labels[c.LABEL_ENVIRONMENT] == "demo"
    assert labels[c.LABEL_SANDBOX_NAME_HASH] == naming.name_hash("demo")

    # An environment that took a pool instance: the label names the instance (the Sandbox), never the
    # environment, so it cannot match another Sandbox's Gitea.
    owned["metadata"]["ownerReferences"] = [{**ref, "name": "other"}]
    labels, _ = res.build_pod_labels_and_annotations(owned)
    assert labels[c.LABEL_ENVIRONMENT] == "demo"
    owned["metadata"]["ownerReferences"] = [{**ref, "kind": "ShadowEnvironmentPool", "name": "pool"}]
    labels, _ = res.build_pod_labels_and_annotations(owned)
    assert labels[c.LABEL_ENVIRONMENT] == "demo"

    for kind, api_version in (
        ("SandboxWarmPool", f"{c.EXTENSIONS_GROUP}/v1beta1"),
        ("ShadowEnvironment", "x.io/v1"),
    ):
        owned["metadata"]["ownerReferences"] = [{**ref, "kind": kind, "apiVersion": api_version, "name": "d"}]
        labels, _ = res.build_pod_labels_and_annotations(owned)
        assert c.LABEL_ENVIRONMENT not in labels, kind


def test_a_sandbox_under_an_egress_allowlist_gets_its_proxy_and_the_egress_ca() -> None:
    body = {
        "apiVersion": "agents.x-k8s.io/v1beta1",
        "kind": "Sandbox",
        "metadata": {"name": "sb", "namespace": "team", "uid": "u", "annotations": {"shadow.dev/egress": "true"}},
        "spec": {"podTemplate": {"spec": {"containers": [{"name": "main", "image": "img", "env": [{"name": "HTTPS_PROXY", "value": "http://evil"}]}]}}},
    }  # fmt: skip
    pod = res.build_pod(body, token_secret=None, egress_gateway=("gw.shadow-system.svc:3128", b"k"))
    container = pod["spec"]["containers"][0]
    env = {e["name"]: e["value"] for e in container["env"]}
    # The template's own proxy variable gives way to the gateway's.
    assert env["HTTPS_PROXY"] == f"http://sandbox:{proxy_token(b'k', 'team', 'sb')}@gw.shadow-system.svc:3128"
    assert [e["name"] for e in container["env"]].count("HTTPS_PROXY") == 1
    assert (
        env["SSL_CERT_FILE"]
        == env["REQUESTS_CA_BUNDLE"]
        == env["PIP_CERT"]
        == "/etc/shadow-egress/bundle.crt"
    )
    assert env["NODE_EXTRA_CA_CERTS"] == "/etc/shadow-egress/ca.crt"
    assert {"name": "shadow-egress-ca", "mountPath": "/etc/shadow-egress", "readOnly": True} in container[
        "volumeMounts"
    ]
    assert {"name": "shadow-egress-ca", "configMap": {"name": "shadow-egress-ca", "optional": True}} in pod[
        "spec"
    ]["volumes"]
    # Without the annotation (a template without spec.egress), or without a gateway, nothing is added.
    del body["metadata"]["annotations"]
    assert "volumes" not in res.build_pod(body, token_secret=None, egress_gateway=("gw:3128", b"k"))["spec"]
