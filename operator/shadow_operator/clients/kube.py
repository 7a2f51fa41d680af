"""A small JSON-in, JSON-out Kubernetes client over kubernetes_asyncio's authenticated transport.

Controllers work with plain dicts (the same shapes kopf hands them), so the generated model classes of
kubernetes_asyncio are bypassed: every call returns the decoded JSON body.
"""

from __future__ import annotations

import builtins
import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

from kubernetes_asyncio import client as k8s_client
from kubernetes_asyncio import config as k8s_config
from kubernetes_asyncio.client.exceptions import ApiException

Body = dict[str, Any]


class ApiError(Exception):
    """A non-2xx answer from the API server; `status` is the HTTP code, `reason` the Status reason."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message

    @property
    def not_found(self) -> bool:
        return self.status == 404

    @property
    def conflict(self) -> bool:
        return self.status == 409

    @property
    def invalid(self) -> bool:
        """The request body was refused on validation (it will not pass on retry)."""
        return self.status in (400, 422)

    @property
    def already_exists(self) -> bool:
        return self.status == 409 and self.reason == "AlreadyExists"


def resource_path(
    api_version: str,
    plural: str,
    namespace: str | None = None,
    name: str | None = None,
    subresource: str | None = None,
) -> str:
    prefix = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    path = prefix + (f"/namespaces/{namespace}" if namespace else "") + f"/{plural}"
    if name:
        path += f"/{name}"
        if subresource:
            path += f"/{subresource}"
    return path


class Kube:
    """Async JSON client. Create with `await Kube.connect()`; close with `await kube.close()`."""

    def __init__(self, api: k8s_client.ApiClient) -> None:
        self._api = api

    @classmethod
    async def connect(cls) -> Kube:
        try:
            k8s_config.load_incluster_config()  # type: ignore[no-untyped-call]
        except k8s_config.ConfigException:
            # Read KUBECONFIG now: the library's default path was fixed when it was imported.
            await k8s_config.load_kube_config(config_file=os.environ.get("KUBECONFIG"))
        return cls(k8s_client.ApiClient())

    async def close(self) -> None:
        await self._api.close()

    async def request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        query: Mapping[str, str] | None = None,
        content_type: str = "application/json",
    ) -> Body:
        try:
            response = await self._api.call_api(
                path,
                method,
                query_params=list((query or {}).items()),
                header_params={"Accept": "application/json", "Content-Type": content_type},
                body=body,
                auth_settings=["BearerToken"],
                _preload_content=False,
                _return_http_data_only=True,
            )
        except ApiException as exc:
            raise _api_error(exc.status or 0, exc.reason or "", exc.body) from None
        # Without preloading, the transport hands back the raw aiohttp response and checks nothing.
        try:
            raw = await response.read()
            status = int(response.status)
        finally:
            response.release()
        if not 200 <= status <= 299:
            raise _api_error(status, str(getattr(response, "reason", "") or ""), raw.decode(errors="replace"))
        decoded: Body = json.loads(raw) if raw else {}
        return decoded

    async def get(self, path: str) -> Body | None:
        try:
            return await self.request("GET", path)
        except ApiError as exc:
            if exc.not_found:
                return None
            raise

    async def list(
        self, path: str, *, labels: str | None = None, fields: str | None = None
    ) -> builtins.list[Body]:
        query = {}
        if labels:
            query["labelSelector"] = labels
        if fields:
            query["fieldSelector"] = fields
        result = await self.request("GET", path, query=query)
        items: builtins.list[Body] = result.get("items", [])
        return items

    async def create(self, path: str, body: Mapping[str, Any]) -> Body:
        return await self.request("POST", path, body=body)

    async def merge_patch(self, path: str, patch: Mapping[str, Any]) -> Body:
        return await self.request("PATCH", path, body=patch, content_type="application/merge-patch+json")

    async def json_patch(self, path: str, ops: Sequence[Mapping[str, Any]]) -> Body:
        return await self.request("PATCH", path, body=ops, content_type="application/json-patch+json")

    async def replace(self, path: str, body: Mapping[str, Any]) -> Body:
        return await self.request("PUT", path, body=body)

    async def delete(
        self,
        path: str,
        *,
        propagation: str | None = None,
        uid: str | None = None,
        resource_version: str | None = None,
    ) -> bool:
        """Delete; False when it was already gone. `uid`/`resource_version` are preconditions."""
        options: dict[str, Any] = {"kind": "DeleteOptions", "apiVersion": "v1"}
        if propagation:
            options["propagationPolicy"] = propagation
        preconditions = {k: v for k, v in (("uid", uid), ("resourceVersion", resource_version)) if v}
        if preconditions:
            options["preconditions"] = preconditions
        try:
            await self.request("DELETE", path, body=options)
        except ApiError as exc:
            if exc.not_found:
                return False
            raise
        return True


def _api_error(status: int, reason: str, body: Any) -> ApiError:
    message = str(body or reason)
    try:
        decoded = json.loads(body) if isinstance(body, str | bytes) else None
    except ValueError:
        decoded = None
    if isinstance(decoded, dict):
        reason = decoded.get("reason") or reason
        message = decoded.get("message") or message
    return ApiError(status, str(reason), str(message))
