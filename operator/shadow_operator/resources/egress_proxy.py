"""What a sandbox Pod under an egress allowlist gets: the proxy variables (with its own proxy credential) and
the namespace's egress CA, trusted by the usual tools. None of it is a secret the workspace could misuse: the
credential works only from the Pod's own address, and the NetworkPolicy, not these variables, is what keeps
the traffic on the gateway."""

from __future__ import annotations

from typing import Any

from shadow_operator.api import constants as c
from shadow_operator.common.egress import PROXY_USER, proxy_token

BUNDLE = f"{c.EGRESS_CA_DIR}/bundle.crt"
CA_ONLY = f"{c.EGRESS_CA_DIR}/ca.crt"
# In-cluster names stay direct (the NetworkPolicy decides whether they are reachable: the environment's Gitea).
NO_PROXY = "localhost,127.0.0.1,::1,.svc,.cluster.local"


def proxy_env(namespace: str, name: str, proxy: str, key: bytes) -> list[dict[str, str]]:
    url = f"http://{PROXY_USER}:{proxy_token(key, namespace, name)}@{proxy}"
    env = {
        "HTTP_PROXY": url,
        "HTTPS_PROXY": url,
        "http_proxy": url,
        "https_proxy": url,
        "NO_PROXY": NO_PROXY,
        "no_proxy": NO_PROXY,
        # OpenSSL, Python's ssl and requests, pip, curl and git read a whole bundle; Node adds one CA.
        "SSL_CERT_FILE": BUNDLE,
        "REQUESTS_CA_BUNDLE": BUNDLE,
        "PIP_CERT": BUNDLE,
        "CURL_CA_BUNDLE": BUNDLE,
        "GIT_SSL_CAINFO": BUNDLE,
        "NODE_EXTRA_CA_CERTS": CA_ONLY,
    }
    return [{"name": k, "value": v} for k, v in env.items()]


def inject_egress_proxy(pod_spec: dict[str, Any], namespace: str, name: str, proxy: str, key: bytes) -> None:
    """Every container (init containers too) gets the variables and the CA, replacing any of the same name."""
    added = proxy_env(namespace, name, proxy, key)
    names = {item["name"] for item in added}
    volumes = [v for v in pod_spec.get("volumes") or () if v.get("name") != c.EGRESS_CA_VOLUME]
    # Optional: until the gateway has written it the Pod starts, and TLS the gateway terminates fails closed.
    volumes.append(
        {"name": c.EGRESS_CA_VOLUME, "configMap": {"name": c.EGRESS_CA_CONFIGMAP, "optional": True}}
    )
    pod_spec["volumes"] = volumes
    for key_name in ("initContainers", "containers"):
        for container in pod_spec.get(key_name) or ():
            env = [e for e in container.get("env") or () if e.get("name") not in names]
            container["env"] = env + added
            mounts = [m for m in container.get("volumeMounts") or () if m.get("name") != c.EGRESS_CA_VOLUME]
            mounts.append({"name": c.EGRESS_CA_VOLUME, "mountPath": c.EGRESS_CA_DIR, "readOnly": True})
            container["volumeMounts"] = mounts
