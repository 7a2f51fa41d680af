"""shadowctl logs in as kubectl does, on a real API server: an exec credential plugin (v1 and v1beta1) that
hands out a ServiceAccount token from the TokenRequest API, a token file, an inline client certificate signed
by the cluster's CA; the context's namespace is the default; --kubeconfig, --context and -n anywhere; -A.

Each identity is bound by RBAC to one namespace only, so a listing that works proves who the client was, and
a refusal elsewhere proves it was not the admin of the surrounding kubeconfig."""

from __future__ import annotations

import base64
import json
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from kubernetes import client

from tests.support.pki import CertificateAuthority
from tests.support.sandbox_operator import CLAIM, ENVIRONMENT, Objects, install_crds
from tests.support.shadowctl import run, write_kubeconfig

pytestmark = pytest.mark.integration


# Prints an ExecCredential (the apiVersion the client asked for in KUBERNETES_EXEC_INFO) holding a token of
# the ServiceAccount $SA in $SA_NAMESPACE, got from the TokenRequest API as `kubectl create token` does.
PLUGIN = """#!{python}
import json, os
from kubernetes import client, config

info = json.loads(os.environ["KUBERNETES_EXEC_INFO"])
api = config.new_client_from_config(config_file=os.environ["ADMIN_KUBECONFIG"])
request = client.AuthenticationV1TokenRequest(spec=client.V1TokenRequestSpec(audiences=[], expiration_seconds=600))
token = client.CoreV1Api(api).create_namespaced_service_account_token(
    os.environ["SA"], os.environ["SA_NAMESPACE"], request
).status.token
with open(os.environ["CALLS"], "a") as fh:
    fh.write(info["apiVersion"] + "\\n")
print(json.dumps({{"apiVersion": info["apiVersion"], "kind": "ExecCredential", "status": {{"token": token}}}}))
"""


def names(result: subprocess.CompletedProcess[str]) -> list[tuple[str, str]]:
    """(namespace, name) of each object of the List `-o json` prints."""
    assert result.returncode == 0, result.stderr
    listed = json.loads(result.stdout)
    assert listed["kind"] == "List"
    return sorted((o["metadata"]["namespace"], o["metadata"]["name"]) for o in listed["items"])


def reader_role(api: client.ApiClient, namespace: str, subject: client.RbacV1Subject) -> None:
    """`subject` may read environments and claims in `namespace`, nothing else anywhere."""
    rbac = client.RbacAuthorizationV1Api(api)
    rbac.create_namespaced_role(
        namespace,
        client.V1Role(
            metadata=client.V1ObjectMeta(name="shadow-reader"),
            rules=[
                client.V1PolicyRule(
                    api_groups=[ENVIRONMENT[0]], resources=[ENVIRONMENT[1]], verbs=["get", "list", "watch"]
                ),
                client.V1PolicyRule(
                    api_groups=[CLAIM[0]], resources=[CLAIM[1]], verbs=["get", "list", "watch"]
                ),
            ],
        ),
    )
    rbac.create_namespaced_role_binding(
        namespace,
        client.V1RoleBinding(
            metadata=client.V1ObjectMeta(name="shadow-reader"),
            role_ref=client.V1RoleRef(
                api_group="rbac.authorization.k8s.io", kind="Role", name="shadow-reader"
            ),
            subjects=[subject],
        ),
    )


def environment(objs: Objects, name: str) -> None:
    objs.create(
        ENVIRONMENT,
        {"metadata": {"name": name}, "spec": {"sources": [{"name": "s", "repo": "o/s", "upload": {}}]}},
        version="v1alpha1",
    )


@pytest.fixture
def namespaces(k8s_api: client.ApiClient, namespace: str) -> Iterator[tuple[str, str]]:
    """Two namespaces, environment `alpha` and claim `first` in the first, environment `beta` in the second."""
    install_crds(k8s_api)
    core = client.CoreV1Api(k8s_api)
    other = f"{namespace[:50]}-b"
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=other)))
    try:
        first, second = Objects(k8s_api, namespace), Objects(k8s_api, other)
        environment(first, "alpha")
        environment(second, "beta")
        first.create(CLAIM, {"metadata": {"name": "first"}, "spec": {"sandboxTemplateRef": {"name": "t"}}})
        yield namespace, other
    finally:
        core.delete_namespace(other, propagation_policy="Background")


@pytest.fixture
def service_account(k8s_api: client.ApiClient, namespaces: tuple[str, str]) -> str:
    """ServiceAccount `tenant` of the first namespace, a reader there only."""
    ns = namespaces[0]
    client.CoreV1Api(k8s_api).create_namespaced_service_account(
        ns, client.V1ServiceAccount(metadata=client.V1ObjectMeta(name="tenant"))
    )
    reader_role(k8s_api, ns, client.RbacV1Subject(kind="ServiceAccount", name="tenant", namespace=ns))
    return "tenant"


def service_account_token(api: client.ApiClient, namespace: str, name: str) -> str:
    request = client.AuthenticationV1TokenRequest(
        spec=client.V1TokenRequestSpec(audiences=[], expiration_seconds=600)
    )
    return str(
        client.CoreV1Api(api).create_namespaced_service_account_token(name, namespace, request).status.token
    )


@pytest.mark.parametrize(
    "version", ["client.authentication.k8s.io/v1", "client.authentication.k8s.io/v1beta1"]
)
def test_exec_credential_plugin(
    k8s_api: client.ApiClient,
    kubeconfig: str,
    namespaces: tuple[str, str],
    service_account: str,
    tmp_path: Path,
    version: str,
) -> None:
    ns, other = namespaces
    plugin = tmp_path / "token-plugin"
    plugin.write_text(PLUGIN.format(python=sys.executable))
    plugin.chmod(plugin.stat().st_mode | stat.S_IXUSR)
    calls = tmp_path / "calls"
    user = {
        "exec": {
            "apiVersion": version,
            "command": str(plugin),
            "interactiveMode": "Never",
            "env": [
                {"name": "ADMIN_KUBECONFIG", "value": kubeconfig},
                {"name": "SA", "value": service_account},
                {"name": "SA_NAMESPACE", "value": ns},
                {"name": "CALLS", "value": str(calls)},
            ],
        }
    }
    config = write_kubeconfig(tmp_path / "config", kubeconfig, {"sa": user}, {"tenant": ("sa", ns)})

    # No -n: the context's namespace.
    assert names(run(config, "list", "-o", "json")) == [(ns, "alpha")]
    assert calls.read_text().split() == [version]
    # The token is the ServiceAccount's: the other namespace is refused, in one line.
    refused = run(config, "list", "-n", other)
    assert refused.returncode == 1 and "Traceback" not in refused.stderr
    assert refused.stderr.startswith("error: ") and "forbidden" in refused.stderr.lower(), refused.stderr
    assert f"system:serviceaccount:{ns}:{service_account}" in refused.stderr


def test_a_failing_exec_plugin_is_one_line(
    kubeconfig: str, namespaces: tuple[str, str], tmp_path: Path
) -> None:
    plugin = tmp_path / "broken-plugin"
    plugin.write_text("#!/bin/sh\necho 'token expired: run aws sso login' >&2\nexit 1\n")
    plugin.chmod(0o755)
    user = {
        "exec": {
            "apiVersion": "client.authentication.k8s.io/v1",
            "command": str(plugin),
            "interactiveMode": "Never",
        }
    }
    config = write_kubeconfig(tmp_path / "config", kubeconfig, {"u": user}, {"c": ("u", namespaces[0])})
    result = run(config, "list")
    assert result.returncode == 1 and "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 2 and lines[0].startswith("error: ") and lines[1].startswith("hint: "), result.stderr
    assert "credential plugin failed" in lines[0] and "aws sso login" in lines[0]
    assert "Unauthorized" not in result.stderr


def test_token_file(
    k8s_api: client.ApiClient,
    kubeconfig: str,
    namespaces: tuple[str, str],
    service_account: str,
    tmp_path: Path,
) -> None:
    ns, other = namespaces
    token = tmp_path / "token"
    token.write_text(service_account_token(k8s_api, ns, service_account))
    config = write_kubeconfig(
        tmp_path / "config", kubeconfig, {"sa": {"tokenFile": str(token)}}, {"c": ("sa", ns)}
    )
    assert names(run(config, "sandbox", "list", "-o", "json")) == [(ns, "first")]
    assert run(config, "sandbox", "list", "-n", other).returncode == 1


def test_client_certificate(
    k8s_api: client.ApiClient, kubeconfig: str, namespaces: tuple[str, str], tmp_path: Path
) -> None:
    """An inline certificate (client-certificate-data) for user `carol`, signed by the cluster's CA."""
    ns, other = namespaces
    ca = CertificateAuthority.load(Path(kubeconfig).parent / "pki")
    pair = ca.issue("carol", "carol")
    reader_role(
        k8s_api, ns, client.RbacV1Subject(kind="User", name="carol", api_group="rbac.authorization.k8s.io")
    )
    user = {
        "client-certificate-data": base64.b64encode(pair.cert.read_bytes()).decode(),
        "client-key-data": base64.b64encode(pair.key.read_bytes()).decode(),
    }
    config = write_kubeconfig(tmp_path / "config", kubeconfig, {"carol": user}, {"c": ("carol", ns)})
    assert names(run(config, "list", "-o", "json")) == [(ns, "alpha")]
    refused = run(config, "list", "-n", other)
    assert refused.returncode == 1 and "carol" in refused.stderr


def test_global_options_anywhere(kubeconfig: str, namespaces: tuple[str, str], tmp_path: Path) -> None:
    """--kubeconfig, --context and -n before or after the verb, with KUBECONFIG pointing nowhere."""
    ns, other = namespaces
    admin = yaml.safe_load(Path(kubeconfig).read_text())["users"][0]["user"]
    config = write_kubeconfig(
        tmp_path / "config",
        kubeconfig,
        {"admin": admin},
        {"first": ("admin", ns), "second": ("admin", other)},
    )
    nowhere = str(tmp_path / "missing")
    alpha, beta = [(ns, "alpha")], [(other, "beta")]
    for args, expected in (
        (["--kubeconfig", config, "list"], alpha),
        (["list", f"--kubeconfig={config}"], alpha),
        (["--kubeconfig", config, "--context", "second", "list"], beta),
        (["list", "--kubeconfig", config, "--context=second"], beta),
        (["--context", "second", "--kubeconfig", config, "-n", ns, "list"], alpha),
        (["list", "-n", ns, "--context", "second", "--kubeconfig", config], alpha),
        ([f"-n{other}", "--kubeconfig", config, "list"], beta),
    ):
        assert names(run(nowhere, *args, "-o", "json")) == expected, args
    # -A on list verbs, before or after the verb.
    both = [(ns, "alpha"), (other, "beta")]

    def ours(rows: list[tuple[str, str]]) -> list[tuple[str, str]]:
        return [row for row in rows if row[0] in (ns, other)]  # other tests' namespaces may still be going

    assert ours(names(run(nowhere, "--kubeconfig", config, "list", "-A", "-o", "json"))) == both
    assert ours(names(run(nowhere, "-A", "--kubeconfig", config, "list", "-o", "json"))) == both
    table = run(config, "list", "--all-namespaces")
    assert table.returncode == 0 and table.stdout.split()[:2] == ["NAMESPACE", "NAME"], table.stdout
    assert ours(names(run(config, "sandbox", "list", "-A", "-o", "json"))) == [(ns, "first")]
    # An unknown context: one line.
    missing = run(config, "--context", "nope", "list")
    assert missing.returncode == 1 and missing.stderr.startswith("error: ") and "nope" in missing.stderr


def test_completion_lists_names_from_the_cluster(
    kubeconfig: str, namespaces: tuple[str, str], tmp_path: Path
) -> None:
    ns = namespaces[0]
    admin = yaml.safe_load(Path(kubeconfig).read_text())["users"][0]["user"]
    config = write_kubeconfig(tmp_path / "config", kubeconfig, {"admin": admin}, {"first": ("admin", ns)})

    def complete(words: str) -> list[str]:
        env = {
            "_SHADOWCTL_COMPLETE": "complete_bash",
            "COMP_WORDS": words,
            "COMP_CWORD": str(len(words.split(" ")) - 1),
        }
        result = run(kubeconfig=config, env=env)
        assert result.returncode == 0 and not result.stderr, result.stderr
        return result.stdout.split()

    assert complete("shadowctl status ") == ["alpha"]
    assert complete("shadowctl diff al") == ["alpha"]
    assert complete("shadowctl diff b") == []
    assert complete("shadowctl sandbox delete ") == ["first"]
    # Global options before the verb count: another kubeconfig, another namespace.
    assert complete(f"shadowctl --kubeconfig {config} -n {namespaces[1]} status ") == ["beta"]
    # No cluster: nothing, silently.
    with_nothing = run(
        kubeconfig=str(tmp_path / "missing"),
        env={"_SHADOWCTL_COMPLETE": "complete_bash", "COMP_WORDS": "shadowctl status ", "COMP_CWORD": "2"},
    )
    assert with_nothing.returncode == 0 and with_nothing.stdout.strip() == "" and not with_nothing.stderr


def test_a_rotated_token_file_is_read_again(
    k8s_api: client.ApiClient,
    kubeconfig: str,
    namespaces: tuple[str, str],
    service_account: str,
    tmp_path: Path,
) -> None:
    """A client made while the file held a stale token reads the file again on 401 (the kubelet rotates
    projected tokens in place), and the request succeeds."""
    from shadow_operator.sdk import kube

    ns = namespaces[0]
    token = tmp_path / "token"
    token.write_text("stale")
    config = write_kubeconfig(
        tmp_path / "config", kubeconfig, {"sa": {"tokenFile": str(token)}}, {"c": ("sa", ns)}
    )
    with kube.connect(kubeconfig=config) as http:
        token.write_text(service_account_token(k8s_api, ns, service_account))
        listed = kube.request(
            http, "GET", f"/apis/{ENVIRONMENT[0]}/v1alpha1/namespaces/{ns}/{ENVIRONMENT[1]}"
        )
    assert [item["metadata"]["name"] for item in listed["items"]] == ["alpha"]
